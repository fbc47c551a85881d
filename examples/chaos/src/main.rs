//! The chaos run of idem-worker (issue 7).
//!
//! `chaos run` publishes `--jobs` jobs (default 2,000) with a fifth of them sent twice onto
//! NATS JetStream and onto RabbitMQ, starts `--workers` worker processes (default 4) of this
//! binary, and `kill -9`s a random one every ~`--kill-every-ms` (default 300) and restarts it,
//! until every job took effect (or `--timeout-secs` passed). The side effect is an INSERT into
//! PostgreSQL. Then it counts, and prints one line per queue and store:
//!
//! ```text
//! queue=nats store=postgres kills=31 jobs=2000 effects=2000 duplicates=0 lost=0
//! ```
//!
//! - `store=postgres`: the claim, the INSERT and the completion share one transaction
//!   (`idem-worker-postgres`). Asserted: effects == jobs, duplicates == 0, lost == 0.
//! - `store=redis`: the INSERT commits on its own, then the result is recorded in Redis. A
//!   worker killed between the two leaves an effect without a record; once its lease lapses the
//!   job runs again: a duplicate. There can be at most one such duplicate per in-flight job of
//!   a killed worker, so duplicates <= kills x concurrency (and are far fewer in practice).
//!   Asserted: lost == 0 (and the bound).
//!
//! The services come from `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`,
//! `IDEM_TEST_NATS_URL` and `IDEM_TEST_AMQP_URL` (defaults: the local test servers).
//! Exit status 1 if an assertion fails.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::IdempotencyKey;
use idem_store_postgres::deadpool_postgres::Transaction;
use idem_store_postgres::tokio_postgres::{self, NoTls};
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_store_redis::{RedisConfig, RedisStore};
use idem_worker::{Disposition, JobContext, JobError, JobGuard, ResultExt, RetryPolicy};
use idem_worker_postgres::PgJobGuard;
use lapin::options::{ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use queue_common::{DispositionFuture, Error, Job};
use rand::Rng;
use rand::seq::SliceRandom;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// Jobs a worker runs at once.
const CONCURRENCY: u16 = 8;
/// The lease: short, so a killed worker's jobs are taken over quickly.
const LEASE: Duration = Duration::from_secs(2);

struct Urls {
    postgres: String,
    redis: String,
    nats: String,
    amqp: String,
}

impl Urls {
    fn from_env() -> Self {
        let var = |name: &str, default: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        Urls {
            postgres: var(
                "IDEM_TEST_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            redis: var("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
            nats: var("IDEM_TEST_NATS_URL", "127.0.0.1:4222"),
            amqp: var(
                "IDEM_TEST_AMQP_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
        }
    }
}

/// The names of one queue x store combination of a run.
#[derive(Clone, Debug)]
struct Names {
    queue: String,
    store: String,
    tag: String,
}

impl Names {
    fn schema(&self) -> String {
        format!("chaos_{}", self.tag)
    }
    fn stream(&self) -> String {
        format!("CHAOS_{}", self.tag)
    }
    fn subject(&self) -> String {
        format!("chaos.{}.jobs", self.tag)
    }
    fn amqp_queue(&self) -> String {
        format!("chaos.{}", self.tag)
    }
    fn effects(&self) -> String {
        format!("{}.effects", self.schema())
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => drive(&args[1..]).await,
        Some("worker") if args.len() == 4 => {
            let names = Names {
                queue: args[1].clone(),
                store: args[2].clone(),
                tag: args[3].clone(),
            };
            work(&names).await
        }
        _ => Err("usage: chaos run [--jobs N] [--workers N] [--kill-every-ms N] [--timeout-secs N] [--queues nats,amqp] [--stores postgres,redis]".into()),
    };
    if let Err(error) = result {
        eprintln!("chaos: {error}");
        std::process::exit(1);
    }
}

struct Options {
    jobs: u32,
    workers: usize,
    kill_every: Duration,
    timeout: Duration,
    queues: Vec<String>,
    stores: Vec<String>,
}

fn options(args: &[String]) -> Result<Options, Error> {
    let mut options = Options {
        jobs: 2_000,
        workers: 4,
        kill_every: Duration::from_millis(300),
        timeout: Duration::from_secs(60),
        queues: vec!["nats".into(), "amqp".into()],
        stores: vec!["postgres".into(), "redis".into()],
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let list = || value.split(',').map(str::to_owned).collect::<Vec<_>>();
        match flag.as_str() {
            "--jobs" => options.jobs = value.parse()?,
            "--workers" => options.workers = value.parse()?,
            "--kill-every-ms" => options.kill_every = Duration::from_millis(value.parse()?),
            "--timeout-secs" => options.timeout = Duration::from_secs(value.parse()?),
            "--queues" => options.queues = list(),
            "--stores" => options.stores = list(),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(options)
}

/// The driver: every queue x store combination in turn; fails if an assertion fails.
async fn drive(args: &[String]) -> Result<(), Error> {
    let options = options(args)?;
    let urls = Urls::from_env();
    let run = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            % 0xffff_ffff
    );
    let mut failures = Vec::new();
    for queue in &options.queues {
        for store in &options.stores {
            let names = Names {
                queue: queue.clone(),
                store: store.clone(),
                tag: format!("{run}_{queue}_{store}"),
            };
            let count = one_run(&options, &urls, &names).await?;
            println!(
                "queue={queue} store={store} kills={} jobs={} effects={} duplicates={} lost={}",
                count.kills, count.jobs, count.effects, count.duplicates, count.lost
            );
            let bound = u64::from(count.kills) * u64::from(CONCURRENCY);
            let ok = match store.as_str() {
                "postgres" => {
                    count.effects == u64::from(count.jobs)
                        && count.duplicates == 0
                        && count.lost == 0
                }
                _ => count.lost == 0 && count.duplicates <= bound,
            };
            if !ok {
                failures.push(format!("queue={queue} store={store}"));
            }
        }
    }
    if failures.is_empty() {
        println!(
            "chaos: every assertion held (postgres: effects == jobs, no duplicate, none lost; redis: none lost, duplicates within kills x {CONCURRENCY})"
        );
        Ok(())
    } else {
        Err(format!("assertions failed for {}", failures.join(", ")).into())
    }
}

struct Count {
    jobs: u32,
    kills: u32,
    effects: u64,
    duplicates: u64,
    lost: u64,
}

async fn pg_client(url: &str) -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// One queue x store combination: set up, publish, run and kill the workers, count, clean up.
async fn one_run(options: &Options, urls: &Urls, names: &Names) -> Result<Count, Error> {
    let pg = pg_client(&urls.postgres).await?;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {effects} (job integer NOT NULL, worker integer NOT NULL)",
        schema = names.schema(),
        effects = names.effects(),
    ))
    .await?;
    if names.store == "postgres" {
        // The store's migrations, once, before the workers start.
        let config = PostgresConfig::new(&urls.postgres)?.with_schema(&names.schema())?;
        PostgresStore::connect(config).await?;
    }

    // The messages: every job once, a fifth twice, in random order.
    let mut messages: Vec<u32> = (0..options.jobs).collect();
    let mut rng = rand::rng();
    let mut twice: Vec<u32> = (0..options.jobs).collect();
    twice.shuffle(&mut rng);
    messages.extend(twice.iter().take(options.jobs as usize / 5));
    messages.shuffle(&mut rng);
    publish(urls, names, &messages).await?;

    let exe = std::env::current_exe()?;
    let spawn = || -> Result<Child, Error> {
        Ok(Command::new(&exe)
            .args(["worker", &names.queue, &names.store, &names.tag])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?)
    };
    let mut workers = (0..options.workers.max(1))
        .map(|_| spawn())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let mut kills = 0u32;
    let distinct_sql = format!("SELECT count(DISTINCT job) FROM {}", names.effects());
    loop {
        let jitter = rng.random_range(0.5..1.5);
        tokio::time::sleep(options.kill_every.mul_f64(jitter)).await;
        let done: i64 = pg.query_one(&distinct_sql, &[]).await?.get(0);
        if done >= i64::from(options.jobs) || started.elapsed() > options.timeout {
            break;
        }
        let victim = rng.random_range(0..workers.len());
        workers[victim].kill().await?;
        kills += 1;
        workers[victim] = spawn()?;
    }
    // Let duplicates still in the queues reach the workers, then stop them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for worker in &mut workers {
        let _ = worker.kill().await;
    }

    let row = pg
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT job) FROM {}",
                names.effects()
            ),
            &[],
        )
        .await?;
    let (effects, distinct): (i64, i64) = (row.get(0), row.get(1));
    let effects = u64::try_from(effects).unwrap_or(0);
    let distinct = u64::try_from(distinct).unwrap_or(0);
    cleanup(urls, names, &pg).await;
    Ok(Count {
        jobs: options.jobs,
        kills,
        effects,
        duplicates: effects - distinct.min(effects),
        lost: u64::from(options.jobs).saturating_sub(distinct),
    })
}

async fn publish(urls: &Urls, names: &Names, messages: &[u32]) -> Result<(), Error> {
    let payload = |job: u32| format!(r#"{{"key":"job:{job}","job":{job}}}"#);
    match names.queue.as_str() {
        "nats" => {
            let client = async_nats::connect(&urls.nats).await?;
            nats_consumer(&client, names).await?;
            let js = async_nats::jetstream::new(client);
            let messages = messages
                .iter()
                .map(|&job| (Some(format!("job:{job}")), payload(job).into()));
            worker_nats::publish(&js, &names.subject(), messages).await?;
        }
        _ => {
            let connection =
                Connection::connect(&urls.amqp, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            worker_rabbitmq::declare(&channel, &names.amqp_queue()).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            for &job in messages {
                let key = format!("job:{job}");
                worker_rabbitmq::publish(
                    &channel,
                    &names.amqp_queue(),
                    Some(&key),
                    payload(job).as_bytes(),
                )
                .await?;
            }
            let _ = connection.close(0, "published".into()).await;
        }
    }
    Ok(())
}

async fn nats_consumer(
    client: &async_nats::Client,
    names: &Names,
) -> Result<async_nats::jetstream::consumer::PullConsumer, Error> {
    // A short ack wait: a killed worker's messages come back quickly. No delivery limit.
    worker_nats::ensure_consumer(
        client,
        &names.stream(),
        &names.subject(),
        "workers",
        -1,
        Duration::from_secs(2),
    )
    .await
}

async fn cleanup(urls: &Urls, names: &Names, pg: &tokio_postgres::Client) {
    let _ = pg
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", names.schema()))
        .await;
    match names.queue.as_str() {
        "nats" => {
            if let Ok(client) = async_nats::connect(&urls.nats).await {
                let _ = async_nats::jetstream::new(client)
                    .delete_stream(names.stream())
                    .await;
            }
        }
        _ => {
            if let Ok(connection) =
                Connection::connect(&urls.amqp, ConnectionProperties::default()).await
                && let Ok(channel) = connection.create_channel().await
            {
                let topology = worker_rabbitmq::Topology::of(&names.amqp_queue());
                for queue in [&topology.queue, &topology.retry, &topology.dead] {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = channel
                    .exchange_delete(topology.dlx.as_str().into(), Default::default())
                    .await;
            }
        }
    }
}

/// A worker process: consumes its queue until killed.
async fn work(names: &Names) -> Result<(), Error> {
    let urls = Urls::from_env();
    let worker = std::process::id();
    let insert = format!(
        "INSERT INTO {} (job, worker) VALUES ($1, $2)",
        names.effects()
    );
    // Retries are cheap here and a job must never be dead-lettered for being unlucky.
    let policy = RetryPolicy::default()
        .with_initial_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))?
        .with_max_attempts(std::num::NonZeroU32::new(10_000).ok_or("attempts")?);
    let handler: Handler = match names.store.as_str() {
        "postgres" => postgres_handler(&urls, names, policy, insert, worker).await?,
        _ => redis_handler(&urls, names, policy, insert, worker).await?,
    };
    let stop = CancellationToken::new();
    let handle = move |job: Job| handler(job);
    match names.queue.as_str() {
        "nats" => {
            let client = async_nats::connect(&urls.nats).await?;
            let consumer = nats_consumer(&client, names).await?;
            worker_nats::consume(consumer, usize::from(CONCURRENCY), stop, handle).await
        }
        _ => {
            let connection =
                Connection::connect(&urls.amqp, ConnectionProperties::default()).await?;
            worker_rabbitmq::consume(&connection, &names.amqp_queue(), CONCURRENCY, stop, handle)
                .await
        }
    }
}

/// What a worker does with a job.
type Handler = Arc<dyn Fn(Job) -> DispositionFuture + Send + Sync>;

/// The handler of a worker on PostgreSQL: the effect (`insert`) commits with the record, in
/// the job's transaction.
async fn postgres_handler(
    urls: &Urls,
    names: &Names,
    policy: RetryPolicy,
    insert: String,
    worker: u32,
) -> Result<Handler, Error> {
    let worker_id = i32::try_from(worker % 1_000_000).unwrap_or(0);
    let config = PostgresConfig::new(&urls.postgres)?
        .with_schema(&names.schema())?
        .with_migrate_on_connect(false);
    let store = PostgresStore::connect(config).await?;
    let guard = JobGuard::builder(Arc::new(store.clone()))
        .job_type("chaos")
        .worker_id(worker.to_string())
        .lease(LEASE)
        .retry_policy(policy)
        .build()?;
    let guard = PgJobGuard::new(guard, store);
    Ok(Arc::new(move |job: Job| -> DispositionFuture {
        let (guard, insert) = (guard.clone(), insert.clone());
        Box::pin(async move {
            let Some(n) = job_number(&job.key) else {
                return Disposition::DeadLetter;
            };
            guard
                .run_in_tx(
                    &job.key,
                    job.fingerprint,
                    job.delivery,
                    async |_ctx: JobContext, tx: &Transaction<'_>| {
                        tx.execute(insert.as_str(), &[&n, &worker_id])
                            .await
                            .transient()?;
                        Ok::<_, JobError>(n)
                    },
                )
                .await
                .disposition
        })
    }))
}

/// The handler of a worker on Redis: the effect (`insert`) commits in PostgreSQL on its own,
/// before the record.
async fn redis_handler(
    urls: &Urls,
    names: &Names,
    policy: RetryPolicy,
    insert: String,
    worker: u32,
) -> Result<Handler, Error> {
    let worker_id = i32::try_from(worker % 1_000_000).unwrap_or(0);
    let store = RedisStore::connect(
        RedisConfig::new(urls.redis.clone())?.with_namespace(format!("chaos.{}", names.tag))?,
    )
    .await?;
    let guard = JobGuard::builder(Arc::new(store))
        .job_type("chaos")
        .worker_id(worker.to_string())
        .store_label("redis")
        .lease(LEASE)
        .retention(Duration::from_secs(600))
        .retry_policy(policy)
        .build()?;
    let pg = Arc::new(pg_client(&urls.postgres).await?);
    Ok(Arc::new(move |job: Job| -> DispositionFuture {
        let (guard, insert, pg) = (guard.clone(), insert.clone(), pg.clone());
        Box::pin(async move {
            let Some(n) = job_number(&job.key) else {
                return Disposition::DeadLetter;
            };
            guard
                .run_delivery(&job.key, job.fingerprint, job.delivery, |_ctx| async move {
                    // The effect commits on its own: a kill after it and before the
                    // record is the duplicate window this run counts.
                    pg.execute(insert.as_str(), &[&n, &worker_id])
                        .await
                        .unknown_outcome()?;
                    Ok::<_, JobError>(n)
                })
                .await
                .disposition
        })
    }))
}

/// The job number in `job:<n>`.
fn job_number(key: &IdempotencyKey) -> Option<i32> {
    key.as_str().strip_prefix("job:")?.parse().ok()
}
