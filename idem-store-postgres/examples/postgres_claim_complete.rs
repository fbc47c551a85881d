//! Claim + complete cycles per second of `PostgresStore` at 1 and 16 tasks, next to a plain
//! `INSERT` + `UPDATE` with the same driver and pool, in one run (`bench/stores.sh` runs it).
//!
//! ```text
//! cargo run --release -p idem-store-postgres --example postgres_claim_complete
//! SECONDS_PER_RUN=10 SLICES=10 TASKS="1 16 64" IDEM_BENCH_POSTGRES_URL=postgres://... cargo run ...
//! ```
//!
//! Works in a schema of its own (`idem_bench_<random>`), dropped at the end. Each cycle is two
//! statements and two commits in every column, on a new key every cycle:
//! - `store`: `PostgresStore::claim` and `complete`;
//! - `by hand`: the store's own two statements (create-if-absent, compare-and-set), prepared
//!   and bound by this client with the values the store would send, without the store's Rust
//!   (machine, driver, decoding): what the store's SQL costs, its floor here;
//! - `wide`: a plain `INSERT` and `UPDATE` of the same record columns in the store's own table
//!   (its row width and its three indexes), without the store's statement shape;
//! - `baseline`: a plain `INSERT` and `UPDATE` of a narrow row in a table with only its key.

use std::error::Error;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_postgres::deadpool_postgres::Pool;
use idem_store_postgres::tokio_postgres::Row as PgRow;
use idem_store_postgres::tokio_postgres::types::ToSql;
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
    let sql = Sql::new(&store, &schema);
    println!(
        "{:>6} {:>11} {:>11} {:>11} {:>12} {:>7} {:>9} {:>7}",
        "tasks", "store c/s", "by hand", "wide", "baseline c/s", "ratio", "by hand", "wide"
    );
    // Each column runs in `slices` slices that alternate with the other columns', so that a
    // change in the machine's load (it is shared) hits every column alike; a column's figure is
    // the mean of its slices.
    let slices: u32 = env_or("SLICES", "5").parse::<u32>()?.max(1);
    let slice = for_how_long / slices;
    for (index, &n) in tasks.iter().enumerate() {
        let mut sums = [0.0f64; 4];
        for part in 0..slices {
            let round = index * 1000 + part as usize;
            let rates = slice_rates(&store, &sql, round, n, slice).await?;
            for (sum, rate) in sums.iter_mut().zip(rates) {
                *sum += rate / f64::from(slices);
            }
        }
        let [store_rate, hand_rate, wide_rate, plain_rate] = sums;
        println!(
            "{n:>6} {store_rate:>11.0} {hand_rate:>11.0} {wide_rate:>11.0} {plain_rate:>12.0} \
             {:>7.2} {:>9.2} {:>7.2}",
            store_rate / plain_rate,
            hand_rate / plain_rate,
            wide_rate / plain_rate,
        );
    }
    let client = store.pool().get().await?;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok(())
}

/// The statements of the columns other than `store`.
struct Sql {
    /// The store's own two (`by hand`).
    create: String,
    swap: String,
    /// `wide`: the record columns in the store's own table.
    wide_insert: String,
    wide_update: String,
    /// `baseline`: a narrow row.
    insert: String,
    update: String,
}

impl Sql {
    fn new(store: &PostgresStore, schema: &str) -> Self {
        let (create, swap) = store.primitive_sql();
        let table = format!("{schema}.idem_records");
        Sql {
            create: create.to_owned(),
            swap: swap.to_owned(),
            wide_insert: format!(
                "INSERT INTO {table} (scope, key, state, fingerprint, owner, fence, lease_until, attempt, \
                 created_at, expires_at) VALUES ('', $1, 'in_flight', $2, $3::text::uuid, 1, $4, 1, $4, $5)"
            ),
            wide_update: format!(
                "UPDATE {table} SET state = 'completed', completed_at = $2, expires_at = $3, \
                 result = $4, version = version + 1 WHERE scope = '' AND key = $1"
            ),
            insert: format!("INSERT INTO {schema}.plain (k, state) VALUES ($1, 'in_flight')"),
            update: format!(
                "UPDATE {schema}.plain SET state = 'completed', result = $2 WHERE k = $1"
            ),
        }
    }
}

/// One slice of every column at `n` tasks: the cycles per second of `store`, `by hand`, `wide`
/// and `baseline`, in that order.
async fn slice_rates(
    store: &PostgresStore,
    sql: &Sql,
    round: usize,
    n: usize,
    slice: Duration,
) -> Result<[f64; 4], BoxError> {
    let s = store.clone();
    let store_rate = measure(n, slice, move |task, i| {
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
    let plain = Cycle {
        prefix: "p",
        sql: [sql.insert.clone(), sql.update.clone()],
        params: |r, step| match step {
            0 => vec![&r.key],
            _ => vec![&r.key, &r.result],
        },
        check: |_| Ok(()),
    };
    let plain_rate = plain.measure(store.pool(), round, n, slice).await?;
    let hand = Cycle {
        prefix: "h",
        sql: [sql.create.clone(), sql.swap.clone()],
        params: |r, step| match step {
            0 => r.claim(),
            _ => {
                let mut params = r.complete();
                params.push(&0i64);
                params
            }
        },
        check: |answers| {
            let created = answers[0].first().map(|row| row.try_get::<_, bool>(17));
            let swapped = answers[1]
                .first()
                .map(|row| row.try_get::<_, Option<i64>>(17));
            match (created, swapped) {
                (Some(Ok(true)), Some(Ok(Some(_)))) => Ok(()),
                other => Err(format!("not created and swapped: {other:?}").into()),
            }
        },
    };
    let hand_rate = hand.measure(store.pool(), round, n, slice).await?;
    let wide = Cycle {
        prefix: "w",
        sql: [sql.wide_insert.clone(), sql.wide_update.clone()],
        params: |r, step| match step {
            0 => vec![&r.key, &r.fingerprint, &r.owner, &r.now, &r.lease_until],
            _ => vec![&r.key, &r.now, &r.expires_at, &r.result],
        },
        check: |_| Ok(()),
    };
    let wide_rate = wide.measure(store.pool(), round, n, slice).await?;
    Ok([store_rate, hand_rate, wide_rate, plain_rate])
}

/// A cycle of the plain client: two statements on one pooled connection, each prepared once
/// per connection, for a new key `{prefix}{round}-{task}-{i}` every cycle.
#[derive(Clone)]
struct Cycle {
    prefix: &'static str,
    sql: [String; 2],
    /// The parameters of statement 0 or 1 for a record.
    params: for<'a> fn(&'a Row, usize) -> Vec<&'a (dyn ToSql + Sync)>,
    /// Whether the two answers are those of a cycle that did its work.
    check: fn(&[Vec<PgRow>; 2]) -> Result<(), BoxError>,
}

impl Cycle {
    /// Cycles per second of `tasks` tasks for `for_how_long`.
    async fn measure(
        self,
        pool: &Pool,
        round: usize,
        tasks: usize,
        for_how_long: Duration,
    ) -> Result<f64, BoxError> {
        let pool = pool.clone();
        measure(tasks, for_how_long, move |task, i| {
            let (pool, cycle) = (pool.clone(), self.clone());
            async move {
                let record = Row::new(&format!("{}{round}-{task}-{i}", cycle.prefix));
                let client = pool.get().await?;
                let mut answers = [Vec::new(), Vec::new()];
                for (step, sql) in cycle.sql.iter().enumerate() {
                    let statement = client.prepare_cached(sql).await?;
                    answers[step] = client
                        .query(&statement, &(cycle.params)(&record, step))
                        .await?;
                }
                (cycle.check)(&answers)
            }
        })
        .await
    }
}

/// The values of one record as the store sends them (see `PostgresStore::primitive_sql`):
/// $1 scope, $2 key, $3..$18 the record columns, $19 the version read (compare-and-set).
struct Row {
    scope: String,
    key: String,
    fingerprint: Vec<u8>,
    owner: String,
    now: SystemTime,
    completed_at: Option<SystemTime>,
    lease_until: SystemTime,
    expires_at: SystemTime,
    result: Option<Vec<u8>>,
}

impl Row {
    fn new(key: &str) -> Row {
        let now = SystemTime::now();
        Row {
            scope: String::new(),
            key: key.to_owned(),
            fingerprint: Fingerprint::of(&[key.as_bytes()]).as_bytes().to_vec(),
            owner: format!("{:032x}", rand::random::<u128>()),
            now,
            completed_at: Some(now),
            lease_until: now + Duration::from_secs(30),
            expires_at: now + Duration::from_secs(3600),
            result: Some(b"result".to_vec()),
        }
    }

    /// The parameters of the claim's create-if-absent: an in-flight record at fence 1.
    fn claim(&self) -> Vec<&(dyn ToSql + Sync)> {
        const NO_TIME: Option<SystemTime> = None;
        const NO_BYTES: Option<Vec<u8>> = None;
        self.columns(&"in_flight", &NO_TIME, &self.lease_until, &NO_BYTES)
    }

    /// The parameters of the completion's compare-and-set, but its version.
    fn complete(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.columns(
            &"completed",
            &self.completed_at,
            &self.expires_at,
            &self.result,
        )
    }

    /// $1 to $18 of a record in `state` (no failure, no unknown outcome) at fence 1, attempt 1.
    fn columns<'a>(
        &'a self,
        state: &'a (dyn ToSql + Sync),
        completed_at: &'a (dyn ToSql + Sync),
        expires_at: &'a (dyn ToSql + Sync),
        result: &'a (dyn ToSql + Sync),
    ) -> Vec<&'a (dyn ToSql + Sync)> {
        const NO_TEXT: Option<String> = None;
        const NO_FLAG: Option<bool> = None;
        const NO_TIME: Option<SystemTime> = None;
        vec![
            &self.scope,
            &self.key,
            state,
            &self.fingerprint,
            &self.owner,
            &1i64,
            &self.lease_until,
            &1i32,
            &self.now,
            completed_at,
            expires_at,
            result,
            &NO_TEXT,
            &NO_FLAG,
            &NO_TEXT,
            &NO_FLAG,
            &NO_FLAG,
            &NO_TIME,
        ]
    }
}
