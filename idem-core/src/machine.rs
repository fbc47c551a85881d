//! The state machine of a record, as pure functions: the one place the decision logic lives.
//!
//! Each function takes the record as the store holds it (`None` when absent), the caller's
//! arguments and the store's current time, and returns a [`Step`]: what to write back and what to
//! answer. A store's only job is to run one of these atomically (under a lock, in a Lua script's
//! equivalent, in an `UPDATE ... WHERE`) and apply the write.
//!
//! ```text
//!            claim (absent, expired, or lease lapsed)
//!   absent ─────────────────────────────────────────▶ in_flight ──heartbeat──▶ in_flight
//!     ▲                                                 │  │  │
//!     │ release / fail(retryable) / expiry              │  │  └─fail(permanent)─▶ failed ──expiry──▶ absent
//!     └─────────────────────────────────────────────────┘  └────complete───────▶ completed ─expiry─▶ absent
//!
//!   in_flight ──settle_unknown──▶ unknown ──resolve_completed──▶ completed
//!                                   │  │
//!                                   │  └─resolve_released / delete / expiry──▶ absent
//!                                   └─claim after hold_until──▶ in_flight (attempt + 1, higher fence)
//! ```
//!
//! Rules that hold in every state:
//! - an expired record (`now >= expires_at`) is treated as absent;
//! - a claim with another fingerprint is answered [`ClaimOutcome::Mismatch`] before anything else
//!   and changes nothing;
//! - a holder's transition is refused unless its owner token and fence match the record's;
//! - a resolution (an operator's, not a holder's) acts only on a record still
//!   [`State::Unknown`] at the fence the resolver saw;
//! - a fence is `max(previous + 1, now in microseconds, min_fence)`, so it strictly increases.

use std::time::Duration;

use bytes::Bytes;

use crate::atomic::Held;
use crate::error::{StoreError, TransitionRejection};
use crate::record::{Failure, Record, State, UnknownOutcome};
use crate::store::{ClaimOutcome, ClaimRequest, Lease};
use crate::time::Timestamp;
use crate::token::{Fence, OwnerToken};

/// What a transition writes back to the store.
// A `Write` lives for one transition; boxing the record would cost an allocation per write.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing changes.
    Nothing,
    /// Store this record under its key (insert or replace).
    Put(Record),
    /// Remove the record.
    Remove,
}

/// The result of a transition: what to write and what to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step<T> {
    /// The write to apply, atomically with the read the decision was based on.
    pub write: Write,
    /// The answer to give the caller once the write is applied.
    pub answer: T,
}

impl<T> Step<T> {
    fn answer(answer: T) -> Self {
        Step {
            write: Write::Nothing,
            answer,
        }
    }
}

/// Whether a holder whose lease lapsed (but whose record nobody took over) may still complete,
/// fail or heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeasePolicy {
    /// Yes: only a takeover (a new owner) stops the old holder. The default.
    #[default]
    Lenient,
    /// No: a lapsed lease is refused with [`TransitionRejection::LeaseExpired`].
    Strict,
}

/// The record as it counts at `now`: validated, and `None` if it has expired.
fn live_record(existing: Option<&Record>, now: Timestamp) -> Result<Option<&Record>, StoreError> {
    match existing {
        Some(record) => {
            record.validate()?;
            Ok((!record.is_expired(now)).then_some(record))
        }
        None => Ok(None),
    }
}

/// The fence of a new grant.
#[must_use]
pub fn next_fence(previous: Option<Fence>, now: Timestamp, min_fence: Fence) -> Fence {
    let after_previous = previous.map_or(Fence::MIN, Fence::successor);
    after_previous
        .max(Fence::new(now.as_micros()))
        .max(min_fence)
        .max(Fence::MIN)
}

/// `claim`: grants the key if it is absent, expired or its lease lapsed; otherwise answers with
/// what is there.
///
/// `owner` is the token for a new grant (the store passes [`ClaimRequest::grant_owner`]); a
/// request whose chosen owner holds the live in-flight record is answered that same grant.
/// `min_fence` is the lowest fence
/// the store allows for a new grant (a store that remembers the highest fence it ever issued
/// passes that plus one; others pass [`Fence::MIN`]).
///
/// # Errors
/// [`StoreError::Corrupt`] if the existing record breaks the record invariants.
pub fn claim(
    existing: Option<&Record>,
    request: &ClaimRequest,
    now: Timestamp,
    min_fence: Fence,
    owner: OwnerToken,
) -> Result<Step<ClaimOutcome>, StoreError> {
    let current = live_record(existing, now)?;
    if let Some(record) = current {
        if record.fingerprint != request.fingerprint {
            return Ok(Step::answer(ClaimOutcome::Mismatch));
        }
        match record.state {
            State::Completed => return Ok(Step::answer(ClaimOutcome::Completed(record.clone()))),
            State::Failed => return Ok(Step::answer(ClaimOutcome::Failed(record.clone()))),
            // The outcome is not known: never run again, until resolved or the hold lapses
            // (then granted below, as after a lapsed lease).
            State::Unknown if !record.hold_lapsed(now) => {
                return Ok(Step::answer(ClaimOutcome::Unknown(record.clone())));
            }
            State::Unknown => {}
            State::InFlight if record.is_live(now) && request.owner == Some(record.owner) => {
                // This very claim, sent again (its answer was lost): the same grant.
                return Ok(Step::answer(ClaimOutcome::Acquired {
                    lease: Lease {
                        key: record.key.clone(),
                        owner: record.owner,
                        fence: record.fence,
                        until: record.lease_until,
                        attempt: record.attempt,
                        held: Held::unknown(),
                    },
                    taken_over: record.attempt > 1,
                }));
            }
            State::InFlight if record.is_live(now) => {
                return Ok(Step::answer(ClaimOutcome::InFlight {
                    retry_after: record.lease_until.saturating_since(now),
                }));
            }
            State::InFlight => {}
        }
    }
    // Absent, expired, in flight with a lapsed lease, or unknown with a lapsed hold: grant. The
    // fence of an expired record
    // still counts, so fences never go back.
    let taken_over = current.is_some();
    let fence = next_fence(existing.map(|r| r.fence), now, min_fence);
    let lease_until = now.saturating_add(request.lease);
    let record = Record {
        key: request.key.clone(),
        state: State::InFlight,
        fingerprint: request.fingerprint,
        owner,
        fence,
        lease_until,
        attempt: current.map_or(1, |r| r.attempt.saturating_add(1)),
        created_at: current.map_or(now, |r| r.created_at),
        completed_at: None,
        expires_at: lease_until.saturating_add(request.lease),
        result: None,
        failure: None,
        unknown: None,
        hold_until: None,
    };
    let lease = Lease {
        key: record.key.clone(),
        owner,
        fence,
        until: lease_until,
        attempt: record.attempt,
        held: Held::unknown(),
    };
    Ok(Step {
        write: Write::Put(record),
        answer: ClaimOutcome::Acquired { lease, taken_over },
    })
}

/// The record `lease` holds, or the rejection. Settled records held by the same lease are
/// returned too; each transition decides what they mean.
fn held<'a>(
    existing: Option<&'a Record>,
    lease: &Lease,
    now: Timestamp,
) -> Result<Option<&'a Record>, StoreError> {
    let Some(record) = live_record(existing, now)? else {
        return Ok(None);
    };
    if lease.holds(record) {
        Ok(Some(record))
    } else {
        Err(TransitionRejection::Superseded {
            current: record.fence,
        }
        .into())
    }
}

fn check_policy(record: &Record, now: Timestamp, policy: LeasePolicy) -> Result<(), StoreError> {
    if policy == LeasePolicy::Strict && record.state == State::InFlight && !record.is_live(now) {
        return Err(TransitionRejection::LeaseExpired.into());
    }
    Ok(())
}

/// `heartbeat`: extends the holder's lease to `extend` from now.
///
/// # Errors
/// [`StoreError::Rejected`] if the record is gone, held by another attempt, settled, or (strict)
/// the lease lapsed; [`StoreError::Corrupt`] for a broken record.
pub fn heartbeat(
    existing: Option<&Record>,
    lease: &Lease,
    extend: Duration,
    now: Timestamp,
    policy: LeasePolicy,
) -> Result<Step<Lease>, StoreError> {
    let record = held(existing, lease, now)?.ok_or(TransitionRejection::NotFound)?;
    if record.state != State::InFlight {
        return Err(TransitionRejection::AlreadySettled {
            state: record.state,
        }
        .into());
    }
    check_policy(record, now, policy)?;
    let lease_until = now.saturating_add(extend).max(record.lease_until);
    let mut updated = record.clone();
    updated.lease_until = lease_until;
    updated.expires_at = lease_until.saturating_add(extend);
    Ok(Step {
        write: Write::Put(updated),
        answer: Lease {
            until: lease_until,
            ..lease.clone()
        },
    })
}

/// `complete`: records `result`, kept for `retention`. A re-sent complete of the same lease is
/// answered `Ok` without a write.
///
/// # Errors
/// [`StoreError::Rejected`] if the record is gone, held by another attempt, failed, or (strict)
/// the lease lapsed; [`StoreError::Corrupt`] for a broken record.
pub fn complete(
    existing: Option<&Record>,
    lease: &Lease,
    result: Bytes,
    retention: Duration,
    now: Timestamp,
    policy: LeasePolicy,
) -> Result<Step<()>, StoreError> {
    let settling = Settling {
        lease,
        into: State::Completed,
        retention,
        now,
        policy,
    };
    settling.apply(existing, |record| record.result = Some(result))
}

/// `fail`: a retryable failure removes the record (the key is free); a permanent one is kept
/// for `retention`. Re-sending the same fail is answered `Ok`.
///
/// # Errors
/// [`StoreError::Rejected`] if another attempt holds the key, the record is completed, or
/// (strict) the lease lapsed; [`StoreError::Corrupt`] for a broken record.
pub fn fail(
    existing: Option<&Record>,
    lease: &Lease,
    failure: Failure,
    retention: Duration,
    now: Timestamp,
    policy: LeasePolicy,
) -> Result<Step<()>, StoreError> {
    let Some(record) = held(existing, lease, now)? else {
        // Gone: a re-sent retryable fail already freed the key; a permanent one has nothing
        // left to record.
        return if failure.retryable {
            Ok(Step::answer(()))
        } else {
            Err(TransitionRejection::NotFound.into())
        };
    };
    match record.state {
        State::Failed if !failure.retryable => Ok(Step::answer(())),
        State::Completed | State::Failed | State::Unknown => {
            Err(TransitionRejection::AlreadySettled {
                state: record.state,
            }
            .into())
        }
        State::InFlight => {
            check_policy(record, now, policy)?;
            if failure.retryable {
                return Ok(Step {
                    write: Write::Remove,
                    answer: (),
                });
            }
            let mut updated = record.clone();
            updated.state = State::Failed;
            updated.completed_at = Some(now);
            updated.expires_at = now.saturating_add(retention);
            updated.failure = Some(failure);
            Ok(Step {
                write: Write::Put(updated),
                answer: (),
            })
        }
    }
}

/// `release`: gives the key back without a result. Releasing a key that is already gone is
/// answered `Ok` (a re-sent release).
///
/// # Errors
/// [`StoreError::Rejected`] if another attempt holds the key or the record is settled;
/// [`StoreError::Corrupt`] for a broken record.
pub fn release(
    existing: Option<&Record>,
    lease: &Lease,
    now: Timestamp,
) -> Result<Step<()>, StoreError> {
    match held(existing, lease, now)? {
        None => Ok(Step::answer(())),
        Some(record) if record.state == State::InFlight => Ok(Step {
            write: Write::Remove,
            answer: (),
        }),
        Some(record) => Err(TransitionRejection::AlreadySettled {
            state: record.state,
        }
        .into()),
    }
}

/// `settle_unknown`: the holder lost the answer of its side effect; the record keeps `outcome`
/// for `retention` and holds the key (every claim answers [`ClaimOutcome::Unknown`]) until it
/// is resolved, or until `hold` from now has passed (`None`: no end but the retention). A
/// re-sent settle of the same lease is answered `Ok` without a write.
///
/// A hold longer than the retention ends with the record: at expiry the key is free.
///
/// # Errors
/// [`StoreError::Rejected`] if the record is gone, held by another attempt, completed or
/// failed, or (strict) the lease lapsed; [`StoreError::Corrupt`] for a broken record.
pub fn settle_unknown(
    existing: Option<&Record>,
    lease: &Lease,
    outcome: UnknownOutcome,
    hold: Option<Duration>,
    retention: Duration,
    now: Timestamp,
    policy: LeasePolicy,
) -> Result<Step<()>, StoreError> {
    let settling = Settling {
        lease,
        into: State::Unknown,
        retention,
        now,
        policy,
    };
    settling.apply(existing, |record| {
        record.unknown = Some(outcome);
        record.hold_until = hold.map(|hold| now.saturating_add(hold));
    })
}

/// A holder settling its in-flight record into `into` (completed or unknown), kept for
/// `retention` from `now`.
struct Settling<'a> {
    lease: &'a Lease,
    into: State,
    retention: Duration,
    now: Timestamp,
    policy: LeasePolicy,
}

impl Settling<'_> {
    /// The step: the record `fill` completes, settled; `Ok` without a write when it is settled
    /// so already (the same settle sent again); refused when it is settled otherwise.
    fn apply(
        &self,
        existing: Option<&Record>,
        fill: impl FnOnce(&mut Record),
    ) -> Result<Step<()>, StoreError> {
        let now = self.now;
        let record = held(existing, self.lease, now)?.ok_or(TransitionRejection::NotFound)?;
        match record.state {
            state if state == self.into => Ok(Step::answer(())),
            State::InFlight => {
                check_policy(record, now, self.policy)?;
                let mut updated = record.clone();
                updated.state = self.into;
                updated.completed_at = Some(now);
                updated.expires_at = now.saturating_add(self.retention);
                fill(&mut updated);
                Ok(Step {
                    write: Write::Put(updated),
                    answer: (),
                })
            }
            state => Err(TransitionRejection::AlreadySettled { state }.into()),
        }
    }
}

/// The record a resolution acts on: live, and at the `fence` the resolver saw.
fn resolvable(
    existing: Option<&Record>,
    fence: Fence,
    now: Timestamp,
) -> Result<Option<&Record>, StoreError> {
    match live_record(existing, now)? {
        Some(record) if record.fence != fence => Err(TransitionRejection::Superseded {
            current: record.fence,
        }
        .into()),
        other => Ok(other),
    }
}

/// `resolve_completed`: an operator (or a reconciler) learned that the operation of an unknown
/// record did happen, with `result`: the record becomes completed, kept for `retention`, and
/// every later claim replays it. `fence` is the fence of the unknown record the resolver saw.
/// Re-sending the same resolution is answered `Ok` without a write.
///
/// # Errors
/// [`StoreError::Rejected`]: [`TransitionRejection::NotFound`] if there is no record,
/// [`TransitionRejection::Superseded`] if the record is at another fence (a newer attempt),
/// [`TransitionRejection::NotUnknown`] if it is not unknown; [`StoreError::Corrupt`] for a
/// broken record.
pub fn resolve_completed(
    existing: Option<&Record>,
    fence: Fence,
    result: Bytes,
    retention: Duration,
    now: Timestamp,
) -> Result<Step<()>, StoreError> {
    let record = resolvable(existing, fence, now)?.ok_or(TransitionRejection::NotFound)?;
    match record.state {
        State::Unknown => {
            let mut updated = record.clone();
            updated.state = State::Completed;
            updated.completed_at = Some(now);
            updated.expires_at = now.saturating_add(retention);
            updated.result = Some(result);
            updated.unknown = None;
            updated.hold_until = None;
            Ok(Step {
                write: Write::Put(updated),
                answer: (),
            })
        }
        // Only a resolution completes a record at the fence of an unknown one: this one, sent
        // again.
        State::Completed if record.result.as_ref() == Some(&result) => Ok(Step::answer(())),
        state => Err(TransitionRejection::NotUnknown { state }.into()),
    }
}

/// `resolve_released`: an operator (or a reconciler) learned that the operation of an unknown
/// record did not happen, or decided it may run again: the record is removed and the next
/// claim runs the operation. `fence` is the fence of the unknown record the resolver saw. A
/// key already free is answered `Ok` (a re-sent resolution).
///
/// # Errors
/// [`StoreError::Rejected`]: [`TransitionRejection::Superseded`] if the record is at another
/// fence (a newer attempt), [`TransitionRejection::NotUnknown`] if it is not unknown;
/// [`StoreError::Corrupt`] for a broken record.
pub fn resolve_released(
    existing: Option<&Record>,
    fence: Fence,
    now: Timestamp,
) -> Result<Step<()>, StoreError> {
    match resolvable(existing, fence, now)? {
        None => Ok(Step::answer(())),
        Some(record) if record.state == State::Unknown => Ok(Step {
            write: Write::Remove,
            answer: (),
        }),
        Some(record) => Err(TransitionRejection::NotUnknown {
            state: record.state,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests;
