//! The store contract, clause by clause, against MemoryStore on a manual clock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{ManualClock, RecordKey, State, Store, Timestamp};
use idem_store_memory::MemoryStore;
use idem_testkit::Harness;

struct MemoryHarness {
    store: MemoryStore,
    clock: ManualClock,
}

#[async_trait]
impl Harness for MemoryHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn corrupt(&self, key: &RecordKey) {
        // An in-memory record cannot be undecodable; it can break the record invariants.
        let mut record = self
            .store
            .get(key)
            .await
            .unwrap()
            .expect("a record to corrupt");
        record.state = State::Completed;
        record.result = None;
        self.store.put_raw(record);
    }
}

async fn harness() -> Option<MemoryHarness> {
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Some(MemoryHarness { store, clock })
}

idem_testkit::store_conformance!(harness);

#[tokio::test]
async fn strict_lease_refuses_a_lapsed_holder() {
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .lease_policy(idem_core::machine::LeasePolicy::Strict)
        .build();
    let h = MemoryHarness { store, clock };
    idem_testkit::conformance::strict_lease_refuses_a_lapsed_holder(&h).await;
}

/// The same contract on a bounded store: a capacity and a byte budget, both far above what the
/// clauses write, so bounding changes no answer.
mod bounded {
    use std::num::NonZeroUsize;

    use super::*;

    async fn harness() -> Option<MemoryHarness> {
        let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
        let store = MemoryStore::builder()
            .capacity(NonZeroUsize::new(1_000_000).unwrap())
            .max_bytes(NonZeroUsize::new(1 << 30).unwrap())
            .clock(clock.clone())
            .build();
        Some(MemoryHarness { store, clock })
    }

    idem_testkit::store_conformance!(harness);
}

/// The racing-grants clause at a scale that finds a fence floor read outside the shard's lock
/// (an earlier version handed out the same fence about once in 2,000 grants on a clock that
/// stands still, and lower ones on the system clock).
mod racing_fences {
    use idem_core::IdempotencyKey;
    use idem_testkit::conformance::fences_increase_under_racing_grants;

    use super::*;

    fn key() -> RecordKey {
        RecordKey::unscoped(IdempotencyKey::new("racing").unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_a_clock_that_stands_still() {
        let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
        let store = MemoryStore::builder().clock(clock).build();
        fences_increase_under_racing_grants(Arc::new(store), key(), 8, 20_000).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_the_system_clock() {
        fences_increase_under_racing_grants(Arc::new(MemoryStore::new()), key(), 8, 20_000).await;
    }
}
