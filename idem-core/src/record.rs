//! [`Record`]: what a store keeps per key, and its [`State`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::RecordKey;
use crate::time::Timestamp;
use crate::token::{Fence, OwnerToken};

/// The state of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// An attempt holds the key and is running.
    InFlight,
    /// The operation is done; the record holds its result.
    Completed,
    /// The operation failed permanently; the record holds the failure.
    Failed,
    /// The attempt that held the key lost the answer of its side effect (the request went out,
    /// the reply never came back): nobody knows whether the operation happened. The record
    /// holds what is known ([`UnknownOutcome`]); a claim is answered
    /// [`crate::ClaimOutcome::Unknown`] and never runs the operation again until the record is
    /// resolved ([`crate::Store::resolve_completed`], [`crate::Store::resolve_released`],
    /// [`crate::Store::delete`]) or its hold lapses ([`Record::hold_until`]).
    Unknown,
}

impl State {
    /// Every state, in order.
    pub const ALL: [State; 4] = [
        State::InFlight,
        State::Completed,
        State::Failed,
        State::Unknown,
    ];

    /// `in_flight`, `completed`, `failed` or `unknown`: the name stores and the CLI use.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            State::InFlight => "in_flight",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Unknown => "unknown",
        }
    }

    /// Whether the state is settled: completed, failed or unknown (not in flight).
    #[must_use]
    pub const fn is_settled(self) -> bool {
        !matches!(self, State::InFlight)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not a state name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}: expected in_flight, completed, failed or unknown")]
pub struct ParseStateError(pub String);

impl FromStr for State {
    type Err = ParseStateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseStateError(s.to_owned()))
    }
}

/// Why an attempt failed, and whether trying again can help.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    /// A human-readable message.
    pub message: String,
    /// `true`: the failure is transient and the key is freed for a new attempt. `false`: the
    /// failure is permanent and kept, so every later attempt is answered with it.
    pub retryable: bool,
}

impl Failure {
    /// A transient failure: the key is freed.
    #[must_use]
    pub fn retryable(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: true,
        }
    }

    /// A permanent failure: kept for the retention period.
    #[must_use]
    pub fn permanent(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: false,
        }
    }
}

/// What is known of an attempt whose outcome was lost: kept in a record in
/// [`State::Unknown`], like [`Failure`] in a failed one.
///
/// ```
/// use idem_core::UnknownOutcome;
///
/// let outcome = UnknownOutcome::new("upstream timed out after 30 s").request_sent(true);
/// assert!(outcome.request_sent && !outcome.head_seen);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnknownOutcome {
    /// What happened, for a human (`upstream timed out`, `connection reset after the head`).
    pub reason: String,
    /// Whether the request (the side effect) was sent, as far as the attempt knows. `false`
    /// only when the attempt knows it never left; the safe default is `true`.
    pub request_sent: bool,
    /// Whether the start of an answer (an HTTP response head, say) was seen before it broke.
    pub head_seen: bool,
}

impl UnknownOutcome {
    /// An outcome lost for `reason`; the request counts as sent, no answer as seen.
    #[must_use]
    pub fn new(reason: impl Into<String>) -> Self {
        UnknownOutcome {
            reason: reason.into(),
            request_sent: true,
            head_seen: false,
        }
    }

    /// The same, with whether the request was sent.
    #[must_use]
    pub fn request_sent(mut self, sent: bool) -> Self {
        self.request_sent = sent;
        self
    }

    /// The same, with whether the start of an answer was seen.
    #[must_use]
    pub fn head_seen(mut self, seen: bool) -> Self {
        self.head_seen = seen;
        self
    }
}

/// One record per (scope, key): the state of one business operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Where the record lives.
    pub key: RecordKey,
    /// In flight, completed, failed or unknown.
    pub state: State,
    /// The identity of the request or job that claimed the key.
    pub fingerprint: Fingerprint,
    /// The token of the attempt that holds (or last held) the key.
    pub owner: OwnerToken,
    /// The fence of that attempt.
    pub fence: Fence,
    /// Until when the holder's lease runs (store time).
    pub lease_until: Timestamp,
    /// How many attempts have been granted this record (1 for the first; a takeover adds one).
    pub attempt: u32,
    /// When the record was created.
    pub created_at: Timestamp,
    /// When the record was settled: completed, failed or marked unknown.
    pub completed_at: Option<Timestamp>,
    /// When the record stops existing (retention; for an in-flight record, one lease after the
    /// lease ends). An expired record is treated as absent.
    pub expires_at: Timestamp,
    /// The stored result of a completed record.
    pub result: Option<Bytes>,
    /// The failure of a failed record.
    pub failure: Option<Failure>,
    /// What is known of the attempt of a record in [`State::Unknown`].
    pub unknown: Option<UnknownOutcome>,
    /// Until when a record in [`State::Unknown`] holds its key: a claim after it is granted,
    /// as after a lapsed lease (a new attempt, with a higher fence). `None`: until it is
    /// resolved (or expires). Always `None` in the other states.
    pub hold_until: Option<Timestamp>,
}

impl Record {
    /// Whether the record no longer exists at `now`.
    #[must_use]
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether the record is in flight with a lease that still runs at `now`.
    #[must_use]
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.state == State::InFlight && now < self.lease_until
    }

    /// Whether the record is unknown with a hold that has lapsed at `now`: a claim may take the
    /// key over (see [`Record::hold_until`]).
    #[must_use]
    pub fn hold_lapsed(&self, now: Timestamp) -> bool {
        self.state == State::Unknown && self.hold_until.is_some_and(|until| now >= until)
    }

    /// The age of the record at `now`.
    #[must_use]
    pub fn age(&self, now: Timestamp) -> Duration {
        now.saturating_since(self.created_at)
    }

    /// Checks the invariants every stored record keeps. A store calls this on every record it
    /// decodes (through the transition functions) and reports a broken one as
    /// [`StoreError::Corrupt`].
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the broken invariant.
    pub fn validate(&self) -> Result<(), StoreError> {
        let problem = match self.state {
            State::InFlight if self.result.is_some() => Some("an in-flight record holds a result"),
            State::InFlight if self.failure.is_some() => {
                Some("an in-flight record holds a failure")
            }
            State::InFlight if self.completed_at.is_some() => {
                Some("an in-flight record has a completion time")
            }
            State::Completed if self.result.is_none() => Some("a completed record has no result"),
            State::Failed if self.failure.is_none() => Some("a failed record has no failure"),
            State::Unknown if self.unknown.is_none() => {
                Some("an unknown record does not say what is known")
            }
            State::Unknown if self.result.is_some() => Some("an unknown record holds a result"),
            State::Unknown if self.failure.is_some() => Some("an unknown record holds a failure"),
            State::InFlight | State::Completed | State::Failed if self.unknown.is_some() => {
                Some("a record that is not unknown holds an unknown outcome")
            }
            State::InFlight | State::Completed | State::Failed if self.hold_until.is_some() => {
                Some("a record that is not unknown has a hold deadline")
            }
            State::Completed | State::Failed | State::Unknown if self.completed_at.is_none() => {
                Some("a settled record has no completion time")
            }
            _ if self.fence < Fence::MIN => Some("the fence is zero"),
            _ if self.attempt == 0 => Some("the attempt count is zero"),
            _ => None,
        };
        match problem {
            Some(reason) => Err(StoreError::corrupt(&self.key, reason)),
            None => Ok(()),
        }
    }
}
