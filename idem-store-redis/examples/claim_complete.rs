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
//!
//! `--mode` chooses what one cycle is, so that the store and its plain-command baselines run on
//! the same client, the same connection type and the same concurrency:
//! - `cycle` (the default): a claim of a new key and its complete (a 100-byte result);
//! - `replay`: a claim of one of 1,000 keys completed beforehand (answered with the record);
//! - `plain`: `SET key v NX PX` then `SET key v' PX` of values as long as the store's in-flight
//!   and completed records, on a connection manager like the store's;
//! - `get`: a `GET` of one of 1,000 values as long as the completed record.

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
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cycle,
    Replay,
    Plain,
    Get,
}

/// Keys a replay or a `GET` run reads, round robin.
const READ_KEYS: u64 = 1000;

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "redis://127.0.0.1:6379".to_owned(),
        tasks: 1,
        seconds: 5.0,
        cluster: false,
        threads: 1,
        mode: Mode::Cycle,
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
            "--mode" => {
                args.mode = match value()?.as_str() {
                    "cycle" => Mode::Cycle,
                    "replay" => Mode::Replay,
                    "plain" => Mode::Plain,
                    "get" => Mode::Get,
                    other => return Err(format!("--mode: unknown mode {other}")),
                }
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

/// A claim request for the key `name`.
fn claim_request(name: &str) -> Result<ClaimRequest, Box<dyn std::error::Error + Send + Sync>> {
    let key = RecordKey::unscoped(IdempotencyKey::new(name)?);
    Ok(ClaimRequest::new(
        key,
        Fingerprint::of(&[name.as_bytes()]),
        Duration::from_secs(30),
    ))
}

/// Claims and completes `name`; the Redis key of its record.
async fn claim_and_complete(
    store: &RedisStore,
    name: &str,
    result: &Bytes,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let request = claim_request(name)?;
    match store.claim(&request).await? {
        ClaimOutcome::Acquired { lease, .. } => {
            store
                .complete(&lease, result.clone(), Duration::from_secs(600))
                .await?;
        }
        ClaimOutcome::Completed(_) => {}
        other => return Err(format!("unexpected {other:?}").into()),
    }
    Ok(store.redis_key(&request.key))
}

/// What every task shares.
struct Shared {
    store: RedisStore,
    plain: redis::aio::ConnectionManager,
    namespace: String,
    result: Bytes,
    /// The lengths of the store's in-flight and completed values, for the plain baselines.
    sizes: (usize, usize),
}

/// One cycle of `mode`: the `i`th of task `task` in `phase`.
async fn cycle(
    shared: &Shared,
    mode: Mode,
    phase: &str,
    task: usize,
    i: u64,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut conn = shared.plain.clone();
    match mode {
        Mode::Cycle => {
            claim_and_complete(
                &shared.store,
                &format!("{phase}-{task}-{i}"),
                &shared.result,
            )
            .await?;
        }
        Mode::Replay => {
            let name = format!("read-{}", (i * 7 + task as u64) % READ_KEYS);
            match shared.store.claim(&claim_request(&name)?).await? {
                ClaimOutcome::Completed(_) => {}
                other => return Err(format!("unexpected {other:?}").into()),
            }
        }
        Mode::Plain => {
            let key = format!("idem:{{{}::{phase}-{task}-{i}}}", shared.namespace);
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(vec![b'i'; shared.sizes.0])
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut conn)
                .await?;
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(vec![b'c'; shared.sizes.1])
                .arg("PX")
                .arg(600_000)
                .query_async(&mut conn)
                .await?;
        }
        Mode::Get => {
            let key = format!(
                "idem:{{{}::get-{}}}",
                shared.namespace,
                (i * 7 + task as u64) % READ_KEYS
            );
            let value: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
            if value.len() != shared.sizes.1 {
                return Err("a GET read another value".into());
            }
        }
    }
    Ok(())
}

/// The length of the value at `redis_key`.
async fn strlen(
    conn: &mut redis::aio::ConnectionManager,
    redis_key: &str,
) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    Ok(redis::cmd("STRLEN")
        .arg(redis_key)
        .query_async(conn)
        .await?)
}

/// The store, a plain connection, the sizes of the store's values, and the keys a replay or a
/// `GET` run reads.
async fn prepare(args: &Args) -> Result<Shared, Box<dyn std::error::Error + Send + Sync>> {
    let namespace = format!("bench{}", std::process::id());
    let config = if args.cluster {
        RedisConfig::cluster(args.url.split(','))?
    } else {
        RedisConfig::new(args.url.clone())?
    }
    .with_namespace(namespace.clone())?;
    let store = RedisStore::connect(config).await?;
    let seed = args.url.split(',').next().unwrap_or_default();
    let mut plain = redis::Client::open(seed)?.get_connection_manager().await?;
    let result = Bytes::from(vec![b'x'; 100]);
    let held = claim_request("size-probe-in-flight")?;
    let ClaimOutcome::Acquired { .. } = store.claim(&held).await? else {
        return Err("the probe key is taken".into());
    };
    let in_flight = strlen(&mut plain, &store.redis_key(&held.key)).await?;
    let completed = claim_and_complete(&store, "size-probe-completed", &result).await?;
    let completed = strlen(&mut plain, &completed).await?;
    for n in 0..READ_KEYS {
        claim_and_complete(&store, &format!("read-{n}"), &result).await?;
        let () = redis::cmd("SET")
            .arg(format!("idem:{{{namespace}::get-{n}}}"))
            .arg(vec![b'c'; completed])
            .arg("PX")
            .arg(600_000)
            .query_async(&mut plain)
            .await?;
    }
    Ok(Shared {
        store,
        plain,
        namespace,
        result,
        sizes: (in_flight, completed),
    })
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let shared = Arc::new(prepare(&args).await.map_err(|e| e.to_string())?);
    let mode = args.mode;
    // A short warm-up, then the measured run.
    let mut warmup_cycles = 0;
    for (phase, seconds) in [("warm-up", 0.5), ("run", args.seconds)] {
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = (0..args.tasks)
            .map(|task| {
                let (shared, stop, cycles) =
                    (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&cycles));
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        cycle(&shared, mode, phase, task, i).await?;
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
                 warmup_cycles={warmup_cycles} in_flight_bytes={} completed_bytes={}",
                args.tasks,
                done as f64 / elapsed,
                shared.sizes.0,
                shared.sizes.1,
            );
        } else {
            warmup_cycles = done;
        }
    }
    Ok(())
}
