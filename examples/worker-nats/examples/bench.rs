//! Jobs per second of a JetStream consumer with and without the guard, in one run: the
//! benchmark `bench/worker.sh` runs.
//!
//! Each round publishes `--jobs` messages with distinct keys onto a fresh stream, then consumes
//! them with [`worker_nats::consume`] (`--concurrency` at a time, `double_ack` for each) and
//! times it until every job ran:
//! - `bare`: the handler runs the job (a counter) and acks;
//! - `guard`: the handler runs the same job through a `JobGuard` on the Redis store (a claim
//!   and a complete: two EVALSHA round trips per job) and acks.
//!
//! The rounds alternate, `--rounds` of each; the best of each side is reported, and the ratio.
//!
//! ```text
//! cargo run --release -p worker-nats --example bench -- --jobs 20000 --concurrency 64 --rounds 3
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Bytes, IdempotencyKey};
use idem_store_redis::{RedisConfig, RedisStore};
use idem_worker::{Disposition, JobError, JobGuard};
use tokio_util::sync::CancellationToken;
use worker_nats::{Error, consume, ensure_consumer};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut jobs = 20_000u64;
    let mut concurrency = 64usize;
    let mut rounds = 3u32;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or("a flag needs a value")?;
        match flag.as_str() {
            "--jobs" => jobs = value.parse()?,
            "--concurrency" => concurrency = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let env =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let nats_url = env("IDEM_TEST_NATS_URL", "127.0.0.1:4222");
    let redis_url = env("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let client = async_nats::connect(&nats_url).await?;
    let run = std::process::id();
    let store = RedisStore::connect(
        RedisConfig::new(redis_url.clone())?.with_namespace(format!("bench.worker.{run}"))?,
    )
    .await?;
    let guard = JobGuard::builder(Arc::new(store))
        .job_type("bench")
        .store_label("redis")
        .retention(Duration::from_secs(120))
        .build()?;

    println!(
        "worker bench: {jobs} jobs, concurrency {concurrency}, best of {rounds} rounds; NATS {nats_url}, Redis {redis_url}"
    );
    let (mut best_bare, mut best_guard) = (0f64, 0f64);
    for round in 0..rounds {
        for guarded in [false, true] {
            let name = format!(
                "BENCH_{run}_{round}_{}",
                if guarded { "guard" } else { "bare" }
            );
            let rate = one_round(
                &client,
                &name,
                jobs,
                concurrency,
                guarded.then(|| guard.clone()),
            )
            .await?;
            println!(
                "  round {round} {:<5}: {rate:>9.0} jobs/s",
                if guarded { "guard" } else { "bare" }
            );
            if guarded {
                best_guard = best_guard.max(rate);
            } else {
                best_bare = best_bare.max(rate);
            }
        }
    }
    println!("bare consumer:            {best_bare:>9.0} jobs/s");
    println!("consumer + guard (Redis): {best_guard:>9.0} jobs/s");
    println!("ratio guard/bare:         {:>9.2}", best_guard / best_bare);
    Ok(())
}

/// Publishes `jobs` messages on a fresh stream `name` and times their consumption.
async fn one_round(
    client: &async_nats::Client,
    name: &str,
    jobs: u64,
    concurrency: usize,
    guard: Option<JobGuard>,
) -> Result<f64, Error> {
    let subject = format!("bench.{name}");
    let consumer =
        ensure_consumer(client, name, &subject, "bench", -1, Duration::from_secs(30)).await?;
    let js = async_nats::jetstream::new(client.clone());
    let messages = (0..jobs).map(|n| (Some(format!("{name}:{n}")), Bytes::from(n.to_string())));
    worker_nats::publish(&js, &subject, messages).await?;

    let done = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let consuming = tokio::spawn(consume(consumer, concurrency, stop.clone(), {
        let (done, stop) = (done.clone(), stop.clone());
        move |job| {
            let (guard, done, stop) = (guard.clone(), done.clone(), stop.clone());
            async move {
                let work = async |_key: &IdempotencyKey| {
                    if done.fetch_add(1, Ordering::SeqCst) + 1 == jobs {
                        stop.cancel();
                    }
                    Ok::<_, JobError>(())
                };
                match guard {
                    Some(guard) => {
                        guard
                            .run_delivery(
                                &job.key,
                                job.fingerprint,
                                job.delivery,
                                |ctx| async move { work(ctx.key()).await },
                            )
                            .await
                            .disposition
                    }
                    None => match work(&job.key).await {
                        Ok(()) => Disposition::Ack,
                        Err(_) => Disposition::DeadLetter,
                    },
                }
            }
        }
    }));
    // `consume` returns once the last job's ack went out.
    consuming.await??;
    let elapsed = started.elapsed();
    js.delete_stream(name).await?;
    Ok(jobs as f64 / elapsed.as_secs_f64())
}
