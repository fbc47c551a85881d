//! The records this gateway holds in flight, kept as its claims happen instead of found by
//! scanning the store when `/metrics` is scraped: a scrape reads [`InFlightIndex::count`] and
//! never touches the store (on the memory store a scan walks every shard under the locks the
//! request path takes).
//!
//! [`Watched`] wraps the gateway's store: every claim it grants enters the index, and the
//! holder's later transitions (heartbeat, complete, fail, release) move or remove its entry,
//! as does an operator's delete. The store decides as before; the wrapper only reads its
//! answers ("the machine decides once": stores stay atomic primitives).
//!
//! What a gateway reports is its own traffic. Several gateways sharing one store (Redis,
//! PostgreSQL) each count the claims they made, so the store's in-flight records are the sum
//! over the gateways, and a record whose holder crashed is counted by none of them: its lease
//! lapses, the next retry takes it over (`idem_lease_takeovers_total`), and `idem keys list
//! --state in_flight` or `/ui` (which scan the store when asked) still show it meanwhile.
//!
//! An entry leaves the index when its holder settles it (complete, fail, release), when the
//! store refuses the holder's transition (another attempt took the key over, or an operator
//! deleted the record), when an operator deletes the key through this gateway, or when it
//! would have expired in the store: one more lease after its lease lapsed, as the store's
//! record does. Until then, an entry whose transition got no answer (the store was down, or
//! the reply was lost) stays, and shows as lapsed once its lease has run out: the record may
//! well still be in flight in the store.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    ClaimOutcome, ClaimRequest, Clock, Failure, Fence, Lease, OwnerToken, Record, RecordKey,
    ScanPage, ScanQuery, Store, StoreError, StoreStats, SystemClock, Timestamp, UnknownOutcome,
};

/// One claim this gateway holds.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The holder, as its lease names it: only its own transitions move the entry.
    owner: OwnerToken,
    fence: Fence,
    /// When the key was first claimed by this gateway (kept across its own takeover of a
    /// lapsed claim, as the store's `created_at` is).
    since: Timestamp,
    /// When the lease runs out (store time).
    lease_until: Timestamp,
    /// When the store's record would expire if nothing settles it.
    expires_at: Timestamp,
}

impl Entry {
    fn held_by(&self, lease: &Lease) -> bool {
        self.owner == lease.owner && self.fence == lease.fence
    }
}

/// What [`InFlightIndex::count`] reads: the gauges of `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InFlightCount {
    /// Claims held (or whose settling got no answer), not yet expired.
    pub records: usize,
    /// Of those, how many have a lapsed lease.
    pub lapsed: usize,
    /// The age of the oldest (zero when there is none).
    pub oldest: Duration,
}

/// The claims in flight by key, hashed by foldhash (a keyed hash, seeded per process, that
/// hashes a key several times faster than std's SipHash: the index is on every request's path).
type Entries = HashMap<RecordKey, Entry, foldhash::quality::RandomState>;

/// The claims this gateway holds in flight, by key. Updated by [`Watched`] on each transition
/// (a lock held for one map operation); read by a scrape, which walks only these entries.
#[derive(Debug)]
pub(crate) struct InFlightIndex {
    clock: Arc<dyn Clock>,
    entries: Mutex<Entries>,
}

impl Default for InFlightIndex {
    fn default() -> Self {
        InFlightIndex::new()
    }
}

impl InFlightIndex {
    /// An empty index on the system clock.
    #[must_use]
    pub(crate) fn new() -> Self {
        InFlightIndex::with_clock(SystemClock)
    }

    /// An empty index on `clock` (the store's, in tests with a `ManualClock`).
    #[must_use]
    pub(crate) fn with_clock(clock: impl Clock + 'static) -> Self {
        InFlightIndex {
            clock: Arc::new(clock),
            entries: Mutex::new(Entries::default()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A claim was granted: `lease`, for `lease_len`; `taken_over` when it took over a lapsed
    /// claim.
    fn claimed(&self, lease: &Lease, lease_len: Duration, taken_over: bool) {
        let now = self.clock.now();
        let mut entry = Entry {
            owner: lease.owner,
            fence: lease.fence,
            since: now,
            lease_until: lease.until,
            expires_at: lease.until.saturating_add(lease_len),
        };
        match self.entries().entry(lease.key.clone()) {
            Slot::Vacant(slot) => {
                slot.insert(entry);
            }
            Slot::Occupied(mut slot) => {
                let held = slot.get();
                // The same grant answered again (a claim re-sent after a lost reply), or this
                // gateway's own lapsed claim taken over: the record is as old as the first.
                if held.held_by(lease) || taken_over {
                    entry.since = held.since;
                }
                slot.insert(entry);
            }
        }
    }

    /// A heartbeat extended `lease` by `extend`.
    fn extended(&self, lease: &Lease, extend: Duration) {
        if let Some(entry) = self.entries().get_mut(&lease.key)
            && entry.held_by(lease)
        {
            entry.lease_until = lease.until;
            entry.expires_at = lease.until.saturating_add(extend);
        }
    }

    /// `lease` is no longer in flight: settled, or refused by the store.
    fn settled(&self, lease: &Lease) {
        let mut entries = self.entries();
        // One lookup on the path every request takes; put back in the rare case that another
        // attempt holds the key now.
        if let Some((key, entry)) = entries.remove_entry(&lease.key)
            && !entry.held_by(lease)
        {
            entries.insert(key, entry);
        }
    }

    /// The record at `key` was deleted, or found absent.
    fn deleted(&self, key: &RecordKey) {
        self.entries().remove(key);
    }

    /// The claims in flight now: drops those past their expiry, then counts the rest.
    #[must_use]
    pub(crate) fn count(&self) -> InFlightCount {
        let now = self.clock.now();
        let mut entries = self.entries();
        entries.retain(|_, entry| now < entry.expires_at);
        let mut count = InFlightCount {
            records: entries.len(),
            ..InFlightCount::default()
        };
        for entry in entries.values() {
            count.lapsed += usize::from(now >= entry.lease_until);
            count.oldest = count.oldest.max(now.saturating_since(entry.since));
        }
        count
    }
}

/// The future every [`Store`] method returns.
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A store that keeps an [`InFlightIndex`] of the claims made through it. Each transition is
/// the inner store's, unchanged; reads (`get`, `scan`, `ping`, `stats`) are the inner store's
/// futures as they are (no second box around them).
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    index: Arc<InFlightIndex>,
}

impl<S> Watched<S> {
    /// `inner`, its claims kept in `index`.
    pub(crate) fn new(inner: S, index: Arc<InFlightIndex>) -> Self {
        Watched { inner, index }
    }
}

impl<S: Store> Watched<S> {
    /// `settle`, a holder's transition of `lease` that ends its claim when it is done or
    /// refused (the record is another attempt's, settled, or gone). Any other error (no answer)
    /// leaves the claim in flight.
    fn settling<'f>(
        &'f self,
        lease: &'f Lease,
        settle: StoreFuture<'f, ()>,
    ) -> StoreFuture<'f, ()> {
        Box::pin(async move {
            let done = settle.await;
            if matches!(done, Ok(()) | Err(StoreError::Rejected(_))) {
                self.index.settled(lease);
            }
            done
        })
    }
}

impl<S: Store> Store for Watched<S> {
    fn claim<'s, 'r, 'f>(&'s self, request: &'r ClaimRequest) -> StoreFuture<'f, ClaimOutcome>
    where
        's: 'f,
        'r: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            let outcome = self.inner.claim(request).await;
            if let Ok(ClaimOutcome::Acquired { lease, taken_over }) = &outcome {
                self.index.claimed(lease, request.lease, *taken_over);
            }
            outcome
        })
    }

    fn heartbeat<'s, 'l, 'f>(&'s self, lease: &'l Lease, extend: Duration) -> StoreFuture<'f, Lease>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            let beat = self.inner.heartbeat(lease, extend).await;
            match &beat {
                Ok(extended) => self.index.extended(extended, extend),
                Err(StoreError::Rejected(_)) => self.index.settled(lease),
                Err(_) => {}
            }
            beat
        })
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
        self.settling(lease, self.inner.complete(lease, result, retention))
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
        self.settling(lease, self.inner.fail(lease, failure, retention))
    }

    fn release<'s, 'l, 'f>(&'s self, lease: &'l Lease) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.settling(lease, self.inner.release(lease))
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
        let settled = self.inner.settle_unknown(lease, outcome, hold, retention);
        self.settling(lease, settled)
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
        self.inner.resolve_completed(key, fence, result, retention)
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
        self.inner.resolve_released(key, fence)
    }

    fn get<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, Option<Record>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.get(key)
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, bool>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            let deleted = self.inner.delete(key).await;
            if deleted.is_ok() {
                self.index.deleted(key);
            }
            deleted
        })
    }

    fn scan<'s, 'q, 'f>(&'s self, query: &'q ScanQuery) -> StoreFuture<'f, ScanPage>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.inner.scan(query)
    }

    fn ping<'s, 'f>(&'s self) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.ping()
    }

    fn stats(&self) -> Option<StoreStats> {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use idem_core::{Fingerprint, IdempotencyKey, ManualClock, Scope};
    use idem_store_memory::MemoryStore;

    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn key(name: &str) -> RecordKey {
        RecordKey::new(Scope::none(), IdempotencyKey::new(name).unwrap())
    }

    /// A memory store and an index on one manual clock, and the watched store over them.
    fn watched() -> (ManualClock, Arc<InFlightIndex>, Watched<MemoryStore>) {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let index = Arc::new(InFlightIndex::with_clock(clock.clone()));
        (clock, index.clone(), Watched::new(store, index))
    }

    async fn claim(store: &impl Store, name: &str) -> (Lease, bool) {
        let request = ClaimRequest::new(key(name), Fingerprint::of(&[b"x"]), LEASE);
        match store.claim(&request).await.unwrap() {
            ClaimOutcome::Acquired { lease, taken_over } => (lease, taken_over),
            other => panic!("not acquired: {other:?}"),
        }
    }

    fn count(records: usize, lapsed: usize, oldest: Duration) -> InFlightCount {
        InFlightCount {
            records,
            lapsed,
            oldest,
        }
    }

    #[tokio::test]
    async fn claims_count_until_they_are_completed_failed_or_released() {
        let (clock, index, store) = watched();
        assert_eq!(index.count(), InFlightCount::default());
        let (a, _) = claim(&store, "a").await;
        clock.advance(Duration::from_secs(2));
        let (b, _) = claim(&store, "b").await;
        let (c, _) = claim(&store, "c").await;
        clock.advance(Duration::from_secs(1));
        assert_eq!(index.count(), count(3, 0, Duration::from_secs(3)));
        // A duplicate of a key in flight changes nothing.
        let request = ClaimRequest::new(key("b"), Fingerprint::of(&[b"x"]), LEASE);
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ));
        assert_eq!(index.count().records, 3);

        store
            .complete(&a, Bytes::from_static(b"ok"), LEASE)
            .await
            .unwrap();
        assert_eq!(index.count(), count(2, 0, Duration::from_secs(1)));
        store
            .fail(&b, Failure::permanent("declined"), LEASE)
            .await
            .unwrap();
        assert_eq!(index.count(), count(1, 0, Duration::from_secs(1)));
        store.release(&c).await.unwrap();
        assert_eq!(index.count(), InFlightCount::default());
        // A replay is no claim.
        let request = ClaimRequest::new(key("a"), Fingerprint::of(&[b"x"]), LEASE);
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::Completed(_)
        ));
        assert_eq!(index.count(), InFlightCount::default());
    }

    #[tokio::test]
    async fn a_lapsed_lease_counts_as_lapsed_then_expires_as_the_record_does() {
        let (clock, index, store) = watched();
        let (lease, _) = claim(&store, "a").await;
        clock.advance(LEASE / 2);
        let beat = store.heartbeat(&lease, LEASE).await.unwrap();
        // The heartbeat moved the lease: not lapsed at the first lease's end.
        clock.advance(LEASE / 2);
        assert_eq!(index.count(), count(1, 0, LEASE));
        clock.advance(LEASE / 2);
        assert_eq!(index.count(), count(1, 1, LEASE * 3 / 2));
        // The store keeps the record one more lease after the lapse; so does the index.
        assert!(store.get(&key("a")).await.unwrap().is_some());
        clock.advance(LEASE - Duration::from_micros(1));
        assert_eq!(index.count().records, 1);
        clock.advance(Duration::from_micros(1));
        assert!(store.get(&key("a")).await.unwrap().is_none());
        assert_eq!(index.count(), InFlightCount::default());
        // Its holder's late completion is refused and changes nothing.
        assert!(
            store
                .complete(&beat, Bytes::from_static(b"late"), LEASE)
                .await
                .is_err()
        );
        assert_eq!(index.count(), InFlightCount::default());
    }

    #[tokio::test]
    async fn a_takeover_replaces_the_lapsed_claim_and_refuses_the_old_holder() {
        let (clock, index, store) = watched();
        let (old, _) = claim(&store, "a").await;
        clock.advance(LEASE + Duration::from_secs(1));
        assert_eq!(index.count(), count(1, 1, LEASE + Duration::from_secs(1)));
        let (new, taken_over) = claim(&store, "a").await;
        assert!(taken_over);
        // One record, live again, as old as the first claim (as the store's `created_at`).
        assert_eq!(index.count(), count(1, 0, LEASE + Duration::from_secs(1)));
        // The old holder's heartbeat and release are refused: the new claim stays.
        assert!(store.heartbeat(&old, LEASE).await.is_err());
        assert!(store.release(&old).await.is_err());
        assert_eq!(index.count().records, 1);
        store
            .complete(&new, Bytes::from_static(b"ok"), LEASE)
            .await
            .unwrap();
        assert_eq!(index.count(), InFlightCount::default());
    }

    #[tokio::test]
    async fn a_claim_taken_over_elsewhere_ends_at_its_holders_next_transition() {
        let (clock, index, store) = watched();
        let (mine, _) = claim(&store, "a").await;
        clock.advance(LEASE + Duration::from_secs(1));
        // Another gateway (the store unwatched) takes the key over.
        let (_, taken_over) = claim(&store.inner, "a").await;
        assert!(taken_over);
        assert_eq!(index.count().lapsed, 1);
        // This gateway's heartbeat is refused: its claim is gone.
        assert!(matches!(
            store.heartbeat(&mine, LEASE).await,
            Err(StoreError::Rejected(_))
        ));
        assert_eq!(index.count(), InFlightCount::default());
    }

    #[tokio::test]
    async fn an_unanswered_transition_keeps_the_claim_and_a_delete_removes_it() {
        use idem_testkit::faulty::FaultyStore;
        use std::sync::atomic::Ordering;

        let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
        let faulty = FaultyStore::new(MemoryStore::builder().clock(clock.clone()).build());
        let faults = faulty.faults.clone();
        let index = Arc::new(InFlightIndex::with_clock(clock.clone()));
        let store = Watched::new(faulty, index.clone());
        let (lease, _) = claim(&store, "a").await;
        faults.complete_down.store(true, Ordering::SeqCst);
        assert!(
            store
                .complete(&lease, Bytes::from_static(b"ok"), LEASE)
                .await
                .is_err()
        );
        // The store did not answer: the record may still be in flight.
        assert_eq!(index.count().records, 1);
        assert!(store.delete(&key("a")).await.unwrap());
        assert_eq!(index.count(), InFlightCount::default());
    }

    /// Many tasks claiming, beating and settling at once leave the index exact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_transitions_keep_the_count_exact() {
        let (_, index, store) = watched();
        let store = Arc::new(store);
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for n in 0..200 {
                        let (lease, _) = claim(&*store, &format!("{t}-{n}")).await;
                        let lease = store.heartbeat(&lease, LEASE).await.unwrap();
                        match n % 3 {
                            0 => store.complete(&lease, Bytes::new(), LEASE).await.unwrap(),
                            1 => store.release(&lease).await.unwrap(),
                            _ => {}
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        // Every third claim of each task was left in flight.
        assert_eq!(index.count().records, 16 * 66);
    }
}
