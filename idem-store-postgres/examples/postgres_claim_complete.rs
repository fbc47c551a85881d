//! Claim + complete cycles per second of `PostgresStore` at 1 and 16 tasks, next to a plain
//! `INSERT` + `UPDATE` with the same driver and pool, in one run (`bench/stores.sh` runs it).
//!
//! ```text
//! cargo run --release -p idem-store-postgres --example postgres_claim_complete
//! SECONDS_PER_RUN=10 TASKS="1 16 64" IDEM_BENCH_POSTGRES_URL=postgres://... cargo run ...
//! ```
//!
//! Works in a schema of its own (`idem_bench_<random>`), dropped at the end. Each cycle is two
//! statements and two commits in both cases: the store's claim and complete, or the baseline's
//! insert and update of one row, on a new key every cycle.

use std::error::Error;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_postgres::{PostgresConfig, PostgresStore};

type BoxError = Box<dyn Error + Send + Sync>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Runs `cycle(task, i)` from `tasks` tasks for `for_how_long`; returns cycles per second.
async fn measure<F, Fut>(tasks: usize, for_how_long: Duration, cycle: F) -> Result<f64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let cycle = Arc::new(cycle);
    let started = Instant::now();
    let runs: Vec<_> = (0..tasks)
        .map(|task| {
            let cycle = Arc::clone(&cycle);
            tokio::spawn(async move {
                let mut done = 0u64;
                while started.elapsed() < for_how_long {
                    cycle(task, done).await?;
                    done += 1;
                }
                Ok::<u64, BoxError>(done)
            })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = env_or(
        "IDEM_BENCH_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let seconds: u64 = env_or("SECONDS_PER_RUN", "5").parse()?;
    let tasks: Vec<usize> = env_or("TASKS", "1 16")
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let for_how_long = Duration::from_secs(seconds);
    let schema = format!("idem_bench_{:08x}", rand::random::<u32>());
    let pool_size = tasks.iter().copied().max().unwrap_or(1).max(1);
    let config = PostgresConfig::new(&url)?
        .with_schema(&schema)?
        .with_pool_size(NonZeroUsize::new(pool_size).unwrap_or(NonZeroUsize::MIN));
    let store = PostgresStore::connect(config).await?;
    let client = store.pool().get().await?;
    let version: String = client
        .query_one("SHOW server_version", &[])
        .await?
        .try_get(0)?;
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.plain (k text PRIMARY KEY, state text NOT NULL, result bytea)"
        ))
        .await?;
    drop(client);
    println!(
        "postgres {version}, {} cores, {seconds}s per run, pool of {pool_size}",
        std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
    );
    println!(
        "{:>6} {:>14} {:>14} {:>7}",
        "tasks", "store c/s", "baseline c/s", "ratio"
    );
    for (round, &n) in tasks.iter().enumerate() {
        let s = store.clone();
        let store_rate = measure(n, for_how_long, move |task, i| {
            let s = s.clone();
            async move {
                let name = format!("s{round}-{task}-{i}");
                let request = ClaimRequest::new(
                    RecordKey::unscoped(IdempotencyKey::new(&name)?),
                    Fingerprint::of(&[name.as_bytes()]),
                    Duration::from_secs(30),
                );
                let ClaimOutcome::Acquired { lease, .. } = s.claim(&request).await? else {
                    return Err(format!("{name} was not acquired").into());
                };
                s.complete(
                    &lease,
                    Bytes::from_static(b"result"),
                    Duration::from_secs(3600),
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        let pool = store.pool().clone();
        let insert = format!("INSERT INTO {schema}.plain (k, state) VALUES ($1, 'in_flight')");
        let update =
            format!("UPDATE {schema}.plain SET state = 'completed', result = $2 WHERE k = $1");
        let plain_rate = measure(n, for_how_long, move |task, i| {
            let pool = pool.clone();
            let (insert, update) = (insert.clone(), update.clone());
            async move {
                let name = format!("p{round}-{task}-{i}");
                let client = pool.get().await?;
                let statement = client.prepare_cached(&insert).await?;
                client.execute(&statement, &[&name]).await?;
                let statement = client.prepare_cached(&update).await?;
                client
                    .execute(&statement, &[&name, &&b"result"[..]])
                    .await?;
                Ok(())
            }
        })
        .await?;
        println!(
            "{n:>6} {store_rate:>14.0} {plain_rate:>14.0} {:>7.2}",
            store_rate / plain_rate
        );
    }
    let client = store.pool().get().await?;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok(())
}
