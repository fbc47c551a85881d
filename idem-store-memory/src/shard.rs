//! One shard: a map of records under one lock, with its incremental sweep.

use std::collections::HashMap;

use idem_core::machine::Write;
use idem_core::{Record, RecordKey, State, Timestamp};

/// Writes between sweeps when a shard holds few records.
const MIN_SWEEP_INTERVAL: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct Shard {
    records: HashMap<RecordKey, Record>,
    writes_since_sweep: usize,
}

/// What applying a write did to the number of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    Added,
    Removed,
    Same,
}

impl Shard {
    pub(crate) fn get(&self, key: &RecordKey) -> Option<&Record> {
        self.records.get(key)
    }

    pub(crate) fn contains(&self, key: &RecordKey) -> bool {
        self.records.contains_key(key)
    }

    pub(crate) fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values()
    }

    /// Applies a transition's write to `key`.
    pub(crate) fn apply(&mut self, key: &RecordKey, write: Write) -> Delta {
        self.writes_since_sweep += 1;
        match write {
            Write::Nothing => Delta::Same,
            // Replace in place when the key is there: no clone of the key.
            Write::Put(record) => match self.records.get_mut(key) {
                Some(slot) => {
                    *slot = record;
                    Delta::Same
                }
                None => {
                    self.records.insert(key.clone(), record);
                    Delta::Added
                }
            },
            Write::Remove => match self.records.remove(key) {
                Some(_) => Delta::Removed,
                None => Delta::Same,
            },
        }
    }

    /// Removes `key`; whether it was there.
    pub(crate) fn remove(&mut self, key: &RecordKey) -> bool {
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
            .values()
            .filter(|record| record.state != State::InFlight)
            .min_by_key(|record| record.completed_at.unwrap_or(record.created_at))
            .map(|record| record.key.clone());
        match victim {
            Some(key) => self.records.remove(&key).is_some(),
            None => false,
        }
    }
}
