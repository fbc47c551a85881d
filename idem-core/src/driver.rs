//! [`Driven`]: every [`Store`] transition on top of any [`Primitives`], decided by
//! [`crate::machine`].
//!
//! Round trips: a claim is one create-if-absent, which both grants an absent key and reads what
//! is there (a replay, a conflict and a mismatch are answered from it); only a takeover (of a
//! lapsed lease, of an expired record still present, of a tombstone) adds a compare-and-set.
//! Complete, fail, heartbeat and release are one compare-and-set against the version the
//! holder's lease carries ([`Held`]), without a read first: a first execution is 2 round trips.
//! A compare-and-set that loses is decided again from the record that won, which it hands back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::atomic::{Created, Held, Primitives, Slot, Swapped, Version, Versioned};
use crate::error::StoreError;
use crate::key::RecordKey;
use crate::machine::{self, Step, Write};
use crate::record::{Failure, Record, UnknownOutcome};
use crate::store::{ClaimOutcome, ClaimRequest, Lease, ScanPage, ScanQuery, Store};
use crate::time::Timestamp;
use crate::token::Fence;

/// How many times one transition decides again after losing a compare-and-set to another
/// writer of the same key, before it gives up with a retryable error.
const MAX_DECISIONS: usize = 16;

/// A [`Store`] made of [`Primitives`]: the machine decides, the primitives apply.
#[derive(Debug)]
pub struct Driven<P> {
    primitives: P,
    round_trips: AtomicU64,
}

impl<P: Primitives> Driven<P> {
    /// The store on `primitives`.
    pub fn new(primitives: P) -> Self {
        Driven {
            primitives,
            round_trips: AtomicU64::new(0),
        }
    }

    /// The primitives underneath.
    pub fn primitives(&self) -> &P {
        &self.primitives
    }

    /// How many primitive operations (round trips to the store) this store has sent: what the
    /// conformance suite counts.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    async fn read(&self, key: &RecordKey) -> Result<Option<Versioned>, StoreError> {
        self.count();
        self.primitives.read(key).await
    }

    async fn create(&self, record: &Record, ttl: Duration) -> Result<Created, StoreError> {
        self.count();
        self.primitives.create(record, ttl).await
    }

    async fn swap(
        &self,
        key: &RecordKey,
        expected: &Version,
        slot: &Slot,
        ttl: Duration,
    ) -> Result<Swapped, StoreError> {
        self.count();
        self.primitives.swap(key, expected, slot, ttl).await
    }

    /// The physical TTL of `record` written at `now`: until it expires, then the fence memory.
    fn ttl(&self, record: &Record, now: Timestamp) -> Duration {
        record
            .expires_at
            .saturating_since(now)
            .saturating_add(self.tombstone_ttl())
    }

    /// The physical TTL of a tombstone (at least a millisecond).
    fn tombstone_ttl(&self) -> Duration {
        self.primitives.fence_memory().max(Duration::from_millis(1))
    }

    /// The store time a claim decides on: the clock estimate less its error bound, so a lease
    /// counts as lapsed only when it has lapsed on every holder's estimate.
    fn claim_now(&self) -> Timestamp {
        self.primitives
            .now()
            .saturating_sub(self.primitives.clock_bound())
    }

    async fn claim_decided(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let owner = request.grant_owner();
        // The owner goes with the request, so a create or compare-and-set that is re-sent after
        // its first copy landed finds its own grant and answers it (not "in flight").
        let chosen;
        let request = match request.owner {
            Some(_) => request,
            None => {
                chosen = request.clone().with_owner(owner);
                &chosen
            }
        };
        let mut current: Option<Versioned> = None;
        for _ in 0..MAX_DECISIONS {
            let now = self.claim_now();
            let (existing, min_fence) = current.as_ref().map_or((None, Fence::MIN), |f| {
                (f.slot.record(), f.slot.min_fence())
            });
            let step = machine::claim(existing, request, now, min_fence, owner)?;
            let record = match step.write {
                Write::Nothing => return Ok(holding(step.answer, current)),
                Write::Put(record) => record,
                Write::Remove => return Err(unexpected("a claim removes")),
            };
            let ttl = self.ttl(&record, now);
            current = match &current {
                None => match self.create(&record, ttl).await? {
                    Created::Created(version) => return Ok(granted(step.answer, record, version)),
                    Created::Present(found) => Some(found),
                },
                Some(found) => {
                    let slot = Slot::Record(record);
                    match self.swap(&request.key, &found.version, &slot, ttl).await? {
                        Swapped::Swapped(version) => {
                            let Slot::Record(record) = slot else {
                                return Err(unexpected("a claim writes a record"));
                            };
                            return Ok(granted(step.answer, record, version));
                        }
                        Swapped::Lost(won) => won,
                    }
                }
            };
        }
        Err(contended(&request.key))
    }

    /// A holder's transition: `decide` on the record the lease holds (from its [`Held`] cache,
    /// else read), then one compare-and-set; on a lost one, decided again from what won.
    /// Returns the answer and what was written for the lease.
    async fn settle<T>(
        &self,
        lease: &Lease,
        decide: impl Fn(Option<&Record>, Timestamp) -> Result<Step<T>, StoreError>,
    ) -> Result<(T, Held), StoreError> {
        let (mut current, mut cached) = match lease.held.get() {
            Some(held) => {
                let (record, version) = &*held;
                let slot = Slot::Record(record.clone());
                let version = version.clone();
                (Some(Versioned { slot, version }), true)
            }
            None => (self.read(&lease.key).await?, false),
        };
        for _ in 0..MAX_DECISIONS {
            let now = self.primitives.now();
            let decided = decide(current.as_ref().and_then(|f| f.slot.record()), now);
            let step = match decided {
                // The cache may be behind (another copy of the lease heartbeated): only a
                // write, checked against it, is trusted; anything else is decided on a read.
                Ok(Step {
                    write: Write::Nothing,
                    ..
                })
                | Err(_)
                    if cached =>
                {
                    cached = false;
                    current = self.read(&lease.key).await?;
                    continue;
                }
                other => other?,
            };
            let Some(found) = &current else {
                return match step.write {
                    Write::Nothing => Ok((step.answer, Held::unknown())),
                    _ => Err(unexpected("a transition writes an absent key")),
                };
            };
            let (slot, ttl) = match step.write {
                Write::Nothing => return Ok((step.answer, held_of(found))),
                Write::Put(record) => {
                    let ttl = self.ttl(&record, now);
                    (Slot::Record(record), ttl)
                }
                Write::Remove => {
                    let fence = found.slot.record().map_or(lease.fence, |r| r.fence);
                    (Slot::Tombstone(fence), self.tombstone_ttl())
                }
            };
            match self.swap(&lease.key, &found.version, &slot, ttl).await? {
                Swapped::Swapped(version) => {
                    let held = match slot {
                        Slot::Record(record) => lease.held.written(record, version),
                        Slot::Tombstone(_) => Held::unknown(),
                    };
                    return Ok((step.answer, held));
                }
                Swapped::Lost(won) => {
                    current = won;
                    cached = false;
                }
            }
        }
        Err(contended(&lease.key))
    }

    /// A resolution of `key` (no lease, so no cache): `decide` on a read, then one
    /// compare-and-set; on a lost one, decided again from what won.
    async fn resolve(
        &self,
        key: &RecordKey,
        decide: impl Fn(Option<&Record>, Timestamp) -> Result<Step<()>, StoreError>,
    ) -> Result<(), StoreError> {
        let mut current = self.read(key).await?;
        for _ in 0..MAX_DECISIONS {
            let now = self.primitives.now();
            let step = decide(current.as_ref().and_then(|f| f.slot.record()), now)?;
            let (found, slot, ttl) = match (&current, step.write) {
                (_, Write::Nothing) => return Ok(()),
                (None, _) => return Err(unexpected("a resolution writes an absent key")),
                (Some(found), Write::Put(record)) => {
                    let ttl = self.ttl(&record, now);
                    (found, Slot::Record(record), ttl)
                }
                (Some(found), Write::Remove) => {
                    let Some(record) = found.slot.record() else {
                        return Err(unexpected("a resolution removes a tombstone"));
                    };
                    (found, Slot::Tombstone(record.fence), self.tombstone_ttl())
                }
            };
            match self.swap(key, &found.version, &slot, ttl).await? {
                Swapped::Swapped(_) => return Ok(()),
                Swapped::Lost(won) => current = won,
            }
        }
        Err(contended(key))
    }

    async fn delete_decided(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let mut current = match self.read(key).await {
            Err(StoreError::Corrupt { .. }) => return self.remove(key).await,
            other => other?,
        };
        for _ in 0..MAX_DECISIONS {
            let Some(found) = &current else {
                return Ok(false);
            };
            let Slot::Record(record) = &found.slot else {
                return Ok(false);
            };
            if record.validate().is_err() {
                return self.remove(key).await;
            }
            let live = !record.is_expired(self.primitives.now());
            let tombstone = Slot::Tombstone(record.fence);
            let ttl = self.tombstone_ttl();
            match self.swap(key, &found.version, &tombstone, ttl).await? {
                Swapped::Swapped(_) => return Ok(live),
                Swapped::Lost(won) => current = won,
            }
        }
        Err(contended(key))
    }

    async fn remove(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.count();
        self.primitives.remove(key).await
    }
}

/// The answer of a claim that wrote nothing; a re-sent claim's grant keeps what it found.
fn holding(answer: ClaimOutcome, found: Option<Versioned>) -> ClaimOutcome {
    match (answer, found) {
        (ClaimOutcome::Acquired { lease, taken_over }, Some(found)) => ClaimOutcome::Acquired {
            lease: Lease {
                held: held_of(&found),
                ..lease
            },
            taken_over,
        },
        (answer, _) => answer,
    }
}

/// The answer of a claim whose `record` was written at `version`.
fn granted(answer: ClaimOutcome, record: Record, version: Version) -> ClaimOutcome {
    match answer {
        ClaimOutcome::Acquired { lease, taken_over } => ClaimOutcome::Acquired {
            lease: Lease {
                held: Held::new(record, version),
                ..lease
            },
            taken_over,
        },
        other => other,
    }
}

fn held_of(found: &Versioned) -> Held {
    match &found.slot {
        Slot::Record(record) => Held::new(record.clone(), found.version.clone()),
        Slot::Tombstone(_) => Held::unknown(),
    }
}

fn unexpected(what: &'static str) -> StoreError {
    StoreError::Backend {
        source: format!("the state machine broke its contract: {what}").into(),
        retryable: false,
    }
}

fn contended(key: &RecordKey) -> StoreError {
    StoreError::Backend {
        source: format!(
            "the record at {key} changed {MAX_DECISIONS} times during one transition; try again"
        )
        .into(),
        retryable: true,
    }
}

#[async_trait]
impl<P: Primitives> Store for Driven<P> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_decided(request).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let policy = self.primitives.lease_policy();
        let decide = |existing: Option<&Record>, now| {
            machine::heartbeat(existing, lease, extend, now, policy)
        };
        let (extended, held) = self.settle(lease, decide).await?;
        Ok(Lease { held, ..extended })
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let policy = self.primitives.lease_policy();
        let decide = |existing: Option<&Record>, now| {
            machine::complete(existing, lease, result.clone(), retention, now, policy)
        };
        self.settle(lease, decide).await.map(drop)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let policy = self.primitives.lease_policy();
        let decide = |existing: Option<&Record>, now| {
            machine::fail(existing, lease, failure.clone(), retention, now, policy)
        };
        self.settle(lease, decide).await.map(drop)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let decide = |existing: Option<&Record>, now| machine::release(existing, lease, now);
        self.settle(lease, decide).await.map(drop)
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let policy = self.primitives.lease_policy();
        let decide = |existing: Option<&Record>, now| {
            machine::settle_unknown(
                existing,
                lease,
                outcome.clone(),
                hold,
                retention,
                now,
                policy,
            )
        };
        self.settle(lease, decide).await.map(drop)
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let decide = |existing: Option<&Record>, now| {
            machine::resolve_completed(existing, fence, result.clone(), retention, now)
        };
        self.resolve(key, decide).await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        let decide =
            |existing: Option<&Record>, now| machine::resolve_released(existing, fence, now);
        self.resolve(key, decide).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        let now = self.primitives.now();
        match self.read(key).await? {
            Some(Versioned {
                slot: Slot::Record(record),
                ..
            }) => {
                record.validate()?;
                Ok((!record.is_expired(now)).then_some(record))
            }
            _ => Ok(None),
        }
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.delete_decided(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.primitives.scan(query, self.primitives.now()).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.primitives.ping().await
    }
}
