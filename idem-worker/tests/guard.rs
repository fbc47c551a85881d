//! Every outcome and disposition of the guard, on MemoryStore with a manual clock. Timer-driven
//! logic (the heartbeat) runs on tokio's paused clock: no test sleeps for real.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Faults, FaultyStore, key, manual_store, state_of, unscoped};
use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, ManualClock, State, Store, StoreError};
use idem_store_memory::MemoryStore;
use idem_worker::{Admission, Disposition, JobError, JobGuard, JobOutcome, RetryPolicy, RunError};
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(30);

fn fp(text: &str) -> Fingerprint {
    Fingerprint::of(&[text.as_bytes()])
}

/// A memory store on a manual clock behind fault switches.
fn faulty() -> (Arc<FaultyStore<MemoryStore>>, Arc<Faults>, ManualClock) {
    let (store, clock) = manual_store();
    let faults = Arc::new(Faults::default());
    let store = Arc::new(FaultyStore {
        inner: store,
        faults: faults.clone(),
    });
    (store, faults, clock)
}

fn guard(store: Arc<dyn Store>) -> JobGuard {
    JobGuard::builder(store)
        .job_type("test")
        .lease(LEASE)
        .retry_policy(
            RetryPolicy::default()
                .with_max_attempts(NonZeroU32::new(3).unwrap())
                .with_initial_delay(Duration::from_secs(1)),
        )
        .build()
        .unwrap()
}

async fn ok_job(runs: &AtomicU32, value: &str) -> Result<String, JobError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(value.to_owned())
}

#[tokio::test]
async fn executed_then_replayed_both_ack() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let runs = AtomicU32::new(0);
    let first = guard
        .run(&key("k"), fp("p"), |_| ok_job(&runs, "done"))
        .await;
    assert!(
        matches!(first.outcome, JobOutcome::Executed(ref v) if v == "done"),
        "{first:?}"
    );
    assert_eq!(first.disposition, Disposition::Ack);

    let second = guard
        .run(&key("k"), fp("p"), |_| ok_job(&runs, "again"))
        .await;
    assert!(
        matches!(second.outcome, JobOutcome::Replayed(ref v) if v == "done"),
        "{second:?}"
    );
    assert_eq!(second.disposition, Disposition::Ack);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The record holds the serde_json encoding of the result.
    let record = store.get(&unscoped("k")).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.result.as_deref(), Some(&b"\"done\""[..]));
}

#[tokio::test]
async fn in_flight_duplicate_is_retried_after_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store);
    let Admission::Claimed(claim) = guard.admit::<String>(&key("k"), fp("p"), 1).await else {
        panic!("the first admission claims");
    };
    let runs = AtomicU32::new(0);
    let dup = guard
        .run_delivery(&key("k"), fp("p"), 7, |_| ok_job(&runs, "dup"))
        .await;
    let JobOutcome::InFlight { retry_after } = dup.outcome else {
        panic!("expected in flight, got {dup:?}");
    };
    assert!(
        retry_after <= LEASE && retry_after > LEASE / 2,
        "{retry_after:?}"
    );
    // Not bounded by the attempts (delivery 7 > 3): the holder's lease bounds the wait.
    // Backoff (delivery 7: up to 30 s here), capped by the holder's lease.
    assert!(
        matches!(dup.disposition, Disposition::Retry { after } if after <= retry_after),
        "{dup:?}"
    );
    let early = guard
        .run_delivery(&key("k"), fp("p"), 1, |_| ok_job(&runs, "dup"))
        .await;
    assert!(
        matches!(early.disposition, Disposition::Retry { after } if after <= Duration::from_secs(1)),
        "{early:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let done = claim.run(|_| ok_job(&runs, "first")).await;
    assert!(matches!(done.outcome, JobOutcome::Executed(_)));
}

#[tokio::test]
async fn another_payload_is_a_mismatch_and_dead_lettered() {
    let guard = guard(Arc::new(MemoryStore::new()));
    let runs = AtomicU32::new(0);
    let _ = guard.run(&key("k"), fp("a"), |_| ok_job(&runs, "a")).await;
    let other = guard.run(&key("k"), fp("b"), |_| ok_job(&runs, "b")).await;
    assert!(matches!(other.outcome, JobOutcome::Mismatch), "{other:?}");
    assert_eq!(other.disposition, Disposition::DeadLetter);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_permanent_failure_is_recorded_and_dead_lettered() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Err::<String, _>(JobError::permanent("card declined"))
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Failed(ref f) if f.message == "card declined" && !f.retryable),
        "{run:?}"
    );
    assert_eq!(run.disposition, Disposition::DeadLetter);
    let record = store.get(&unscoped("k")).await.unwrap().unwrap();
    assert_eq!(record.state, State::Failed);

    // A redelivery gets the recorded failure without running: no blind retries.
    let runs = AtomicU32::new(0);
    let again = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(matches!(again.outcome, JobOutcome::Failed(ref f) if f.message == "card declined"));
    assert_eq!(again.disposition, Disposition::DeadLetter);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_transient_failure_releases_and_backs_off_until_the_attempts_are_spent() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let transient = |_| async { Err::<String, _>(JobError::transient("connection refused")) };
    let run = guard.run_delivery(&key("k"), fp("p"), 1, transient).await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Transient(_))),
        "{run:?}"
    );
    assert!(
        matches!(run.disposition, Disposition::Retry { after } if after <= Duration::from_secs(1)),
        "{run:?}"
    );
    assert_eq!(
        store.get(&unscoped("k")).await.unwrap(),
        None,
        "the key is released"
    );

    let run = guard.run_delivery(&key("k"), fp("p"), 2, transient).await;
    assert!(
        matches!(run.disposition, Disposition::Retry { after } if after <= Duration::from_secs(2) && after >= Duration::from_secs(1)),
        "{run:?}"
    );
    // Delivery 3 of at most 3: dead-letter.
    let run = guard.run_delivery(&key("k"), fp("p"), 3, transient).await;
    assert_eq!(run.disposition, Disposition::DeadLetter);

    // The key is free: a later delivery runs.
    let runs = AtomicU32::new(0);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "ok")).await;
    assert!(matches!(run.outcome, JobOutcome::Executed(_)));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_is_recorded_and_never_runs_again_until_resolved() {
    let (store, clock) = manual_store();
    let guard = guard(Arc::new(store.clone()));
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Err::<String, _>(JobError::unknown("timed out after sending"))
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::UnknownOutcome(_))),
        "{run:?}"
    );
    assert_eq!(
        run.disposition,
        Disposition::DeadLetter,
        "set aside: {run:?}"
    );
    let record = store.get(&unscoped("k")).await.unwrap().unwrap();
    assert_eq!(record.state, State::Unknown, "the outcome is recorded");
    let outcome = record.unknown.clone().unwrap();
    assert!(
        outcome.reason.contains("timed out after sending"),
        "{outcome:?}"
    );
    assert_eq!(record.hold_until, None);

    // A redelivery, also long after the lease: answered unknown, the job does not run.
    let runs = AtomicU32::new(0);
    for advance in [Duration::ZERO, LEASE * 10] {
        clock.advance(advance);
        let again = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
        match &again.outcome {
            JobOutcome::Unknown {
                outcome: seen,
                fence,
                hold_until,
            } => {
                assert_eq!(seen, &outcome);
                assert_eq!(*fence, record.fence);
                assert_eq!(*hold_until, None);
            }
            other => panic!("expected Unknown, got {other:?}"),
        }
        assert_eq!(again.disposition, Disposition::DeadLetter);
        assert_eq!(again.outcome.kind(), "unknown");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Resolved as completed (the ledger shows the effect): replayed from then on.
    let stale = guard
        .resolve_completed(&key("k"), record.fence.successor(), &"found".to_owned())
        .await;
    assert!(
        matches!(
            stale,
            Err(RunError::Store {
                op: "resolve_completed",
                ..
            })
        ),
        "{stale:?}"
    );
    guard
        .resolve_completed(&key("k"), record.fence, &"found in the ledger".to_owned())
        .await
        .unwrap();
    let replayed = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(replayed.outcome, JobOutcome::Replayed(ref r) if r == "found in the ledger"),
        "{replayed:?}"
    );
    assert_eq!(replayed.disposition, Disposition::Ack);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_released_by_an_operator_runs_on_the_next_delivery() {
    let (store, _clock) = manual_store();
    let guard = guard(Arc::new(store.clone()));
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Err::<String, _>(JobError::unknown("connection reset"))
        })
        .await;
    assert_eq!(run.disposition, Disposition::DeadLetter);
    let fence = store.get(&unscoped("k")).await.unwrap().unwrap().fence;
    guard.resolve_released(&key("k"), fence).await.unwrap();
    guard.resolve_released(&key("k"), fence).await.unwrap();
    let runs = AtomicU32::new(0);
    let again = guard
        .run(&key("k"), fp("p"), |_| ok_job(&runs, "ran"))
        .await;
    assert!(
        matches!(again.outcome, JobOutcome::Executed(_)),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The record is completed now: releasing it is refused.
    let err = guard.resolve_released(&key("k"), fence).await.unwrap_err();
    assert!(err.rejection().is_some(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_hold_lets_a_delivery_take_the_key_over_after_it() {
    let (store, clock) = manual_store();
    let guard = JobGuard::builder(Arc::new(store.clone()))
        .lease(LEASE)
        .unknown_hold(Duration::from_secs(600))
        .build()
        .unwrap();
    assert_eq!(guard.unknown_hold(), Some(Duration::from_secs(600)));
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Err::<String, _>(JobError::unknown("timed out"))
        })
        .await;
    assert_eq!(run.disposition, Disposition::DeadLetter);
    let runs = AtomicU32::new(0);
    clock.advance(Duration::from_secs(599));
    let held = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(
            held.outcome,
            JobOutcome::Unknown {
                hold_until: Some(_),
                ..
            }
        ),
        "{held:?}"
    );
    clock.advance(Duration::from_secs(1));
    let later = guard
        .run(&key("k"), fp("p"), |ctx| async move {
            assert_eq!(ctx.lease_attempt(), 2);
            Ok::<_, JobError>("checked downstream".to_owned())
        })
        .await;
    assert!(
        matches!(later.outcome, JobOutcome::Executed(_)),
        "{later:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_the_store_cannot_record_lapses_with_the_lease() {
    let (store, faults, clock) = faulty();
    faults.settle_unknown_down.store(true, Ordering::SeqCst);
    let guard = guard(store.clone());
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Err::<String, _>(JobError::unknown("timed out after sending"))
        })
        .await;
    assert!(
        matches!(
            run.outcome,
            JobOutcome::Error(RunError::Store {
                op: "settle_unknown",
                ..
            })
        ),
        "{run:?}"
    );
    assert!(
        matches!(run.disposition, Disposition::Retry { after } if after >= LEASE - Duration::from_secs(1)),
        "retry only after the lease: {run:?}"
    );
    assert!(faults.unknowns.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        state_of(&*store, "k").await,
        Some(State::InFlight),
        "the claim is kept"
    );
    // Before the lease ends a redelivery is told it is in flight; after it, it takes over.
    let runs = AtomicU32::new(0);
    let early = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(early.outcome, JobOutcome::InFlight { .. }),
        "{early:?}"
    );
    clock.advance(LEASE + Duration::from_secs(1));
    let later = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(later.outcome, JobOutcome::Executed(_)),
        "{later:?}"
    );
}

#[tokio::test]
async fn a_panic_releases_the_key_and_records_nothing() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            if true {
                panic!("boom");
            }
            Ok::<String, JobError>(String::new())
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Panicked(ref m)) if m == "boom"),
        "{run:?}"
    );
    assert!(matches!(run.disposition, Disposition::Retry { .. }));
    assert_eq!(store.get(&unscoped("k")).await.unwrap(), None);

    // A panic in the closure itself (before its future) is caught too.
    let run = guard
        .run(
            &key("k2"),
            fp("p"),
            |_| -> std::future::Ready<Result<String, JobError>> { panic!("early") },
        )
        .await;
    assert!(matches!(run.outcome, JobOutcome::Error(RunError::Panicked(ref m)) if m == "early"));
    assert_eq!(store.get(&unscoped("k2")).await.unwrap(), None);
}

#[tokio::test]
async fn a_dropped_run_releases_the_key_and_records_nothing() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let (started_tx, started_rx) = oneshot::channel();
    let task = tokio::spawn({
        let guard = guard.clone();
        async move {
            guard
                .run(&key("k"), fp("p"), |_| async move {
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                    Ok::<String, JobError>("never".to_owned())
                })
                .await
        }
    });
    started_rx.await.unwrap();
    assert_eq!(state_of(&store, "k").await, Some(State::InFlight));
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The release is spawned: give it a moment to run.
    for _ in 0..100 {
        if store.get(&unscoped("k")).await.unwrap().is_none() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.get(&unscoped("k")).await.unwrap(),
        None,
        "released, nothing recorded"
    );

    // A dropped admission releases too.
    let admitted = guard.admit::<String>(&key("k3"), fp("p"), 1).await;
    assert!(matches!(admitted, Admission::Claimed(_)));
    drop(admitted);
    for _ in 0..100 {
        if store.get(&unscoped("k3")).await.unwrap().is_none() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(store.get(&unscoped("k3")).await.unwrap(), None);
}

#[tokio::test]
async fn an_admitted_claim_can_be_released() {
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let Admission::Claimed(claim) = guard.admit::<String>(&key("k"), fp("p"), 1).await else {
        panic!("claimed");
    };
    assert!(!claim.taken_over());
    assert_eq!(claim.context().key().as_str(), "k");
    claim.release().await.unwrap();
    assert_eq!(store.get(&unscoped("k")).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_cancels_the_job_and_its_stale_result_is_refused() {
    let (store, clock) = manual_store();
    let store = Arc::new(store);
    let guard = guard(store.clone());
    let (started_tx, started_rx) = oneshot::channel();
    let task = tokio::spawn({
        let guard = guard.clone();
        async move {
            guard
                .run(&key("k"), fp("p"), |ctx| async move {
                    let _ = started_tx.send(ctx.fence());
                    // Stop when the lease is lost, and return a (stale) result anyway.
                    ctx.cancelled().await;
                    Ok::<_, JobError>("stale".to_owned())
                })
                .await
        }
    });
    let old_fence = started_rx.await.unwrap();

    // The worker stalls past its lease (no heartbeat has run yet: the tokio clock has not
    // moved) and another attempt takes the key over.
    clock.advance(LEASE + Duration::from_secs(1));
    let request = ClaimRequest::new(unscoped("k"), fp("p"), LEASE);
    let ClaimOutcome::Acquired {
        lease: new_lease,
        taken_over,
    } = store.claim(&request).await.unwrap()
    else {
        panic!("the lapsed claim is taken over");
    };
    assert!(taken_over);
    assert!(new_lease.fence > old_fence);

    // The next heartbeat is refused: the job is cancelled, its result refused and reported.
    let run = task.await.unwrap();
    let JobOutcome::Error(RunError::LeaseLost { fence, source }) = &run.outcome else {
        panic!("expected a lost lease, got {run:?}");
    };
    assert_eq!(*fence, old_fence);
    assert!(source.rejection().is_some(), "{source}");
    assert!(matches!(run.disposition, Disposition::Retry { .. }));

    // The stale result was not recorded: the new holder's record is untouched.
    let record = store.get(&unscoped("k")).await.unwrap().unwrap();
    assert_eq!(record.state, State::InFlight);
    assert_eq!(record.fence, new_lease.fence);
    store
        .complete(&new_lease, "\"fresh\"".into(), Duration::from_secs(60))
        .await
        .unwrap();
    let runs = AtomicU32::new(0);
    let replay = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(replay.outcome, JobOutcome::Replayed(ref v) if v == "fresh"),
        "{replay:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_complete_refused_without_a_heartbeat_is_reported_as_a_lost_lease() {
    let (store, clock) = manual_store();
    let store = Arc::new(store);
    let guard = guard(store.clone());
    let run = guard
        .run(&key("k"), fp("p"), |_| {
            let store = store.clone();
            let clock = clock.clone();
            async move {
                // Taken over while we run, before any heartbeat.
                clock.advance(LEASE * 2);
                let request = ClaimRequest::new(unscoped("k"), fp("p"), LEASE);
                assert!(matches!(
                    store.claim(&request).await.unwrap(),
                    ClaimOutcome::Acquired { .. }
                ));
                Ok::<_, JobError>("stale".to_owned())
            }
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::LeaseLost { .. })),
        "{run:?}"
    );
    assert_eq!(
        store.get(&unscoped("k")).await.unwrap().unwrap().result,
        None
    );
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_a_job_of_three_leases_alive() {
    let (store, faults, clock) = faulty();
    let guard = guard(store.clone());
    assert_eq!(guard.heartbeat_interval(), LEASE / 3);
    let step = LEASE / 3;
    let run = guard
        .run(&key("long"), fp("p"), |ctx| {
            let store = store.clone();
            let clock = clock.clone();
            async move {
                for _ in 0..9 {
                    // Store time and tokio time move together, a third of a lease at a time.
                    clock.advance(step);
                    tokio::time::sleep(step).await;
                    let dup = ClaimRequest::new(unscoped("long"), fp("p"), LEASE);
                    match store.claim(&dup).await.unwrap() {
                        ClaimOutcome::InFlight { .. } => {}
                        other => panic!("the lease lapsed: {other:?}"),
                    }
                    assert!(!ctx.is_cancelled());
                }
                Ok::<_, JobError>(ctx.fence().get())
            }
        })
        .await;
    assert!(matches!(run.outcome, JobOutcome::Executed(_)), "{run:?}");
    let beats = faults.heartbeats.load(Ordering::SeqCst);
    assert!(beats >= 8, "{beats} heartbeats over three leases");
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_failing_for_a_whole_lease_cancels_the_job() {
    let (store, faults, _clock) = faulty();
    faults.heartbeat_down.store(true, Ordering::SeqCst);
    let guard = guard(store);
    let run = guard
        .run(&key("k"), fp("p"), |ctx| async move {
            ctx.cancelled().await;
            Err::<String, _>(JobError::transient("stopped: lease lost"))
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Transient(_))),
        "{run:?}"
    );
    assert!(faults.heartbeats.load(Ordering::SeqCst) >= 3);
}

/// The run's claim failed with a store error, and the delivery is to be retried.
fn assert_claim_failed_and_retried<T: std::fmt::Debug>(run: &idem_worker::Run<T>) {
    assert!(
        matches!(
            run.outcome,
            JobOutcome::Error(RunError::Store { op: "claim", .. })
        ),
        "{run:?}"
    );
    assert!(matches!(run.disposition, Disposition::Retry { .. }));
}

#[tokio::test]
async fn store_errors_at_the_claim_retry_or_dead_letter() {
    let (store, faults, _clock) = faulty();
    let guard = guard(store);
    let runs = AtomicU32::new(0);
    faults.claim_down.store(true, Ordering::SeqCst);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert_claim_failed_and_retried(&run);
    faults.claim_down.store(false, Ordering::SeqCst);
    faults.claim_corrupt.store(true, Ordering::SeqCst);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert_eq!(run.disposition, Disposition::DeadLetter);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A claim the store granted but whose answer was lost (a timeout) is sent again with the same
/// owner and answered that grant: the job runs now, instead of the key sitting in flight for a
/// whole lease with nothing running. Two lost answers in a row: the delivery is retried, and
/// the key waits out its lease.
#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_sent_again_and_runs() {
    let (store, faults, _clock) = faulty();
    let guard = guard(store.clone());
    let runs = AtomicU32::new(0);
    faults.claim_lost_replies.store(1, Ordering::SeqCst);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(matches!(run.outcome, JobOutcome::Executed(_)), "{run:?}");
    assert_eq!(run.disposition, Disposition::Ack);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(state_of(&store, "k").await, Some(State::Completed));

    faults.claim_lost_replies.store(2, Ordering::SeqCst);
    let run = guard.run(&key("k2"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert_claim_failed_and_retried(&run);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_result_the_store_cannot_take_keeps_the_claim_until_the_lease_ends() {
    let (store, faults, _clock) = faulty();
    faults.complete_down.store(true, Ordering::SeqCst);
    let guard = guard(store.clone());
    let runs = AtomicU32::new(0);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "x")).await;
    assert!(
        matches!(
            run.outcome,
            JobOutcome::Error(RunError::Store { op: "complete", .. })
        ),
        "{run:?}"
    );
    assert!(
        matches!(run.disposition, Disposition::Retry { after } if after >= LEASE / 2),
        "{run:?}"
    );
    // Not released: a retry before the lease ends must not run the effect again.
    assert_eq!(faults.releases.load(Ordering::SeqCst), 0);
    assert_eq!(state_of(&store, "k").await, Some(State::InFlight));
}

#[tokio::test]
async fn a_recorded_result_of_another_type_is_dead_lettered() {
    let guard = guard(Arc::new(MemoryStore::new()));
    let _ = guard
        .run(&key("k"), fp("p"), |_| async {
            Ok::<_, JobError>("text".to_owned())
        })
        .await;
    let run = guard
        .run(&key("k"), fp("p"), |_| async { Ok::<_, JobError>(1u32) })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Decode(_))),
        "{run:?}"
    );
    assert_eq!(run.disposition, Disposition::DeadLetter);
}

#[tokio::test]
async fn a_result_that_cannot_be_encoded_is_recorded_as_a_permanent_failure() {
    struct Unencodable;
    impl serde::Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }
    impl<'de> serde::Deserialize<'de> for Unencodable {
        fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
            Ok(Unencodable)
        }
    }
    let store = Arc::new(MemoryStore::new());
    let guard = guard(store.clone());
    let run = guard
        .run(&key("k"), fp("p"), |_| async {
            Ok::<_, JobError>(Unencodable)
        })
        .await;
    assert!(matches!(
        run.outcome,
        JobOutcome::Error(RunError::Encode(_))
    ));
    assert_eq!(run.disposition, Disposition::DeadLetter);
    assert_eq!(state_of(&store, "k").await, Some(State::Failed));
}

/// A result over the store's size limit cannot be recorded, and running the job again would
/// repeat its effect: the failure is recorded as permanent, every later delivery gets it, and
/// the message is dead-lettered.
#[tokio::test]
async fn a_result_over_the_stores_limit_is_recorded_as_a_permanent_failure() {
    let store = Arc::new(
        MemoryStore::builder()
            .shards(std::num::NonZeroUsize::MIN)
            .max_bytes(std::num::NonZeroUsize::new(4_096).unwrap())
            .build(),
    );
    let guard = guard(store.clone());
    let runs = AtomicU32::new(0);
    let big = "x".repeat(10_000);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, &big)).await;
    assert!(
        matches!(run.outcome, JobOutcome::Failed(ref failure) if failure.message.contains("over the store's limit")),
        "{run:?}"
    );
    assert_eq!(run.disposition, Disposition::DeadLetter);
    assert_eq!(state_of(&store, "k").await, Some(State::Failed));
    let again = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, &big)).await;
    assert!(matches!(again.outcome, JobOutcome::Failed(_)), "{again:?}");
    assert_eq!(again.disposition, Disposition::DeadLetter);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_context_carries_key_fence_and_delivery() {
    let guard = guard(Arc::new(MemoryStore::new()));
    let run = guard
        .run_delivery(&key("ctx"), fp("p"), 2, |ctx| async move {
            assert_eq!(ctx.key().as_str(), "ctx");
            assert_eq!(ctx.delivery(), 2);
            assert_eq!(ctx.lease_attempt(), 1);
            assert!(!ctx.is_cancelled());
            Ok::<_, JobError>(ctx.fence().get())
        })
        .await;
    assert!(matches!(run.outcome, JobOutcome::Executed(fence) if fence > 0));
}

#[test]
fn a_heartbeat_not_below_the_lease_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    assert!(
        JobGuard::builder(store.clone())
            .lease(Duration::from_secs(10))
            .heartbeat_interval(Duration::from_secs(10))
            .build()
            .is_err()
    );
    assert!(
        JobGuard::builder(store)
            .lease(Duration::ZERO)
            .build()
            .is_err()
    );
}

#[tokio::test]
async fn store_errors_inside_a_job_classify_by_retryability() {
    let transient: JobError = StoreError::unavailable("down").into();
    assert_eq!(transient.class(), idem_worker::ErrorClass::Transient);
    let unknown: JobError = StoreError::corrupt(&unscoped("k"), "bad").into();
    assert_eq!(unknown.class(), idem_worker::ErrorClass::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_lease_was_lost_while_it_waited_does_not_run_the_job() {
    let (store, clock) = manual_store();
    let store = Arc::new(store);
    let guard = guard(store.clone());
    let Admission::Claimed(claim) = guard.admit::<String>(&key("k"), fp("p"), 1).await else {
        panic!("the first admission claims");
    };
    let old_fence = claim.fence();
    // The claim waits (in a receiver's queue) past its lease; another attempt takes it over.
    clock.advance(LEASE + Duration::from_secs(1));
    let request = ClaimRequest::new(unscoped("k"), fp("p"), LEASE);
    let ClaimOutcome::Acquired {
        lease: new_lease, ..
    } = store.claim(&request).await.unwrap()
    else {
        panic!("the lapsed claim is taken over");
    };
    // The next heartbeat is refused: the claim's token fires before its job starts.
    tokio::time::sleep(guard.heartbeat_interval() + Duration::from_millis(1)).await;
    assert!(claim.context().is_cancelled(), "the heartbeat saw the loss");

    let runs = AtomicU32::new(0);
    let run = claim.run(|_| ok_job(&runs, "stale")).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a lost claim must not run its job: the new holder runs it"
    );
    let JobOutcome::Error(RunError::LeaseLost { fence, source }) = &run.outcome else {
        panic!("expected a lost lease, got {run:?}");
    };
    assert_eq!(*fence, old_fence);
    assert!(source.rejection().is_some(), "{source}");
    assert!(
        matches!(run.disposition, Disposition::Retry { .. }),
        "{run:?}"
    );
    // The new holder's record is untouched.
    let record = store.get(&unscoped("k")).await.unwrap().unwrap();
    assert_eq!(record.state, State::InFlight);
    assert_eq!(record.fence, new_lease.fence);
}

#[tokio::test(start_paused = true)]
async fn a_lease_too_long_for_the_clock_never_panics() {
    let store = Arc::new(MemoryStore::new());
    let guard = JobGuard::builder(store.clone())
        .lease(Duration::MAX)
        .build()
        .unwrap();
    let runs = AtomicU32::new(0);
    let run = guard.run(&key("k"), fp("p"), |_| ok_job(&runs, "v")).await;
    assert!(matches!(run.outcome, JobOutcome::Executed(_)), "{run:?}");
    let run = guard
        .run(&key("u"), fp("p"), |_| async {
            Err::<String, _>(JobError::unknown("timed out"))
        })
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::UnknownOutcome(_))),
        "{run:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_cancels_the_job_when_the_lease_ends_not_a_heartbeat_later() {
    let (store, faults, _clock) = faulty();
    faults.heartbeat_down.store(true, Ordering::SeqCst);
    // A heartbeat interval of two thirds of the lease: the second tick comes after the lease.
    let guard = JobGuard::builder(store)
        .lease(LEASE)
        .heartbeat_interval(LEASE * 2 / 3)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let run = guard
        .run(&key("k"), fp("p"), |ctx| async move {
            ctx.cancelled().await;
            Ok::<_, JobError>(started.elapsed())
        })
        .await;
    let Some(cancelled_after) = run.result().copied() else {
        panic!("the job ends once cancelled: {run:?}");
    };
    assert!(
        cancelled_after <= LEASE + Duration::from_millis(100),
        "the job learnt of the lost lease {cancelled_after:?} after its start (lease {LEASE:?})"
    );
    assert!(
        cancelled_after >= LEASE - Duration::from_millis(100),
        "{cancelled_after:?}"
    );
}
