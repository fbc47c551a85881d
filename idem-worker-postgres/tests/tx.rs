//! Against the real PostgreSQL server (`IDEM_TEST_POSTGRES_URL`, default
//! postgres@127.0.0.1:5432/test), one schema per test: what commits for every way a job ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Fingerprint, IdempotencyKey, RecordKey, State, Store};
use idem_store_postgres::deadpool_postgres::Transaction;
use idem_store_postgres::tokio_postgres;
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_testkit::probe::{require_tcp, service_url};
use idem_worker::{Disposition, JobContext, JobError, JobGuard, JobOutcome, ResultExt, RunError};
use idem_worker_postgres::PgJobGuard;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A guard on a schema of its own, with an `effects` table; the schema is dropped at the end.
struct Fixture {
    guard: PgJobGuard,
    store: PostgresStore,
    schema: String,
}

impl Fixture {
    async fn new() -> Option<Fixture> {
        let url = service_url("IDEM_TEST_POSTGRES_URL", DEFAULT_URL);
        let config: tokio_postgres::Config = url.parse().unwrap();
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if !require_tcp("PostgreSQL", &format!("{host}:{port}")) {
            return None;
        }
        let schema = format!("idem_wpg_{:016x}", rand::random::<u64>());
        let store = PostgresStore::connect(
            PostgresConfig::new(&url)
                .unwrap()
                .with_schema(&schema)
                .unwrap()
                .with_op_timeout(Duration::from_secs(20)),
        )
        .await
        .unwrap();
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE {schema}.effects (key text NOT NULL)"
            ))
            .await
            .unwrap();
        let guard = JobGuard::builder(Arc::new(store.clone()))
            .job_type("test")
            .build()
            .unwrap();
        Some(Fixture {
            guard: PgJobGuard::new(guard, store.clone()),
            store,
            schema,
        })
    }

    fn insert(&self) -> String {
        format!("INSERT INTO {}.effects VALUES ($1)", self.schema)
    }

    async fn effects(&self, key: &str) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        let sql = format!(
            "SELECT count(*) FROM {}.effects WHERE key = $1",
            self.schema
        );
        client.query_one(&sql, &[&key]).await.unwrap().get(0)
    }

    async fn state(&self, key: &str) -> Option<State> {
        let key = RecordKey::unscoped(IdempotencyKey::new(key).unwrap());
        self.store.get(&key).await.unwrap().map(|r| r.state)
    }

    async fn drop_schema(self) {
        let client = self.store.pool().get().await.unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .unwrap();
    }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(&[b"payload"])
}

/// A job that inserts its key, then ends as `end` says. A macro, not a function: a closure
/// behind `impl AsyncFnOnce` hides whether its future is `Send`.
macro_rules! job {
    ($sql:expr, $end:expr) => {{
        let (sql, end): (String, &str) = ($sql, $end);
        async move |ctx: JobContext, tx: &Transaction<'_>| {
            let key = ctx.key().to_string();
            tx.execute(sql.as_str(), &[&key]).await.transient()?;
            match end {
                "ok" => Ok(format!("done {key}")),
                "transient" => Err(JobError::transient("busy")),
                "permanent" => Err(JobError::permanent("invalid")),
                "unknown" => Err(JobError::unknown("timed out")),
                _ => panic!("the job panicked"),
            }
        }
    }};
}

#[tokio::test]
async fn the_effect_and_the_completion_commit_together() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let run = f
        .guard
        .run_in_tx(&key("a"), fp(), 1, job!(f.insert(), "ok"))
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Executed(ref v) if v == "done a"),
        "{run:?}"
    );
    assert_eq!(run.disposition, Disposition::Ack);
    assert_eq!(f.effects("a").await, 1);
    assert_eq!(f.state("a").await, Some(State::Completed));

    let again = f
        .guard
        .run_in_tx(&key("a"), fp(), 2, job!(f.insert(), "ok"))
        .await;
    assert!(
        matches!(again.outcome, JobOutcome::Replayed(ref v) if v == "done a"),
        "{again:?}"
    );
    assert_eq!(again.disposition, Disposition::Ack);
    assert_eq!(f.effects("a").await, 1, "the replay wrote nothing");
    f.drop_schema().await;
}

#[tokio::test]
async fn a_transient_failure_rolls_back_the_effect_and_the_claim() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let run = f
        .guard
        .run_in_tx(&key("t"), fp(), 1, job!(f.insert(), "transient"))
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Transient(_))),
        "{run:?}"
    );
    assert!(matches!(run.disposition, Disposition::Retry { .. }));
    assert_eq!(f.effects("t").await, 0);
    assert_eq!(f.state("t").await, None, "the key is free");
    let retry = f
        .guard
        .run_in_tx(&key("t"), fp(), 2, job!(f.insert(), "ok"))
        .await;
    assert!(matches!(retry.outcome, JobOutcome::Executed(_)));
    assert_eq!(f.effects("t").await, 1);
    f.drop_schema().await;
}

#[tokio::test]
async fn a_permanent_failure_undoes_the_effect_and_records_the_failure() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let run = f
        .guard
        .run_in_tx(&key("p"), fp(), 1, job!(f.insert(), "permanent"))
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Failed(ref failure) if failure.message == "invalid"),
        "{run:?}"
    );
    assert_eq!(run.disposition, Disposition::DeadLetter);
    assert_eq!(f.effects("p").await, 0);
    assert_eq!(f.state("p").await, Some(State::Failed));
    let again = f
        .guard
        .run_in_tx(&key("p"), fp(), 2, job!(f.insert(), "ok"))
        .await;
    assert!(matches!(again.outcome, JobOutcome::Failed(_)));
    assert_eq!(f.effects("p").await, 0);
    f.drop_schema().await;
}

#[tokio::test]
async fn an_unknown_outcome_keeps_the_claim_alone() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let run = f
        .guard
        .run_in_tx(&key("u"), fp(), 1, job!(f.insert(), "unknown"))
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::UnknownOutcome(_))),
        "{run:?}"
    );
    assert!(
        matches!(run.disposition, Disposition::Retry { after } if after >= Duration::from_secs(29)),
        "{run:?}"
    );
    assert_eq!(f.effects("u").await, 0);
    assert_eq!(f.state("u").await, Some(State::InFlight));
    let early = f
        .guard
        .run_in_tx(&key("u"), fp(), 2, job!(f.insert(), "ok"))
        .await;
    assert!(
        matches!(early.outcome, JobOutcome::InFlight { .. }),
        "{early:?}"
    );
    f.drop_schema().await;
}

#[tokio::test]
async fn a_panic_or_a_dropped_run_rolls_everything_back() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let run = f
        .guard
        .run_in_tx(&key("x"), fp(), 1, job!(f.insert(), "panic"))
        .await;
    assert!(
        matches!(run.outcome, JobOutcome::Error(RunError::Panicked(_))),
        "{run:?}"
    );
    assert_eq!(f.effects("x").await, 0);
    assert_eq!(f.state("x").await, None);

    // A run dropped in the middle of its job: the transaction goes with it.
    let sql = f.insert();
    let dropped = key("d");
    let pending = f.guard.run_in_tx(
        &dropped,
        fp(),
        1,
        async move |ctx: JobContext, tx: &Transaction<'_>| {
            tx.execute(sql.as_str(), &[&ctx.key().to_string()])
                .await
                .transient()?;
            std::future::pending::<()>().await;
            Ok::<_, JobError>(String::new())
        },
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), pending)
            .await
            .is_err()
    );
    let after = f
        .guard
        .run_in_tx(&key("d"), fp(), 2, job!(f.insert(), "ok"))
        .await;
    assert!(
        matches!(after.outcome, JobOutcome::Executed(_)),
        "{after:?}"
    );
    assert_eq!(f.effects("d").await, 1);
    f.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_take_effect_once() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let f = Arc::new(f);
    let keys = 40;
    let mut tasks = Vec::new();
    for task in 0..8 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..keys {
                let k = (k + task * 5) % keys;
                let key = key(&format!("job:{k}"));
                let mut delivery = 1;
                loop {
                    let run = f
                        .guard
                        .run_in_tx(&key, fp(), delivery, job!(f.insert(), "ok"))
                        .await;
                    match run.disposition {
                        Disposition::Ack => break,
                        Disposition::Retry { .. } => delivery += 1,
                        Disposition::DeadLetter => panic!("{run:?}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let client = f.store.pool().get().await.unwrap();
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT key) FROM {}.effects",
                f.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let (total, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((total, distinct), (keys as i64, keys as i64));
    drop(client);
    Arc::into_inner(f).unwrap().drop_schema().await;
}
