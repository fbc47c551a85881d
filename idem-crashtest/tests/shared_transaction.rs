//! The window that only a shared transaction closes, demonstrated.
//!
//! 1,000 jobs whose side effect is an INSERT into PostgreSQL. A worker process takes them from
//! a queue (a table of acks: a job is redelivered until acked; the last five acked jobs are
//! redelivered after every restart, as lost acks; one delivery in ten is duplicated) and is
//! killed with `kill -9` at random moments and restarted until every job is acked.
//!
//! - With the redb store, the effect commits in PostgreSQL and the completion in redb: a crash
//!   between the two leaves an in-flight record whose lease lapses, and the redelivered job
//!   runs the effect again. The test counts and prints those doubled effects (at most one per
//!   kill).
//! - With the PostgreSQL store, `claim_in`, the INSERT and `complete_in` share one
//!   transaction: a crash rolls all three back, so no effect is ever doubled (asserted).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::collections::HashSet;
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_crashtest::EffectCounts;
use idem_store_postgres::tokio_postgres;
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_store_redb::RedbStore;
use rand::Rng;

mod common;
use common::{TestSchema, connect, postgres_up, runtime, spawn_child, url};

const JOBS: i32 = 1_000;
/// Restarts allowed before the test gives up.
const MAX_RUNS: usize = 2_000;
const RETENTION: Duration = Duration::from_secs(3600);
/// The redb mode's lease: short, so a crashed worker's claim lapses quickly.
const REDB_LEASE: Duration = Duration::from_millis(100);

const ENV_MODE: &str = "IDEM_DEMO_MODE";
const ENV_SCHEMA: &str = "IDEM_DEMO_SCHEMA";
const ENV_REDB: &str = "IDEM_DEMO_REDB";

/// A schema of the test's own: the queue, the effects, and (PostgreSQL mode) the store.
fn test_schema() -> TestSchema {
    TestSchema::create(
        "idem_demo",
        "CREATE TABLE {schema}.effects (job integer NOT NULL,
                                        at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE {schema}.acks (job integer PRIMARY KEY,
                                     at timestamptz NOT NULL DEFAULT clock_timestamp());",
    )
}

fn request(job: i32, lease: Duration) -> ClaimRequest {
    let name = format!("job-{job}");
    ClaimRequest::new(
        RecordKey::unscoped(IdempotencyKey::new(&name).unwrap()),
        Fingerprint::of(&[name.as_bytes()]),
        lease,
    )
}

/// The effect and the completion in two stores: redb records, PostgreSQL effects.
async fn process_with_redb(
    store: &RedbStore,
    effects: &tokio_postgres::Client,
    schema: &str,
    job: i32,
) {
    let request = request(job, REDB_LEASE);
    loop {
        match store.claim(&request).await.unwrap() {
            ClaimOutcome::Acquired { lease, .. } => {
                effects
                    .execute(
                        &format!("INSERT INTO {schema}.effects (job) VALUES ($1)"),
                        &[&job],
                    )
                    .await
                    .unwrap();
                // A kill here doubles the effect: the claim lapses and the job runs again.
                store
                    .complete(&lease, Bytes::from(job.to_string()), RETENTION)
                    .await
                    .unwrap();
                return;
            }
            ClaimOutcome::Completed(_) => return,
            // The claim of a killed worker: wait for its lease to lapse, then take it over.
            ClaimOutcome::InFlight { retry_after } => tokio::time::sleep(retry_after).await,
            other => panic!("job {job}: {other:?}"),
        }
    }
}

/// The claim, the effect and the completion in ONE PostgreSQL transaction.
async fn process_with_postgres(store: &PostgresStore, schema: &str, job: i32) {
    let request = request(job, Duration::from_secs(30));
    loop {
        let mut client = store.pool().get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        match store.claim_in(&tx, &request).await.unwrap() {
            ClaimOutcome::Acquired { lease, .. } => {
                tx.execute(
                    &format!("INSERT INTO {schema}.effects (job) VALUES ($1)"),
                    &[&job],
                )
                .await
                .unwrap();
                store
                    .complete_in(&tx, &lease, Bytes::from(job.to_string()), RETENTION)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                return;
            }
            ClaimOutcome::Completed(_) => {
                tx.rollback().await.unwrap();
                return;
            }
            ClaimOutcome::InFlight { retry_after } => {
                tx.rollback().await.unwrap();
                tokio::time::sleep(retry_after).await;
            }
            other => panic!("job {job}: {other:?}"),
        }
    }
}

/// The worker: takes every unacked job from the queue (after redelivering the last five acked
/// ones), delivers one in ten twice, and acks each after processing it. Prints `READY` once
/// connected and `DONE` at the end.
#[test]
#[ignore = "the child process of the shared transaction tests"]
fn child_worker_of_the_shared_transaction_test() {
    let (Ok(mode), Ok(schema)) = (std::env::var(ENV_MODE), std::env::var(ENV_SCHEMA)) else {
        return;
    };
    runtime().block_on(async {
        let queue = connect().await;
        // The queue's acks (and, in redb mode, the effects) need not wait for the WAL flush:
        // only the worker is killed, never the server, which keeps every commit it answered.
        queue
            .batch_execute("SET synchronous_commit = off")
            .await
            .unwrap();
        let (redb, postgres) = if mode == "redb" {
            let path = std::env::var(ENV_REDB).unwrap();
            (Some(RedbStore::open(path).unwrap()), None)
        } else {
            let config = PostgresConfig::new(&url())
                .unwrap()
                .with_schema(&schema)
                .unwrap()
                .with_migrate_on_connect(false);
            (None, Some(PostgresStore::connect(config).await.unwrap()))
        };
        let acked: HashSet<i32> = queue
            .query(&format!("SELECT job FROM {schema}.acks"), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let lost_acks: Vec<i32> = queue
            .query(
                &format!("SELECT job FROM {schema}.acks ORDER BY at DESC LIMIT 5"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let deliveries = lost_acks
            .into_iter()
            .chain((0..JOBS).filter(|job| !acked.contains(job)));
        println!("READY");
        let mut rng = rand::rng();
        for job in deliveries {
            let times = if rng.random_ratio(1, 10) { 2 } else { 1 };
            for _ in 0..times {
                match (&redb, &postgres) {
                    (Some(store), _) => process_with_redb(store, &queue, &schema, job).await,
                    (_, Some(store)) => process_with_postgres(store, &schema, job).await,
                    _ => unreachable!(),
                }
            }
            queue
                .execute(
                    &format!("INSERT INTO {schema}.acks (job) VALUES ($1) ON CONFLICT DO NOTHING"),
                    &[&job],
                )
                .await
                .unwrap();
        }
        println!("DONE");
    });
}

fn spawn_worker(mode: &str, schema: &str, redb: Option<&Path>) -> (Child, mpsc::Receiver<String>) {
    let redb = redb.map(|path| path.display().to_string());
    let mut envs = vec![(ENV_MODE, mode), (ENV_SCHEMA, schema)];
    if let Some(path) = &redb {
        envs.push((ENV_REDB, path));
    }
    let (child, lines) = spawn_child("child_worker_of_the_shared_transaction_test", &envs);
    let (events, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines {
            for event in ["READY", "DONE"] {
                if line.contains(event) {
                    let _ = events.send(event.to_owned());
                }
            }
        }
    });
    (child, received)
}

/// Runs and kills workers until one finishes the queue; returns how many were killed.
fn run_with_kills(mode: &str, schema: &str, redb: Option<&Path>) -> usize {
    let mut rng = rand::rng();
    // Every run before the last is killed.
    for kills in 0..MAX_RUNS {
        let (mut child, events) = spawn_worker(mode, schema, redb);
        assert_eq!(
            events.recv_timeout(Duration::from_secs(30)).as_deref(),
            Ok("READY"),
            "the worker did not start"
        );
        let run_for = Duration::from_millis(rng.random_range(20..300));
        if events.recv_timeout(run_for).as_deref() == Ok("DONE") {
            let status = child.wait().unwrap();
            assert!(status.success(), "the worker failed: {status}");
            return kills;
        }
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        if status.success() {
            // It finished just before the kill.
            return kills;
        }
    }
    panic!("the queue was not done after {MAX_RUNS} runs");
}

/// Effects per job, from the effects table.
fn effect_counts(schema: &str) -> EffectCounts {
    runtime().block_on(async {
        let rows = connect()
            .await
            .query(
                &format!(
                    "SELECT j, count(e.job) FROM generate_series(0, {last}) j
                     LEFT JOIN {schema}.effects e ON e.job = j GROUP BY j ORDER BY j",
                    last = JOBS - 1
                ),
                &[],
            )
            .await
            .unwrap();
        let per_job: Vec<u64> = rows
            .iter()
            .map(|row| u64::try_from(row.get::<_, i64>(1)).unwrap())
            .collect();
        EffectCounts::from_per_job(&per_job)
    })
}

/// Runs the queue to the end with kills, then checks that every job ran and reports.
fn demonstrate(
    mode: &str,
    what: &str,
    schema: &TestSchema,
    redb: Option<&Path>,
) -> (usize, EffectCounts) {
    let started = Instant::now();
    let kills = run_with_kills(mode, &schema.0, redb);
    let counts = effect_counts(&schema.0);
    eprintln!(
        "{what}: {} jobs, {kills} kill -9s in {:.1?}: {} doubled effects, {} missing",
        counts.jobs,
        started.elapsed(),
        counts.doubled,
        counts.missing
    );
    assert!(kills >= 10, "only {kills} kills: the test proved little");
    assert_eq!(counts.missing, 0, "every job ran");
    (kills, counts)
}

#[test]
fn redb_store_doubles_effects_only_by_a_crash_between_effect_and_completion() {
    if !postgres_up() {
        return;
    }
    let schema = test_schema();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.redb");
    let (kills, counts) = demonstrate(
        "redb",
        "redb store (effect in PostgreSQL, completion in redb; a crash between the two doubles)",
        &schema,
        Some(&path),
    );
    // A worker processes one job at a time: each kill can double at most one effect.
    assert!(
        counts.doubled <= kills as u64,
        "{} doubled by {kills} kills",
        counts.doubled
    );
}

#[test]
fn postgres_in_the_same_transaction_never_doubles_an_effect() {
    if !postgres_up() {
        return;
    }
    let schema = test_schema();
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&schema.0)
        .unwrap();
    runtime()
        .block_on(idem_store_postgres::migrate(&config))
        .unwrap();
    let (_, counts) = demonstrate(
        "postgres",
        "postgres store (claim_in, INSERT and complete_in in one transaction)",
        &schema,
        None,
    );
    assert_eq!(
        counts.doubled, 0,
        "a shared transaction never doubles an effect"
    );
}
