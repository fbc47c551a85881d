//! What a guarded run ends with: the [`JobOutcome`], and the [`Run`] that pairs it with a
//! [`Disposition`].

use std::time::Duration;

use idem_core::{BoxError, Failure, Fence, StoreError, Timestamp, UnknownOutcome};

use crate::retry::Disposition;

/// How a guarded run ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobOutcome<T> {
    /// This attempt ran the job and recorded its result.
    Executed(T),
    /// An earlier attempt ran the job: here is its recorded result. The job did not run.
    Replayed(T),
    /// Another attempt holds the key with a live lease; its lease lapses in `retry_after`.
    InFlight {
        /// How long until the holder's lease lapses.
        retry_after: Duration,
    },
    /// The key was used by a job with another fingerprint (another payload). Nothing ran.
    Mismatch,
    /// The job failed permanently: in this attempt, or in an earlier one whose failure is
    /// recorded.
    Failed(Failure),
    /// An earlier attempt lost the answer of its side effect ([`RunError::UnknownOutcome`]):
    /// nobody knows whether the job took effect, so it did not run. Its disposition is
    /// [`Disposition::DeadLetter`]: the message is set aside until an operator resolves the
    /// record ([`crate::JobGuard::resolve_completed`], [`crate::JobGuard::resolve_released`]),
    /// after which a redelivery is replayed or runs.
    Unknown {
        /// What the attempt knew when it lost the answer.
        outcome: UnknownOutcome,
        /// The fence of the unknown record: what a resolution names.
        fence: Fence,
        /// When a delivery may take the key over and run the job again (store time); `None`:
        /// not before it is resolved.
        hold_until: Option<Timestamp>,
    },
    /// The run did not settle the key with a result; see [`RunError`] for what happened to
    /// the claim.
    Error(RunError),
}

impl<T> JobOutcome<T> {
    /// `executed`, `replayed`, `in_flight`, `mismatch`, `failed`, `unknown`, or the error's
    /// kind: a stable name for metrics labels and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            JobOutcome::Executed(_) => "executed",
            JobOutcome::Replayed(_) => "replayed",
            JobOutcome::InFlight { .. } => "in_flight",
            JobOutcome::Mismatch => "mismatch",
            JobOutcome::Failed(_) => "failed",
            JobOutcome::Unknown { .. } => "unknown",
            JobOutcome::Error(error) => error.kind(),
        }
    }

    /// The result, executed or replayed.
    #[must_use]
    pub fn result(&self) -> Option<&T> {
        match self {
            JobOutcome::Executed(value) | JobOutcome::Replayed(value) => Some(value),
            _ => None,
        }
    }

    /// The result, executed or replayed, owned.
    #[must_use]
    pub fn into_result(self) -> Option<T> {
        match self {
            JobOutcome::Executed(value) | JobOutcome::Replayed(value) => Some(value),
            _ => None,
        }
    }
}

/// Why a run did not settle its key with a result, and what became of the claim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The job failed transiently; the key was released.
    #[error("the job failed transiently (key released): {0}")]
    Transient(#[source] BoxError),
    /// The job failed with an unknown outcome (it may or may not have taken effect): the key
    /// is recorded as unknown, so no later delivery runs the job again until it is resolved
    /// (see [`JobOutcome::Unknown`]); the disposition is [`Disposition::DeadLetter`]. If the
    /// store could not record it, the run ends with [`RunError::Store`] instead and the claim
    /// lapses with its lease.
    #[error(
        "the job's outcome is unknown (recorded as unknown; not run again until resolved): {0}"
    )]
    UnknownOutcome(#[source] BoxError),
    /// The job panicked; the key was released.
    #[error("the job panicked (key released): {0}")]
    Panicked(String),
    /// The lease was lost (a heartbeat or the completion was refused: another attempt took
    /// the key over, or the record is gone; or the store stayed unreachable for a whole
    /// lease). The job's result, if any, was NOT recorded; a claim whose lease was lost
    /// before its job started does not run the job.
    #[error("the lease of fence {fence} was lost; the result was not recorded: {source}")]
    LeaseLost {
        /// The fence this attempt held.
        fence: Fence,
        /// The store's refusal.
        #[source]
        source: StoreError,
    },
    /// The store failed (at the claim, or while settling the key). After a claim error
    /// nothing ran; after a settle error the claim is kept until its lease ends.
    #[error("store error during {op}: {source}")]
    Store {
        /// The store operation that failed.
        op: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The job's result could not be encoded; the job's effect happened, so the key was
    /// recorded as failed permanently rather than run again.
    #[error("the job's result could not be encoded (recorded as a permanent failure): {0}")]
    Encode(#[source] serde_json::Error),
    /// A recorded result could not be decoded into the job's result type (the type changed
    /// since it was recorded). The job ran before and does not run again: the disposition is
    /// dead-letter.
    #[error("the recorded result could not be decoded: {0}")]
    Decode(#[source] serde_json::Error),
}

impl RunError {
    /// A stable name of the variant for metrics labels and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            RunError::Transient(_) => "transient",
            RunError::UnknownOutcome(_) => "unknown_outcome",
            RunError::Panicked(_) => "panicked",
            RunError::LeaseLost { .. } => "lease_lost",
            RunError::Store { .. } => "store_error",
            RunError::Encode(_) => "encode_error",
            RunError::Decode(_) => "decode_error",
        }
    }
}

/// The end of a guarded run: what happened, and what to do with the message.
#[derive(Debug)]
#[must_use]
pub struct Run<T> {
    /// What happened.
    pub outcome: JobOutcome<T>,
    /// What the consumer should do with the message.
    pub disposition: Disposition,
}

impl<T> Run<T> {
    /// The result, executed or replayed.
    #[must_use]
    pub fn result(&self) -> Option<&T> {
        self.outcome.result()
    }
}
