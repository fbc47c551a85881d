//! Crash tests of idem that need more than one crate (`tests/shared_transaction.rs`): a worker
//! process whose side effect is an INSERT into PostgreSQL is killed with `kill -9` at random
//! moments and restarted while the queue redelivers jobs, once with the redb store and once
//! with the PostgreSQL store in the same transaction as the INSERT; the test counts the effects
//! that ran twice.
//!
//! `tests/http_crash.rs` does the same over real HTTP: a server process whose axum handler
//! INSERTs a payment is killed with `kill -9` at random moments while a client retries 1,000
//! keyed requests, once behind idem-http-postgres's `PgIdempotencyLayer` (the INSERT and the
//! stored response in one transaction: zero doubled, zero lost, asserted) and once behind
//! idem-http's plain layer on the PostgreSQL store (its doubled payments printed).
//!
//! This crate is not published: it exists because a store crate never depends on another
//! store. The library only holds the arithmetic the test reports with.
//!
//! ```
//! use idem_crashtest::EffectCounts;
//!
//! // Effects per job: job 1 ran twice, job 3 never.
//! let counts = EffectCounts::from_per_job(&[1, 2, 1, 0]);
//! assert_eq!((counts.doubled, counts.missing), (1, 1));
//! ```

/// What a run did to the side effects, job by job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EffectCounts {
    /// Jobs.
    pub jobs: usize,
    /// Effects beyond the first, over every job (a job that ran three times counts two).
    pub doubled: u64,
    /// Jobs whose effect never ran.
    pub missing: usize,
}

impl EffectCounts {
    /// Counts from the number of effects of each job.
    #[must_use]
    pub fn from_per_job(per_job: &[u64]) -> Self {
        EffectCounts {
            jobs: per_job.len(),
            doubled: per_job.iter().map(|&n| n.saturating_sub(1)).sum(),
            missing: per_job.iter().filter(|&&n| n == 0).count(),
        }
    }
}
