//! The concurrency hammer: many tasks deliver the same keys at once, some attempts fail
//! transiently before their effect, and every key's effect runs exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use idem_core::{Fingerprint, IdempotencyKey};
use idem_store_memory::MemoryStore;
use idem_worker::{Disposition, JobError, JobGuard, JobOutcome};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const TASKS: usize = 32;
const KEYS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_on_the_same_keys_execute_each_key_once() {
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("hammer")
        .build()
        .unwrap();
    let effects: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let replays = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let guard = guard.clone();
        let effects = effects.clone();
        let replays = replays.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(task as u64);
            let mut order: Vec<usize> = (0..KEYS).collect();
            order.shuffle(&mut rng);
            for index in order {
                let key = IdempotencyKey::new(format!("job:{index}")).unwrap();
                let fingerprint = Fingerprint::of(&[index.to_string().as_bytes()]);
                let mut delivery = 1;
                loop {
                    let fail_first = rng.random_ratio(1, 8);
                    let effects = effects.clone();
                    let run = guard
                        .run_delivery(&key, fingerprint, delivery, |_ctx| async move {
                            if fail_first {
                                return Err(JobError::transient("refused before the effect"));
                            }
                            effects[index].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            Ok(index)
                        })
                        .await;
                    match (&run.outcome, run.disposition) {
                        (JobOutcome::Executed(v) | JobOutcome::Replayed(v), Disposition::Ack) => {
                            assert_eq!(*v, index);
                            if matches!(run.outcome, JobOutcome::Replayed(_)) {
                                replays.fetch_add(1, Ordering::Relaxed);
                            }
                            break;
                        }
                        (_, Disposition::Retry { .. }) => {
                            // No real backoff in a hammer: deliver again at once.
                            delivery = (delivery + 1).min(5);
                            tokio::task::yield_now().await;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let executions: Vec<u32> = effects.iter().map(|e| e.load(Ordering::SeqCst)).collect();
    let total: u32 = executions.iter().sum();
    assert_eq!(total as usize, KEYS, "real executions == keys");
    assert!(executions.iter().all(|&n| n == 1), "{executions:?}");
    assert!(replays.load(Ordering::Relaxed) > 0);
}

/// Many tasks deliver the same keys while attempts lose the answer of their effect (after it
/// happened, or before it left): each such attempt records the key as unknown, no delivery runs
/// it again, and the task that meets the unknown record reconciles it (completed if the effect
/// happened, released if not). Every key's effect runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_outcomes_never_run_a_key_twice() {
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("hammer-unknown")
        .build()
        .unwrap();
    let effects: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let resolutions = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let guard = guard.clone();
        let effects = effects.clone();
        let resolutions = resolutions.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + task as u64);
            let mut order: Vec<usize> = (0..KEYS).collect();
            order.shuffle(&mut rng);
            for index in order {
                let key = IdempotencyKey::new(format!("job:{index}")).unwrap();
                let fingerprint = Fingerprint::of(&[index.to_string().as_bytes()]);
                let mut delivery = 1;
                for _ in 0..10_000 {
                    let lost_after = rng.random_ratio(1, 6);
                    let lost_before = !lost_after && rng.random_ratio(1, 5);
                    let job_effects = effects.clone();
                    let run = guard
                        .run_delivery(&key, fingerprint, delivery, |_ctx| async move {
                            if lost_before {
                                return Err(JobError::unknown("timed out before sending"));
                            }
                            job_effects[index].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            if lost_after {
                                return Err(JobError::unknown("timed out after sending"));
                            }
                            Ok(index)
                        })
                        .await;
                    match (&run.outcome, run.disposition) {
                        (JobOutcome::Executed(v) | JobOutcome::Replayed(v), Disposition::Ack) => {
                            assert_eq!(*v, index);
                            break;
                        }
                        (JobOutcome::Unknown { fence, .. }, Disposition::DeadLetter) => {
                            // The reconciler: the ledger (the effect counter) tells.
                            let resolved = if effects[index].load(Ordering::SeqCst) > 0 {
                                guard.resolve_completed(&key, *fence, &index).await.err()
                            } else {
                                guard
                                    .resolve_released(&key, *fence)
                                    .await
                                    .err()
                                    .map(|source| idem_worker::RunError::Store {
                                        op: "resolve_released",
                                        source,
                                    })
                            };
                            match resolved {
                                None => {
                                    resolutions.fetch_add(1, Ordering::Relaxed);
                                }
                                // Another task resolved it first.
                                Some(idem_worker::RunError::Store { source, .. })
                                    if source.rejection().is_some() => {}
                                Some(other) => panic!("resolution failed: {other}"),
                            }
                        }
                        (
                            JobOutcome::Error(idem_worker::RunError::UnknownOutcome(_)),
                            Disposition::DeadLetter,
                        ) => {}
                        (_, Disposition::Retry { .. }) => {
                            delivery = (delivery + 1).min(5);
                            tokio::task::yield_now().await;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let executions: Vec<u32> = effects.iter().map(|e| e.load(Ordering::SeqCst)).collect();
    let total: u32 = executions.iter().sum();
    assert_eq!(total as usize, KEYS, "real executions == keys");
    assert!(executions.iter().all(|&n| n == 1), "{executions:?}");
    assert!(
        resolutions.load(Ordering::Relaxed) > 0,
        "no unknown outcome was met"
    );
}
