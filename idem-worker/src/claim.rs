//! [`Claim`]: a claimed key between [`JobGuard::admit`](crate::JobGuard::admit) and its run, with
//! the lease its heartbeat keeps alive.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Bytes, Failure, Fence, Lease, Store, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::context::JobContext;
use crate::error::{ErrorClass, JobError};
use crate::guard::Inner;
use crate::metrics::{self as m};
use crate::outcome::{Outcome, Run, RunError};
use crate::retry::Disposition;
use crate::unwind::catch_unwind;

/// A claimed key whose lease a heartbeat keeps alive, waiting for its job. Made by
/// [`JobGuard::admit`](crate::JobGuard::admit).
///
/// Dropping it (or a [`Claim::run`] future before it ends) releases the key from a spawned
/// task: a claim is never held forever and never settled with a result it did not get.
#[must_use]
pub struct Claim {
    held: Held,
    taken_over: bool,
    span: Span,
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("lease", &self.held.lease)
            .field("delivery", &self.held.delivery)
            .field("taken_over", &self.taken_over)
            .finish_non_exhaustive()
    }
}

impl Claim {
    /// Holds `lease`, granted by a claim sent at `sent`, and starts its heartbeat.
    pub(crate) fn start(
        inner: Arc<Inner>,
        lease: Lease,
        delivery: u32,
        sent: Instant,
        taken_over: bool,
        span: Span,
    ) -> Claim {
        Claim {
            held: Held::start(inner, lease, delivery, sent),
            taken_over,
            span,
        }
    }

    /// The lease held.
    #[must_use]
    pub fn lease(&self) -> &Lease {
        &self.held.lease
    }

    /// The fence of this claim.
    #[must_use]
    pub fn fence(&self) -> Fence {
        self.held.lease.fence
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
            &self.held.lease,
            self.held.delivery,
            self.held.cancel.clone(),
        )
    }

    /// Gives the key back without running anything.
    ///
    /// # Errors
    /// The store's error; the key then lapses with its lease.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.held.stop_heartbeat();
        let inner = self.held.inner.clone();
        let lease = self.held.lease.clone();
        let result = inner
            .settle("release", || inner.store.release(&lease))
            .instrument(self.span.clone())
            .await;
        self.held.settled = true;
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
        if self.held.cancel.is_cancelled() {
            // The lease was lost while the claim waited (in a receiver's queue, say): another
            // attempt may hold the key and run the job. Running it here too could take effect
            // twice, so give the key back (if it is still ours) and let a retry find out.
            self.held.stop_heartbeat();
            let source = self.held.take_loss();
            let fence = self.held.lease.fence;
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
        let delivery = self.held.delivery;
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
                        self.fail_permanently(failure, Outcome::Failed).await
                    }
                    ErrorClass::Unknown => {
                        // Keep the claim: nobody may run the job again before the lease ends.
                        self.held.settled = true;
                        (
                            Outcome::Error(RunError::UnknownOutcome(error.into_cause())),
                            inner
                                .retry
                                .after_failure_waiting(delivery, self.held.remaining()),
                            "in_flight",
                        )
                    }
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
    ) -> (Outcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let lease = self.held.lease.clone();
        let released = inner
            .settle("release", || inner.store.release(&lease))
            .await;
        self.held.settled = true;
        let delivery = self.held.delivery;
        match released {
            Ok(()) => (
                Outcome::Error(error),
                inner.retry.after_failure(delivery),
                "absent",
            ),
            // Another attempt holds the key now: nothing to give back.
            Err(store) if store.rejection().is_some() => (
                Outcome::Error(error),
                inner.retry.after_failure(delivery),
                "lost",
            ),
            // Not released: the key lapses with the lease.
            Err(_) => (
                Outcome::Error(error),
                inner
                    .retry
                    .after_failure_waiting(delivery, self.held.remaining()),
                "in_flight",
            ),
        }
    }

    /// Records `failure` as permanent; `outcome` makes the outcome once it is recorded.
    async fn fail_permanently<T>(
        &mut self,
        failure: Failure,
        outcome: impl FnOnce(Failure) -> Outcome<T>,
    ) -> (Outcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let lease = self.held.lease.clone();
        let failed = inner
            .settle("fail", || {
                inner
                    .store
                    .fail(&lease, failure.clone(), inner.failure_retention)
            })
            .await;
        self.held.settled = true;
        match failed {
            Ok(()) => (outcome(failure), Disposition::DeadLetter, "failed"),
            Err(store) => self.settle_error("fail", store),
        }
    }

    /// Encodes and records a successful result.
    async fn record_result<T: Serialize>(
        &mut self,
        value: T,
    ) -> (Outcome<T>, Disposition, &'static str) {
        let inner = self.held.inner.clone();
        let lease = self.held.lease.clone();
        let bytes = match serde_json::to_vec(&value) {
            Ok(bytes) => Bytes::from(bytes),
            Err(error) => {
                // The effect happened: record a permanent failure rather than run it again.
                inner.labels.failure("encode");
                let failure =
                    Failure::permanent(format!("the job's result could not be encoded: {error}"));
                return self
                    .fail_permanently(failure, |_| Outcome::Error(RunError::Encode(error)))
                    .await;
            }
        };
        let completed = inner
            .settle("complete", || {
                inner.store.complete(&lease, bytes.clone(), inner.retention)
            })
            .await;
        self.held.settled = true;
        match completed {
            Ok(()) => (Outcome::Executed(value), Disposition::Ack, "completed"),
            Err(StoreError::TooLarge { size, limit }) => {
                inner.labels.failure("encode");
                let failure = Failure::permanent(format!(
                    "the job's result of {size} bytes is over the store's limit of {limit} bytes"
                ));
                self.fail_permanently(failure, Outcome::Failed).await
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
    ) -> (Outcome<T>, Disposition, &'static str) {
        let inner = &self.held.inner;
        let delivery = self.held.delivery;
        if error.rejection().is_some() {
            if !self.held.cancel.is_cancelled() {
                // The heartbeat had not noticed yet.
                inner.labels.count(m::LEASE_LOSSES);
                self.held.cancel.cancel();
            }
            (
                Outcome::Error(RunError::LeaseLost {
                    fence: self.held.lease.fence,
                    source: error,
                }),
                inner.retry.after_failure(delivery),
                "lost",
            )
        } else {
            (
                Outcome::Error(RunError::Store { op, source: error }),
                inner
                    .retry
                    .after_failure_waiting(delivery, self.held.remaining()),
                "in_flight",
            )
        }
    }
}

/// The claim's lease, its heartbeat, and the guard that releases an unsettled claim.
struct Held {
    inner: Arc<Inner>,
    lease: Lease,
    delivery: u32,
    cancel: CancellationToken,
    /// When the lease ends, as far as this process knows (the last granted extension).
    deadline: Arc<Mutex<Instant>>,
    /// The heartbeat's error that ended the lease, once it did.
    loss: Arc<Mutex<Option<StoreError>>>,
    heartbeat: Option<JoinHandle<()>>,
    settled: bool,
}

impl Held {
    /// Holds `lease`, granted by a claim sent at `sent`.
    fn start(inner: Arc<Inner>, lease: Lease, delivery: u32, sent: Instant) -> Held {
        let cancel = CancellationToken::new();
        let deadline = Arc::new(Mutex::new(lease_end(sent, inner.lease)));
        let loss = Arc::new(Mutex::new(None));
        let heartbeat = tokio::spawn(
            heartbeat(
                inner.clone(),
                lease.clone(),
                cancel.clone(),
                deadline.clone(),
                loss.clone(),
            )
            .in_current_span(),
        );
        Held {
            inner,
            lease,
            delivery,
            cancel,
            deadline,
            loss,
            heartbeat: Some(heartbeat),
            settled: false,
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(handle) = self.heartbeat.take() {
            handle.abort();
        }
    }

    /// The heartbeat's error that ended the lease (taken once).
    fn take_loss(&self) -> StoreError {
        let taken = match self.loss.lock() {
            Ok(mut loss) => loss.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        taken.unwrap_or_else(|| StoreError::unavailable("the lease was lost"))
    }

    /// How long the lease has left, as far as this process knows.
    fn remaining(&self) -> Duration {
        let deadline = match self.deadline.lock() {
            Ok(deadline) => *deadline,
            Err(poisoned) => *poisoned.into_inner(),
        };
        deadline.saturating_duration_since(Instant::now())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if self.settled {
            return;
        }
        // Dropped before the job ended (a cancelled future, a shutdown): nothing to record,
        // so give the key back. Without a runtime the key lapses with its lease.
        let inner = self.inner.clone();
        let lease = self.lease.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            tracing::debug!(
                fence = lease.fence.get(),
                "claim dropped unsettled: releasing"
            );
            runtime.spawn(async move {
                if let Err(error) = inner.settle("release", || inner.store.release(&lease)).await {
                    let error = error.redacted(inner.redact_keys);
                    tracing::warn!(%error, fence = lease.fence.get(), "release of a dropped claim failed; the key lapses with its lease");
                }
            });
        }
    }
}

/// Extends the lease every interval until aborted; on a refusal (or when the store stayed
/// unreachable for a whole lease) fires `cancel` and stops.
async fn heartbeat(
    inner: Arc<Inner>,
    lease: Lease,
    cancel: CancellationToken,
    deadline: Arc<Mutex<Instant>>,
    loss: Arc<Mutex<Option<StoreError>>>,
) {
    let interval = inner.heartbeat;
    let mut next = lease_end(Instant::now(), interval);
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        match inner
            .labels
            .store_op("heartbeat", inner.store.heartbeat(&lease, inner.lease))
            .await
        {
            Ok(_) => {
                let mut guard = match deadline.lock() {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *guard = lease_end(sent, inner.lease);
                next = lease_end(sent, interval);
            }
            Err(error) => {
                let ends = match deadline.lock() {
                    Ok(guard) => *guard,
                    Err(poisoned) => *poisoned.into_inner(),
                };
                let now = Instant::now();
                if error.is_retryable() && now < ends {
                    tracing::warn!(error = %error.redacted(inner.redact_keys), "heartbeat failed; trying again");
                    // Again after an interval, but no later than the lease's end: a store
                    // still unreachable then means the lease is lost, and the job learns it
                    // when the lease ends, not up to an interval later.
                    next = lease_end(now, interval).min(ends);
                    continue;
                }
                inner.labels.count(m::LEASE_LOSSES);
                tracing::warn!(error = %error.redacted(inner.redact_keys), "lease lost: cancelling the job");
                match loss.lock() {
                    Ok(mut loss) => *loss = Some(error),
                    Err(poisoned) => *poisoned.into_inner() = Some(error),
                }
                cancel.cancel();
                return;
            }
        }
    }
}

/// When a lease of `lease` granted at `sent` ends; far in the future (never a panic) for a
/// lease longer than the clock can count.
fn lease_end(sent: Instant, lease: Duration) -> Instant {
    Instant::from_std(idem_core::saturating_deadline(sent.into_std(), lease))
}
