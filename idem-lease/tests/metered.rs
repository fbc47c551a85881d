//! [`Metered`]: one label set (`store`, `op`; `kind` on errors) for every operation, counted
//! by the testkit's recorder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_lease::{Metered, StoreOp};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use idem_testkit::recorder::CountingRecorder;

const LEASE: Duration = Duration::from_secs(30);

fn request(key: &str) -> ClaimRequest {
    let key = RecordKey::unscoped(IdempotencyKey::new(key).unwrap());
    ClaimRequest::new(key, Fingerprint::of(&[b"x"]), LEASE)
}

#[tokio::test(flavor = "current_thread")]
async fn every_operation_is_timed_under_store_and_op_and_every_error_under_its_kind() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Metered::new(FaultyStore::new(MemoryStore::new()), "memory");

    let ClaimOutcome::Acquired { lease, .. } = store.claim(&request("a")).await.unwrap() else {
        panic!("a fresh key is free");
    };
    store.heartbeat(&lease, LEASE).await.unwrap();
    store
        .complete(&lease, "done".into(), Duration::from_secs(60))
        .await
        .unwrap();
    store.get(&lease.key).await.unwrap();
    store.ping().await.unwrap();
    store
        .get_ref()
        .faults
        .claim_down
        .store(true, Ordering::SeqCst);
    assert!(store.claim(&request("b")).await.is_err());
    // An operation that is not a Store method (a transaction's commit), under the same labels.
    store.time("commit", async { Ok(()) }).await.unwrap();

    for (op, times) in [
        ("claim", 2),
        ("heartbeat", 1),
        ("complete", 1),
        // The ping reads a probe key inside the wrapped store: timed as a ping only.
        ("get", 1),
        ("commit", 1),
    ] {
        let series = format!("idem_store_operation_seconds{{op={op},store=memory}}");
        assert_eq!(recorder.get(&series), times, "{series}");
    }
    assert_eq!(
        recorder.get("idem_store_operation_seconds{op=ping,store=memory}"),
        1
    );
    assert_eq!(
        recorder.get("idem_store_errors_total{kind=unavailable,op=claim,store=memory}"),
        1
    );
    assert_eq!(
        recorder.get("idem_store_errors_total{kind=unavailable,op=heartbeat,store=memory}"),
        0
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_label_known_only_at_run_time_is_used() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Metered::new(MemoryStore::new(), String::from("redis-eu"));
    assert_eq!(store.label(), "redis-eu");
    store.register_at_zero(&[StoreOp::Release]);
    store.ping().await.unwrap();
    assert_eq!(
        recorder.get("idem_store_operation_seconds{op=ping,store=redis-eu}"),
        1
    );
}

#[test]
fn every_op_has_its_label() {
    for op in StoreOp::ALL {
        assert_eq!(StoreOp::from_name(op.as_str()), Some(op));
        assert_eq!(op.to_string(), op.as_str());
    }
    assert_eq!(StoreOp::from_name("commit"), None);
}
