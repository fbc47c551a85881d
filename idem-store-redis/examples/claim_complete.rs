//! Claim + complete cycles per second against a Redis server, from N concurrent tasks sharing
//! one store (one multiplexed connection). Driven by `bench/redis.sh`, which runs it next to
//! `redis-benchmark` on the same server.
//!
//! ```text
//! cargo run --release -p idem-store-redis --example claim_complete -- \
//!     --url redis://127.0.0.1:6379 --tasks 16 --seconds 5
//! ```
//!
//! Prints one line: `tasks=16 cycles=... seconds=... cycles_per_sec=... warmup_cycles=...`. `--threads N` sets
//! the runtime's worker threads (default 1, like `redis-benchmark`); `--cluster` takes a
//! comma-separated seed list as `--url`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_redis::{RedisConfig, RedisStore};

struct Args {
    url: String,
    tasks: usize,
    seconds: f64,
    cluster: bool,
    threads: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "redis://127.0.0.1:6379".to_owned(),
        tasks: 1,
        seconds: 5.0,
        cluster: false,
        threads: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--tasks" => args.tasks = value()?.parse().map_err(|e| format!("--tasks: {e}"))?,
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?;
            }
            "--cluster" => args.cluster = true,
            "--threads" => {
                args.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.threads == 0 || args.tasks == 0 || args.seconds.is_nan() || args.seconds <= 0.0 {
        return Err("--threads, --tasks and --seconds must be positive".to_owned());
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    // One runtime thread by default, like redis-benchmark: on a small machine the client then
    // leaves the other cores to the server.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let namespace = format!("bench{}", std::process::id());
    let config = if args.cluster {
        RedisConfig::cluster(args.url.split(','))?
    } else {
        RedisConfig::new(args.url.clone())?
    }
    .with_namespace(namespace)?;
    let store = Arc::new(RedisStore::connect(config).await?);
    let result = Bytes::from(vec![b'x'; 100]);

    // A short warm-up, then the measured run.
    let mut warmup_cycles = 0;
    for (phase, seconds) in [("warm-up", 0.5), ("run", args.seconds)] {
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = (0..args.tasks)
            .map(|task| {
                let (store, stop, cycles, result) = (
                    Arc::clone(&store),
                    Arc::clone(&stop),
                    Arc::clone(&cycles),
                    result.clone(),
                );
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let name = format!("{phase}-{task}-{i}");
                        let key = RecordKey::unscoped(IdempotencyKey::new(&name)?);
                        let request = ClaimRequest::new(
                            key,
                            Fingerprint::of(&[name.as_bytes()]),
                            Duration::from_secs(30),
                        );
                        match store.claim(&request).await? {
                            ClaimOutcome::Acquired { lease, .. } => {
                                store
                                    .complete(&lease, result.clone(), Duration::from_secs(60))
                                    .await?;
                            }
                            other => return Err(format!("unexpected {other:?}").into()),
                        }
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await?.map_err(|e| e.to_string())?;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let done = cycles.load(Ordering::Relaxed);
        if phase == "run" {
            println!(
                "tasks={} cycles={done} seconds={elapsed:.2} cycles_per_sec={:.0} \
                 warmup_cycles={warmup_cycles}",
                args.tasks,
                done as f64 / elapsed
            );
        } else {
            warmup_cycles = done;
        }
    }
    Ok(())
}
