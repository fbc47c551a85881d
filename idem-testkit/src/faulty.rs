//! [`FaultyStore`]: a store that wraps another and makes chosen operations fail, for the tests
//! of what sits on top of a store (the HTTP layer, the job guard): a store that is down at the
//! claim, answers `Corrupt`, loses its connection while a response is stored, or stops taking
//! heartbeats.
//!
//! ```
//! use std::sync::atomic::Ordering;
//! use idem_testkit::faulty::FaultyStore;
//! # #[derive(Debug)] struct AnyStore;
//! # let inner = AnyStore;
//! let store = FaultyStore::new(inner);
//! store.faults.complete_failures.store(3, Ordering::SeqCst); // the next three completes fail
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Lease, Record, RecordKey, ScanPage,
    ScanQuery, Store, StoreError, UnknownOutcome,
};
use tokio::sync::Notify;

/// The switches of a [`FaultyStore`], shared with the test that flips them, and what it
/// counted.
#[derive(Debug, Default)]
pub struct Faults {
    /// `claim` answers `Unavailable`.
    pub claim_down: AtomicBool,
    /// `claim` answers `Corrupt`.
    pub claim_corrupt: AtomicBool,
    /// The next this many calls of `claim` reach the store, which applies them, and then
    /// answer `Timeout` (a reply lost on its way back).
    pub claim_lost_replies: AtomicU32,
    /// `complete` answers `Unavailable`.
    pub complete_down: AtomicBool,
    /// The next this many calls of `complete` answer `Unavailable`.
    pub complete_failures: AtomicU32,
    /// While set, `complete` waits before it reaches the store (a slow store), until
    /// [`Faults::release_completes`].
    pub complete_held: AtomicBool,
    /// Wakes the completes held.
    completes_released: Notify,
    /// How many completes were asked for (held or not).
    pub completes: AtomicU32,
    /// `heartbeat` answers `Unavailable`.
    pub heartbeat_down: AtomicBool,
    /// How many heartbeats were asked for.
    pub heartbeats: AtomicU32,
    /// How many releases were asked for.
    pub releases: AtomicU32,
    /// How many scan pages were asked for.
    pub scans: AtomicU32,
    /// `settle_unknown` answers `Unavailable`.
    pub settle_unknown_down: AtomicBool,
    /// How many settles as unknown were asked for.
    pub unknowns: AtomicU32,
}

impl Faults {
    /// Lets the completes held by [`Faults::complete_held`] go on, and the next ones through.
    pub fn release_completes(&self) {
        self.complete_held.store(false, Ordering::SeqCst);
        self.completes_released.notify_waiters();
    }

    /// Waits while completes are held.
    async fn hold_complete(&self) {
        loop {
            let released = self.completes_released.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            if !self.complete_held.load(Ordering::SeqCst) {
                return;
            }
            released.await;
        }
    }
}

/// Wraps `S`; every operation goes to it unless a switch of [`Faults`] makes it fail.
#[derive(Debug)]
pub struct FaultyStore<S> {
    /// The store that answers when no fault is on.
    pub inner: S,
    /// The switches.
    pub faults: Arc<Faults>,
}

impl<S> FaultyStore<S> {
    /// `inner`, with every fault off.
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            faults: Arc::default(),
        }
    }
}

/// The error of a switched-off operation: the store cannot be reached.
#[must_use]
pub fn down() -> StoreError {
    StoreError::unavailable(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "switched off by the test",
    ))
}

/// Takes one from `counter` if it is above zero; whether it did.
fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl<S: Store> Store for FaultyStore<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.faults.claim_down.load(Ordering::SeqCst) {
            return Err(down());
        }
        if self.faults.claim_corrupt.load(Ordering::SeqCst) {
            return Err(StoreError::corrupt(&request.key, "planted by the test"));
        }
        let answer = self.inner.claim(request).await;
        if take_one(&self.faults.claim_lost_replies) {
            return Err(StoreError::Timeout {
                op: "claim",
                after: Duration::ZERO,
            });
        }
        answer
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.faults.heartbeats.fetch_add(1, Ordering::SeqCst);
        if self.faults.heartbeat_down.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner.heartbeat(lease, extend).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.faults.completes.fetch_add(1, Ordering::SeqCst);
        self.faults.hold_complete().await;
        if self.faults.complete_down.load(Ordering::SeqCst)
            || take_one(&self.faults.complete_failures)
        {
            return Err(down());
        }
        self.inner.complete(lease, result, retention).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner.fail(lease, failure, retention).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.faults.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(lease).await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.faults.unknowns.fetch_add(1, Ordering::SeqCst);
        if self.faults.settle_unknown_down.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner
            .settle_unknown(lease, outcome, hold, retention)
            .await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .resolve_completed(key, fence, result, retention)
            .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.inner.resolve_released(key, fence).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.faults.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.scan(query).await
    }
}
