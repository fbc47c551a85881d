//! Claim + complete cycles per second of `RedbStore` at 1 and 16 tasks, next to plain redb
//! (one insert and one update per cycle, each its own durable write transaction), in one run
//! (`bench/stores.sh` runs it).
//!
//! ```text
//! cargo run --release -p idem-store-redb --example redb_claim_complete
//! SECONDS_PER_RUN=10 TASKS="1 16 64" cargo run --release -p idem-store-redb --example redb_claim_complete
//! ```
//!
//! The files live in a temporary directory (`IDEM_BENCH_DIR` to choose the disk), removed at
//! the end. Every commit is fsync'd (`Durability::Immediate`) in both cases. The baseline is
//! measured twice: with redb's defaults, and with quick repair on every commit as the store
//! does.

use std::error::Error;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_redb::RedbStore;
use redb::{Database, Durability, TableDefinition};

type BoxError = Box<dyn Error + Send + Sync>;

const PLAIN: TableDefinition<&str, &[u8]> = TableDefinition::new("plain");

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// The store: `tasks` tokio tasks sharing one store, for `for_how_long`; cycles per second.
async fn store_rate(
    store: &RedbStore,
    tasks: usize,
    for_how_long: Duration,
    round: usize,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let runs: Vec<_> = (0..tasks)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while started.elapsed() < for_how_long {
                    let name = format!("s{round}-{task}-{done}");
                    let request = ClaimRequest::new(
                        RecordKey::unscoped(IdempotencyKey::new(&name)?),
                        Fingerprint::of(&[name.as_bytes()]),
                        Duration::from_secs(30),
                    );
                    let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else {
                        return Err::<u64, BoxError>(format!("{name} was not acquired").into());
                    };
                    store
                        .complete(
                            &lease,
                            Bytes::from_static(b"result"),
                            Duration::from_secs(3600),
                        )
                        .await?;
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Plain redb: `threads` threads, each cycle an insert and an update in two durable write
/// transactions; cycles per second.
fn plain_rate(
    db: &Arc<Database>,
    threads: usize,
    for_how_long: Duration,
    round: usize,
    quick_repair: bool,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let runs: Vec<_> = (0..threads)
        .map(|thread| {
            let db = Arc::clone(db);
            std::thread::spawn(move || {
                let mut done = 0u64;
                let write = |key: &str, value: &[u8]| -> Result<(), BoxError> {
                    let mut txn = db.begin_write()?;
                    txn.set_durability(Durability::Immediate)?;
                    txn.set_quick_repair(quick_repair);
                    txn.open_table(PLAIN)?.insert(key, value)?;
                    txn.commit()?;
                    Ok(())
                };
                while started.elapsed() < for_how_long {
                    let key = format!("p{round}-{quick_repair}-{thread}-{done}");
                    write(&key, b"in_flight")?;
                    write(&key, b"completed:result")?;
                    done += 1;
                }
                Ok::<u64, BoxError>(done)
            })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.join().map_err(|_| "a baseline thread panicked")??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seconds: u64 = env_or("SECONDS_PER_RUN", "5").parse()?;
    let tasks: Vec<usize> = env_or("TASKS", "1 16")
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let for_how_long = Duration::from_secs(seconds);
    let dir = match std::env::var_os("IDEM_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let store = RedbStore::open(dir.path().join("store.redb"))?;
    let plain = Arc::new(Database::create(dir.path().join("plain.redb"))?);
    println!(
        "redb, {} cores, {seconds}s per run, files in {}",
        std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        dir.path().display()
    );
    println!(
        "{:>6} {:>14} {:>14} {:>7} {:>18} {:>7}",
        "tasks", "store c/s", "baseline c/s", "ratio", "baseline+qr c/s", "ratio"
    );
    for (round, &n) in tasks.iter().enumerate() {
        let store_rate = store_rate(&store, n, for_how_long, round).await?;
        let plain = Arc::clone(&plain);
        let (plain_default, plain_quick) = tokio::task::spawn_blocking(move || {
            Ok::<_, BoxError>((
                plain_rate(&plain, n, for_how_long, round, false)?,
                plain_rate(&plain, n, for_how_long, round, true)?,
            ))
        })
        .await??;
        println!(
            "{n:>6} {store_rate:>14.0} {plain_default:>14.0} {:>7.2} {plain_quick:>18.0} {:>7.2}",
            store_rate / plain_default,
            store_rate / plain_quick
        );
    }
    Ok(())
}
