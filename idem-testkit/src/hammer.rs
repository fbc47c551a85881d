//! The hammer: many tasks, the same keys, random delays, and a count of real executions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// How hard to hammer.
#[derive(Clone, Debug)]
pub struct HammerConfig {
    /// Concurrent tasks; each visits every key once, in its own random order.
    pub tasks: usize,
    /// Distinct keys.
    pub keys: usize,
    /// The longest random delay before a claim and inside the side effect.
    pub max_delay: Duration,
    /// One in this many grants gives the key back without running the effect (a transient
    /// failure before the side effect), so release and re-claim are hammered too. 0: never.
    pub release_one_in: u32,
    /// The lease of every claim: long, so no lease lapses during the run.
    pub lease: Duration,
    /// A prefix for the key names, so runs on a shared store do not collide.
    pub prefix: String,
}

impl Default for HammerConfig {
    /// 64 tasks x 1,000 keys, delays up to 2 ms, one grant in 10 released.
    fn default() -> Self {
        HammerConfig {
            tasks: 64,
            keys: 1_000,
            max_delay: Duration::from_millis(2),
            release_one_in: 10,
            lease: Duration::from_secs(600),
            prefix: "hammer".to_owned(),
        }
    }
}

/// What the hammer counted.
#[derive(Clone, Debug)]
pub struct HammerReport {
    /// Distinct keys.
    pub keys: usize,
    /// Real executions of the side effect, per key.
    pub executions: Vec<u32>,
    /// Claims that were granted (including those released again).
    pub acquired: u64,
    /// Attempts answered with the stored result.
    pub replayed: u64,
    /// Claims answered "in flight" (and retried).
    pub in_flight: u64,
    /// Grants given back without running the effect.
    pub released: u64,
}

/// `keys=.. executions=.. acquired=.. released=.. replayed=.. in_flight=..`, for a test's log.
impl std::fmt::Display for HammerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "keys={} executions={} acquired={} released={} replayed={} in_flight={}",
            self.keys,
            self.total_executions(),
            self.acquired,
            self.released,
            self.replayed,
            self.in_flight
        )
    }
}

impl HammerReport {
    /// Total executions of the side effect.
    #[must_use]
    pub fn total_executions(&self) -> u64 {
        self.executions.iter().map(|&n| u64::from(n)).sum()
    }

    /// Panics unless every key ran exactly once.
    ///
    /// # Panics
    /// If a key ran twice or never.
    pub fn assert_exactly_once(&self) {
        let twice: Vec<usize> = (0..self.keys).filter(|&k| self.executions[k] > 1).collect();
        let never: Vec<usize> = (0..self.keys)
            .filter(|&k| self.executions[k] == 0)
            .collect();
        assert!(
            twice.is_empty() && never.is_empty(),
            "{} keys ran more than once (first: {:?}), {} never ran; {self:?}",
            twice.len(),
            twice.first(),
            never.len()
        );
        assert_eq!(self.total_executions(), self.keys as u64);
    }
}

/// Runs `config.tasks` tasks, each claiming every one of `config.keys` keys in a nearly shared
/// order with random delays. The task that is granted a key runs the side effect (a counter per key)
/// and completes with the key's name as the result; every other attempt must be answered with
/// that result (checked) or "in flight" (retried).
///
/// # Panics
/// On a store error, or an answer that breaks the contract (a wrong result, a mismatch).
pub async fn hammer(store: Arc<dyn Store>, config: HammerConfig) -> HammerReport {
    let executions: Arc<Vec<AtomicU32>> =
        Arc::new((0..config.keys).map(|_| AtomicU32::new(0)).collect());
    let counters = Arc::new([0u8; 4].map(|_| AtomicU64::new(0)));
    let config = Arc::new(config);
    let tasks: Vec<_> = (0..config.tasks)
        .map(|task| {
            let store = Arc::clone(&store);
            let executions = Arc::clone(&executions);
            let counters = Arc::clone(&counters);
            let config = Arc::clone(&config);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(task as u64 ^ 0x1de_3000);
                // Every task walks the keys in nearly the same order (shuffled within windows
                // of 8), so many tasks reach a key at the same moment.
                let mut order: Vec<usize> = (0..config.keys).collect();
                for window in order.chunks_mut(8) {
                    window.shuffle(&mut rng);
                }
                for k in order {
                    one_key(&*store, &config, k, &executions[k], &counters, &mut rng).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a hammer task panicked");
    }
    let [acquired, replayed, in_flight, released] = &*counters;
    HammerReport {
        keys: config.keys,
        executions: executions
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .collect(),
        acquired: acquired.load(Ordering::SeqCst),
        replayed: replayed.load(Ordering::SeqCst),
        in_flight: in_flight.load(Ordering::SeqCst),
        released: released.load(Ordering::SeqCst),
    }
}

async fn pause(rng: &mut StdRng, max: Duration) {
    if rng.random_ratio(1, 8) && !max.is_zero() {
        let micros = rng.random_range(0..=max.as_micros().max(1));
        tokio::time::sleep(Duration::from_micros(u64::try_from(micros).unwrap_or(0))).await;
    } else {
        tokio::task::yield_now().await;
    }
}

async fn one_key(
    store: &dyn Store,
    config: &HammerConfig,
    k: usize,
    executions: &AtomicU32,
    [acquired, replayed, in_flight, released]: &[AtomicU64; 4],
    rng: &mut StdRng,
) {
    let name = format!("{}-{k}", config.prefix);
    let key = RecordKey::unscoped(IdempotencyKey::new(&name).expect("valid key"));
    let request = ClaimRequest::new(key, Fingerprint::of(&[name.as_bytes()]), config.lease);
    loop {
        pause(rng, config.max_delay).await;
        match store.claim(&request).await.expect("claim") {
            ClaimOutcome::Acquired { lease, .. } => {
                acquired.fetch_add(1, Ordering::Relaxed);
                if config.release_one_in > 0 && rng.random_ratio(1, config.release_one_in) {
                    store.release(&lease).await.expect("release");
                    released.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                executions.fetch_add(1, Ordering::SeqCst);
                pause(rng, config.max_delay).await;
                store
                    .complete(&lease, Bytes::from(name.clone()), Duration::from_secs(3600))
                    .await
                    .expect("complete");
                return;
            }
            ClaimOutcome::InFlight { retry_after } => {
                in_flight.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(retry_after.min(Duration::from_millis(1))).await;
            }
            ClaimOutcome::Completed(record) => {
                assert_eq!(
                    record.result.as_deref(),
                    Some(name.as_bytes()),
                    "a replay carried another key's result"
                );
                replayed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            other => panic!("unexpected answer for {name}: {other:?}"),
        }
    }
}
