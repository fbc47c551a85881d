//! The clauses of the store contract, one `async fn` each. [`crate::store_conformance!`] turns
//! every clause into a named test of the calling store crate.
//!
//! Every clause takes a fresh [`Harness`] (its own namespace) and uses the [`LEASE`] and
//! [`RETENTION`] below; time moves only through [`Harness::advance`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fingerprint, IdempotencyKey, Lease, Record,
    RecordKey, Rejection, ScanQuery, Scope, State, Store, StoreError, UnreadableRecord,
};

use crate::Harness;
use crate::hammer::{HammerConfig, hammer};

/// The lease every clause claims with.
pub const LEASE: Duration = Duration::from_secs(30);
/// The retention every clause completes with.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// A record key in no scope.
#[must_use]
pub fn key(name: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(name).expect("valid test key"))
}

/// A claim of `key` with the fingerprint of `payload`.
#[must_use]
pub fn request(key: &RecordKey, payload: &str) -> ClaimRequest {
    ClaimRequest::new(key.clone(), Fingerprint::of(&[payload.as_bytes()]), LEASE)
}

/// Claims and expects a grant.
pub async fn acquire(store: &dyn Store, request: &ClaimRequest) -> Lease {
    match store.claim(request).await {
        Ok(ClaimOutcome::Acquired { lease, .. }) => lease,
        other => panic!("expected Acquired for {:?}, got {other:?}", request.key),
    }
}

fn expect_rejected<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) -> Rejection {
    match result {
        Err(StoreError::Rejected(rejection)) => rejection,
        other => panic!("{what}: expected a rejection, got {other:?}"),
    }
}

async fn record(store: &dyn Store, key: &RecordKey) -> Record {
    store
        .get(key)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("no record at {key:?}"))
}

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
/// A holder whose lease lapsed is refused with `Rejection::LeaseExpired` (heartbeat, complete,
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
    let lapsed = |what: &str, r: Rejection| {
        assert_eq!(r, Rejection::LeaseExpired, "{what}");
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
        matches!(r, Rejection::Superseded { current } if current == fresh.fence),
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

/// Ends a grant in one of the three ways that free its key, by `turn`: a release, a retryable
/// failure, or a completion and a delete.
async fn give_back(store: &dyn Store, lease: &Lease, turn: usize) {
    match turn % 3 {
        0 => store.release(lease).await.expect("release"),
        1 => store
            .fail(lease, Failure::retryable("t"), RETENTION)
            .await
            .expect("fail"),
        _ => {
            store
                .complete(lease, Bytes::new(), RETENTION)
                .await
                .expect("complete");
            assert!(store.delete(&lease.key).await.expect("delete"));
        }
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

/// Claims until granted, letting an in-flight lease lapse.
async fn acquire_eventually(h: &impl Harness, store: &dyn Store, req: &ClaimRequest) -> Lease {
    for _ in 0..3 {
        match store.claim(req).await.expect("claim") {
            ClaimOutcome::Acquired { lease, .. } => return lease,
            ClaimOutcome::InFlight { .. } => h.advance(LEASE + Duration::from_secs(1)).await,
            other => panic!("expected a grant, got {other:?}"),
        }
    }
    panic!("never granted")
}

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
        Rejection::AlreadySettled {
            state: State::Completed
        }
    );
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

/// Claims and completes `count` records, `{prefix}-0` and on; their keys.
async fn completed_records(store: &dyn Store, prefix: &str, count: usize) -> HashSet<RecordKey> {
    let mut completed = HashSet::new();
    for i in 0..count {
        let k = key(&format!("{prefix}-{i}"));
        let lease = acquire(store, &request(&k, "a")).await;
        store
            .complete(&lease, Bytes::new(), RETENTION)
            .await
            .expect("complete");
        completed.insert(k);
    }
    completed
}

/// A scan refuses a cursor the store did not hand out with [`StoreError::InvalidCursor`] (not
/// retryable): a garbled one, or one of another kind of store, is the caller's mistake, neither
/// an outage nor a silently empty page.
pub async fn scan_refuses_a_cursor_it_did_not_give(h: &impl Harness) {
    let store = h.store();
    completed_records(&*store, "scan-cursor", 3).await;
    for cursor in ["garbage", "zz:1:2", "%%%"] {
        let query = ScanQuery {
            cursor: Some(cursor.to_owned()),
            ..ScanQuery::all()
        };
        match store.scan(&query).await {
            Err(error @ StoreError::InvalidCursor { .. }) => {
                assert!(!error.is_retryable(), "{error}");
                assert_eq!(error.kind(), "invalid_cursor");
            }
            other => panic!("cursor {cursor:?}: expected InvalidCursor, got {other:?}"),
        }
    }
    // The cursors it hands out still page through everything.
    let all = scan_all(&*store, &ScanQuery::all().with_limit(1)).await;
    assert_eq!(all.len(), 3);
}

/// Scans filter by state and by age, and page through everything with cursors.
pub async fn scan_filters_by_state_and_age(h: &impl Harness) {
    let store = h.store();
    let completed = completed_records(&*store, "scan-old", 5).await;
    h.advance(Duration::from_secs(120)).await;
    let mut in_flight = HashSet::new();
    for i in 0..3 {
        let k = key(&format!("scan-new-{i}"));
        acquire(&*store, &request(&k, "a")).await;
        in_flight.insert(k);
    }
    let failed = key("scan-failed");
    let lease = acquire(&*store, &request(&failed, "a")).await;
    store
        .fail(&lease, Failure::permanent("no"), RETENTION)
        .await
        .expect("fail");

    let keys = |page: Vec<Record>| page.into_iter().map(|r| r.key).collect::<HashSet<_>>();
    let all = scan_all(&*store, &ScanQuery::all().with_limit(2)).await;
    assert_eq!(
        all.len(),
        9,
        "paging with limit 2 returns every record once"
    );
    assert_eq!(keys(all.clone()).len(), 9, "no record twice");

    let query = ScanQuery::all().with_state(State::Completed);
    assert_eq!(keys(scan_all(&*store, &query).await), completed);
    let query = ScanQuery::all().with_state(State::InFlight);
    assert_eq!(keys(scan_all(&*store, &query).await), in_flight);
    let query = ScanQuery::all().with_state(State::Failed);
    assert_eq!(
        keys(scan_all(&*store, &query).await),
        HashSet::from([failed])
    );
    let query = ScanQuery::all().with_min_age(Duration::from_secs(60));
    assert_eq!(keys(scan_all(&*store, &query).await), completed, "by age");
}

/// The records of every page of a scan.
pub async fn scan_all(store: &dyn Store, query: &ScanQuery) -> Vec<Record> {
    scan_entries(store, query).await.0
}

/// Every page of a scan: its records, and the records it reported unreadable. Checks that no
/// page is over its limit, which counts both.
pub async fn scan_entries(
    store: &dyn Store,
    query: &ScanQuery,
) -> (Vec<Record>, Vec<UnreadableRecord>) {
    let mut query = query.clone();
    let (mut records, mut unreadable) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        let page = store.scan(&query).await.expect("scan");
        assert!(page.len() <= query.page_size(), "page over its limit");
        records.extend(page.records);
        unreadable.extend(page.unreadable);
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return (records, unreadable),
        }
    }
    panic!("scan never ended")
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

/// A corrupt stored record is answered with `StoreError::Corrupt` by every operation that reads
/// it, never a panic, and an operator can delete it.
pub async fn corrupt_record_is_reported_not_panicked(h: &impl Harness) {
    let store = h.store();
    let k = key("corrupt");
    let lease = acquire(&*store, &request(&k, "a")).await;
    h.corrupt(&k).await;
    let corrupt = |what: &str, err: Option<StoreError>| match err {
        Some(StoreError::Corrupt { .. }) => {}
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    };
    corrupt("claim", store.claim(&request(&k, "a")).await.err());
    corrupt("get", store.get(&k).await.err());
    corrupt("heartbeat", store.heartbeat(&lease, LEASE).await.err());
    corrupt(
        "complete",
        store.complete(&lease, Bytes::new(), RETENTION).await.err(),
    );
    corrupt(
        "fail",
        store
            .fail(&lease, Failure::permanent("x"), RETENTION)
            .await
            .err(),
    );
    corrupt("release", store.release(&lease).await.err());
    store.delete(&k).await.expect("delete of a corrupt record");
    acquire(&*store, &request(&k, "a")).await;
}

/// One corrupt record does not stop a scan: over a store holding one among readable records,
/// a scan returns every readable record and reports the corrupt one in
/// [`ScanPage::unreadable`](idem_core::ScanPage::unreadable), exactly once, with pages of every
/// size (the limit counts it: a page of it alone moves the cursor on). A filtered scan still
/// answers, with every readable record that matches. `get` of the corrupt record still answers
/// `Corrupt`, and `delete` removes it.
pub async fn scan_reports_a_corrupt_record_beside_the_readable_ones(h: &impl Harness) {
    let store = h.store();
    let completed = completed_records(&*store, "scan-ok", 4).await;
    let held = key("scan-held");
    acquire(&*store, &request(&held, "a")).await;
    let mut readable = completed.clone();
    readable.insert(held);
    let bad = key("scan-corrupt");
    acquire(&*store, &request(&bad, "a")).await;
    h.corrupt(&bad).await;

    let keys = |records: &[Record]| {
        records
            .iter()
            .map(|r| r.key.clone())
            .collect::<HashSet<_>>()
    };
    for limit in [1, 2, 3, ScanQuery::DEFAULT_LIMIT] {
        let (records, unreadable) =
            scan_entries(&*store, &ScanQuery::all().with_limit(limit)).await;
        assert_eq!(
            keys(&records),
            readable,
            "limit {limit}: every readable record"
        );
        assert_eq!(
            records.len(),
            readable.len(),
            "limit {limit}: a record twice"
        );
        assert_eq!(
            unreadable.len(),
            1,
            "limit {limit}: the corrupt record, once: {unreadable:?}"
        );
        let unreadable = &unreadable[0];
        assert!(!unreadable.stored_key.is_empty(), "{unreadable:?}");
        assert!(!unreadable.reason.is_empty(), "{unreadable:?}");
        if let Some(named) = &unreadable.key {
            assert_eq!(named, &bad, "the unreadable record names another key");
        }
    }
    // A filter the corrupt record may or may not be judged by: the readable records it keeps
    // are all there, and the corrupt one is reported at most once.
    let query = ScanQuery::all().with_state(State::Completed).with_limit(2);
    let (records, unreadable) = scan_entries(&*store, &query).await;
    assert_eq!(keys(&records), completed, "a filtered scan");
    assert!(unreadable.len() <= 1, "{unreadable:?}");

    match store.get(&bad).await {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("get of the corrupt record: expected Corrupt, got {other:?}"),
    }
    store
        .delete(&bad)
        .await
        .expect("delete of a corrupt record");
    assert!(store.get(&bad).await.expect("get after delete").is_none());
    let (records, unreadable) = scan_entries(&*store, &ScanQuery::all().with_limit(2)).await;
    assert_eq!(keys(&records), readable, "after the delete");
    assert!(
        unreadable.is_empty(),
        "deleted, still reported: {unreadable:?}"
    );
}

/// The hammer: 64 tasks over 1,000 keys with random delays: exactly one execution per key, and
/// every other attempt answered from the record.
pub async fn hammer_counts_one_execution_per_key(h: &impl Harness) {
    let config = HammerConfig::default();
    let report = hammer(h.store(), config.clone()).await;
    eprintln!(
        "hammer: {} tasks x {} keys: executions={} acquired={} released={} replayed={} in_flight={}",
        config.tasks,
        report.keys,
        report.total_executions(),
        report.acquired,
        report.released,
        report.replayed,
        report.in_flight
    );
    report.assert_exactly_once();
}

/// A reachable store answers `ping`.
pub async fn ping_answers(h: &impl Harness) {
    h.store().ping().await.expect("ping");
}
