//! A burst of duplicated jobs through [`MemoryStore`], from many tasks at once.
//!
//! Every job names a business operation (`job:{n}`) and is delivered several times, in random
//! order, from many tokio tasks: the way a queue redelivers after a crash or a client retries
//! after a timeout. Each delivery claims its key; the one that acquires it runs the side effect
//! (increments that key's counter) and completes; a delivery that finds the first one still in
//! flight waits and retries; every other delivery is answered from the record.
//!
//! At the end it prints what happened and exits non-zero if any key's side effect ran more
//! than once (or never). Run `cargo run -p idem-example-burst -- --help` for the flags.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_memory::MemoryStore;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// How long a claim holds the key before another delivery may take it over.
const LEASE: Duration = Duration::from_secs(30);
/// How long a completed job's result is kept to answer duplicates.
const RETENTION: Duration = Duration::from_secs(3600);
/// How long a delivery that met an in-flight claim waits before it claims again.
const RETRY_DELAY: Duration = Duration::from_millis(1);

const USAGE: &str = "\
usage: cargo run -p idem-example-burst -- [--jobs N] [--keys N] [--tasks N] [--work-us N] [--seed N]

  --jobs N      deliveries in the burst (default 10000)
  --keys N      distinct business keys they name (default 1000)
  --tasks N     tokio tasks delivering at once (default 64)
  --work-us N   how long the side effect takes, in microseconds (default 1000)
  --seed N      seed of the delivery order (default: random)";

/// The burst to run.
#[derive(Debug)]
struct Config {
    jobs: usize,
    keys: usize,
    tasks: usize,
    work: Duration,
    seed: u64,
}

impl Config {
    /// Reads the flags; `Ok(None)` after printing the usage for `--help`.
    fn from_args(args: impl Iterator<Item = String>) -> Result<Option<Self>, Box<dyn Error>> {
        let mut config = Config {
            jobs: 10_000,
            keys: 1_000,
            tasks: 64,
            work: Duration::from_micros(1_000),
            seed: rand::rng().random(),
        };
        let mut args = args.skip(1);
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                println!("{USAGE}");
                return Ok(None);
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n\n{USAGE}"))?;
            let number = |what: &str| -> Result<u64, Box<dyn Error>> {
                value
                    .parse()
                    .map_err(|_| format!("{what} must be a whole number, not {value:?}").into())
            };
            match flag.as_str() {
                "--jobs" => config.jobs = usize::try_from(number("--jobs")?)?,
                "--keys" => config.keys = usize::try_from(number("--keys")?)?,
                "--tasks" => config.tasks = usize::try_from(number("--tasks")?)?,
                "--work-us" => config.work = Duration::from_micros(number("--work-us")?),
                "--seed" => config.seed = number("--seed")?,
                other => return Err(format!("unknown flag {other}\n\n{USAGE}").into()),
            }
        }
        if config.keys == 0 || config.tasks == 0 || config.jobs < config.keys {
            return Err(format!(
                "need at least one key and one task, and at least as many jobs as keys\n\n{USAGE}"
            )
            .into());
        }
        Ok(Some(config))
    }
}

/// What the deliveries saw, counted across tasks.
#[derive(Debug, Default)]
struct Tally {
    executed: AtomicUsize,
    replayed: AtomicUsize,
    collisions: AtomicUsize,
    taken_over: AtomicUsize,
}

/// One business operation: its key, its fingerprint and its side-effect counter.
#[derive(Debug)]
struct Operation {
    request: ClaimRequest,
    effects: AtomicU32,
}

/// Everything the delivering tasks share.
#[derive(Debug)]
struct Burst {
    store: MemoryStore,
    operations: Vec<Operation>,
    /// The delivery order: indexes into `operations`, each key several times.
    deliveries: Vec<usize>,
    /// The next delivery to take.
    next: AtomicUsize,
    work: Duration,
    tally: Tally,
}

impl Burst {
    fn new(config: &Config) -> Result<Self, Box<dyn Error>> {
        let operations = (0..config.keys)
            .map(|n| {
                let key = RecordKey::unscoped(IdempotencyKey::new(format!("job:{n}"))?);
                let fingerprint = Fingerprint::of(&[b"burst-job", &n.to_be_bytes()]);
                Ok(Operation {
                    request: ClaimRequest::new(key, fingerprint, LEASE),
                    effects: AtomicU32::new(0),
                })
            })
            .collect::<Result<Vec<_>, Box<dyn Error>>>()?;
        // Every key at least once, the rest spread over the keys, then shuffled: duplicates
        // land anywhere, some right behind the first delivery while it is still in flight.
        let mut deliveries: Vec<usize> = (0..config.jobs).map(|i| i % config.keys).collect();
        deliveries.shuffle(&mut StdRng::seed_from_u64(config.seed));
        Ok(Burst {
            store: MemoryStore::new(),
            operations,
            deliveries,
            next: AtomicUsize::new(0),
            work: config.work,
            tally: Tally::default(),
        })
    }

    /// One task: takes deliveries until none are left.
    async fn deliver_all(&self) -> Result<(), String> {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&operation) = self.deliveries.get(index) else {
                return Ok(());
            };
            self.deliver(&self.operations[operation]).await?;
        }
    }

    /// One delivery of `operation`: claim, then run and complete, or take the recorded answer.
    async fn deliver(&self, operation: &Operation) -> Result<(), String> {
        let key = &operation.request.key;
        loop {
            let outcome = self
                .store
                .claim(&operation.request)
                .await
                .map_err(|e| format!("claim {key}: {e}"))?;
            match outcome {
                ClaimOutcome::Acquired { lease, taken_over } => {
                    if taken_over {
                        self.tally.taken_over.fetch_add(1, Ordering::Relaxed);
                    }
                    // The side effect, exactly once per key if idem does its job.
                    operation.effects.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(self.work).await;
                    self.store
                        .complete(&lease, result_of(key), RETENTION)
                        .await
                        .map_err(|e| format!("complete {key}: {e}"))?;
                    self.tally.executed.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                ClaimOutcome::InFlight { retry_after } => {
                    // The first delivery is still running: come back once it may be done.
                    self.tally.collisions.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(retry_after.min(RETRY_DELAY)).await;
                }
                ClaimOutcome::Completed(record) => {
                    if record.result != Some(result_of(key)) {
                        return Err(format!("{key}: replayed {:?}", record.result));
                    }
                    self.tally.replayed.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                other => return Err(format!("{key}: unexpected answer {}", other.kind())),
            }
        }
    }
}

/// The result a job records, and every duplicate must be answered with.
fn result_of(key: &RecordKey) -> Bytes {
    Bytes::from(format!("done {key}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

/// Runs the burst and prints the report; a failure exit code if a key ran twice or never.
async fn run() -> Result<ExitCode, Box<dyn Error>> {
    let Some(config) = Config::from_args(std::env::args())? else {
        return Ok(ExitCode::SUCCESS);
    };
    let burst = Arc::new(Burst::new(&config)?);

    let started = Instant::now();
    let tasks: Vec<_> = (0..config.tasks)
        .map(|_| {
            let burst = Arc::clone(&burst);
            tokio::spawn(async move { burst.deliver_all().await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();

    let effects: Vec<u32> = burst
        .operations
        .iter()
        .map(|op| op.effects.load(Ordering::SeqCst))
        .collect();
    let max = effects.iter().copied().max().unwrap_or(0);
    let min = effects.iter().copied().min().unwrap_or(0);
    let ran_twice = effects.iter().filter(|&&n| n > 1).count();
    let never_ran = effects.iter().filter(|&&n| n == 0).count();
    let tally = &burst.tally;

    println!(
        "burst: {} jobs over {} distinct keys from {} tasks on MemoryStore (seed {})",
        config.jobs, config.keys, config.tasks, config.seed
    );
    println!("  jobs                               {:>8}", config.jobs);
    println!("  distinct keys                      {:>8}", config.keys);
    println!(
        "  executed (side effect ran)         {:>8}",
        tally.executed.load(Ordering::Relaxed)
    );
    println!(
        "  answered as duplicates (replayed)  {:>8}",
        tally.replayed.load(Ordering::Relaxed)
    );
    println!(
        "  in-flight collisions retried       {:>8}",
        tally.collisions.load(Ordering::Relaxed)
    );
    println!(
        "  leases taken over                  {:>8}",
        tally.taken_over.load(Ordering::Relaxed)
    );
    println!("  elapsed                            {elapsed:>8.1?}");
    println!("effects per key: max {max} (min {min})");

    if ran_twice > 0 || never_ran > 0 {
        eprintln!("FAILED: {ran_twice} keys ran more than once, {never_ran} keys never ran");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
