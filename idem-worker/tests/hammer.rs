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
