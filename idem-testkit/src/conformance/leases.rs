//! Clauses on leases and fences: takeover after a lapse, the lenient and strict policies, stale
//! owners, fences that only rise, the heartbeat.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Bytes, ClaimOutcome, Failure, RecordKey, State, Store, TransitionRejection};

use crate::Harness;

use super::{
    LEASE, RETENTION, acquire, acquire_eventually, expect_rejected, give_back, key, record, request,
};

/// An in-flight record whose lease lapsed is taken over by the next claim, with a higher fence
/// and a new owner.
pub async fn lapsed_lease_is_taken_over_with_a_higher_fence(h: &impl Harness) {
    let store = h.store();
    let k = key("lapsed");
    let first = acquire(&*store, &request(&k, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Acquired { lease, taken_over } => {
            assert!(taken_over, "the claim reports the takeover");
            assert!(
                lease.fence > first.fence,
                "fence {} <= {}",
                lease.fence,
                first.fence
            );
            assert_ne!(lease.owner, first.owner);
            assert_eq!(lease.attempt, 2);
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}

/// Under the default (lenient) lease policy, a holder whose lease lapsed but whose key nobody
/// took over may still heartbeat and complete: only a takeover stops it. A strict store
/// refuses it instead (see [`strict_lease_refuses_a_lapsed_holder`]).
pub async fn lapsed_holder_not_taken_over_may_still_complete(h: &impl Harness) {
    let store = h.store();
    let k = key("lapsed-holder");
    let lease = acquire(&*store, &request(&k, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let extended = store
        .heartbeat(&lease, LEASE)
        .await
        .expect("a lapsed holder's heartbeat");
    assert!(extended.until > lease.until);
    assert_eq!((extended.owner, extended.fence), (lease.owner, lease.fence));
    // The heartbeat made the lease live again: another claim waits.
    assert!(matches!(
        store.claim(&request(&k, "a")).await.expect("claim"),
        ClaimOutcome::InFlight { .. }
    ));
    h.advance(LEASE + Duration::from_secs(1)).await;
    store
        .complete(&extended, Bytes::from_static(b"late"), RETENTION)
        .await
        .expect("a lapsed holder's complete");
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Completed(record) => {
            assert_eq!(record.result.as_deref(), Some(&b"late"[..]));
            assert_eq!(record.fence, lease.fence);
        }
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// For a store built with the strict lease policy (`LeasePolicy::Strict`), not part of
/// [`crate::store_conformance!`]: call it from the store's own tests with a strict harness.
///
/// A holder whose lease lapsed is refused with `TransitionRejection::LeaseExpired` (heartbeat, complete,
/// permanent and retryable fail), even though nobody took the key over, and the record stays
/// as it was; the holder may still release it, and a new claim takes it over. A holder inside
/// its lease completes as usual, and re-sending that complete after its lease would have
/// lapsed (a lost reply) still answers `Ok`.
pub async fn strict_lease_refuses_a_lapsed_holder(h: &impl Harness) {
    let store = h.store();
    let k = key("strict");
    let lease = acquire(&*store, &request(&k, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let before = record(&*store, &k).await;
    let lapsed = |what: &str, r: TransitionRejection| {
        assert_eq!(r, TransitionRejection::LeaseExpired, "{what}");
    };
    lapsed(
        "heartbeat",
        expect_rejected(store.heartbeat(&lease, LEASE).await, "strict heartbeat"),
    );
    lapsed(
        "complete",
        expect_rejected(
            store
                .complete(&lease, Bytes::from_static(b"late"), RETENTION)
                .await,
            "strict complete",
        ),
    );
    lapsed(
        "permanent fail",
        expect_rejected(
            store
                .fail(&lease, Failure::permanent("late"), RETENTION)
                .await,
            "strict permanent fail",
        ),
    );
    lapsed(
        "retryable fail",
        expect_rejected(
            store
                .fail(&lease, Failure::retryable("late"), RETENTION)
                .await,
            "strict retryable fail",
        ),
    );
    assert_eq!(
        record(&*store, &k).await,
        before,
        "a refused holder changed the record"
    );
    // Giving the key back is still allowed, and frees it.
    store.release(&lease).await.expect("strict release");
    assert!(store.get(&k).await.expect("get").is_none());

    // A lapsed holder is also refused once another claim could take over, and the takeover
    // is granted.
    let k2 = key("strict-takeover");
    let old = acquire(&*store, &request(&k2, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let new = acquire(&*store, &request(&k2, "a")).await;
    assert!(new.fence > old.fence);
    expect_rejected(
        store.complete(&old, Bytes::new(), RETENTION).await,
        "strict complete after a takeover",
    );

    // Inside its lease, a holder completes; the same complete re-sent after the lease would
    // have lapsed is answered Ok, and keeps the first result.
    let k3 = key("strict-resent");
    let lease = acquire(&*store, &request(&k3, "a")).await;
    h.advance(LEASE / 2).await;
    store
        .complete(&lease, Bytes::from_static(b"first"), RETENTION)
        .await
        .expect("strict complete inside the lease");
    h.advance(LEASE).await;
    store
        .complete(&lease, Bytes::from_static(b"first"), RETENTION)
        .await
        .expect("re-sent complete after the lease");
    assert_eq!(
        record(&*store, &k3).await.result.as_deref(),
        Some(&b"first"[..])
    );
}

/// After a takeover, the stale owner's heartbeat, complete, fail and release are refused, and
/// the new owner's record is unchanged by them.
pub async fn stale_owner_is_rejected_after_takeover(h: &impl Harness) {
    let store = h.store();
    let k = key("stale");
    let stale = acquire(&*store, &request(&k, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let fresh = acquire(&*store, &request(&k, "a")).await;
    let before = record(&*store, &k).await;

    let r = expect_rejected(store.heartbeat(&stale, LEASE).await, "stale heartbeat");
    assert!(
        matches!(r, TransitionRejection::Superseded { current } if current == fresh.fence),
        "{r:?}"
    );
    expect_rejected(
        store
            .complete(&stale, Bytes::from_static(b"late"), RETENTION)
            .await,
        "stale complete",
    );
    expect_rejected(
        store
            .fail(&stale, Failure::permanent("late"), RETENTION)
            .await,
        "stale permanent fail",
    );
    expect_rejected(
        store
            .fail(&stale, Failure::retryable("late"), RETENTION)
            .await,
        "stale retryable fail",
    );
    expect_rejected(store.release(&stale).await, "stale release");
    assert_eq!(
        record(&*store, &k).await,
        before,
        "a stale owner changed the record"
    );

    // The new owner is unaffected.
    store
        .complete(&fresh, Bytes::from_static(b"ok"), RETENTION)
        .await
        .expect("fresh complete");
}

/// Fences strictly increase across every grant of a key: takeovers, releases, retryable
/// failures, and a delete followed by a new claim.
pub async fn fences_strictly_increase_also_after_delete(h: &impl Harness) {
    let store = h.store();
    let k = key("fences");
    let mut last = acquire(&*store, &request(&k, "a")).await.fence;
    for round in 0..6 {
        let lease = acquire_eventually(h, &*store, &request(&k, "a")).await;
        assert!(
            lease.fence > last,
            "round {round}: fence {} <= {last}",
            lease.fence
        );
        last = lease.fence;
        give_back(&*store, &lease, round).await;
    }
}

/// Fences strictly increase across grants that race: tasks claim one key over and over, and
/// each one that is granted notes its fence while it holds the key (so the notes are in grant
/// order), then releases, fails retryably, or completes and deletes. A store that reads its
/// fence floor outside the step that grants would hand out a fence again.
pub async fn fences_strictly_increase_under_concurrent_grants(h: &impl Harness) {
    fences_increase_under_racing_grants(h.store(), key("racing-fences"), 16, 100).await;
}

/// The body of [`fences_strictly_increase_under_concurrent_grants`]: `tasks` tasks make
/// `rounds` claims each on `k`; returns how many grants were made.
///
/// # Panics
/// If a grant's fence is not above the one before it, or the store fails.
pub async fn fences_increase_under_racing_grants(
    store: Arc<dyn Store>,
    k: RecordKey,
    tasks: usize,
    rounds: usize,
) -> usize {
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut running = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (store, grants, req) = (store.clone(), grants.clone(), request(&k, "a"));
        running.push(tokio::spawn(async move {
            for round in 0..rounds {
                let ClaimOutcome::Acquired { lease, .. } = store.claim(&req).await.expect("claim")
                else {
                    tokio::task::yield_now().await;
                    continue;
                };
                grants
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(lease.fence);
                give_back(&*store, &lease, task + round).await;
            }
        }));
    }
    for task in running {
        task.await.expect("a claiming task panicked");
    }
    let grants = grants
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (n, pair) in grants.windows(2).enumerate() {
        assert!(
            pair[1] > pair[0],
            "grant {}: fence {} after {}",
            n + 1,
            pair[1],
            pair[0]
        );
    }
    assert!(!grants.is_empty(), "no claim was ever granted");
    grants.len()
}

/// A heartbeat moves the lease forward, so the holder is not taken over; the record keeps
/// owner and fence.
pub async fn heartbeat_extends_the_lease(h: &impl Harness) {
    let store = h.store();
    let k = key("heartbeat");
    let mut lease = acquire(&*store, &request(&k, "a")).await;
    for _ in 0..4 {
        h.advance(LEASE / 2).await;
        let extended = store.heartbeat(&lease, LEASE).await.expect("heartbeat");
        assert!(extended.until > lease.until);
        assert_eq!((extended.owner, extended.fence), (lease.owner, lease.fence));
        lease = extended;
    }
    // Two full leases after the claim, the holder still holds the key.
    assert!(matches!(
        store.claim(&request(&k, "a")).await.expect("claim"),
        ClaimOutcome::InFlight { .. }
    ));
    let stored = record(&*store, &k).await;
    assert_eq!(stored.lease_until, lease.until);
    store
        .complete(&lease, Bytes::new(), RETENTION)
        .await
        .expect("complete");
    // A heartbeat on a settled record is refused.
    let r = expect_rejected(
        store.heartbeat(&lease, LEASE).await,
        "heartbeat after complete",
    );
    assert_eq!(
        r,
        TransitionRejection::AlreadySettled {
            state: State::Completed
        }
    );
}
