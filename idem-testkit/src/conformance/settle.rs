//! Clauses on settling a claim: complete (and its resend), fail retryably or permanently,
//! release, expiry after the retention, delete.

use std::time::Duration;

use idem_core::{Bytes, ClaimOutcome, Failure, State, Store};

use crate::Harness;

use super::{RETENTION, acquire, expect_rejected, key, record, request};

/// A complete re-sent by the same owner and fence (after a lost reply) answers `Ok` and keeps
/// the first result; so does a re-sent permanent fail.
pub async fn resent_complete_by_the_same_owner_is_ok(h: &impl Harness) {
    let store = h.store();
    let k = key("resend");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"first"), RETENTION)
        .await
        .expect("complete");
    store
        .complete(&lease, Bytes::from_static(b"first"), RETENTION)
        .await
        .expect("re-sent complete");
    let stored = record(&*store, &k).await;
    assert_eq!(stored.result.as_deref(), Some(&b"first"[..]));
    // The owner cannot turn its completed record into a failure or release it.
    expect_rejected(
        store.fail(&lease, Failure::permanent("x"), RETENTION).await,
        "fail after complete",
    );
    expect_rejected(store.release(&lease).await, "release after complete");

    let k2 = key("resend-fail");
    let lease = acquire(&*store, &request(&k2, "a")).await;
    store
        .fail(&lease, Failure::permanent("declined"), RETENTION)
        .await
        .expect("fail");
    store
        .fail(&lease, Failure::permanent("declined"), RETENTION)
        .await
        .expect("re-sent fail");
    expect_rejected(
        store.complete(&lease, Bytes::new(), RETENTION).await,
        "complete after permanent fail",
    );
}

/// A retryable failure frees the key: the next claim is granted (a new attempt, higher fence).
pub async fn retryable_fail_frees_the_key(h: &impl Harness) {
    let store = h.store();
    let k = key("retryable");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .fail(&lease, Failure::retryable("timeout upstream"), RETENTION)
        .await
        .expect("fail");
    assert!(
        store
            .get(&k)
            .await
            .expect("get")
            .is_none_or(|r| r.state != State::InFlight)
    );
    let next = acquire(&*store, &request(&k, "a")).await;
    assert!(next.fence > lease.fence);
    // A re-sent retryable fail of the old attempt does not free the new attempt's key.
    expect_rejected(
        store
            .fail(&lease, Failure::retryable("again"), RETENTION)
            .await,
        "old retryable fail after a new grant",
    );
}

/// A permanent failure is kept: later claims are answered `Failed` with the failure, for the
/// retention period; after it the key is free again, with a higher fence.
pub async fn permanent_fail_keeps_a_failed_record(h: &impl Harness) {
    let store = h.store();
    let k = key("permanent");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .fail(&lease, Failure::permanent("card declined"), RETENTION)
        .await
        .expect("fail");
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Failed(record) => {
            assert_eq!(record.state, State::Failed);
            assert_eq!(record.failure, Some(Failure::permanent("card declined")));
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    h.advance(RETENTION - Duration::from_secs(60)).await;
    assert!(matches!(
        store.claim(&request(&k, "a")).await.expect("claim"),
        ClaimOutcome::Failed(_)
    ));
    h.advance(Duration::from_secs(61)).await;
    assert!(
        store.get(&k).await.expect("get").is_none(),
        "a failed record outlived its retention"
    );
    let again = acquire(&*store, &request(&k, "a")).await;
    assert!(
        again.fence > lease.fence,
        "{} <= {}",
        again.fence,
        lease.fence
    );
}

/// Release gives the key back: the next claim is granted at once; a re-sent release is `Ok`.
pub async fn release_frees_the_key(h: &impl Harness) {
    let store = h.store();
    let k = key("release");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store.release(&lease).await.expect("release");
    store.release(&lease).await.expect("re-sent release");
    assert!(store.get(&k).await.expect("get").is_none());
    // After a release, even another payload may claim the key.
    acquire(&*store, &request(&k, "b")).await;
}

/// After the retention period a completed record is gone: `get` finds nothing and a new claim
/// is granted (with a higher fence).
pub async fn retention_expiry_frees_the_key(h: &impl Harness) {
    let store = h.store();
    let k = key("expiry");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"r"), Duration::from_secs(60))
        .await
        .expect("complete");
    h.advance(Duration::from_secs(59)).await;
    assert!(
        store.get(&k).await.expect("get").is_some(),
        "expired too early"
    );
    h.advance(Duration::from_secs(2)).await;
    assert!(store.get(&k).await.expect("get").is_none(), "not expired");
    let again = acquire(&*store, &request(&k, "other payload")).await;
    assert!(again.fence > lease.fence);
}

/// `delete` answers whether a live record was there: `true` for an in-flight or completed
/// record (which is then gone, and whose holder is refused), `false` for an absent key, a
/// record deleted already, or one whose retention ended.
pub async fn delete_answers_whether_a_live_record_was_there(h: &impl Harness) {
    let store = h.store();
    let absent = key("delete-absent");
    assert!(!store.delete(&absent).await.expect("delete"), "absent key");

    let in_flight = key("delete-in-flight");
    let lease = acquire(&*store, &request(&in_flight, "a")).await;
    assert!(store.delete(&in_flight).await.expect("delete"), "in flight");
    assert!(store.get(&in_flight).await.expect("get").is_none());
    assert!(!store.delete(&in_flight).await.expect("delete"), "twice");
    expect_rejected(
        store.complete(&lease, Bytes::new(), RETENTION).await,
        "complete after delete",
    );
    assert!(
        store.get(&in_flight).await.expect("get").is_none(),
        "a refused complete brought the record back"
    );

    let completed = key("delete-completed");
    let lease = acquire(&*store, &request(&completed, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"r"), RETENTION)
        .await
        .expect("complete");
    assert!(store.delete(&completed).await.expect("delete"), "completed");
    // Deleted, the key is free: even another payload is granted.
    acquire(&*store, &request(&completed, "b")).await;

    let expired = key("delete-expired");
    let lease = acquire(&*store, &request(&expired, "a")).await;
    store
        .complete(&lease, Bytes::new(), Duration::from_secs(60))
        .await
        .expect("complete");
    h.advance(Duration::from_secs(61)).await;
    assert!(!store.delete(&expired).await.expect("delete"), "expired");
}
