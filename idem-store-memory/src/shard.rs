//! One shard: a map of records under one lock, with its incremental sweep, its eviction queue
//! and its byte budget.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

use idem_core::machine::{Step, Write};
use idem_core::{Bytes, Fence, Record, State, StoreError, Timestamp};

use crate::hashed::{HashedKey, PassThroughState};

/// Writes between sweeps when a shard holds few records.
const MIN_SWEEP_INTERVAL: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct Shard {
    /// Boxed: a slot of the map stays small (key and pointer), so inserting into a large, cold
    /// map and growing it move a few bytes, and a completion rewrites the record where the claim
    /// just wrote it (in cache) instead of in the map's slot.
    records: HashMap<HashedKey, Box<Record>, PassThroughState>,
    /// The settled records in the order they were settled, named by key and fence: the
    /// eviction order, so a full store evicts in O(1) instead of searching the shard for its
    /// oldest record. An entry whose record has since gone or changed (another fence, in flight
    /// again) is stale: eviction skips it, and the queue is compacted when stale entries could
    /// outnumber the records.
    settled: VecDeque<(HashedKey, Fence)>,
    /// Whether the store has a capacity or a byte budget, so [`Shard::settled`] is kept (a
    /// store without either never evicts, and its writes skip the queue).
    evicts: bool,
    /// The most bytes ([`charge`]) this shard's records may hold, if the store has a budget.
    budget: Option<usize>,
    /// The bytes its records hold, by [`charge`]; kept only when there is a budget.
    bytes: usize,
    /// Records evicted for the budget and not yet reported to the store's count.
    evicted: usize,
    writes_since_sweep: usize,
}

/// What a record costs beyond its variable parts: the record, its box, its slot in the map (key,
/// pointer and a control byte), its entry in the eviction queue, and the headers of the two
/// `Arc<str>` of its key.
const RECORD_OVERHEAD: usize = size_of::<Record>()
    + size_of::<(HashedKey, Box<Record>)>()
    + 1
    + size_of::<(HashedKey, Fence)>()
    + 4 * size_of::<usize>();

/// The bytes a record is charged against a byte budget: its key, its result, its failure
/// message and the reason of its unknown outcome, plus [`RECORD_OVERHEAD`]. The allocator's own
/// overhead is not counted.
pub(crate) fn charge(record: &Record) -> usize {
    RECORD_OVERHEAD
        + record.key.scope.as_str().len()
        + record.key.key.as_str().len()
        + record.result.as_ref().map_or(0, Bytes::len)
        + record
            .failure
            .as_ref()
            .map_or(0, |failure| failure.message.len())
        + record
            .unknown
            .as_ref()
            .map_or(0, |unknown| unknown.reason.len())
}

/// What a transition did to the number of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    Added,
    Removed,
    Same,
}

/// The result of [`Shard::transition`].
pub(crate) enum Applied<T> {
    /// The write is applied.
    Done {
        answer: T,
        delta: Delta,
        /// The fence of the record written, if one was.
        written_fence: Option<Fence>,
    },
    /// The transition would add a record and there is no room: nothing was written.
    Full,
}

/// What a write of `record` leaves behind for the eviction queue: its fence, and whether it
/// may be evicted.
fn written(record: &Record) -> (Fence, bool) {
    (record.fence, evictable(record))
}

/// Whether `record` may be evicted before its retention: a completed or failed one. Never an
/// in-flight one (its holder may still complete it), nor an unknown one (evicting it would let
/// the next claim run an operation that may have happened).
fn evictable(record: &Record) -> bool {
    matches!(record.state, State::Completed | State::Failed)
}

impl Shard {
    /// An empty shard; `capacity` when the store has a capacity (so it may evict), `budget` the
    /// bytes its records may hold.
    pub(crate) fn new(capacity: bool, budget: Option<usize>) -> Self {
        Shard {
            evicts: capacity || budget.is_some(),
            budget,
            ..Shard::default()
        }
    }

    /// The bytes its records hold, by [`charge`] (0 without a budget).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many records were evicted for the byte budget since the last call.
    pub(crate) fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }

    /// `record`'s charge, where there is a budget to charge it to (0 otherwise).
    fn budgeted_charge(&self, record: &Record) -> usize {
        if self.budget.is_some() {
            charge(record)
        } else {
            0
        }
    }

    pub(crate) fn get(&self, key: &HashedKey) -> Option<&Record> {
        self.records.get(key).map(|record| &**record)
    }

    pub(crate) fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values().map(|record| &**record)
    }

    /// Runs one transition on `key`: `decide` sees the record (or `None`), and its write is
    /// applied in place. A write that adds a record first takes a slot with `reserve`; if that
    /// fails nothing is written and the answer is [`Applied::Full`]. Under a byte budget, a
    /// write that grows the shard past it first evicts settled records, oldest first; a record
    /// larger than the whole budget is refused with [`StoreError::TooLarge`], and a write that
    /// no eviction can make room for (the rest is in flight) with [`StoreError::Capacity`].
    pub(crate) fn transition<T>(
        &mut self,
        key: &HashedKey,
        decide: impl FnOnce(Option<&Record>) -> Result<Step<T>, StoreError>,
        reserve: impl FnOnce() -> bool,
    ) -> Result<Applied<T>, StoreError> {
        let Some(budget) = self.budget else {
            return self.apply(key, decide, reserve);
        };
        // Decide on the record as it is, make room for what the write adds (never by evicting
        // this key's record, so the decision stays right), then apply the decided step.
        let existing = self.get(key);
        let charged = existing.map_or(0, charge);
        let step = decide(existing)?;
        if let Write::Put(record) = &step.write {
            self.make_room_for(key, charge(record), charged, budget)?;
        }
        self.apply(key, |_| Ok(step), reserve)
    }

    /// Applies the write `decide` makes of the record at `key`, hashing and probing once.
    fn apply<T>(
        &mut self,
        key: &HashedKey,
        decide: impl FnOnce(Option<&Record>) -> Result<Step<T>, StoreError>,
        reserve: impl FnOnce() -> bool,
    ) -> Result<Applied<T>, StoreError> {
        let budgeted = self.budget.is_some();
        let (answer, delta, written) = match self.records.entry(key.clone()) {
            Entry::Occupied(mut slot) => {
                let step = decide(Some(&**slot.get()))?;
                match step.write {
                    Write::Nothing => (step.answer, Delta::Same, None),
                    Write::Put(record) => {
                        let written = written(&record);
                        if budgeted {
                            self.bytes = self.bytes - charge(slot.get()) + charge(&record);
                        }
                        **slot.get_mut() = record;
                        (step.answer, Delta::Same, Some(written))
                    }
                    Write::Remove => {
                        let record = slot.remove();
                        if budgeted {
                            self.bytes -= charge(&record);
                        }
                        (step.answer, Delta::Removed, None)
                    }
                }
            }
            Entry::Vacant(slot) => {
                let step = decide(None)?;
                match step.write {
                    Write::Put(record) => {
                        if !reserve() {
                            return Ok(Applied::Full);
                        }
                        let written = written(&record);
                        if budgeted {
                            self.bytes += charge(&record);
                        }
                        slot.insert(Box::new(record));
                        (step.answer, Delta::Added, Some(written))
                    }
                    Write::Nothing | Write::Remove => (step.answer, Delta::Same, None),
                }
            }
        };
        self.writes_since_sweep += 1;
        if let Some((fence, true)) = written {
            self.settled_now(key, fence);
        }
        Ok(Applied::Done {
            answer,
            delta,
            written_fence: written.map(|(fence, _)| fence),
        })
    }

    /// Evicts settled records, oldest first and never `key`'s, until a write that replaces a
    /// record charged `charged` with one of `size` bytes fits in `budget`.
    fn make_room_for(
        &mut self,
        key: &HashedKey,
        size: usize,
        charged: usize,
        budget: usize,
    ) -> Result<(), StoreError> {
        if size > budget {
            return Err(StoreError::TooLarge {
                size,
                limit: budget,
            });
        }
        while self.bytes - charged + size > budget {
            if !self.evict_oldest(Some(key)) {
                return Err(StoreError::Capacity {
                    limit: self.records.len(),
                });
            }
            self.evicted += 1;
        }
        Ok(())
    }

    /// Stores `record` as it is; whether it added a record.
    pub(crate) fn put(&mut self, key: HashedKey, record: Record) -> bool {
        let written = written(&record);
        self.bytes += self.budgeted_charge(&record);
        let replaced = self.records.insert(key.clone(), Box::new(record));
        let added = match replaced {
            Some(old) => {
                self.bytes -= self.budgeted_charge(&old);
                false
            }
            None => true,
        };
        if let (fence, true) = written {
            self.settled_now(&key, fence);
        }
        added
    }

    /// Entries in the eviction queue, stale ones included.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.settled.len()
    }

    /// Queues the record just settled at `key` (with `fence`) for eviction.
    fn settled_now(&mut self, key: &HashedKey, fence: Fence) {
        if !self.evicts {
            return;
        }
        self.settled.push_back((key.clone(), fence));
        self.compact_if_stale();
    }

    /// Whether the queue entry `(key, fence)` still names a settled record.
    fn live(&self, key: &HashedKey, fence: Fence) -> bool {
        self.records
            .get(key)
            .is_some_and(|record| record.fence == fence && evictable(record))
    }

    /// Drops the stale entries of the eviction queue once it holds more than twice as many
    /// entries as the shard holds records (amortized: the queue has grown by about as many
    /// entries as it keeps since the last time).
    fn compact_if_stale(&mut self) {
        if self.settled.len() <= 2 * self.records.len() + MIN_SWEEP_INTERVAL {
            return;
        }
        let mut settled = std::mem::take(&mut self.settled);
        settled.retain(|(key, fence)| self.live(key, *fence));
        self.settled = settled;
    }

    /// Removes `key`; whether it was there.
    pub(crate) fn remove(&mut self, key: &HashedKey) -> bool {
        match self.records.remove(key) {
            Some(record) => {
                self.bytes -= self.budgeted_charge(&record);
                true
            }
            None => false,
        }
    }

    /// Sweeps expired records if enough writes happened since the last sweep; returns how many
    /// were removed.
    pub(crate) fn maybe_sweep(&mut self, now: Timestamp) -> usize {
        if self.writes_since_sweep < self.records.len().max(MIN_SWEEP_INTERVAL) {
            return 0;
        }
        self.sweep(now)
    }

    /// Sweeps expired records if a quarter as many writes as the shard holds records happened
    /// since the last sweep (what a full store tries before it evicts: often enough to find
    /// what expired, rarely enough to stay O(1) per write); returns how many were removed.
    pub(crate) fn sweep_if_due(&mut self, now: Timestamp) -> usize {
        if self.writes_since_sweep < (self.records.len() / 4).max(1) {
            return 0;
        }
        self.sweep(now)
    }

    /// Removes every expired record; returns how many.
    pub(crate) fn sweep(&mut self, now: Timestamp) -> usize {
        self.writes_since_sweep = 0;
        let before = self.records.len();
        let budgeted = self.budget.is_some();
        let bytes = &mut self.bytes;
        self.records.retain(|_, record| {
            let expired = record.is_expired(now);
            if expired && budgeted {
                *bytes -= charge(record);
            }
            !expired
        });
        self.compact_if_stale();
        before - self.records.len()
    }

    /// Evicts the oldest settled record (completed or failed), in the order records settled.
    /// Never an in-flight record, not even one whose lease lapsed: its holder may still complete
    /// it; never an unknown one, which holds its key until it is resolved. Returns whether one
    /// was evicted.
    pub(crate) fn evict_one(&mut self) -> bool {
        self.evict_oldest(None)
    }

    /// [`Shard::evict_one`], passing over `except`'s record (its queue entry is dropped: the
    /// write about to replace that record queues it again if it stays settled).
    fn evict_oldest(&mut self, except: Option<&HashedKey>) -> bool {
        while let Some((key, fence)) = self.settled.pop_front() {
            if except != Some(&key) && self.live(&key, fence) {
                self.remove(&key);
                return true;
            }
        }
        false
    }
}
