//! The transactional guard emits the metrics of the metrics table of ops/README.md as the plain guard does:
//! job duration by job type, store operation latency by store and op. Against the real
//! PostgreSQL server (`IDEM_TEST_POSTGRES_URL`), on a schema of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use idem_core::{Fingerprint, IdempotencyKey};
use idem_store_postgres::deadpool_postgres::Transaction;
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_testkit::probe::{require_tcp, service_url};
use idem_testkit::recorder::CountingRecorder;
use idem_worker::{JobContext, JobError, JobGuard, JobOutcome};
use idem_worker_postgres::PgJobGuard;

#[tokio::test(flavor = "current_thread")]
async fn job_duration_and_store_operations_are_measured() {
    let url = service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let config: idem_store_postgres::tokio_postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(idem_store_postgres::tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    if !require_tcp("PostgreSQL", &format!("{host}:{port}")) {
        return;
    }
    let schema = format!("idem_wpgm_{:016x}", rand::random::<u64>());
    let store = PostgresStore::connect(
        PostgresConfig::new(&url)
            .unwrap()
            .with_schema(&schema)
            .unwrap(),
    )
    .await
    .unwrap();

    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let guard = JobGuard::builder(Arc::new(store.clone()))
        .job_type("credit")
        .store_label("postgres")
        .build()
        .unwrap();
    let guard = PgJobGuard::new(guard, store.clone());
    let key = IdempotencyKey::new("credit:1").unwrap();
    let fp = Fingerprint::of(&[b"p"]);
    let job = async |_ctx: JobContext, _tx: &Transaction<'_>| Ok::<_, JobError>(7u32);
    let run = guard.run_in_tx(&key, fp, 1, job).await;
    assert!(matches!(run.outcome, JobOutcome::Executed(7)), "{run:?}");
    let failing = IdempotencyKey::new("credit:2").unwrap();
    let job = async |_ctx: JobContext, _tx: &Transaction<'_>| {
        Err::<u32, _>(JobError::permanent("invalid"))
    };
    let run = guard.run_in_tx(&failing, fp, 1, job).await;
    assert!(matches!(run.outcome, JobOutcome::Failed(_)), "{run:?}");

    assert_eq!(
        recorder.get("idem_job_duration_seconds{job_type=credit}"),
        2
    );
    for (op, times) in [("claim", 2), ("complete", 1), ("fail", 1), ("commit", 2)] {
        assert_eq!(
            recorder.get(&format!(
                "idem_store_operation_seconds{{op={op},store=postgres}}"
            )),
            times,
            "{op}"
        );
    }

    let client = store.pool().get().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
