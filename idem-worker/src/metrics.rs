//! The metric names of the guard, emitted through the `metrics` facade.
//! The application installs an exporter; without one, these cost next to nothing.
//!
//! Every metric carries a `job_type` label (the guard's [`crate::JobGuardBuilder::job_type`]),
//! except the store metrics: those come from the guard's store wrapped in idem-lease's
//! [`Metered`](idem_lease::Metered), with the labels the HTTP layer's carry too (`store`, `op`).
//! The lease losses are counted by idem-lease's [`LeaseKeeper`](idem_lease::LeaseKeeper).
//!
//! | name | kind | more labels |
//! |---|---|---|
//! | `idem_jobs_total` | counter | `outcome` ([`crate::JobOutcome::kind`]), `disposition` |
//! | `idem_job_duration_seconds` | histogram | |
//! | `idem_claims_acquired_total` | counter | |
//! | `idem_duplicates_replayed_total` | counter | |
//! | `idem_in_flight_collisions_total` | counter | |
//! | `idem_mismatches_total` | counter | |
//! | `idem_failures_total` | counter | `kind`: `transient`, `permanent`, `unknown`, `panic`, `encode` |
//! | `idem_lease_takeovers_total` | counter | |
//! | `idem_lease_losses_total` | counter | |
//! | `idem_store_operation_seconds` | histogram | `store`, `op` (no `job_type`) |
//! | `idem_store_errors_total` | counter | `store`, `op`, `kind` (no `job_type`) |

pub use idem_core::metrics::{
    CLAIMS_ACQUIRED, COLLISIONS, FAILURES, LEASE_LOSSES, MISMATCHES, REPLAYS, STORE_ERRORS,
    STORE_SECONDS, TAKEOVERS,
};

/// Jobs by outcome and disposition.
pub const JOBS: &str = "idem_jobs_total";
/// Time spent in the job closure.
pub const JOB_SECONDS: &str = "idem_job_duration_seconds";

/// The labels every metric of one guard carries.
#[derive(Clone, Debug)]
pub(crate) struct Labels {
    pub(crate) job_type: String,
}

impl Labels {
    pub(crate) fn count(&self, name: &'static str) {
        metrics::counter!(name, "job_type" => self.job_type.clone()).increment(1);
    }

    pub(crate) fn failure(&self, kind: &'static str) {
        metrics::counter!(FAILURES, "job_type" => self.job_type.clone(), "kind" => kind)
            .increment(1);
    }

    pub(crate) fn job(&self, outcome: &'static str, disposition: &'static str) {
        metrics::counter!(JOBS, "job_type" => self.job_type.clone(), "outcome" => outcome, "disposition" => disposition)
            .increment(1);
    }

    pub(crate) fn job_seconds(&self, seconds: f64) {
        metrics::histogram!(JOB_SECONDS, "job_type" => self.job_type.clone()).record(seconds);
    }
}
