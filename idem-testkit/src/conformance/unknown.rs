//! Clauses on the unknown state: an attempt that lost the answer of its side effect settles its
//! record as unknown (holder only), a claim of it is answered `Unknown` and never runs again
//! until it is resolved or its hold lapses, and the resolutions act only on a record still
//! unknown at the fence the resolver saw.

use std::collections::HashSet;
use std::time::Duration;

use idem_core::machine::{self, LeasePolicy, Write};
use idem_core::{
    Bytes, ClaimOutcome, Fence, Lease, Record, ScanQuery, State, Store, TransitionRejection,
    UnknownOutcome,
};

use crate::Harness;

use super::{LEASE, RETENTION, acquire, expect_rejected, key, record, request, scan_all};

/// What the attempts of these clauses know when they lose the answer.
fn lost() -> UnknownOutcome {
    UnknownOutcome::new("upstream timed out").head_seen(false)
}

/// Claims `lease.key` and expects `Unknown`, with the record as `get` has it.
async fn expect_unknown(store: &dyn Store, lease: &Lease, payload: &str) -> Record {
    match store.claim(&request(&lease.key, payload)).await {
        Ok(ClaimOutcome::Unknown(record)) => {
            assert_eq!(record.state, State::Unknown);
            assert_eq!(record.fence, lease.fence);
            assert_eq!(record.owner, lease.owner);
            record
        }
        other => panic!("expected Unknown for {:?}, got {other:?}", lease.key),
    }
}

/// Only the attempt holding the key (its owner and fence) may settle it as unknown: a stale
/// attempt, taken over after its lease lapsed, is refused as for a complete. The record is the
/// one the machine writes, field for field; settling again is `Ok`, and the holder can no
/// longer complete, fail, release or heartbeat it.
pub async fn settle_unknown_is_for_the_holder_only(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-holder");
    let req = request(&k, "a");
    let stale = acquire(&*store, &req).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let holder = acquire(&*store, &req).await;
    let rejection = expect_rejected(
        store.settle_unknown(&stale, lost(), None, RETENTION).await,
        "settle unknown by a stale attempt",
    );
    assert_eq!(
        rejection,
        TransitionRejection::Superseded {
            current: holder.fence
        }
    );
    let in_flight = record(&*store, &k).await;
    assert_eq!(in_flight.state, State::InFlight, "the stale attempt wrote");

    let hold = Duration::from_secs(600);
    store
        .settle_unknown(&holder, lost(), Some(hold), RETENTION)
        .await
        .expect("settle unknown");
    let unknown = record(&*store, &k).await;
    let now = unknown
        .completed_at
        .expect("an unknown record has its settle time");
    let step = machine::settle_unknown(
        Some(&in_flight),
        &holder,
        lost(),
        Some(hold),
        RETENTION,
        now,
        LeasePolicy::Lenient,
    )
    .expect("settle unknown");
    let Write::Put(expected) = step.write else {
        panic!("the machine writes an unknown record")
    };
    assert_eq!(unknown, expected, "the record the machine writes");
    assert_eq!(unknown.attempt, 2);
    assert_eq!(unknown.hold_until, Some(now.saturating_add(hold)));

    store
        .settle_unknown(&holder, lost(), Some(hold), RETENTION)
        .await
        .expect("re-sent settle unknown");
    let settled = TransitionRejection::AlreadySettled {
        state: State::Unknown,
    };
    let done = store.complete(&holder, Bytes::new(), RETENTION).await;
    assert_eq!(expect_rejected(done, "complete after unknown"), settled);
    let release = store.release(&holder).await;
    assert_eq!(expect_rejected(release, "release after unknown"), settled);
    let beat = store.heartbeat(&holder, LEASE).await;
    assert_eq!(expect_rejected(beat, "heartbeat after unknown"), settled);
    assert_eq!(record(&*store, &k).await, unknown, "a refused step wrote");

    // A completed record is not made unknown.
    let done = key("unknown-after-complete");
    let lease = acquire(&*store, &request(&done, "a")).await;
    store
        .complete(&lease, Bytes::from_static(b"r"), RETENTION)
        .await
        .expect("complete");
    let late = store.settle_unknown(&lease, lost(), None, RETENTION).await;
    assert_eq!(
        expect_rejected(late, "unknown after complete"),
        TransitionRejection::AlreadySettled {
            state: State::Completed
        }
    );
}

/// A claim of an unknown key is answered `Unknown` with its record, never `Acquired`: also long
/// after the lease, and for the owner that settled it. A claim with another payload is a
/// mismatch. After its hold has passed, a claim is granted as after a lapsed lease: a higher
/// fence, the next attempt. Without a hold it lasts until the retention ends.
pub async fn a_claim_of_an_unknown_key_never_acquires_until_the_hold_lapses(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-claim");
    let lease = acquire(&*store, &request(&k, "a")).await;
    let hold = Duration::from_secs(300);
    store
        .settle_unknown(&lease, lost(), Some(hold), RETENTION)
        .await
        .expect("settle unknown");
    let first = expect_unknown(&*store, &lease, "a").await;
    assert_eq!(first.unknown, Some(lost()));
    h.advance(LEASE * 3).await;
    expect_unknown(&*store, &lease, "a").await;
    let own = request(&k, "a").with_owner(lease.owner);
    assert!(matches!(
        store.claim(&own).await.expect("claim"),
        ClaimOutcome::Unknown(_)
    ));
    assert_eq!(
        store.claim(&request(&k, "b")).await.expect("claim"),
        ClaimOutcome::Mismatch
    );
    h.advance(hold).await;
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Acquired {
            lease: next,
            taken_over,
        } => {
            assert!(taken_over, "a lapsed hold is taken over");
            assert!(
                next.fence > lease.fence,
                "{} <= {}",
                next.fence,
                lease.fence
            );
            assert_eq!(next.attempt, lease.attempt + 1);
            let granted = record(&*store, &k).await;
            assert_eq!(granted.state, State::InFlight);
            assert_eq!((granted.unknown, granted.hold_until), (None, None));
        }
        other => panic!("expected a grant after the hold, got {other:?}"),
    }

    // No hold: unknown for the whole retention, then free.
    let k = key("unknown-no-hold");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .settle_unknown(&lease, lost(), None, RETENTION)
        .await
        .expect("settle unknown");
    h.advance(RETENTION - Duration::from_secs(60)).await;
    let held = expect_unknown(&*store, &lease, "a").await;
    assert_eq!(held.hold_until, None);
    h.advance(Duration::from_secs(61)).await;
    let next = acquire(&*store, &request(&k, "a")).await;
    assert!(next.fence > lease.fence);
}

/// `resolve_completed` turns an unknown record into a completed one with the given result,
/// replayed from then on; only from unknown, only at the fence of the unknown record. Sent
/// again, it is `Ok`.
pub async fn resolve_completed_replays_the_result_from_then_on(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-resolve-completed");
    let lease = acquire(&*store, &request(&k, "a")).await;
    let result = Bytes::from_static(b"charged, found in the ledger");
    let early = store
        .resolve_completed(&k, lease.fence, result.clone(), RETENTION)
        .await;
    assert_eq!(
        expect_rejected(early, "resolving an in-flight record"),
        TransitionRejection::NotUnknown {
            state: State::InFlight
        }
    );
    store
        .settle_unknown(&lease, lost(), None, RETENTION)
        .await
        .expect("settle unknown");
    let wrong = store
        .resolve_completed(&k, lease.fence.successor(), result.clone(), RETENTION)
        .await;
    assert_eq!(
        expect_rejected(wrong, "resolving at another fence"),
        TransitionRejection::Superseded {
            current: lease.fence
        }
    );
    let absent = store
        .resolve_completed(
            &key("unknown-absent"),
            Fence::MIN,
            result.clone(),
            RETENTION,
        )
        .await;
    assert_eq!(
        expect_rejected(absent, "resolving an absent key"),
        TransitionRejection::NotFound
    );
    assert_eq!(record(&*store, &k).await.state, State::Unknown);

    h.advance(Duration::from_secs(5)).await;
    store
        .resolve_completed(&k, lease.fence, result.clone(), RETENTION)
        .await
        .expect("resolve completed");
    store
        .resolve_completed(&k, lease.fence, result.clone(), RETENTION)
        .await
        .expect("re-sent resolution");
    match store.claim(&request(&k, "a")).await.expect("claim") {
        ClaimOutcome::Completed(record) => {
            assert_eq!(record.result.as_ref(), Some(&result));
            assert_eq!((record.fence, record.attempt), (lease.fence, lease.attempt));
            assert_eq!((record.unknown, record.hold_until), (None, None));
        }
        other => panic!("expected the resolved result, got {other:?}"),
    }
    let other = store
        .resolve_completed(&k, lease.fence, Bytes::new(), RETENTION)
        .await;
    assert_eq!(
        expect_rejected(other, "resolving a completed record"),
        TransitionRejection::NotUnknown {
            state: State::Completed
        }
    );
    let release = store.resolve_released(&k, lease.fence).await;
    assert_eq!(
        expect_rejected(release, "releasing a completed record"),
        TransitionRejection::NotUnknown {
            state: State::Completed
        }
    );
}

/// `resolve_released` frees an unknown key: the next claim runs (a higher fence); sent again on
/// the free key it is `Ok`. Only from unknown.
pub async fn resolve_released_lets_the_next_claim_run(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-resolve-released");
    let lease = acquire(&*store, &request(&k, "a")).await;
    let early = store.resolve_released(&k, lease.fence).await;
    assert_eq!(
        expect_rejected(early, "releasing an in-flight record"),
        TransitionRejection::NotUnknown {
            state: State::InFlight
        }
    );
    store
        .settle_unknown(&lease, lost(), None, RETENTION)
        .await
        .expect("settle unknown");
    let wrong = store.resolve_released(&k, lease.fence.successor()).await;
    assert!(matches!(
        expect_rejected(wrong, "releasing at another fence"),
        TransitionRejection::Superseded { .. }
    ));
    store
        .resolve_released(&k, lease.fence)
        .await
        .expect("resolve released");
    assert_eq!(store.get(&k).await.expect("get"), None);
    store
        .resolve_released(&k, lease.fence)
        .await
        .expect("re-sent resolution");
    let next = acquire(&*store, &request(&k, "a")).await;
    assert!(
        next.fence > lease.fence,
        "{} <= {}",
        next.fence,
        lease.fence
    );
}

/// A resolution never overwrites a newer attempt: once the hold lapsed and a claim took the key,
/// both resolutions with the fence the resolver saw are refused and change nothing; and the
/// stale holder cannot settle the new attempt's record as unknown.
pub async fn a_resolution_after_a_newer_attempt_is_refused(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-newer");
    let lease = acquire(&*store, &request(&k, "a")).await;
    let hold = Duration::from_secs(60);
    store
        .settle_unknown(&lease, lost(), Some(hold), RETENTION)
        .await
        .expect("settle unknown");
    let seen = record(&*store, &k).await;
    h.advance(hold + Duration::from_secs(1)).await;
    let next = acquire(&*store, &request(&k, "a")).await;
    let newer = record(&*store, &k).await;
    let completed = store
        .resolve_completed(&k, seen.fence, Bytes::new(), RETENTION)
        .await;
    let superseded = TransitionRejection::Superseded {
        current: next.fence,
    };
    assert_eq!(
        expect_rejected(completed, "stale resolve_completed"),
        superseded
    );
    let released = store.resolve_released(&k, seen.fence).await;
    assert_eq!(
        expect_rejected(released, "stale resolve_released"),
        superseded
    );
    let stale = store.settle_unknown(&lease, lost(), None, RETENTION).await;
    assert_eq!(expect_rejected(stale, "stale settle unknown"), superseded);
    assert_eq!(
        record(&*store, &k).await,
        newer,
        "a refused resolution wrote"
    );
    store
        .complete(&next, Bytes::from_static(b"second"), RETENTION)
        .await
        .expect("the newer attempt completes");
}

/// An operator can delete an unknown record (`true`: there was one); the next claim runs with
/// a higher fence. A scan filtered on the unknown state lists exactly the unknown records.
pub async fn unknown_records_are_deleted_and_scanned(h: &impl Harness) {
    let store = h.store();
    let mut unknown = HashSet::new();
    for i in 0..3 {
        let k = key(&format!("unknown-scan-{i}"));
        let lease = acquire(&*store, &request(&k, "a")).await;
        store
            .settle_unknown(&lease, lost(), None, RETENTION)
            .await
            .expect("settle unknown");
        unknown.insert(k);
    }
    let done = key("unknown-scan-done");
    let lease = acquire(&*store, &request(&done, "a")).await;
    store
        .complete(&lease, Bytes::new(), RETENTION)
        .await
        .expect("complete");
    acquire(&*store, &request(&key("unknown-scan-running"), "a")).await;

    let query = ScanQuery::all().with_state(State::Unknown).with_limit(2);
    let listed = scan_all(&*store, &query).await;
    assert!(listed.iter().all(|r| r.unknown == Some(lost())));
    let listed = listed.into_iter().map(|r| r.key).collect::<HashSet<_>>();
    assert_eq!(listed, unknown, "the unknown records, and only them");
    assert_eq!(scan_all(&*store, &ScanQuery::all()).await.len(), 5);

    let k = key("unknown-scan-0");
    let fence = record(&*store, &k).await.fence;
    assert!(store.delete(&k).await.expect("delete"));
    assert!(!store.delete(&k).await.expect("delete again"));
    let next = acquire(&*store, &request(&k, "a")).await;
    assert!(next.fence > fence);
}

/// Many resolvers racing on one unknown record: exactly one `resolve_completed` or
/// `resolve_released` changes it; the others are refused (or, for a re-sent identical one,
/// answered `Ok` without changing it), and the record ends completed with the one result or
/// absent.
pub async fn concurrent_resolutions_apply_once(h: &impl Harness) {
    let store = h.store();
    let k = key("unknown-race");
    let lease = acquire(&*store, &request(&k, "a")).await;
    store
        .settle_unknown(&lease, lost(), None, RETENTION)
        .await
        .expect("settle unknown");
    let tasks = (0..16)
        .map(|i| {
            let store = store.clone();
            let k = k.clone();
            let fence = lease.fence;
            tokio::spawn(async move {
                if i % 2 == 0 {
                    let result = Bytes::from(format!("result-{i}"));
                    store
                        .resolve_completed(&k, fence, result, RETENTION)
                        .await
                        .map(|()| Some(i))
                } else {
                    store.resolve_released(&k, fence).await.map(|()| None)
                }
            })
        })
        .collect::<Vec<_>>();
    let mut completed_by = Vec::new();
    let mut released = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(Some(i)) => completed_by.push(i),
            Ok(None) => released += 1,
            Err(err) => assert!(err.rejection().is_some(), "{err}"),
        }
    }
    match store.get(&k).await.expect("get") {
        Some(record) => {
            assert_eq!(record.state, State::Completed);
            assert_eq!(
                completed_by.len(),
                1,
                "one resolution won: {completed_by:?}"
            );
            let result = format!("result-{}", completed_by[0]);
            assert_eq!(record.result.as_deref(), Some(result.as_bytes()));
            assert_eq!(released, 0, "a release answered Ok beside a completion");
        }
        None => {
            assert!(
                completed_by.is_empty(),
                "completed, then freed: {completed_by:?}"
            );
            assert!(released >= 1);
        }
    }
}
