//! [`JobClaim`]: a claimed key between [`JobGuard::admit`](crate::JobGuard::admit) and its run, with
//! the lease its heartbeat keeps alive.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Bytes, Failure, Fence, Lease, StoreError, UnknownOutcome};
use idem_lease::LeaseKeeper;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::context::JobContext;
use crate::error::{ErrorClass, JobError};
use crate::guard::Inner;
use crate::outcome::{JobOutcome, Run, RunError};
use crate::retry::Disposition;
use crate::unwind::catch_unwind;

/// A claimed key whose lease a heartbeat keeps alive, waiting for its job. Made by
/// [`JobGuard::admit`](crate::JobGuard::admit).
///
/// Dropping it (or a [`JobClaim::run`] future before it ends) releases the key from a spawned
/// task: a claim is never held forever and never settled with a result it did not get.
#[must_use]
pub struct JobClaim {
    held: Held,
    taken_over: bool,
    span: Span,
}

impl fmt::Debug for JobClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobClaim")
            .field("lease", self.held.keeper.lease())
            .field("delivery", &self.held.delivery)
            .field("taken_over", &self.taken_over)
            .finish_non_exhaustive()
    }
}

impl JobClaim {
    /// Holds `lease`, granted by a claim sent at `sent`, and starts its heartbeat.
    pub(crate) fn start(
        inner: Arc<Inner>,
        lease: Lease,
        delivery: u32,
        sent: Instant,
        taken_over: bool,
        span: Span,
    ) -> JobClaim {
        JobClaim {
            held: Held::start(inner, lease, delivery, sent),
            taken_over,
            span,
        }
    }

    /// The lease held.
    #[must_use]
    pub fn lease(&self) -> &Lease {
        self.held.keeper.lease()
    }

    /// The fence of this claim.
    #[must_use]
    pub fn fence(&self) -> Fence {
        self.held.keeper.lease().fence
    }

    /// Whether this claim took over a lapsed lease (an earlier holder crashed or stalled).
    #[must_use]
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }

    /// The context the job will get.
    #[must_use]
    pub fn context(&self) -> JobContext {
        JobContext::new(
            self.held.keeper.lease(),
            self.held.delivery,
            self.held.keeper.lost().clone(),
        )
    }

    /// Gives the key back without running anything.
    ///
    /// # Errors
    /// The store's error; the key then lapses with its lease.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.held.stop_heartbeat();
        let span = self.span.clone();
        let result = self.held.settle(Settle::Release).instrument(span).await;
        self.span.record("state_after", "absent");
        result
    }

    /// Runs `job` and records what it returns; see [`JobGuard::run_delivery`](crate::JobGuard::run_delivery).
    pub async fn run<T, F, Fut>(self, job: F) -> Run<T>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(JobContext) -> Fut,
        Fut: Future<Output = Result<T, JobError>>,
    {
        let span = self.span.clone();
        self.run_inner(job).instrument(span).await
    }

    async fn run_inner<T, F, Fut>(mut self, job: F) -> Run<T>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(JobContext) -> Fut,
        Fut: Future<Output = Result<T, JobError>>,
    {
        let inner = self.held.inner.clone();
        if self.held.keeper.is_lost() {
            // The lease was lost while the claim waited (in a receiver's queue, say): another
            // attempt may hold the key and run the job. Running it here too could take effect
            // twice, so give the key back (if it is still ours) and let a retry find out.
            self.held.stop_heartbeat();
            let source = self.held.keeper.take_loss();
            let fence = self.held.keeper.lease().fence;
            let (outcome, disposition, state_after) = self
                .release_after(RunError::LeaseLost { fence, source })
                .await;
            self.span.record("state_after", state_after);
            return inner.finish(&self.span, outcome, disposition);
        }
        let ctx = self.context();
        let started = Instant::now();
        let returned = catch_unwind(|| job(ctx)).await;
        inner.labels.job_seconds(started.elapsed().as_secs_f64());
        // The job is over: no more heartbeats, whatever the settle below does.
        self.held.stop_heartbeat();
        let (outcome, disposition, state_after) = match returned {
            Ok(Ok(value)) => self.record_result(value).await,
            Ok(Err(error)) => {
                inner.labels.failure(error.class().as_str());
                match error.class() {
                    ErrorClass::Transient => {
                        self.release_after(RunError::Transient(error.into_cause()))
                            .await
                    }
                    ErrorClass::Permanent => {
                        let failure = Failure::permanent(error.cause().to_string());
                        self.fail_permanently(failure, JobOutcome::Failed).await
                    }
                    ErrorClass::Unknown => self.settle_unknown(error).await,
                }
            }
            Err(message) => {
                inner.labels.failure("panic");
                self.release_after(RunError::Panicked(message)).await
            }
        };
        self.span.record("state_after", state_after);
        inner.finish(&self.span, outcome, disposition)
    }

    /// Releases the key after a failure that a retry may cure.
    async fn release_after<T>(
        &mut self,
        error: RunError,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let released = self.held.settle(Settle::Release).await;
        let delivery = self.held.delivery;
        match released {
            Ok(()) => (
                JobOutcome::Error(error),
                inner.retry.after_failure(delivery),
                "absent",
            ),
            // Another attempt holds the key now: nothing to give back.
            Err(store) if store.rejection().is_some() => (
                JobOutcome::Error(error),
                inner.retry.after_failure(delivery),
                "lost",
            ),
            // Not released: the key lapses with the lease.
            Err(_) => (
                JobOutcome::Error(error),
                inner
                    .retry
                    .after_failure_waiting(delivery, self.held.keeper.remaining()),
                "in_flight",
            ),
        }
    }

    /// Records the key as unknown after a job whose outcome it could not learn: no later
    /// delivery runs it again until it is resolved (or the guard's unknown hold passes).
    async fn settle_unknown<T>(
        &mut self,
        error: JobError,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let outcome = UnknownOutcome::new(error.cause().to_string());
        let settle = Settle::Unknown(outcome, inner.unknown_hold, inner.failure_retention);
        match self.held.settle(settle).await {
            Ok(()) => (
                JobOutcome::Error(RunError::UnknownOutcome(error.into_cause())),
                Disposition::DeadLetter,
                "unknown",
            ),
            // Lost (another attempt holds the key), or the store failed: the claim lapses with
            // its lease, and nothing recorded the unknown outcome.
            Err(store) => self.settle_error("settle_unknown", store),
        }
    }

    /// Records `failure` as permanent; `outcome` makes the outcome once it is recorded.
    async fn fail_permanently<T>(
        &mut self,
        failure: Failure,
        outcome: impl FnOnce(Failure) -> JobOutcome<T>,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let retention = self.held.inner.failure_retention;
        let failed = self
            .held
            .settle(Settle::Fail(failure.clone(), retention))
            .await;
        match failed {
            Ok(()) => (outcome(failure), Disposition::DeadLetter, "failed"),
            Err(store) => self.settle_error("fail", store),
        }
    }

    /// Encodes and records a successful result.
    async fn record_result<T: Serialize>(
        &mut self,
        value: T,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let bytes = match serde_json::to_vec(&value) {
            Ok(bytes) => Bytes::from(bytes),
            Err(error) => {
                // The effect happened: record a permanent failure rather than run it again.
                inner.labels.failure("encode");
                let failure =
                    Failure::permanent(format!("the job's result could not be encoded: {error}"));
                return self
                    .fail_permanently(failure, |_| JobOutcome::Error(RunError::Encode(error)))
                    .await;
            }
        };
        let completed = self
            .held
            .settle(Settle::Complete(bytes, inner.retention))
            .await;
        match completed {
            Ok(()) => (JobOutcome::Executed(value), Disposition::Ack, "completed"),
            Err(StoreError::TooLarge { size, limit }) => {
                inner.labels.failure("encode");
                let failure = Failure::permanent(format!(
                    "the job's result of {size} bytes is over the store's limit of {limit} bytes"
                ));
                self.fail_permanently(failure, JobOutcome::Failed).await
            }
            Err(error) => self.settle_error("complete", error),
        }
    }

    /// The outcome of a refused or failed settle. A refusal means the lease was lost; any
    /// other error leaves the claim to lapse with its lease.
    fn settle_error<T>(
        &self,
        op: &'static str,
        error: StoreError,
    ) -> (JobOutcome<T>, Disposition, &'static str) {
        let inner = &self.held.inner;
        let delivery = self.held.delivery;
        if error.rejection().is_some() {
            // Counted unless the heartbeat had noticed already.
            self.held.keeper.lose(&error);
            (
                JobOutcome::Error(RunError::LeaseLost {
                    fence: self.held.keeper.lease().fence,
                    source: error,
                }),
                inner.retry.after_failure(delivery),
                "lost",
            )
        } else {
            (
                JobOutcome::Error(RunError::Store { op, source: error }),
                inner
                    .retry
                    .after_failure_waiting(delivery, self.held.keeper.remaining()),
                "in_flight",
            )
        }
    }
}

/// The claim's lease keeper (heartbeat, retried settle, release on drop) and the task that
/// runs its heartbeat.
struct Held {
    inner: Arc<Inner>,
    keeper: LeaseKeeper,
    delivery: u32,
    heartbeat: Option<JoinHandle<()>>,
}

impl Held {
    /// Holds `lease`, granted by a claim sent at `sent`.
    fn start(inner: Arc<Inner>, lease: Lease, delivery: u32, sent: Instant) -> Held {
        let keeper = LeaseKeeper::new(inner.store.clone(), inner.keeper.clone(), lease, sent);
        let heartbeat = tokio::spawn(keeper.heartbeat().in_current_span());
        Held {
            inner,
            keeper,
            delivery,
            heartbeat: Some(heartbeat),
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(handle) = self.heartbeat.take() {
            handle.abort();
        }
    }

    /// Sends `settle`, again while the store answers a retryable error (the guard's settle
    /// tries); the claim is settled after it.
    async fn settle(&mut self, settle: Settle) -> Result<(), StoreError> {
        let store = self.inner.store.clone();
        let lease = self.keeper.lease().clone();
        let tries = self.inner.settle_tries;
        self.keeper
            .settle_with(tries, || match &settle {
                Settle::Release => store.release(&lease),
                Settle::Fail(failure, retention) => store.fail(&lease, failure.clone(), *retention),
                Settle::Complete(result, retention) => {
                    store.complete(&lease, result.clone(), *retention)
                }
                Settle::Unknown(outcome, hold, retention) => {
                    store.settle_unknown(&lease, outcome.clone(), *hold, *retention)
                }
            })
            .await
    }
}

/// A transition that settles a claim.
enum Settle {
    /// Give the key back.
    Release,
    /// Record a failure, kept for the duration.
    Fail(Failure, Duration),
    /// Record a result, kept for the duration.
    Complete(Bytes, Duration),
    /// Record an unknown outcome, holding the key for the first duration (`None`: until
    /// resolved), kept for the second.
    Unknown(UnknownOutcome, Option<Duration>, Duration),
}

impl Drop for Held {
    fn drop(&mut self) {
        // The keeper releases a claim dropped unsettled (a cancelled future, a shutdown).
        self.stop_heartbeat();
    }
}
