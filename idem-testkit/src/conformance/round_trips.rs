//! Clauses on round trips (remote stores only: see [`Harness::round_trips`]) and on the one
//! clock of every holder of a key (see [`Harness::skewed_store`]).

use std::future::Future;
use std::time::Duration;

use idem_core::{Bytes, ClaimOutcome, TransitionRejection};

use crate::Harness;

use super::{LEASE, RETENTION, acquire, expect_rejected, key, request};

/// Runs `op` and answers what it gave and the round trips it took (`None`: not counted).
async fn counted<T>(h: &impl Harness, op: impl Future<Output = T>) -> (T, Option<u64>) {
    let before = h.round_trips();
    let out = op.await;
    let taken = h
        .round_trips()
        .zip(before)
        .map(|(after, before)| after - before);
    (out, taken)
}

/// A first execution takes 2 round trips: create-if-absent, then compare-and-set, also when a
/// lease keeper's copy of the lease heartbeated in between.
pub async fn a_first_execution_takes_two_round_trips(h: &impl Harness) {
    let store = h.store();
    let k = key("first");
    let (lease, claim) = counted(h, acquire(&*store, &request(&k, "a"))).await;
    let done = store.complete(&lease, Bytes::from_static(b"r"), RETENTION);
    let (done, complete) = counted(h, done).await;
    done.expect("complete");
    if let (Some(claim), Some(complete)) = (claim, complete) {
        assert_eq!((claim, complete), (1, 1), "claim, complete");
    }
    // A heartbeat, a permanent failure and a release are one compare-and-set each as well.
    let lease = acquire(&*store, &request(&key("first-2"), "a")).await;
    let (lease, beat) = counted(h, store.heartbeat(&lease, LEASE)).await;
    let lease = lease.expect("heartbeat");
    let (released, release) = counted(h, store.release(&lease)).await;
    released.expect("release");
    if let (Some(beat), Some(release)) = (beat, release) {
        assert_eq!((beat, release), (1, 1), "heartbeat, release");
    }
    // A lease keeper heartbeats with its own copy of the lease; the completion, sent with the
    // copy the claim answered, starts from the heartbeat's write: one compare-and-set still.
    let lease = acquire(&*store, &request(&key("first-3"), "a")).await;
    let keeper = lease.clone();
    store.heartbeat(&keeper, LEASE).await.expect("heartbeat");
    let done = store.complete(&lease, Bytes::from_static(b"r"), RETENTION);
    let (done, complete) = counted(h, done).await;
    done.expect("complete after a heartbeat");
    if let Some(complete) = complete {
        assert_eq!(
            complete, 1,
            "complete after a heartbeat of another copy of the lease"
        );
    }
}

/// A replay, a conflict (in flight) and a mismatch each take 1 round trip.
pub async fn a_replay_a_conflict_and_a_mismatch_take_one_round_trip(h: &impl Harness) {
    let store = h.store();
    let (done, held) = (key("replayed"), key("conflict"));
    let lease = acquire(&*store, &request(&done, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"r"), RETENTION)
        .await
        .expect("complete");
    let _held = acquire(&*store, &request(&held, "a")).await;
    for (what, req, expected) in [
        ("replay", request(&done, "a"), "completed"),
        ("conflict", request(&held, "a"), "in_flight"),
        ("mismatch", request(&done, "b"), "mismatch"),
    ] {
        let (answer, taken) = counted(h, store.claim(&req)).await;
        assert_eq!(answer.expect("claim").kind(), expected, "{what}");
        if let Some(taken) = taken {
            assert_eq!(taken, 1, "{what}");
        }
    }
}

/// A takeover of a lapsed lease takes at most 2 round trips (the create-if-absent that reads
/// the lapsed record, then a compare-and-set), and so does a claim after a release (over the
/// tombstone that keeps the fence).
pub async fn a_takeover_takes_at_most_two_round_trips(h: &impl Harness) {
    let store = h.store();
    let k = key("taken");
    acquire(&*store, &request(&k, "a")).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let (answer, taken) = counted(h, store.claim(&request(&k, "a"))).await;
    let ClaimOutcome::Acquired { lease, taken_over } = answer.expect("claim") else {
        panic!("expected a takeover")
    };
    assert!(taken_over);
    store.release(&lease).await.expect("release");
    let (again, regrant) = counted(h, acquire(&*store, &request(&k, "a"))).await;
    assert!(again.fence > lease.fence);
    if let (Some(taken), Some(regrant)) = (taken, regrant) {
        assert!(taken <= 2, "takeover: {taken}");
        assert!(regrant <= 2, "claim after a release: {regrant}");
    }
}

/// Two handles whose local clocks disagree by an hour either way decide on one clock: neither
/// takes over a lease that is live on it, and each takes over once it has lapsed.
pub async fn skewed_clocks_never_grant_a_live_lease_twice(h: &impl Harness) {
    let skew = Duration::from_secs(3600);
    let (Some(ahead), Some(behind)) = (
        h.skewed_store(skew, true).await,
        h.skewed_store(skew, false).await,
    ) else {
        return;
    };
    let store = h.store();
    let k = key("skewed");
    let first = acquire(&*store, &request(&k, "a")).await;
    for other in [&ahead, &behind] {
        let answer = other.claim(&request(&k, "a")).await.expect("claim");
        assert_eq!(answer.kind(), "in_flight", "{answer:?}");
    }
    h.advance(LEASE / 2).await;
    let answer = ahead.claim(&request(&k, "a")).await.expect("claim");
    assert_eq!(answer.kind(), "in_flight", "half a lease on: {answer:?}");
    h.advance(LEASE).await;
    // Lapsed: the handle an hour ahead takes over, and the first holder is superseded...
    let second = acquire(&*ahead, &request(&k, "a")).await;
    assert!(second.fence > first.fence);
    let stale = store.complete(&first, Bytes::new(), RETENTION).await;
    let rejection = expect_rejected(stale, "the superseded holder completes");
    assert!(
        matches!(rejection, TransitionRejection::Superseded { .. }),
        "{rejection:?}"
    );
    // ...and the handle an hour behind sees that grant live.
    let answer = behind.claim(&request(&k, "a")).await.expect("claim");
    assert_eq!(answer.kind(), "in_flight", "{answer:?}");
    h.advance(LEASE + Duration::from_secs(1)).await;
    let third = acquire(&*behind, &request(&k, "a")).await;
    assert!(third.fence > second.fence);
}
