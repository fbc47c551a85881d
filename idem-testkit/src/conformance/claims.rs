//! Clauses on claims: a grant, in flight, a completed record, a mismatch, a resent claim,
//! scopes, the hammer and `ping`.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, Failure, Fingerprint, IdempotencyKey, RecordKey, Scope, State, Store,
};

use crate::Harness;
use crate::hammer::{HammerConfig, hammer};

use super::{LEASE, RETENTION, acquire, key, record, request};

/// A claim on an absent key is granted, with a fence and a lease in the future, and the record
/// is in flight.
pub async fn claim_on_an_absent_key_acquires(h: &impl Harness) {
    let store = h.store();
    let k = key("absent");
    let lease = match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Acquired { lease, taken_over } => {
            assert!(!taken_over, "a fresh key is not a takeover");
            lease
        }
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(lease.key, k);
    assert_eq!(lease.attempt, 1);
    let stored = record(&*store, &k).await;
    assert_eq!(stored.state, State::InFlight);
    assert_eq!(stored.owner, lease.owner);
    assert_eq!(stored.fence, lease.fence);
    assert_eq!(stored.lease_until, lease.until);
    assert_eq!(stored.fingerprint, Fingerprint::of(&[b"a"]));
    assert!(lease.until > stored.created_at);
}

/// 64 tasks claiming one key at once: exactly one is granted; every other is told it is in
/// flight.
pub async fn one_of_64_concurrent_claims_acquires(h: &impl Harness) {
    let store = h.store();
    let k = key("contended");
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            let req = request(&k, "same");
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&req).await.expect("claim")
            })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        match task.await.expect("task") {
            ClaimOutcome::Acquired { .. } => acquired += 1,
            ClaimOutcome::InFlight { .. } => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(acquired, 1, "exactly one of 64 concurrent claims acquires");
}

/// A claim while another attempt holds a live lease answers `InFlight` with the time left on
/// that lease.
pub async fn in_flight_answers_with_retry_after(h: &impl Harness) {
    let store = h.store();
    let k = key("busy");
    acquire(&*store, &request(&k, "a")).await;
    h.advance(Duration::from_secs(10)).await;
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::InFlight { retry_after } => {
            assert!(retry_after > Duration::ZERO, "retry_after is positive");
            assert!(
                retry_after <= Duration::from_secs(20),
                "{retry_after:?} > 20s left"
            );
            assert!(
                retry_after >= Duration::from_secs(19),
                "{retry_after:?} < 19s left"
            );
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
}

/// A completed record answers every later claim with its result, byte for byte.
pub async fn completed_record_answers_with_its_result(h: &impl Harness) {
    let store = h.store();
    let k = key("done");
    let lease = acquire(&*store, &request(&k, "a")).await;
    // A result with every byte value, to catch lossy encodings.
    let result: Bytes = (0..=255u8).cycle().take(5_000).collect::<Vec<u8>>().into();
    store
        .complete(&lease, result.clone(), RETENTION)
        .await
        .expect("complete");
    for _ in 0..2 {
        match store.claim(&request(&k, "a")).await.expect("claim") {
            ClaimOutcome::Completed(record) => {
                assert_eq!(record.state, State::Completed);
                assert_eq!(record.result.as_ref(), Some(&result));
                assert_eq!(record.fence, lease.fence);
                assert!(record.completed_at.is_some());
            }
            other => panic!("expected Completed, got {other:?}"),
        }
    }
    // An empty result is a result too.
    let k2 = key("done-empty");
    let lease = acquire(&*store, &request(&k2, "a")).await;
    store
        .complete(&lease, Bytes::new(), RETENTION)
        .await
        .expect("complete");
    match store.claim(&request(&k2, "a")).await.expect("claim") {
        ClaimOutcome::Completed(record) => assert_eq!(record.result, Some(Bytes::new())),
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// A claim with another fingerprint is a `Mismatch` in every state (in flight, completed,
/// failed) and leaves the record exactly as it was.
pub async fn mismatch_in_every_state_leaves_the_record_untouched(h: &impl Harness) {
    let store = h.store();
    let in_flight = key("mm-in-flight");
    acquire(&*store, &request(&in_flight, "a")).await;

    let completed = key("mm-completed");
    let lease = acquire(&*store, &request(&completed, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"r"), RETENTION)
        .await
        .expect("complete");

    let failed = key("mm-failed");
    let lease = acquire(&*store, &request(&failed, "a")).await;
    store
        .fail(&lease, Failure::permanent("declined"), RETENTION)
        .await
        .expect("fail");

    for k in [&in_flight, &completed, &failed] {
        let before = record(&*store, k).await;
        let answer = store.claim(&request(k, "b")).await.expect("claim");
        assert_eq!(
            answer,
            ClaimOutcome::Mismatch,
            "{k:?} in state {}",
            before.state
        );
        assert_eq!(record(&*store, k).await, before, "a mismatch changed {k:?}");
    }
    // A lapsed in-flight record is not taken over by a different payload either.
    h.advance(LEASE + Duration::from_secs(1)).await;
    let before = record(&*store, &in_flight).await;
    assert_eq!(
        store.claim(&request(&in_flight, "b")).await.expect("claim"),
        ClaimOutcome::Mismatch
    );
    assert_eq!(record(&*store, &in_flight).await, before);
}

/// A claim with an owner chosen by the caller, sent again while its grant is live (its answer
/// was lost, or timed out), answers that same grant; any other claim still sees it in flight.
/// Once the grant is released, the same request is granted anew, with a higher fence.
pub async fn resent_claim_with_its_owner_gets_the_same_grant(h: &impl Harness) {
    let store = h.store();
    let k = key("resent-claim");
    let owner = idem_core::OwnerToken::random();
    let req = request(&k, "a").with_owner(owner);
    let first = acquire(&*store, &req).await;
    assert_eq!(first.owner, owner);
    let again = acquire(&*store, &req).await;
    assert_eq!(again, first, "a re-sent claim is its own grant");
    for other in [
        request(&k, "a"),
        request(&k, "a").with_owner(idem_core::OwnerToken::random()),
    ] {
        let answer = store.claim(&other).await.expect("claim");
        assert!(
            matches!(answer, ClaimOutcome::InFlight { .. }),
            "another claim: {answer:?}"
        );
    }
    store.release(&again).await.expect("release");
    let next = acquire(&*store, &req).await;
    assert!(
        next.fence > first.fence,
        "{} <= {}",
        next.fence,
        first.fence
    );
    store
        .complete(&next, Bytes::from_static(b"done"), RETENTION)
        .await
        .expect("complete");
    assert!(matches!(
        store.claim(&req).await.expect("claim"),
        ClaimOutcome::Completed(_)
    ));
}

/// The same key in two scopes is two records: one scope never sees the other's.
pub async fn scopes_are_isolated(h: &impl Harness) {
    let store = h.store();
    let id = IdempotencyKey::new("shared-name").expect("key");
    let alice = RecordKey::new(Scope::new("alice").expect("scope"), id.clone());
    let bob = RecordKey::new(Scope::from_secret(b"Bearer bob"), id);
    let lease = acquire(&*store, &request(&alice, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"alice's"), RETENTION)
        .await
        .expect("complete");
    // Bob's claim of the same name, even with another payload, is a fresh grant.
    let bob_lease = acquire(&*store, &request(&bob, "b")).await;
    assert_eq!(bob_lease.key, bob);
    assert_eq!(
        record(&*store, &alice).await.result.as_deref(),
        Some(&b"alice's"[..])
    );
}

/// The hammer: 64 tasks over 1,000 keys with random delays: exactly one execution per key, and
/// every other attempt answered from the record.
pub async fn hammer_counts_one_execution_per_key(h: &impl Harness) {
    let config = HammerConfig::default();
    let report = hammer(h.store(), config.clone()).await;
    eprintln!("hammer: {} tasks: {report}", config.tasks);
    report.assert_exactly_once();
}

/// A reachable store answers `ping`.
pub async fn ping_answers(h: &impl Harness) {
    h.store().ping().await.expect("ping");
}
