//! [`JobGuard`]: claims a key, runs the job under the claim and records its outcome.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Fingerprint, IdempotencyKey, Lease,
    OwnerToken, Record, RecordKey, Scope, Store, StoreError, UnknownOutcome,
};
use idem_lease::{KeeperConfig, Metered};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::{Instrument, Span, field};

use crate::builder::JobGuardBuilder;
use crate::claim::JobClaim;
use crate::context::JobContext;
use crate::error::JobError;
use crate::metrics::{self as m, Labels};
use crate::outcome::{JobOutcome, Run, RunError};
use crate::retry::{Disposition, RetryPolicy};

pub(crate) struct Inner {
    /// The store, [`Metered`] under the guard's store label.
    pub(crate) store: Arc<dyn Store>,
    /// The same store, for the operations [`JobGuard::store_op`] times.
    pub(crate) metered: Arc<Metered<Arc<dyn Store>>>,
    /// How each claim keeps its lease.
    pub(crate) keeper: Arc<KeeperConfig>,
    pub(crate) labels: Labels,
    pub(crate) worker_id: String,
    pub(crate) scope: Scope,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) retention: Duration,
    pub(crate) failure_retention: Duration,
    pub(crate) unknown_hold: Option<Duration>,
    pub(crate) retry: RetryPolicy,
    pub(crate) redact_keys: bool,
    pub(crate) settle_tries: u32,
}

/// Runs jobs at most once per key to completion: claims the key, runs the job while a
/// heartbeat extends the lease, records the result, and tells the consumer what to do with
/// the message. Cheap to clone (an `Arc`).
///
/// See the [crate documentation](crate) for an example.
#[derive(Clone)]
pub struct JobGuard {
    pub(crate) inner: Arc<Inner>,
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
    /// The key is claimed and its lease kept alive: run the job with [`JobClaim::run`] (or give
    /// the key back with [`JobClaim::release`]). Dropping the claim releases the key.
    Claimed(JobClaim),
    /// Nothing to run: replayed, in flight, mismatch, failed, unknown, or a store error.
    Answered(Run<T>),
}

impl JobGuard {
    /// A builder over `store`, with the defaults of [`JobGuardBuilder`].
    pub fn builder(store: Arc<dyn Store>) -> JobGuardBuilder {
        JobGuardBuilder::new(store)
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
        let claim = || self.inner.store.claim(&request).instrument(span.clone());
        let mut claimed = claim().await;
        if matches!(claimed, Err(StoreError::Timeout { .. })) {
            // The claim may have been granted with only its answer lost: that grant would hold
            // the key for a whole lease with nothing running. Sent again (same owner), it is
            // answered that grant, or granted now.
            claimed = claim().await;
        }
        match self.answer(&span, claimed, delivery) {
            Ok(run) => Admission::Answered(run),
            Err((lease, taken_over)) => Admission::Claimed(JobClaim::start(
                self.inner.clone(),
                lease,
                delivery,
                sent,
                taken_over,
                span,
            )),
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
        let finish = |outcome: JobOutcome<T>, disposition: Disposition, state: &'static str| {
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
                    JobOutcome::Error(RunError::Store {
                        op: "claim",
                        source: error,
                    }),
                    disposition,
                    "unknown",
                )
            }
            Ok(ClaimOutcome::Completed(record)) => {
                inner.labels.count(m::REPLAYS);
                let (outcome, disposition) = replayed(&record);
                finish(outcome, disposition, "completed")
            }
            Ok(ClaimOutcome::Failed(record)) => {
                let failure = record
                    .failure
                    .unwrap_or_else(|| Failure::permanent("failed (no message recorded)"));
                finish(
                    JobOutcome::Failed(failure),
                    Disposition::DeadLetter,
                    "failed",
                )
            }
            Ok(ClaimOutcome::Unknown(record)) => {
                span.record("fence", record.fence.get());
                finish(held_unknown(record), Disposition::DeadLetter, "unknown")
            }
            Ok(ClaimOutcome::Mismatch) => {
                inner.labels.count(m::MISMATCHES);
                finish(JobOutcome::Mismatch, Disposition::DeadLetter, "mismatch")
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
                    JobOutcome::InFlight { retry_after },
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

    /// Resolves the unknown record of `key` as completed with `result` (encoded as the job's
    /// result, serde_json, kept for the retention): an operator or a reconciler found out that
    /// the job did take effect. Every later delivery is answered [`JobOutcome::Replayed`].
    /// `fence` is the one [`JobOutcome::Unknown`] reported (or the record shows), so a
    /// resolution never overwrites a newer attempt.
    ///
    /// # Errors
    /// [`RunError::Encode`] if `result` does not encode; [`RunError::Store`] with the store's
    /// error otherwise: [`StoreError::Rejected`] unless the record is still unknown at `fence`.
    pub async fn resolve_completed<T: Serialize>(
        &self,
        key: &IdempotencyKey,
        fence: Fence,
        result: &T,
    ) -> Result<(), RunError> {
        let bytes = Bytes::from(serde_json::to_vec(result).map_err(RunError::Encode)?);
        let record_key = self.record_key(key);
        self.inner
            .store
            .resolve_completed(&record_key, fence, bytes, self.inner.retention)
            .await
            .map_err(|source| RunError::Store {
                op: "resolve_completed",
                source,
            })
    }

    /// Resolves the unknown record of `key` by freeing the key: an operator or a reconciler
    /// found out that the job did not take effect (or decided it may run again). The next
    /// delivery runs the job. `fence` is the one [`JobOutcome::Unknown`] reported. A key
    /// already free is `Ok`.
    ///
    /// # Errors
    /// The store's error: [`StoreError::Rejected`] if the record is not unknown, or at
    /// another fence.
    pub async fn resolve_released(
        &self,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<(), StoreError> {
        let record_key = self.record_key(key);
        self.inner.store.resolve_released(&record_key, fence).await
    }

    /// How long an unknown outcome holds its key (`None`: until resolved); see
    /// [`JobGuardBuilder::unknown_hold`](crate::JobGuardBuilder::unknown_hold).
    #[must_use]
    pub fn unknown_hold(&self) -> Option<Duration> {
        self.inner.unknown_hold
    }

    /// Ends a run: records `outcome` and `disposition` in `span`, the metrics and the log.
    pub fn report<T>(
        &self,
        span: &Span,
        outcome: JobOutcome<T>,
        disposition: Disposition,
    ) -> Run<T> {
        self.inner.finish(span, outcome, disposition)
    }

    /// Runs one store operation `op` of a variant of the guard (see [`JobGuard::answer`]),
    /// timing it into `idem_store_operation_seconds` and counting its error into
    /// `idem_store_errors_total`, with the guard's `store` label (the labels of every metered
    /// store: see idem-lease's `Metered`).
    ///
    /// # Errors
    /// The operation's error, unchanged.
    pub async fn store_op<T>(
        &self,
        op: &'static str,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.inner.metered.time(op, operation).await
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
    pub(crate) fn finish<T>(
        &self,
        span: &Span,
        outcome: JobOutcome<T>,
        disposition: Disposition,
    ) -> Run<T> {
        span.record("outcome", outcome.kind());
        span.record("disposition", disposition.as_str());
        self.labels.job(outcome.kind(), disposition.as_str());
        match &outcome {
            JobOutcome::Error(error) => {
                let error = logged(error, self.redact_keys);
                tracing::warn!(parent: span, %error, %disposition, "job not settled");
            }
            JobOutcome::Failed(failure) => {
                tracing::info!(parent: span, failure = %failure.message, %disposition, "job failed");
            }
            _ => tracing::debug!(parent: span, outcome = outcome.kind(), %disposition, "job done"),
        }
        Run {
            outcome,
            disposition,
        }
    }
}

/// Shows the key, or a digest of it when keys are redacted.
pub(crate) struct KeyField<'a> {
    pub(crate) key: &'a RecordKey,
    pub(crate) redact: bool,
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

/// `error` as the guard's log lines show it: with `redact`, a store error's message leaves out
/// the record's key (see [`StoreError::redacted`]); the line's key field is redacted already.
pub(crate) fn logged(error: &RunError, redact: bool) -> String {
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

/// The answer to a delivery of a completed job: its kept result, decoded.
fn replayed<T: DeserializeOwned>(record: &Record) -> (JobOutcome<T>, Disposition) {
    let decoded = record
        .result
        .as_deref()
        .map(serde_json::from_slice::<T>)
        .unwrap_or_else(|| serde_json::from_slice::<T>(b""));
    match decoded {
        Ok(value) => (JobOutcome::Replayed(value), Disposition::Ack),
        Err(error) => (
            JobOutcome::Error(RunError::Decode(error)),
            Disposition::DeadLetter,
        ),
    }
}

/// The answer to a delivery of a job whose earlier attempt lost the answer of its side effect:
/// the job may have taken effect, so it does not run again. The message is set aside for an
/// operator, who resolves the record and then redelivers it (replayed once resolved as
/// completed, run once released).
fn held_unknown<T>(record: Record) -> JobOutcome<T> {
    let outcome = record
        .unknown
        .unwrap_or_else(|| UnknownOutcome::new("the outcome is unknown (nothing recorded)"));
    JobOutcome::Unknown {
        outcome,
        fence: record.fence,
        hold_until: record.hold_until,
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
