//! [`StoreError`]: everything a store operation can answer besides success.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::key::RecordKey;
use crate::record::State;
use crate::token::Fence;

/// A boxed error kept as the source of a [`StoreError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a store refused a holder's transition (heartbeat, complete, fail, release): the holder
/// lost its claim, or the record is not in a state that allows the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionRejection {
    /// There is no record under the key any more (it expired or was deleted).
    NotFound,
    /// Another attempt holds (or held) the key: the record's fence or owner differs.
    Superseded {
        /// The fence of the record as it is now.
        current: Fence,
    },
    /// The holder's lease ran out and the store runs in strict mode.
    LeaseExpired,
    /// The record was already settled with another outcome (a complete after a permanent fail,
    /// a release after a complete).
    AlreadySettled {
        /// The state the record is in.
        state: State,
    },
    /// A resolution ([`crate::Store::resolve_completed`], [`crate::Store::resolve_released`])
    /// found the record in another state than [`State::Unknown`]: nothing was changed.
    NotUnknown {
        /// The state the record is in.
        state: State,
    },
}

impl fmt::Display for TransitionRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionRejection::NotFound => f.write_str("the record no longer exists"),
            TransitionRejection::Superseded { current } => {
                write!(f, "the key is held by a newer attempt (fence {current})")
            }
            TransitionRejection::LeaseExpired => f.write_str("the lease ran out"),
            TransitionRejection::AlreadySettled { state } => {
                write!(f, "the record is already {state}")
            }
            TransitionRejection::NotUnknown { state } => {
                write!(f, "the record is {state}, not unknown")
            }
        }
    }
}

/// What a store operation can fail with.
///
/// Every variant answers [`StoreError::is_retryable`]: whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached (connection refused or lost, server down).
    #[error("store unavailable: {source}")]
    Unavailable {
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The store did not answer within the configured time.
    #[error("store operation {op} timed out after {after:?}")]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
        /// The configured limit.
        after: Duration,
    },
    /// A stored record cannot be decoded or breaks the record invariants.
    #[error("corrupt record at {key}: {reason}")]
    Corrupt {
        /// The record's key, as text.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The holder's transition was refused: its claim is lost or the record is settled.
    #[error("transition refused: {0}")]
    Rejected(TransitionRejection),
    /// The store is full of records it may not evict (records in flight).
    #[error("store full: {limit} records, none of which may be evicted")]
    Capacity {
        /// The configured capacity.
        limit: usize,
    },
    /// A value is too large for the store.
    #[error("value of {size} bytes is over the store's limit of {limit} bytes")]
    TooLarge {
        /// The size offered.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A scan was given a cursor this store did not hand out (garbled, or another store's): the
    /// caller's mistake, so an API in front of a scan answers it as bad input.
    #[error("not a scan cursor of this store: {cursor:?}")]
    InvalidCursor {
        /// The cursor as given.
        cursor: String,
    },
    /// Any other error of the backend.
    #[error("store backend error: {source}")]
    Backend {
        /// The underlying error.
        #[source]
        source: BoxError,
        /// Whether the same call may succeed later.
        retryable: bool,
    },
}

impl StoreError {
    /// Whether the same call may succeed later (the store was unreachable, slow or full).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Unavailable { .. }
            | StoreError::Timeout { .. }
            | StoreError::Capacity { .. } => true,
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::Corrupt { .. }
            | StoreError::Rejected(_)
            | StoreError::TooLarge { .. }
            | StoreError::InvalidCursor { .. } => false,
        }
    }

    /// The rejection, if this error is one.
    #[must_use]
    pub fn rejection(&self) -> Option<TransitionRejection> {
        match self {
            StoreError::Rejected(rejection) => Some(*rejection),
            _ => None,
        }
    }

    /// Every [`StoreError::kind`], in the order of the variants: the `kind` labels a metric of
    /// store errors can carry.
    pub const KINDS: [&'static str; 8] = [
        "unavailable",
        "timeout",
        "corrupt",
        "rejected",
        "capacity",
        "too_large",
        "invalid_cursor",
        "backend",
    ];

    /// A short, stable name of the variant for metrics labels and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Timeout { .. } => "timeout",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Rejected(_) => "rejected",
            StoreError::Capacity { .. } => "capacity",
            StoreError::TooLarge { .. } => "too_large",
            StoreError::InvalidCursor { .. } => "invalid_cursor",
            StoreError::Backend { .. } => "backend",
        }
    }

    /// A [`StoreError::Corrupt`] for the record at `key`.
    #[must_use]
    pub fn corrupt(key: &RecordKey, reason: impl Into<String>) -> Self {
        StoreError::Corrupt {
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// A [`StoreError::InvalidCursor`] for `cursor`.
    #[must_use]
    pub fn invalid_cursor(cursor: &str) -> Self {
        StoreError::InvalidCursor {
            cursor: cursor.to_owned(),
        }
    }

    /// A [`StoreError::Unavailable`] keeping `source`.
    #[must_use]
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable {
            source: source.into(),
        }
    }

    /// This error as a log line shows it: with `redact`, a [`StoreError::Corrupt`] without the
    /// record's key (for logs that redact keys: the line's own, redacted, key field names the
    /// record); otherwise, and for every other error, as its `Display`.
    #[must_use]
    pub fn redacted(&self, redact: bool) -> RedactedError<'_> {
        RedactedError {
            error: self,
            redact,
        }
    }
}

/// A [`StoreError`] as a log line shows it: see [`StoreError::redacted`].
#[derive(Debug)]
pub struct RedactedError<'a> {
    error: &'a StoreError,
    redact: bool,
}

impl fmt::Display for RedactedError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error {
            StoreError::Corrupt { reason, .. } if self.redact => {
                write!(f, "corrupt record (key redacted): {reason}")
            }
            error => error.fmt(f),
        }
    }
}

impl From<TransitionRejection> for StoreError {
    fn from(rejection: TransitionRejection) -> Self {
        StoreError::Rejected(rejection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryability_is_answered() {
        assert!(StoreError::unavailable("down").is_retryable());
        assert!(!StoreError::Rejected(TransitionRejection::NotFound).is_retryable());
        let err = StoreError::unavailable(std::io::Error::other("refused"));
        assert!(err.source().is_some());
        assert_eq!(err.kind(), "unavailable");
    }

    #[test]
    fn kinds_lists_the_kind_of_every_variant_in_order() {
        let key = RecordKey::unscoped(crate::IdempotencyKey::new("k").unwrap());
        let every = [
            StoreError::unavailable("down"),
            StoreError::Timeout {
                op: "claim",
                after: std::time::Duration::from_secs(1),
            },
            StoreError::corrupt(&key, "no state"),
            StoreError::Rejected(TransitionRejection::NotFound),
            StoreError::Capacity { limit: 1 },
            StoreError::TooLarge { size: 2, limit: 1 },
            StoreError::invalid_cursor("x"),
            StoreError::Backend {
                source: "refused".into(),
                retryable: false,
            },
        ];
        let kinds: Vec<&str> = every.iter().map(StoreError::kind).collect();
        assert_eq!(kinds, StoreError::KINDS);
    }

    #[test]
    fn a_redacted_corrupt_error_leaves_out_its_key() {
        let key = RecordKey::unscoped(crate::IdempotencyKey::new("card-4242").unwrap());
        let err = StoreError::corrupt(&key, "no state");
        assert_eq!(err.to_string(), "corrupt record at card-4242: no state");
        assert_eq!(err.redacted(false).to_string(), err.to_string());
        assert_eq!(
            err.redacted(true).to_string(),
            "corrupt record (key redacted): no state"
        );
        let down = StoreError::unavailable("refused");
        assert_eq!(down.redacted(true).to_string(), down.to_string());
    }
}
