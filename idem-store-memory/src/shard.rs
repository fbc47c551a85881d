//! One shard: a map of records under one lock, with its incremental sweep.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use idem_core::machine::{Step, Write};
use idem_core::{Fence, Record, State, StoreError, Timestamp};

use crate::hashed::{HashedKey, PassThroughState};

/// Writes between sweeps when a shard holds few records.
const MIN_SWEEP_INTERVAL: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct Shard {
    /// Boxed: a slot of the map stays small (key and pointer), so inserting into a large, cold
    /// map and growing it move a few bytes, and a completion rewrites the record where the claim
    /// just wrote it (in cache) instead of in the map's slot.
    records: HashMap<HashedKey, Box<Record>, PassThroughState>,
    writes_since_sweep: usize,
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

impl Shard {
    pub(crate) fn get(&self, key: &HashedKey) -> Option<&Record> {
        self.records.get(key).map(|record| &**record)
    }

    pub(crate) fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values().map(|record| &**record)
    }

    /// Runs one transition on `key`: `decide` sees the record (or `None`), and its write is
    /// applied in place. The key is hashed once. A write that adds a record first takes a slot
    /// with `reserve`; if that fails nothing is written and the answer is [`Applied::Full`].
    pub(crate) fn transition<T>(
        &mut self,
        key: &HashedKey,
        decide: impl FnOnce(Option<&Record>) -> Result<Step<T>, StoreError>,
        reserve: impl FnOnce() -> bool,
    ) -> Result<Applied<T>, StoreError> {
        let (answer, delta, written_fence) = match self.records.entry(key.clone()) {
            Entry::Occupied(mut slot) => {
                let step = decide(Some(&**slot.get()))?;
                match step.write {
                    Write::Nothing => (step.answer, Delta::Same, None),
                    Write::Put(record) => {
                        let fence = record.fence;
                        **slot.get_mut() = record;
                        (step.answer, Delta::Same, Some(fence))
                    }
                    Write::Remove => {
                        slot.remove();
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
                        let fence = record.fence;
                        slot.insert(Box::new(record));
                        (step.answer, Delta::Added, Some(fence))
                    }
                    Write::Nothing | Write::Remove => (step.answer, Delta::Same, None),
                }
            }
        };
        self.writes_since_sweep += 1;
        Ok(Applied::Done {
            answer,
            delta,
            written_fence,
        })
    }

    /// Stores `record` as it is; whether it added a record.
    pub(crate) fn put(&mut self, key: HashedKey, record: Record) -> bool {
        self.records.insert(key, Box::new(record)).is_none()
    }

    /// Removes `key`; whether it was there.
    pub(crate) fn remove(&mut self, key: &HashedKey) -> bool {
        self.records.remove(key).is_some()
    }

    /// Sweeps expired records if enough writes happened since the last sweep; returns how many
    /// were removed.
    pub(crate) fn maybe_sweep(&mut self, now: Timestamp) -> usize {
        if self.writes_since_sweep < self.records.len().max(MIN_SWEEP_INTERVAL) {
            return 0;
        }
        self.sweep(now)
    }

    /// Removes every expired record; returns how many.
    pub(crate) fn sweep(&mut self, now: Timestamp) -> usize {
        self.writes_since_sweep = 0;
        let before = self.records.len();
        self.records.retain(|_, record| !record.is_expired(now));
        before - self.records.len()
    }

    /// Evicts the oldest settled record (completed or failed). Never an in-flight record, not
    /// even one whose lease lapsed: its holder may still complete it. Returns whether one was
    /// evicted.
    pub(crate) fn evict_one(&mut self) -> bool {
        let victim = self
            .records
            .iter()
            .filter(|(_, record)| record.state != State::InFlight)
            .min_by_key(|(_, record)| record.completed_at.unwrap_or(record.created_at))
            .map(|(key, _)| key.clone());
        match victim {
            Some(key) => self.records.remove(&key).is_some(),
            None => false,
        }
    }
}
