//! The store contract, clause by clause, against redb (a temporary file per test, a manual
//! clock).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::LeasePolicy;
use idem_core::{ManualClock, RecordKey, Store, Timestamp};
use idem_store_redb::RedbStore;
use idem_testkit::Harness;

struct RedbHarness {
    store: RedbStore,
    clock: ManualClock,
    // Dropped after the store: the file goes with the directory.
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Harness for RedbHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn corrupt(&self, key: &RecordKey) {
        // A half-written record: the format byte and the state, then nothing.
        self.store.put_raw(key, vec![1, 0]).await.unwrap();
    }
}

async fn harness() -> Option<RedbHarness> {
    harness_with(LeasePolicy::Lenient)
}

fn harness_with(policy: LeasePolicy) -> Option<RedbHarness> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = RedbStore::builder()
        .clock(clock.clone())
        .lease_policy(policy)
        .open(dir.path().join("idem.redb"))
        .unwrap();
    Some(RedbHarness {
        store,
        clock,
        _dir: dir,
    })
}

idem_testkit::store_conformance!(harness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_lease_refuses_a_lapsed_holder() {
    let h = harness_with(LeasePolicy::Strict).unwrap();
    idem_testkit::conformance::strict_lease_refuses_a_lapsed_holder(&h).await;
}
