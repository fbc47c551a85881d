//! The job guard of idem inside a PostgreSQL transaction: the claim, the job's database
//! writes and the completion commit together.
//!
//! With a plain [`JobGuard`], a worker that dies after its side effect and before recording
//! the result leaves a window: once its lease lapses, the job runs again. When the side effect
//! is a write to the same PostgreSQL database as the store, [`PgJobGuard::run_in_tx`] closes
//! that window: the claim (`claim_in`), the job's writes and the completion (`complete_in`)
//! share one transaction, so they commit together or not at all.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-postgres = "0.1"
//! idem-worker = "0.1"
//! idem-worker-postgres = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, IdempotencyKey};
//! use idem_store_postgres::{PostgresConfig, PostgresStore};
//! use idem_worker::{JobError, JobGuard, JobOutcome, ResultExt};
//! use idem_worker_postgres::PgJobGuard;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
//! # let schema = format!("idem_doc_{:016x}", rand::random::<u64>());
//! let config = PostgresConfig::new(&url)?.with_schema(&schema)?;
//! # let Ok(store) = PostgresStore::connect(config).await else { return Ok(()) }; // no server here
//! # /*
//! let store = PostgresStore::connect(config).await?;
//! # */
//! let guard = JobGuard::builder(Arc::new(store.clone())).job_type("credit").build()?;
//! let guard = PgJobGuard::new(guard, store.clone());
//! # let client = store.pool().get().await?;
//! # client.batch_execute(&format!("CREATE TABLE {schema}.credits (account text, amount int)")).await?;
//!
//! let key = IdempotencyKey::new("credit:7")?;
//! let payload = br#"{"account":"a1","amount":10}"#;
//! let sql = format!("INSERT INTO {schema}.credits VALUES ('a1', 10)");
//! let job = async |_ctx: idem_worker::JobContext, tx: &idem_store_postgres::deadpool_postgres::Transaction<'_>| {
//!     // The side effect, in the claim's transaction.
//!     tx.execute(sql.as_str(), &[]).await.transient()?;
//!     Ok::<_, JobError>("credited".to_owned())
//! };
//! let run = guard.run_in_tx(&key, Fingerprint::of(&[payload]), 1, job).await;
//! assert!(matches!(run.outcome, JobOutcome::Executed(_)));
//!
//! // A redelivery is answered from the record; the INSERT ran once.
//! let again = guard.run_in_tx(&key, Fingerprint::of(&[payload]), 2, job).await;
//! assert!(matches!(again.outcome, JobOutcome::Replayed(ref r) if r == "credited"));
//! # let n: i64 = client.query_one(&format!("SELECT count(*) FROM {schema}.credits"), &[]).await?.get(0);
//! # assert_eq!(n, 1);
//! # client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What commits
//! | the job returns | the transaction | outcome | disposition |
//! |---|---|---|---|
//! | `Ok(result)` | the job's writes and the completion commit | executed | ack |
//! | transient error | rolled back: no writes, no claim | transient | retry with backoff |
//! | permanent error | the job's writes rolled back; the failure is recorded and commits | failed | dead-letter |
//! | unknown outcome | the job's writes rolled back; the claim commits and is kept until its lease ends | unknown outcome | retry after the lease |
//! | a panic, or the future dropped | rolled back | panicked | retry with backoff |
//! | a commit that fails or outlasts the store's operation timeout | unknown: committed or not, a redelivery sees the record or a free key | store error | retry with backoff |
//!
//! While the transaction is open, a duplicate's claim of the same key waits for it (a row
//! lock), up to the store's operation timeout, after which it is retried. No heartbeat is
//! needed: the claim is not visible to anyone until it commits, and a worker that dies takes
//! its transaction with it.

use idem_core::{Bytes, Failure, Fingerprint, IdempotencyKey, Lease, StoreError};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::deadpool_postgres::Transaction;
use idem_worker::{
    Disposition, ErrorClass, JobContext, JobError, JobGuard, JobOutcome, Run, RunError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Span;

/// A [`JobGuard`] whose jobs run inside the claim's PostgreSQL transaction. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PgJobGuard {
    guard: JobGuard,
    store: PostgresStore,
}

/// The savepoint the job's writes go to, so a failure can undo them and keep the claim.
const SAVEPOINT: &str = "idem_job";

impl PgJobGuard {
    /// A transactional guard: `guard` gives the configuration (lease, retention, retry
    /// policy, job type), `store` the transactions. `guard` should be over the same store.
    #[must_use]
    pub fn new(guard: JobGuard, store: PostgresStore) -> Self {
        PgJobGuard { guard, store }
    }

    /// The guard that gives the configuration.
    #[must_use]
    pub fn guard(&self) -> &JobGuard {
        &self.guard
    }

    /// Claims `key` in a new transaction and, if the key is free, runs `job` with that
    /// transaction (a savepoint of it), then records the result in it and commits: see the
    /// [crate documentation](crate) for what commits when.
    ///
    /// Write `job` as an async closure at the call: behind an `impl AsyncFnOnce` its future's
    /// `Send`-ness is hidden, and the run could not be spawned.
    pub async fn run_in_tx<T, F>(
        &self,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        delivery: u32,
        job: F,
    ) -> Run<T>
    where
        T: Serialize + DeserializeOwned,
        F: AsyncFnOnce(JobContext, &Transaction<'_>) -> Result<T, JobError>,
    {
        let delivery = delivery.max(1);
        let guard = &self.guard;
        let span = guard.span(key, delivery);
        let request = guard.claim_request(key, fingerprint);
        let mut client = match self.store.pool().get().await {
            Ok(client) => client,
            Err(error) => {
                let error = StoreError::unavailable(error);
                return self.answered(&span, Err(error), delivery);
            }
        };
        let mut tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(error) => {
                let error = StoreError::unavailable(error);
                return self.answered(&span, Err(error), delivery);
            }
        };
        let claimed = guard
            .store_op("claim", self.store.claim_in(&tx, &request))
            .await;
        let lease = match guard.answer::<T>(&span, claimed, delivery) {
            Ok(run) => {
                // Nothing was written: end the transaction.
                let _ = tx.rollback().await;
                return run;
            }
            Err((lease, _taken_over)) => lease,
        };
        let ctx = JobContext::new(&lease, delivery, CancellationToken::new());
        let ended = {
            let savepoint = match tx.savepoint(SAVEPOINT).await {
                Ok(savepoint) => savepoint,
                Err(error) => {
                    let outcome = JobOutcome::Error(RunError::Store {
                        op: "savepoint",
                        source: StoreError::unavailable(error),
                    });
                    let disposition = guard.retry_policy().after_failure(delivery);
                    return guard.report(&span, outcome, disposition);
                }
            };
            let started = std::time::Instant::now();
            let returned = idem_worker::catch_unwind(|| job(ctx, &savepoint)).await;
            guard.record_job_duration(started.elapsed());
            match returned {
                Ok(Ok(value)) => match serde_json::to_vec(&value) {
                    Ok(bytes) => match savepoint.commit().await {
                        Ok(()) => Ended::Done(value, Bytes::from(bytes)),
                        Err(error) => Ended::Broken("release savepoint", error),
                    },
                    Err(error) => {
                        let _ = savepoint.rollback().await;
                        Ended::Unencodable(error)
                    }
                },
                Ok(Err(error)) => match error.class() {
                    // The claim goes with the rest.
                    ErrorClass::Transient => Ended::Transient(error),
                    ErrorClass::Permanent | ErrorClass::Unknown => {
                        match savepoint.rollback().await {
                            Ok(()) => Ended::Undone(error),
                            Err(pg) => Ended::Broken("rollback to savepoint", pg),
                        }
                    }
                },
                Err(message) => Ended::Panicked(message),
            }
        };
        self.settle(&span, tx, &lease, delivery, ended).await
    }

    fn answered<T: DeserializeOwned>(
        &self,
        span: &Span,
        claimed: Result<idem_core::ClaimOutcome, StoreError>,
        delivery: u32,
    ) -> Run<T> {
        match self.guard.answer::<T>(span, claimed, delivery) {
            Ok(run) => run,
            // A claim error is never an acquired claim.
            Err(_) => self.guard.report(
                span,
                JobOutcome::Error(RunError::Store {
                    op: "claim",
                    source: StoreError::unavailable("no claim"),
                }),
                self.guard.retry_policy().after_failure(delivery),
            ),
        }
    }

    /// Records what the job ended with in `tx` and commits (or rolls back).
    async fn settle<T>(
        &self,
        span: &Span,
        tx: Transaction<'_>,
        lease: &Lease,
        delivery: u32,
        ended: Ended<T>,
    ) -> Run<T> {
        let guard = &self.guard;
        let retry = guard.retry_policy();
        let (outcome, disposition, state) = match ended {
            Ended::Done(value, bytes) => {
                let completed = guard
                    .store_op(
                        "complete",
                        self.store.complete_in(&tx, lease, bytes, guard.retention()),
                    )
                    .await;
                match completed {
                    Ok(()) => match self.commit(tx).await {
                        Ok(()) => (JobOutcome::Executed(value), Disposition::Ack, "completed"),
                        // Committed or not: a redelivery finds the record or a free key.
                        Err(error) => commit_failed(retry.after_failure(delivery), error),
                    },
                    Err(error) => {
                        let _ = tx.rollback().await;
                        (
                            JobOutcome::Error(RunError::Store {
                                op: "complete",
                                source: error,
                            }),
                            retry.after_failure(delivery),
                            "absent",
                        )
                    }
                }
            }
            Ended::Transient(error) => {
                self.count_failure("transient");
                let _ = tx.rollback().await;
                (
                    JobOutcome::Error(RunError::Transient(error.into_cause())),
                    retry.after_failure(delivery),
                    "absent",
                )
            }
            Ended::Panicked(message) => {
                self.count_failure("panic");
                let _ = tx.rollback().await;
                (
                    JobOutcome::Error(RunError::Panicked(message)),
                    retry.after_failure(delivery),
                    "absent",
                )
            }
            Ended::Broken(op, error) => {
                let _ = tx.rollback().await;
                (
                    JobOutcome::Error(RunError::Store {
                        op,
                        source: StoreError::unavailable(error),
                    }),
                    retry.after_failure(delivery),
                    "absent",
                )
            }
            Ended::Unencodable(error) => {
                self.count_failure("encode");
                let failure =
                    Failure::permanent(format!("the job's result could not be encoded: {error}"));
                self.fail(tx, lease, failure, delivery, |_| {
                    JobOutcome::Error(RunError::Encode(error))
                })
                .await
            }
            Ended::Undone(error) if error.class() == ErrorClass::Permanent => {
                self.count_failure("permanent");
                let failure = Failure::permanent(error.cause().to_string());
                self.fail(tx, lease, failure, delivery, JobOutcome::Failed)
                    .await
            }
            Ended::Undone(error) => {
                // Unknown outcome: keep the claim (alone) until its lease ends.
                self.count_failure("unknown");
                let kept = self.commit(tx).await;
                let outcome = JobOutcome::Error(RunError::UnknownOutcome(error.into_cause()));
                match kept {
                    Ok(()) => (
                        outcome,
                        retry.after_failure_waiting(delivery, guard.lease()),
                        "in_flight",
                    ),
                    Err(_) => (outcome, retry.after_failure(delivery), "absent"),
                }
            }
        };
        span.record("state_after", state);
        guard.report(span, outcome, disposition)
    }

    /// Records a permanent failure in `tx` and commits.
    async fn fail<T>(
        &self,
        tx: Transaction<'_>,
        lease: &Lease,
        failure: Failure,
        delivery: u32,
        outcome: impl FnOnce(Failure) -> JobOutcome<T>,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let retry = self.guard.retry_policy();
        let failed = self
            .guard
            .store_op(
                "fail",
                self.store
                    .fail_in(&tx, lease, failure.clone(), self.guard.failure_retention()),
            )
            .await;
        match failed {
            Ok(()) => match self.commit(tx).await {
                Ok(()) => (outcome(failure), Disposition::DeadLetter, "failed"),
                Err(error) => commit_failed(retry.after_failure(delivery), error),
            },
            Err(error) => {
                let _ = tx.rollback().await;
                (
                    JobOutcome::Error(RunError::Store {
                        op: "fail",
                        source: error,
                    }),
                    retry.after_failure(delivery),
                    "absent",
                )
            }
        }
    }

    /// Commits `tx` within the store's operation timeout, timed and counted as the store
    /// operation `commit`.
    async fn commit(&self, tx: Transaction<'_>) -> Result<(), StoreError> {
        self.guard.store_op("commit", self.store.commit(tx)).await
    }

    fn count_failure(&self, kind: &'static str) {
        metrics::counter!(idem_worker::metrics::FAILURES, "job_type" => self.guard.job_type().to_owned(), "kind" => kind)
            .increment(1);
    }
}

/// How the job ended, with the savepoint already released or rolled back.
enum Ended<T> {
    Done(T, Bytes),
    Transient(JobError),
    /// A permanent or unknown-outcome error; the job's writes are rolled back.
    Undone(JobError),
    Unencodable(serde_json::Error),
    Panicked(String),
    Broken(
        &'static str,
        idem_store_postgres::deadpool_postgres::tokio_postgres::Error,
    ),
}

fn commit_failed<T>(
    disposition: Disposition,
    error: StoreError,
) -> (JobOutcome<T>, Disposition, &'static str) {
    (
        JobOutcome::Error(RunError::Store {
            op: "commit",
            source: error,
        }),
        disposition,
        "unknown",
    )
}
