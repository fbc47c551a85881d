//! [`Metered`]: a store that times every operation of the store it wraps into
//! `idem_store_operation_seconds{store, op}` and counts its errors into
//! `idem_store_errors_total{store, op, kind}`, one label set for the HTTP layer, the job guard
//! and the gateway.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::metrics::{LEASE_LOSSES, STORE_ERRORS, STORE_SECONDS};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Lease, Record, RecordKey, ScanPage,
    ScanQuery, Store, StoreError, StoreStats, UnknownOutcome,
};
use metrics::{Key, Label, Level, Metadata, SharedString, Unit};

use crate::bound::BoundHistogram;

/// What the metrics of this crate say of themselves to the recorder (as `metrics::counter!`
/// would).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A store operation: the `op` label of the store metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOp {
    /// [`Store::claim`].
    Claim,
    /// [`Store::heartbeat`].
    Heartbeat,
    /// [`Store::complete`].
    Complete,
    /// [`Store::fail`].
    Fail,
    /// [`Store::release`].
    Release,
    /// [`Store::get`].
    Get,
    /// [`Store::delete`].
    Delete,
    /// [`Store::scan`].
    Scan,
    /// [`Store::ping`].
    Ping,
    /// [`Store::settle_unknown`].
    SettleUnknown,
    /// [`Store::resolve_completed`].
    ResolveCompleted,
    /// [`Store::resolve_released`].
    ResolveReleased,
}

impl StoreOp {
    /// Every operation, in the order of the variants.
    pub const ALL: [StoreOp; 12] = [
        StoreOp::Claim,
        StoreOp::Heartbeat,
        StoreOp::Complete,
        StoreOp::Fail,
        StoreOp::Release,
        StoreOp::Get,
        StoreOp::Delete,
        StoreOp::Scan,
        StoreOp::Ping,
        StoreOp::SettleUnknown,
        StoreOp::ResolveCompleted,
        StoreOp::ResolveReleased,
    ];

    /// The `op` label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Heartbeat => "heartbeat",
            StoreOp::Complete => "complete",
            StoreOp::Fail => "fail",
            StoreOp::Release => "release",
            StoreOp::Get => "get",
            StoreOp::Delete => "delete",
            StoreOp::Scan => "scan",
            StoreOp::Ping => "ping",
            StoreOp::SettleUnknown => "settle_unknown",
            StoreOp::ResolveCompleted => "resolve_completed",
            StoreOp::ResolveReleased => "resolve_released",
        }
    }

    /// The operation labelled `name`, if it is one of [`StoreOp::ALL`].
    #[must_use]
    pub fn from_name(name: &str) -> Option<StoreOp> {
        StoreOp::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Describes the metrics this crate emits to the installed recorder (their help texts and
/// units): the store metrics of [`Metered`] and the lease losses the
/// [`LeaseKeeper`](crate::LeaseKeeper) counts. [`Metered::new`] calls it; describing again is
/// harmless. Without an installed recorder this does nothing.
pub fn describe() {
    metrics::describe_histogram!(
        STORE_SECONDS,
        Unit::Seconds,
        "Store operation latency, by store and operation"
    );
    metrics::describe_counter!(
        STORE_ERRORS,
        "Store operation errors, by store, operation and kind"
    );
    metrics::describe_counter!(
        LEASE_LOSSES,
        "Leases lost while the work ran (a heartbeat refused, a store unreachable until the \
         lease ended, or a completion refused)"
    );
}

/// Describes the store metrics ([`describe`]) and registers the series of the store labelled
/// `label` for `ops` at zero (a histogram per op, an error counter per op and kind), so that a
/// scrape shows them before the first operation: Prometheus' advice for a series that may stay
/// at zero. Without an installed recorder this does nothing.
pub fn register_at_zero(label: &str, ops: &[StoreOp]) {
    describe();
    Keys::new(SharedString::from_owned(label.to_owned())).register_at_zero(ops);
}

/// The keys of one store's metrics, made once for its label.
struct Keys {
    /// The `store` label.
    store: SharedString,
    /// The latency histogram of each [`StoreOp`], in the order of [`StoreOp::ALL`], with its
    /// handle in the recorder in use.
    seconds: Vec<BoundHistogram>,
    /// The error counter of each [`StoreOp`] and [`StoreError::KINDS`] kind.
    errors: Vec<Key>,
}

impl Keys {
    fn new(store: SharedString) -> Keys {
        let labels = |op: StoreOp| {
            vec![
                Label::new("store", store.clone()),
                Label::from_static_parts("op", op.as_str()),
            ]
        };
        let seconds = StoreOp::ALL
            .iter()
            .map(|&op| BoundHistogram::new(Key::from_parts(STORE_SECONDS, labels(op))))
            .collect();
        let errors = StoreOp::ALL
            .iter()
            .flat_map(|&op| {
                StoreError::KINDS.iter().map(move |&kind| {
                    let mut labels = labels(op);
                    labels.push(Label::from_static_parts("kind", kind));
                    Key::from_parts(STORE_ERRORS, labels)
                })
            })
            .collect();
        Keys {
            store,
            seconds,
            errors,
        }
    }

    /// Registers the series of `ops` at zero.
    fn register_at_zero(&self, ops: &[StoreOp]) {
        metrics::with_recorder(|recorder| {
            for &op in ops {
                let _ = recorder.register_histogram(self.seconds[op as usize].key(), &METADATA);
                for kind in StoreError::KINDS {
                    let _ = recorder.register_counter(&self.error(op, kind), &METADATA);
                }
            }
        });
    }

    /// The error counter of `op` for an error of `kind`; made now for a kind this crate does
    /// not know (a newer idem-core).
    fn error(&self, op: StoreOp, kind: &'static str) -> Key {
        match StoreError::KINDS.iter().position(|&k| k == kind) {
            Some(at) => self.errors[op as usize * StoreError::KINDS.len() + at].clone(),
            None => self.error_named(op.as_str(), kind),
        }
    }

    fn error_named(&self, op: &'static str, kind: &'static str) -> Key {
        Key::from_parts(
            STORE_ERRORS,
            vec![
                Label::new("store", self.store.clone()),
                Label::from_static_parts("op", op),
                Label::from_static_parts("kind", kind),
            ],
        )
    }
}

/// A store that wraps `S` and meters it, tower style: every operation goes to `S`, timed into
/// `idem_store_operation_seconds{store, op}`; an error also counts into
/// `idem_store_errors_total{store, op, kind}`. The label set is the same wherever a store is
/// metered (the HTTP layer, the job guard, the gateway), and every key is made once, when the
/// store is wrapped: an operation allocates nothing for its metrics.
///
/// ```
/// use idem_lease::Metered;
/// use idem_store_memory::MemoryStore;
///
/// let store = Metered::new(MemoryStore::new(), "memory");
/// assert_eq!(store.label(), "memory");
/// ```
pub struct Metered<S> {
    inner: S,
    keys: Arc<Keys>,
}

impl<S> Metered<S> {
    /// `inner`, metered under the `store` label `label` (`memory`, `redis`, `postgres`...).
    /// Describes the metrics to the installed recorder ([`describe`]).
    pub fn new(inner: S, label: impl Into<String>) -> Self {
        describe();
        let label: Arc<str> = Arc::from(label.into());
        Metered {
            inner,
            keys: Arc::new(Keys::new(SharedString::from_shared(label))),
        }
    }

    /// The `store` label.
    #[must_use]
    pub fn label(&self) -> &str {
        &self.keys.store
    }

    /// The store metered.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The store metered, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Registers this store's series of `ops` at zero: see [`register_at_zero`].
    pub fn register_at_zero(&self, ops: &[StoreOp]) {
        self.keys.register_at_zero(ops);
    }

    /// Runs `operation`, an operation `op` on this store that is not one of the [`Store`]
    /// methods (a transaction's commit, a claim inside a caller's transaction), timing it and
    /// counting its error under this store's labels.
    ///
    /// # Errors
    /// The operation's error, unchanged.
    pub async fn time<T>(
        &self,
        op: &'static str,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if let Some(known) = StoreOp::from_name(op) {
            return self.timed(known, operation).await;
        }
        let start = Instant::now();
        let result = operation.await;
        let seconds = Key::from_parts(
            STORE_SECONDS,
            vec![
                Label::new("store", self.keys.store.clone()),
                Label::from_static_parts("op", op),
            ],
        );
        record(&seconds, start.elapsed());
        if let Err(error) = &result {
            increment(&self.keys.error_named(op, error.kind()));
        }
        result
    }

    /// Runs `operation`, timing it and counting its error.
    async fn timed<T>(
        &self,
        op: StoreOp,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = operation.await;
        self.keys.seconds[op as usize].record(start.elapsed().as_secs_f64());
        if let Err(error) = &result {
            increment(&self.keys.error(op, error.kind()));
        }
        result
    }
}

/// Records `elapsed` into the histogram `key`.
fn record(key: &Key, elapsed: Duration) {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
        .record(elapsed.as_secs_f64());
}

/// Adds one to the counter `key`.
pub(crate) fn increment(key: &Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
}

impl<S: fmt::Debug> fmt::Debug for Metered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("store", &self.label())
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S: Clone> Clone for Metered<S> {
    fn clone(&self) -> Self {
        Metered {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for Metered<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.timed(StoreOp::Claim, self.inner.claim(request)).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.timed(StoreOp::Heartbeat, self.inner.heartbeat(lease, extend))
            .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let completed = self.inner.complete(lease, result, retention);
        self.timed(StoreOp::Complete, completed).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let failed = self.inner.fail(lease, failure, retention);
        self.timed(StoreOp::Fail, failed).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.timed(StoreOp::Release, self.inner.release(lease))
            .await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let settled = self.inner.settle_unknown(lease, outcome, hold, retention);
        self.timed(StoreOp::SettleUnknown, settled).await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let resolved = self.inner.resolve_completed(key, fence, result, retention);
        self.timed(StoreOp::ResolveCompleted, resolved).await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        let resolved = self.inner.resolve_released(key, fence);
        self.timed(StoreOp::ResolveReleased, resolved).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.timed(StoreOp::Get, self.inner.get(key)).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.timed(StoreOp::Delete, self.inner.delete(key)).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.timed(StoreOp::Scan, self.inner.scan(query)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.timed(StoreOp::Ping, self.inner.ping()).await
    }

    fn stats(&self) -> Option<StoreStats> {
        self.inner.stats()
    }
}
