//! Test helpers: a store with switchable faults, and a manual-clock memory store.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, IdempotencyKey, Lease, ManualClock, Record,
    RecordKey, ScanPage, ScanQuery, Store, StoreError, Timestamp,
};
use idem_store_memory::MemoryStore;

/// A memory store on a manual clock.
pub fn manual_store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (store, clock)
}

pub fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

pub fn unscoped(text: &str) -> RecordKey {
    RecordKey::unscoped(key(text))
}

/// Wraps a store; each fault switch makes one operation answer `Unavailable` (or `Corrupt`).
#[derive(Debug, Default)]
pub struct Faults {
    pub claim_down: AtomicBool,
    pub claim_corrupt: AtomicBool,
    pub complete_down: AtomicBool,
    pub heartbeat_down: AtomicBool,
    pub heartbeats: AtomicU32,
    pub releases: AtomicU32,
}

#[derive(Debug)]
pub struct FaultyStore {
    pub inner: MemoryStore,
    pub faults: Arc<Faults>,
}

fn down() -> StoreError {
    StoreError::unavailable("switched off by the test")
}

#[async_trait]
impl Store for FaultyStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.faults.claim_down.load(Ordering::SeqCst) {
            return Err(down());
        }
        if self.faults.claim_corrupt.load(Ordering::SeqCst) {
            return Err(StoreError::corrupt(&request.key, "planted by the test"));
        }
        self.inner.claim(request).await
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
        if self.faults.complete_down.load(Ordering::SeqCst) {
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

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.inner.scan(query).await
    }
}

/// The state of the record at `key`, if there is one.
pub async fn state_of<S: Store + ?Sized>(store: &S, key: &str) -> Option<idem_core::State> {
    store.get(&unscoped(key)).await.unwrap().map(|r| r.state)
}
