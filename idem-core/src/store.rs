//! The [`Store`] contract: one atomic round trip per transition.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::atomic::Held;
use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{Failure, Record, State, UnknownOutcome};
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
    /// The owner token a grant gets, when the caller chose it ([`ClaimRequest::with_owner`]);
    /// `None`: the store draws one.
    pub owner: Option<OwnerToken>,
}

impl ClaimRequest {
    /// A claim request from its parts; the store draws the owner token of a grant.
    #[must_use]
    pub fn new(key: RecordKey, fingerprint: Fingerprint, lease: Duration) -> Self {
        ClaimRequest {
            key,
            fingerprint,
            lease,
            owner: None,
        }
    }

    /// The same request with the owner token of its grant chosen by the caller. Sending it
    /// again while its grant is live answers that same grant (`Acquired`, same fence) instead
    /// of `InFlight`: a caller whose claim timed out, not knowing whether it landed, re-sends
    /// it to learn, and can then release the key. Never share one owner between attempts.
    #[must_use]
    pub fn with_owner(mut self, owner: OwnerToken) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The owner token of a new grant: the chosen one, or a fresh random one.
    #[must_use]
    pub fn grant_owner(&self) -> OwnerToken {
        self.owner.unwrap_or_else(OwnerToken::random)
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
    /// What the store last wrote for this lease, where it keeps that (see [`Held`]): a cache
    /// that lets the next transition skip a read; never part of the lease's equality.
    pub held: Held,
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
    /// An earlier attempt lost the answer of its side effect: nobody knows whether the
    /// operation happened, so it is not run again. Here is its record, with what is known
    /// ([`Record::unknown`]) and until when it holds the key ([`Record::hold_until`]). An
    /// operator resolves it ([`Store::resolve_completed`], [`Store::resolve_released`]).
    Unknown(Record),
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
            ClaimOutcome::Unknown(_) => "unknown",
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

    /// Whether a readable `record` belongs on a page at `now`: it has not expired and passes
    /// the filters.
    #[must_use]
    pub fn keeps(&self, record: &Record, now: Timestamp) -> bool {
        !record.is_expired(now) && self.matches(record, now)
    }

    /// The step of every store's scan for one stored record, "decode or report": what the page
    /// gets of it. `read` is the store's reading of the record (`Ok(None)`: no record there),
    /// `key` its key where the store could read it, `now` the store time of the reading.
    ///
    /// - A record that passes [`Record::validate`] and [`ScanQuery::keeps`]:
    ///   `Some(ScanEntry::Record)`; one that has expired or that the filters leave out, or no
    ///   record: `None`.
    /// - A [`StoreError::Corrupt`], of the reading or of `validate`:
    ///   `Some(ScanEntry::Unreadable)`, whatever the filters and expiry, which cannot be told
    ///   on a record that cannot be read. (A store may apply a filter before reading the
    ///   record, on what it can read without it: see [`ScanPage::unreadable`].)
    ///
    /// # Errors
    /// Any other error of `read` (the store failed, not the record): the page fails with it.
    pub fn entry(
        &self,
        key: Option<&RecordKey>,
        read: Result<Option<Record>, StoreError>,
        now: Timestamp,
    ) -> Result<Option<ScanEntry>, StoreError> {
        let checked = read.and_then(|record| match record {
            Some(record) => record.validate().map(|()| Some(record)),
            None => Ok(None),
        });
        match checked {
            Ok(record) => Ok(record
                .filter(|record| self.keeps(record, now))
                .map(ScanEntry::Record)),
            Err(err) => UnreadableRecord::from_error(err, key)
                .map(|unreadable| Some(ScanEntry::Unreadable(unreadable))),
        }
    }
}

/// A stored record that a scan could not read: it cannot be decoded, or it breaks the record
/// invariants (what every other operation on it answers with [`StoreError::Corrupt`]). A scan
/// reports it in [`ScanPage::unreadable`] instead of failing the page, so an operator can list
/// the keys, see it and delete it ([`Store::delete`] removes it like any record).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableRecord {
    /// The record's key as the store holds it, as text (lossy where it is not UTF-8): what a
    /// [`StoreError::Corrupt`] about it names. Its form is the store's: `scope/key` (or `key`
    /// in no scope) for the memory, redb and PostgreSQL stores, the Redis key (which holds a
    /// digest of the key, not the key) for Redis.
    pub stored_key: String,
    /// The record's key, where the store could read it: what [`Store::get`] and
    /// [`Store::delete`] take. `None` where the store knows only [`UnreadableRecord::stored_key`]
    /// (a Redis key, a stored key that breaks the key rules).
    pub key: Option<RecordKey>,
    /// What is wrong with the record (the reason of the [`StoreError::Corrupt`]).
    pub reason: String,
}

impl UnreadableRecord {
    /// The record held at `stored_key`, unreadable for `reason`; its [`RecordKey`] unknown.
    #[must_use]
    pub fn new(stored_key: impl Into<String>, reason: impl Into<String>) -> Self {
        UnreadableRecord {
            stored_key: stored_key.into(),
            key: None,
            reason: reason.into(),
        }
    }

    /// The same, with the record's key known.
    #[must_use]
    pub fn with_key(mut self, key: RecordKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The unreadable record a [`StoreError::Corrupt`] names, with its key where the store
    /// knows it.
    ///
    /// # Errors
    /// `err` itself when it is not [`StoreError::Corrupt`].
    pub fn from_error(err: StoreError, key: Option<&RecordKey>) -> Result<Self, StoreError> {
        match err {
            StoreError::Corrupt {
                key: stored,
                reason,
            } => Ok(UnreadableRecord {
                stored_key: stored,
                key: key.cloned(),
                reason,
            }),
            other => Err(other),
        }
    }
}

/// One entry of a scan page, as a store meets it: a record, or one it could not read. See
/// [`ScanQuery::entry`] and [`ScanPage::push`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScanEntry {
    /// A readable record.
    Record(Record),
    /// A record the store could not read.
    Unreadable(UnreadableRecord),
}

/// One page of a scan: the records read, and the records that could not be read.
///
/// The page's limit ([`ScanQuery::page_size`]) counts both, so a page of only unreadable
/// records still moves the cursor on, and a scan of a store full of them ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScanPage {
    /// The records of this page.
    pub records: Vec<Record>,
    /// The records of this page that the store could not read (corrupt): reported here, beside
    /// the readable ones, instead of failing the page with [`StoreError::Corrupt`]. Always
    /// empty for a store that cannot hold one.
    ///
    /// The filters of the query are applied to what the store can read: a filter a store
    /// evaluates before reading the record (PostgreSQL's state and age columns and expiry,
    /// the meta field of a Redis record when it is readable) leaves out an unreadable record
    /// like any other; a filter that cannot be evaluated on it does not leave it out. So an
    /// unfiltered scan ([`ScanQuery::all`]) reports every unreadable record, and a filtered one
    /// may report some that the filter would have left out.
    pub unreadable: Vec<UnreadableRecord>,
    /// The cursor of the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

impl ScanPage {
    /// A page of `entries`, followed by the page at `next_cursor` (`None`: the last page).
    #[must_use]
    pub fn new(entries: impl IntoIterator<Item = ScanEntry>, next_cursor: Option<String>) -> Self {
        let mut page = ScanPage {
            next_cursor,
            ..ScanPage::default()
        };
        entries.into_iter().for_each(|entry| page.push(entry));
        page
    }

    /// Adds `entry` to the page.
    pub fn push(&mut self, entry: ScanEntry) {
        match entry {
            ScanEntry::Record(record) => self.records.push(record),
            ScanEntry::Unreadable(unreadable) => self.unreadable.push(unreadable),
        }
    }

    /// The entries of the page, readable or not: what the query's limit counts.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len() + self.unreadable.len()
    }

    /// Whether the page has no entry at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.unreadable.is_empty()
    }
}

/// What a store holds, as far as it knows without reading its records: the `stats` of the
/// design's admin operations ([`Store::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// The records held (expired ones not yet reclaimed included).
    pub records: u64,
    /// The bytes the records hold, as the store counts them against a byte budget; `None`
    /// where it does not count them.
    pub bytes: Option<u64>,
}

impl StoreStats {
    /// `records` records, and `bytes` if the store counts them.
    #[must_use]
    pub fn new(records: u64, bytes: Option<u64>) -> Self {
        StoreStats { records, bytes }
    }
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

    /// Settles the record as [`State::Unknown`]: the holder sent its side effect and lost the
    /// answer, so nobody knows whether it happened. The record keeps `outcome` for `retention`,
    /// and every claim is answered [`ClaimOutcome::Unknown`] (the operation is not run again)
    /// until it is resolved, or until `hold` has passed (`None`: no end but the retention), after
    /// which a claim is granted as after a lapsed lease. Re-sending it after a lost reply
    /// returns `Ok`. See [`crate::machine::settle_unknown`].
    ///
    /// # Errors
    /// [`StoreError::Rejected`] unless `lease` holds the record in flight.
    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Resolves an unknown record as completed with `result` (an operator's or a reconciler's
    /// action, not a holder's): kept for `retention` and replayed from then on. `fence` is the
    /// fence of the unknown record as the resolver read it, so a resolution never overwrites a
    /// newer attempt. Re-sending it returns `Ok`. See [`crate::machine::resolve_completed`].
    ///
    /// # Errors
    /// [`StoreError::Rejected`] unless the record at `key` is still unknown at `fence`.
    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Resolves an unknown record by freeing its key (an operator's or a reconciler's action):
    /// the next claim runs the operation. `fence` is the fence of the unknown record as the
    /// resolver read it. A key already free returns `Ok`. See
    /// [`crate::machine::resolve_released`].
    ///
    /// # Errors
    /// [`StoreError::Rejected`] if the record at `key` is not unknown, or at another fence.
    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError>;

    /// The record at `key`, if there is one that has not expired.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Removes the record at `key` (an operator's action); `true` if there was one.
    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError>;

    /// Lists records by state and age, a page at a time. A record the store cannot read does
    /// not fail the page: it is reported in [`ScanPage::unreadable`] (see there how filters
    /// apply to it), and counts against the page's limit.
    ///
    /// # Errors
    /// The store's failures (unreachable, timed out); [`StoreError::InvalidCursor`] for a
    /// cursor this store did not hand out; never [`StoreError::Corrupt`] for a record.
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

    /// What the store holds, where it knows at once (the memory store counts its records and
    /// bytes); `None` (the default) where that would take a scan or a round trip. The gateway
    /// exports it as gauges when `/metrics` is scraped.
    fn stats(&self) -> Option<StoreStats> {
        None
    }
}

/// The future every [`Store`] method returns (what `#[async_trait]` makes of an `async fn`).
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Forwards to the shared store. Written without `#[async_trait]`: each call returns the inner
/// store's future as it is, instead of boxing a second future around it (an `Arc<dyn Store>`
/// is how the layer, the guard and the gateway hold their store, so every operation goes
/// through here).
impl<S: Store + ?Sized> Store for Arc<S> {
    fn claim<'s, 'r, 'f>(&'s self, request: &'r ClaimRequest) -> StoreFuture<'f, ClaimOutcome>
    where
        's: 'f,
        'r: 'f,
        Self: 'f,
    {
        (**self).claim(request)
    }

    fn heartbeat<'s, 'l, 'f>(&'s self, lease: &'l Lease, extend: Duration) -> StoreFuture<'f, Lease>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        (**self).heartbeat(lease, extend)
    }

    fn complete<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        result: Bytes,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        (**self).complete(lease, result, retention)
    }

    fn fail<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        failure: Failure,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        (**self).fail(lease, failure, retention)
    }

    fn release<'s, 'l, 'f>(&'s self, lease: &'l Lease) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        (**self).release(lease)
    }

    fn settle_unknown<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        (**self).settle_unknown(lease, outcome, hold, retention)
    }

    fn resolve_completed<'s, 'k, 'f>(
        &'s self,
        key: &'k RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        (**self).resolve_completed(key, fence, result, retention)
    }

    fn resolve_released<'s, 'k, 'f>(
        &'s self,
        key: &'k RecordKey,
        fence: Fence,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        (**self).resolve_released(key, fence)
    }

    fn get<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, Option<Record>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        (**self).get(key)
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, bool>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        (**self).delete(key)
    }

    fn scan<'s, 'q, 'f>(&'s self, query: &'q ScanQuery) -> StoreFuture<'f, ScanPage>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        (**self).scan(query)
    }

    fn ping<'s, 'f>(&'s self) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        (**self).ping()
    }

    fn stats(&self) -> Option<StoreStats> {
        (**self).stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{self, Write};
    use crate::token::Fence;

    fn in_flight(name: &str, now: Timestamp) -> Record {
        let key = RecordKey::unscoped(IdempotencyKey::new(name).unwrap());
        let request = ClaimRequest::new(key, Fingerprint::of(&[b"x"]), Duration::from_secs(30));
        let step = machine::claim(None, &request, now, Fence::MIN, OwnerToken::random()).unwrap();
        let Write::Put(record) = step.write else {
            panic!("a claim writes its record")
        };
        record
    }

    #[test]
    fn an_entry_is_a_record_nothing_or_an_unreadable_one() {
        let now = Timestamp::from_micros(1_000_000_000);
        let all = ScanQuery::all();
        let record = in_flight("k", now);
        let key = record.key.clone();
        assert_eq!(
            all.entry(Some(&key), Ok(Some(record.clone())), now)
                .unwrap(),
            Some(ScanEntry::Record(record.clone()))
        );
        assert_eq!(all.entry(Some(&key), Ok(None), now).unwrap(), None);
        // Filtered out, or expired: nothing.
        let completed = ScanQuery::all().with_state(State::Completed);
        let entry = completed.entry(Some(&key), Ok(Some(record.clone())), now);
        assert_eq!(entry.unwrap(), None);
        let later = Timestamp::from_micros(now.as_micros() + 3_600_000_000);
        assert_eq!(
            all.entry(Some(&key), Ok(Some(record.clone())), later)
                .unwrap(),
            None
        );

        // A record that breaks the invariants is reported whatever the filters.
        let mut broken = record.clone();
        broken.state = State::Completed;
        let entry = completed
            .entry(Some(&key), Ok(Some(broken)), later)
            .unwrap();
        let Some(ScanEntry::Unreadable(unreadable)) = entry else {
            panic!("not reported: {entry:?}")
        };
        assert_eq!(unreadable.stored_key, "k");
        assert_eq!(unreadable.key, Some(key.clone()));
        assert_eq!(unreadable.reason, "a completed record has no result");

        // A reading that is Corrupt names the record as the store holds it.
        let corrupt = StoreError::Corrupt {
            key: "idem:{ns::digest}".to_owned(),
            reason: "garbled".to_owned(),
        };
        let entry = all.entry(None, Err(corrupt), now).unwrap();
        assert_eq!(
            entry,
            Some(ScanEntry::Unreadable(UnreadableRecord::new(
                "idem:{ns::digest}",
                "garbled"
            )))
        );
        // Any other error fails the page.
        let down = all.entry(Some(&key), Err(StoreError::unavailable("down")), now);
        assert!(matches!(down, Err(StoreError::Unavailable { .. })));
    }

    #[test]
    fn a_page_counts_both_kinds_of_entry() {
        let now = Timestamp::from_micros(1_000_000_000);
        let record = in_flight("k", now);
        let unreadable = UnreadableRecord::new("b", "garbled").with_key(record.key.clone());
        let page = ScanPage::new(
            [
                ScanEntry::Unreadable(unreadable.clone()),
                ScanEntry::Record(record.clone()),
            ],
            Some("c".to_owned()),
        );
        assert_eq!(page.records, vec![record]);
        assert_eq!(page.unreadable, vec![unreadable]);
        assert_eq!(page.len(), 2);
        assert!(!page.is_empty());
        assert_eq!(page.next_cursor.as_deref(), Some("c"));
        assert!(ScanPage::default().is_empty());
    }
}
