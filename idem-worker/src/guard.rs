//! [`JobGuard`]: claim, run with a heartbeat, record; and the [`Claim`] in between.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Fingerprint, IdempotencyKey, Lease,
    OwnerToken, RecordKey, Scope, Store, StoreError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, field};

use crate::context::JobContext;
use crate::error::{ErrorClass, JobError};
use crate::metrics::{self as m, Labels};
use crate::outcome::{Outcome, Run, RunError};
use crate::retry::{Disposition, RetryPolicy};

/// A [`JobGuardBuilder`] setting was out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease is zero.
    #[error("the lease is zero: it must be at least 1 ms")]
    ZeroLease,
    /// The heartbeat interval is zero or not shorter than the lease.
    #[error("the heartbeat interval {interval:?} must be above zero and below the lease {lease:?}")]
    Heartbeat {
        /// The interval.
        interval: Duration,
        /// The lease.
        lease: Duration,
    },
}

/// Builds a [`JobGuard`]. Made by [`JobGuard::builder`].
///
/// Defaults: job type `job`, worker id `worker`, store label `store`, no scope, lease 30 s,
/// heartbeat every lease / 3, results kept 24 h, permanent failures kept 24 h, the default
/// [`RetryPolicy`], keys shown in logs, 3 tries to record a result.
#[must_use]
pub struct JobGuardBuilder {
    store: Arc<dyn Store>,
    job_type: String,
    worker_id: String,
    store_label: String,
    scope: Scope,
    lease: Duration,
    heartbeat: Option<Duration>,
    retention: Duration,
    failure_retention: Duration,
    retry: RetryPolicy,
    redact_keys: bool,
    settle_tries: u32,
}

impl fmt::Debug for JobGuardBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobGuardBuilder")
            .field("job_type", &self.job_type)
            .field("worker_id", &self.worker_id)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

impl JobGuardBuilder {
    /// The job type: the `job_type` label of every metric and log line.
    pub fn job_type(mut self, job_type: impl Into<String>) -> Self {
        self.job_type = job_type.into();
        self
    }

    /// The worker's identity in logs (a host name, a pod name, a process id).
    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Self {
        self.worker_id = worker_id.into();
        self
    }

    /// The `store` label of the store metrics (`memory`, `redis`, `postgres`...).
    pub fn store_label(mut self, store: impl Into<String>) -> Self {
        self.store_label = store.into();
        self
    }

    /// The scope of every key (for example one per job type, so two job types never share a
    /// key). Default: none.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// How long a claim lasts without a heartbeat: a crashed worker's job runs again this long
    /// after its last heartbeat.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a running job's lease is extended. Default: lease / 3.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// How long a result is kept (and duplicates answered with it).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a permanent failure is kept (and duplicates answered with it).
    pub fn failure_retention(mut self, retention: Duration) -> Self {
        self.failure_retention = retention;
        self
    }

    /// The backoff and attempt bound of retried messages.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Logs a digest of the key instead of the key (keys can hold personal data); a store
    /// error that names its record (a corrupt one) is logged without the key too.
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.redact_keys = redact;
        self
    }

    /// How many times a result (or failure, or release) is sent when the store is
    /// unreachable, before the claim is left to lapse. At least 1.
    pub fn settle_tries(mut self, tries: u32) -> Self {
        self.settle_tries = tries.max(1);
        self
    }

    /// The guard.
    ///
    /// # Errors
    /// [`ConfigError`] if the lease is zero or the heartbeat interval is not below the lease.
    pub fn build(self) -> Result<JobGuard, ConfigError> {
        if self.lease < Duration::from_millis(1) {
            return Err(ConfigError::ZeroLease);
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3);
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return Err(ConfigError::Heartbeat {
                interval: heartbeat,
                lease: self.lease,
            });
        }
        Ok(JobGuard {
            inner: Arc::new(Inner {
                store: self.store,
                labels: Labels {
                    job_type: self.job_type,
                    store: self.store_label,
                },
                worker_id: self.worker_id,
                scope: self.scope,
                lease: self.lease,
                heartbeat,
                retention: self.retention,
                failure_retention: self.failure_retention,
                retry: self.retry,
                redact_keys: self.redact_keys,
                settle_tries: self.settle_tries,
            }),
        })
    }
}

struct Inner {
    store: Arc<dyn Store>,
    labels: Labels,
    worker_id: String,
    scope: Scope,
    lease: Duration,
    heartbeat: Duration,
    retention: Duration,
    failure_retention: Duration,
    retry: RetryPolicy,
    redact_keys: bool,
    settle_tries: u32,
}

/// Runs jobs at most once per key to completion: claims the key, runs the job while a
/// heartbeat extends the lease, records the result, and tells the consumer what to do with
/// the message. Cheap to clone (an `Arc`).
///
/// See the [crate documentation](crate) for an example.
#[derive(Clone)]
pub struct JobGuard {
    inner: Arc<Inner>,
}

impl fmt::Debug for JobGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobGuard")
            .field("job_type", &self.inner.labels.job_type)
            .field("worker_id", &self.inner.worker_id)
            .field("store", &self.inner.store)
            .field("lease", &self.inner.lease)
            .field("heartbeat", &self.inner.heartbeat)
            .finish_non_exhaustive()
    }
}

/// The answer to [`JobGuard::admit`]: the key is yours to run, or here is the answer.
#[derive(Debug)]
#[must_use]
pub enum Admission<T> {
    /// The key is claimed and its lease kept alive: run the job with [`Claim::run`] (or give
    /// the key back with [`Claim::release`]). Dropping the claim releases the key.
    Claimed(Claim),
    /// Nothing to run: replayed, in flight, mismatch, failed, or a store error.
    Answered(Run<T>),
}

impl JobGuard {
    /// A builder over `store`, with the defaults of [`JobGuardBuilder`].
    pub fn builder(store: Arc<dyn Store>) -> JobGuardBuilder {
        JobGuardBuilder {
            store,
            job_type: "job".to_owned(),
            worker_id: "worker".to_owned(),
            store_label: "store".to_owned(),
            scope: Scope::none(),
            lease: Duration::from_secs(30),
            heartbeat: None,
            retention: Duration::from_secs(24 * 3600),
            failure_retention: Duration::from_secs(24 * 3600),
            retry: RetryPolicy::default(),
            redact_keys: false,
            settle_tries: 3,
        }
    }

    /// A guard over `store` with every default.
    #[must_use]
    pub fn new(store: Arc<dyn Store>) -> Self {
        // The defaults are valid: lease 30 s, heartbeat 10 s.
        match JobGuard::builder(store.clone()).build() {
            Ok(guard) => guard,
            Err(_) => unreachable!("the default configuration is valid"),
        }
    }

    /// The lease of every claim.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The heartbeat interval.
    #[must_use]
    pub fn heartbeat_interval(&self) -> Duration {
        self.inner.heartbeat
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The record key of `key` under the guard's scope.
    #[must_use]
    pub fn record_key(&self, key: &IdempotencyKey) -> RecordKey {
        RecordKey::new(self.inner.scope.clone(), key.clone())
    }

    /// Runs `job` for the first delivery of a message: see [`JobGuard::run_delivery`].
    pub async fn run<T, F, Fut>(
        &self,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        job: F,
    ) -> Run<T>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(JobContext) -> Fut,
        Fut: Future<Output = Result<T, JobError>>,
    {
        self.run_delivery(key, fingerprint, 1, job).await
    }

    /// Claims `key` and, if the key is free, runs `job` while a heartbeat keeps the lease,
    /// then records its result (or failure). `delivery` is the queue's delivery count of the
    /// message (1 for the first); the retry policy bounds it.
    ///
    /// The job runs in the caller's task. If the returned future is dropped before the end,
    /// or the job panics, the key is released (by a spawned task) and nothing is recorded.
    pub async fn run_delivery<T, F, Fut>(
        &self,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        delivery: u32,
        job: F,
    ) -> Run<T>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(JobContext) -> Fut,
        Fut: Future<Output = Result<T, JobError>>,
    {
        match self.admit(key, fingerprint, delivery).await {
            Admission::Claimed(claim) => claim.run(job).await,
            Admission::Answered(run) => run,
        }
    }

    /// Claims `key` without running anything yet: the first half of
    /// [`JobGuard::run_delivery`], for a receiver that answers at once and runs the job later
    /// (a webhook receiver with a queue). The lease is kept alive by a heartbeat from now on.
    pub async fn admit<T: DeserializeOwned>(
        &self,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        delivery: u32,
    ) -> Admission<T> {
        let delivery = delivery.max(1);
        let span = self.span(key, delivery);
        // The owner is chosen here, so that a claim whose answer is lost can be sent again
        // and be answered the grant it made.
        let request = self
            .claim_request(key, fingerprint)
            .with_owner(OwnerToken::random());
        // The store starts the lease when it takes the claim, which is after this and before
        // the answer arrives: counting from here never overestimates it.
        let sent = Instant::now();
        let claim = || {
            self.inner
                .labels
                .store_op("claim", self.inner.store.claim(&request))
                .instrument(span.clone())
        };
        let mut claimed = claim().await;
        if matches!(claimed, Err(StoreError::Timeout { .. })) {
            // The claim may have been granted with only its answer lost: that grant would hold
            // the key for a whole lease with nothing running. Sent again (same owner), it is
            // answered that grant, or granted now.
            claimed = claim().await;
        }
        match self.answer(&span, claimed, delivery) {
            Ok(run) => Admission::Answered(run),
            Err((lease, taken_over)) => Admission::Claimed(Claim {
                held: Held::start(self.inner.clone(), lease, delivery, sent),
                taken_over,
                span,
            }),
        }
    }

    /// The `idem_job` span of one delivery of `key`, with the fields of the crate
    /// documentation. For a variant of the guard (see [`JobGuard::answer`]).
    #[must_use]
    pub fn span(&self, key: &IdempotencyKey, delivery: u32) -> Span {
        let inner = &self.inner;
        let record_key = self.record_key(key);
        tracing::info_span!(
            "idem_job",
            idempotency_key = %KeyField { key: &record_key, redact: inner.redact_keys },
            job_type = %inner.labels.job_type,
            worker_id = %inner.worker_id,
            attempt = delivery,
            fence = field::Empty,
            lease_attempt = field::Empty,
            state_before = field::Empty,
            state_after = field::Empty,
            outcome = field::Empty,
            disposition = field::Empty,
        )
    }

    /// The claim request of `key`: the guard's scope and lease.
    #[must_use]
    pub fn claim_request(&self, key: &IdempotencyKey, fingerprint: Fingerprint) -> ClaimRequest {
        ClaimRequest::new(self.record_key(key), fingerprint, self.inner.lease)
    }

    /// Turns the answer to a claim into a [`Run`], with its metrics and log line; an acquired
    /// claim comes back as `Err((lease, taken_over))` for the caller to run.
    ///
    /// This and [`JobGuard::span`], [`JobGuard::claim_request`] and [`JobGuard::report`] are
    /// the pieces of [`JobGuard::run_delivery`], for a variant of the guard that claims
    /// somewhere else (inside a database transaction, as `idem-worker-postgres` does) and
    /// answers the same way.
    ///
    /// # Errors
    /// `Err((lease, taken_over))` when the claim was acquired: nothing is answered yet.
    pub fn answer<T: DeserializeOwned>(
        &self,
        span: &Span,
        claimed: Result<ClaimOutcome, StoreError>,
        delivery: u32,
    ) -> Result<Run<T>, (Lease, bool)> {
        let inner = &self.inner;
        let finish = |outcome: Outcome<T>, disposition: Disposition, state: &'static str| {
            span.record("state_before", state);
            span.record("state_after", state);
            Ok(inner.finish(span, outcome, disposition))
        };
        match claimed {
            Err(error) => {
                let disposition = if error.is_retryable() {
                    inner.retry.after_failure(delivery)
                } else {
                    Disposition::DeadLetter
                };
                finish(
                    Outcome::Error(RunError::Store {
                        op: "claim",
                        source: error,
                    }),
                    disposition,
                    "unknown",
                )
            }
            Ok(ClaimOutcome::Completed(record)) => {
                inner.labels.count(m::REPLAYS);
                let decoded = record
                    .result
                    .as_deref()
                    .map(serde_json::from_slice::<T>)
                    .unwrap_or_else(|| serde_json::from_slice::<T>(b""));
                match decoded {
                    Ok(value) => finish(Outcome::Replayed(value), Disposition::Ack, "completed"),
                    Err(error) => finish(
                        Outcome::Error(RunError::Decode(error)),
                        Disposition::DeadLetter,
                        "completed",
                    ),
                }
            }
            Ok(ClaimOutcome::Failed(record)) => {
                let failure = record
                    .failure
                    .unwrap_or_else(|| Failure::permanent("failed (no message recorded)"));
                finish(Outcome::Failed(failure), Disposition::DeadLetter, "failed")
            }
            Ok(ClaimOutcome::Mismatch) => {
                inner.labels.count(m::MISMATCHES);
                finish(Outcome::Mismatch, Disposition::DeadLetter, "mismatch")
            }
            Ok(ClaimOutcome::InFlight { retry_after }) => {
                inner.labels.count(m::COLLISIONS);
                // Back off, but never past the holder's lease: a short job is usually done
                // long before its lease lapses, and a crashed holder's key is taken over once
                // it does. Not bounded by the attempts: the holder's lease bounds the wait.
                let after = inner
                    .retry
                    .delay(delivery)
                    .min(retry_after)
                    .max(Duration::from_millis(1));
                finish(
                    Outcome::InFlight { retry_after },
                    Disposition::Retry { after },
                    "in_flight",
                )
            }
            Ok(ClaimOutcome::Acquired { lease, taken_over }) => {
                inner.labels.count(m::CLAIMS_ACQUIRED);
                if taken_over {
                    inner.labels.count(m::TAKEOVERS);
                }
                span.record("fence", lease.fence.get());
                span.record("lease_attempt", lease.attempt);
                span.record(
                    "state_before",
                    if taken_over { "in_flight" } else { "absent" },
                );
                tracing::debug!(parent: span, taken_over, "claim acquired");
                Err((lease, taken_over))
            }
        }
    }

    /// Ends a run: records `outcome` and `disposition` in `span`, the metrics and the log.
    pub fn report<T>(&self, span: &Span, outcome: Outcome<T>, disposition: Disposition) -> Run<T> {
        self.inner.finish(span, outcome, disposition)
    }

    /// Runs one store operation `op` of a variant of the guard (see [`JobGuard::answer`]),
    /// timing it into `idem_store_operation_seconds` and counting its error into
    /// `idem_store_errors_total`, with the guard's `job_type` and `store` labels.
    ///
    /// # Errors
    /// The operation's error, unchanged.
    pub async fn store_op<T>(
        &self,
        op: &'static str,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.inner.labels.store_op(op, operation).await
    }

    /// Records how long a job ran (`idem_job_duration_seconds`), for a variant of the guard
    /// (see [`JobGuard::answer`]).
    pub fn record_job_duration(&self, elapsed: Duration) {
        self.inner.labels.job_seconds(elapsed.as_secs_f64());
    }

    /// The job type (the `job_type` label).
    #[must_use]
    pub fn job_type(&self) -> &str {
        &self.inner.labels.job_type
    }

    /// How long results are kept.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// How long permanent failures are kept.
    #[must_use]
    pub fn failure_retention(&self) -> Duration {
        self.inner.failure_retention
    }
}

impl Inner {
    fn finish<T>(&self, span: &Span, outcome: Outcome<T>, disposition: Disposition) -> Run<T> {
        span.record("outcome", outcome.kind());
        span.record("disposition", disposition.as_str());
        self.labels.job(outcome.kind(), disposition.as_str());
        match &outcome {
            Outcome::Error(error) => {
                let error = logged(error, self.redact_keys);
                tracing::warn!(parent: span, %error, %disposition, "job not settled");
            }
            Outcome::Failed(failure) => {
                tracing::info!(parent: span, failure = %failure.message, %disposition, "job failed");
            }
            _ => tracing::debug!(parent: span, outcome = outcome.kind(), %disposition, "job done"),
        }
        Run {
            outcome,
            disposition,
        }
    }

    /// Sends one settling transition, again while the store answers with a retryable error.
    async fn settle<F, Fut>(&self, op: &'static str, mut send: F) -> Result<(), StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.labels.store_op(op, send()).await {
                Err(error) if error.is_retryable() && tries < self.settle_tries => {
                    let pause = Duration::from_millis(20u64 << tries.min(8));
                    let error = error.redacted(self.redact_keys);
                    tracing::debug!(%error, tries, "settle failed, trying again");
                    tokio::time::sleep(pause).await;
                }
                other => return other,
            }
        }
    }
}

/// Shows the key, or a digest of it when keys are redacted.
struct KeyField<'a> {
    key: &'a RecordKey,
    redact: bool,
}

impl fmt::Display for KeyField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.redact {
            write!(f, "sha256:{}", &self.key.digest_hex()[..16])
        } else {
            fmt::Display::fmt(self.key, f)
        }
    }
}

/// A claimed key whose lease a heartbeat keeps alive, waiting for its job. Made by
/// [`JobGuard::admit`].
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

    /// Runs `job` and records what it returns; see [`JobGuard::run_delivery`].
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

/// `error` as the guard's log lines show it: with `redact`, a store error's message leaves out
/// the record's key (see [`StoreError::redacted`]); the line's key field is redacted already.
fn logged(error: &RunError, redact: bool) -> String {
    match error {
        RunError::Store { op, source } if redact => {
            format!("store error during {op}: {}", source.redacted(true))
        }
        RunError::LeaseLost { fence, source } if redact => format!(
            "the lease of fence {fence} was lost; the result was not recorded: {}",
            source.redacted(true)
        ),
        other => other.to_string(),
    }
}

/// When a lease of `lease` granted at `sent` ends; far in the future (never a panic) for a
/// lease longer than the clock can count.
fn lease_end(sent: Instant, lease: Duration) -> Instant {
    Instant::from_std(idem_core::saturating_deadline(sent.into_std(), lease))
}

/// Creates the future with `make` and runs it, catching a panic in either step: `Err` holds
/// the panic's message. The guard runs jobs through this; a variant of the guard can too.
///
/// # Errors
/// The message of the panic.
pub async fn catch_unwind<F, Fut>(make: F) -> Result<Fut::Output, String>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let caught = match std::panic::catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => CatchUnwind(Box::pin(future)).await,
        Err(panic) => Err(panic),
    };
    caught.map_err(|panic| panic_message(panic.as_ref()))
}

/// Catches a panic while polling the job's future.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_keys_show_a_digest_only() {
        let key = RecordKey::unscoped(IdempotencyKey::new("user@example.com:welcome").unwrap());
        let shown = KeyField {
            key: &key,
            redact: true,
        }
        .to_string();
        assert!(
            shown.starts_with("sha256:") && shown.len() == 7 + 16,
            "{shown}"
        );
        assert!(!shown.contains("example"));
        let plain = KeyField {
            key: &key,
            redact: false,
        }
        .to_string();
        assert_eq!(plain, "user@example.com:welcome");
    }
}
