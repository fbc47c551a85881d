//! The [`Store`] contract: one atomic round trip per transition.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{Failure, Record, State};
use crate::time::Timestamp;
use crate::token::{Fence, OwnerToken};

/// A request to claim a key for one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The key to claim.
    pub key: RecordKey,
    /// The identity of the request or job; a record with another fingerprint is a mismatch.
    pub fingerprint: Fingerprint,
    /// How long the lease runs before another attempt may take the key over.
    pub lease: Duration,
}

impl ClaimRequest {
    /// A claim request from its parts.
    #[must_use]
    pub fn new(key: RecordKey, fingerprint: Fingerprint, lease: Duration) -> Self {
        ClaimRequest {
            key,
            fingerprint,
            lease,
        }
    }
}

/// The proof of a granted claim: the holder presents it to every later transition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The key held.
    pub key: RecordKey,
    /// The holder's token.
    pub owner: OwnerToken,
    /// The holder's fence; pass it downstream so stale writes can be refused there too.
    pub fence: Fence,
    /// Until when the lease runs (store time).
    pub until: Timestamp,
    /// The attempt number (1 for the first; a takeover adds one).
    pub attempt: u32,
}

impl Lease {
    /// Whether `record` is held by this lease (same owner and fence).
    #[must_use]
    pub fn holds(&self, record: &Record) -> bool {
        record.owner == self.owner && record.fence == self.fence
    }
}

/// The answer to a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is yours: run the operation, then complete, fail or release.
    Acquired {
        /// The proof of the claim.
        lease: Lease,
        /// Whether the claim took over an in-flight record whose lease had lapsed (its holder
        /// probably crashed).
        taken_over: bool,
    },
    /// Another attempt holds a live lease on the key.
    InFlight {
        /// How long until that lease lapses.
        retry_after: Duration,
    },
    /// The operation is done: here is its record, with the result.
    Completed(Record),
    /// The operation failed permanently: here is its record, with the failure.
    Failed(Record),
    /// The key is in use with another fingerprint (another payload). The record is untouched
    /// and not revealed.
    Mismatch,
}

impl ClaimOutcome {
    /// A short, stable name of the outcome for metrics labels and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            ClaimOutcome::Acquired { .. } => "acquired",
            ClaimOutcome::InFlight { .. } => "in_flight",
            ClaimOutcome::Completed(_) => "completed",
            ClaimOutcome::Failed(_) => "failed",
            ClaimOutcome::Mismatch => "mismatch",
        }
    }
}

/// Which records a scan returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanQuery {
    /// Only records in this state.
    pub state: Option<State>,
    /// Only records at least this old (by creation time).
    pub min_age: Option<Duration>,
    /// At most this many records per page (0 means the store's default of 100).
    pub limit: usize,
    /// Continue after this cursor, from an earlier [`ScanPage::next_cursor`].
    pub cursor: Option<String>,
}

impl ScanQuery {
    /// The default page size.
    pub const DEFAULT_LIMIT: usize = 100;

    /// Every record, a page at a time.
    #[must_use]
    pub fn all() -> Self {
        ScanQuery::default()
    }

    /// Only records in `state`.
    #[must_use]
    pub fn with_state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records at least `age` old.
    #[must_use]
    pub fn with_min_age(mut self, age: Duration) -> Self {
        self.min_age = Some(age);
        self
    }

    /// At most `limit` records per page.
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The page size to use.
    #[must_use]
    pub fn page_size(&self) -> usize {
        if self.limit == 0 {
            Self::DEFAULT_LIMIT
        } else {
            self.limit
        }
    }

    /// Whether `record` passes the state and age filters at `now`.
    #[must_use]
    pub fn matches(&self, record: &Record, now: Timestamp) -> bool {
        self.state.is_none_or(|state| record.state == state)
            && self.min_age.is_none_or(|age| record.age(now) >= age)
    }
}

/// One page of a scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// The records of this page.
    pub records: Vec<Record>,
    /// The cursor of the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// The store contract. Every transition is ONE atomic round trip to the backend; the decision
/// logic lives in [`crate::machine`], which every store applies.
///
/// Object safe: the gateway holds an `Arc<dyn Store>` chosen at run time.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Claims `request.key`: see [`ClaimOutcome`].
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Extends the lease to `extend` from now.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] unless `lease` still holds an in-flight record.
    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError>;

    /// Records the result and keeps it for `retention`. Re-sending the same complete after a
    /// lost reply returns `Ok`.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] unless `lease` holds the record.
    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Records a failure: a retryable one frees the key, a permanent one is kept for
    /// `retention`.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] unless `lease` holds the record.
    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Gives the key back without a result.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] if another attempt holds the key or the record is settled.
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// The record at `key`, if there is one that has not expired.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Removes the record at `key` (an operator's action); `true` if there was one.
    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError>;

    /// Lists records by state and age, a page at a time.
    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError>;

    /// Checks that the store answers (for a readiness probe). The default reads one key that
    /// is never written; a store may answer more cheaply (a `PING`).
    async fn ping(&self) -> Result<(), StoreError> {
        let probe =
            IdempotencyKey::new("idem-readiness-probe").map_err(|err| StoreError::Backend {
                source: Box::new(err),
                retryable: false,
            })?;
        self.get(&RecordKey::new(Scope::none(), probe))
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        (**self).claim(request).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        (**self).heartbeat(lease, extend).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        (**self).complete(lease, result, retention).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        (**self).fail(lease, failure, retention).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        (**self).release(lease).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        (**self).get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        (**self).delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        (**self).scan(query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        (**self).ping().await
    }
}
