//! [`JobGuardBuilder`]: the settings of a [`JobGuard`], checked when it is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Scope, Store};
use idem_lease::{KeeperConfig, Metered};

use crate::guard::{Inner, JobGuard};
use crate::metrics::Labels;
use crate::retry::RetryPolicy;

/// A [`JobGuardBuilder`] setting was out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GuardConfigError {
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
    /// A retention is zero: the result (or permanent failure) would be forgotten at once, and
    /// a duplicate delivered after the job would run it again.
    #[error("{0} is zero: a duplicate delivered after the job would run it again")]
    ZeroRetention(&'static str),
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
    unknown_hold: Option<Duration>,
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
    /// A builder over `store`, with the defaults ([`JobGuard::builder`]).
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
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
            unknown_hold: None,
            retry: RetryPolicy::default(),
            redact_keys: false,
            settle_tries: 3,
        }
    }

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

    /// How long a job whose outcome is unknown ([`JobError::unknown`](crate::JobError::unknown))
    /// holds its key: once `hold` has passed, a delivery of the job takes the key over and runs
    /// it again. Without it (the default) the key is held until an operator resolves it
    /// ([`JobGuard::resolve_completed`](crate::JobGuard::resolve_completed),
    /// [`JobGuard::resolve_released`](crate::JobGuard::resolve_released)) or the failure
    /// retention ends. The unknown record is kept for the failure retention.
    pub fn unknown_hold(mut self, hold: Duration) -> Self {
        self.unknown_hold = Some(hold);
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
    /// [`GuardConfigError`] if the lease or a retention is zero, or the heartbeat interval is not
    /// below the lease.
    pub fn build(self) -> Result<JobGuard, GuardConfigError> {
        if self.lease < Duration::from_millis(1) {
            return Err(GuardConfigError::ZeroLease);
        }
        for (retention, what) in [
            (self.retention, "the retention"),
            (self.failure_retention, "the failure retention"),
        ] {
            if retention.is_zero() {
                return Err(GuardConfigError::ZeroRetention(what));
            }
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3);
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return Err(GuardConfigError::Heartbeat {
                interval: heartbeat,
                lease: self.lease,
            });
        }
        let keeper = KeeperConfig::new(self.lease, heartbeat)
            .settle_tries(self.settle_tries)
            .redact_keys(self.redact_keys)
            .loss_label("job_type", self.job_type.clone());
        let metered = Arc::new(Metered::new(self.store, self.store_label));
        Ok(JobGuard {
            inner: Arc::new(Inner {
                store: metered.clone(),
                metered,
                keeper: Arc::new(keeper),
                labels: Labels {
                    job_type: self.job_type,
                },
                worker_id: self.worker_id,
                scope: self.scope,
                lease: self.lease,
                heartbeat,
                retention: self.retention,
                failure_retention: self.failure_retention,
                unknown_hold: self.unknown_hold,
                retry: self.retry,
                redact_keys: self.redact_keys,
                settle_tries: self.settle_tries,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use idem_store_memory::MemoryStore;

    use super::*;

    #[test]
    fn zero_durations_are_refused() {
        let builder = || JobGuard::builder(Arc::new(MemoryStore::new()));
        assert!(matches!(
            builder().lease(Duration::ZERO).build(),
            Err(GuardConfigError::ZeroLease)
        ));
        assert!(matches!(
            builder().retention(Duration::ZERO).build(),
            Err(GuardConfigError::ZeroRetention("the retention"))
        ));
        assert!(matches!(
            builder().failure_retention(Duration::ZERO).build(),
            Err(GuardConfigError::ZeroRetention("the failure retention"))
        ));
        assert!(
            builder()
                .retention(Duration::from_millis(1))
                .build()
                .is_ok()
        );
    }
}
