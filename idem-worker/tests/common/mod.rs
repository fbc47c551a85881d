//! Test helpers: a store with switchable faults, and a manual-clock memory store.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use idem_core::{IdempotencyKey, ManualClock, RecordKey, Store, Timestamp};
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

pub use idem_testkit::faulty::{Faults, FaultyStore};

/// The state of the record at `key`, if there is one.
pub async fn state_of<S: Store + ?Sized>(store: &S, key: &str) -> Option<idem_core::State> {
    store.get(&unscoped(key)).await.unwrap().map(|r| r.state)
}
