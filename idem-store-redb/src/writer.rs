//! The single writer thread: every write operation queued since its last commit is applied in
//! one write transaction, committed once (one fsync for the batch), then answered.

use std::sync::Arc;
use std::sync::mpsc::Receiver;

use idem_core::machine::{Step, Write};
use idem_core::{Clock, Fence, Record, RecordKey, StoreError, Timestamp};
use redb::{Database, ReadableTable};

use crate::codec;
use crate::error::storage;
use crate::guard::Db;
use crate::store::{FENCE_FLOOR, MAX_BATCH, META, RECORDS, SWEEP_BATCH, begin_write};

/// What the writer hands back once the batch's commit is settled: `None` if it committed.
pub(crate) type Reply = Box<dyn FnOnce(Option<&(Arc<str>, bool)>) + Send>;
/// One operation for the writer: runs against the open batch (or `None` if the batch could
/// not be opened) and returns how to answer.
pub(crate) type Job = Box<dyn FnOnce(Option<&mut Batch<'_>>) -> Reply + Send>;

/// The single writer: takes every operation queued since its last commit, applies them in one
/// write transaction, commits once (one fsync for the batch), then answers them all.
pub(crate) struct Writer {
    pub(crate) db: Arc<Db>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The highest fence granted since the file was opened, or the floor.
    pub(crate) last_fence: u64,
    /// The fence floor as committed.
    pub(crate) floor: u64,
    pub(crate) quick_repair: bool,
}

/// The open write transaction of one batch, as operations see it.
pub(crate) struct Batch<'t> {
    pub(crate) records: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) last_fence: u64,
    pub(crate) floor: u64,
    pub(crate) dirty: bool,
    /// A storage error: the batch is aborted and every operation in it fails.
    pub(crate) broken: Option<StoreError>,
}

impl Writer {
    pub(crate) fn run(mut self, queue: &Receiver<Job>) {
        while let Ok(first) = queue.recv() {
            let mut jobs = vec![first];
            while jobs.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            // Each operation runs under the guard (see `RedbStore::submit`), and the whole
            // batch too: a panic in redb marks the file damaged instead of ending this thread.
            // The operations of a batch that panicked outside their own guard (or that came
            // once the file was known to be damaged) are dropped unanswered: their callers
            // find the damage.
            let db = Arc::clone(&self.db);
            let Ok((replies, outcome)) = db.with(|db| Ok(self.batch(db, jobs))) else {
                continue;
            };
            let failure = outcome
                .err()
                .map(|e| (Arc::<str>::from(e.to_string()), e.is_retryable()));
            for reply in replies {
                reply(failure.as_ref());
            }
        }
    }

    fn batch(&mut self, db: &Database, jobs: Vec<Job>) -> (Vec<Reply>, Result<(), StoreError>) {
        let txn = match begin_write(db, self.quick_repair) {
            Ok(txn) => txn,
            Err(err) => return (jobs.into_iter().map(|job| job(None)).collect(), Err(err)),
        };
        let records = match txn.open_table(RECORDS) {
            Ok(records) => records,
            Err(err) => {
                return (
                    jobs.into_iter().map(|job| job(None)).collect(),
                    Err(storage(err)),
                );
            }
        };
        let (replies, records, last_fence, floor, dirty, broken) = {
            let mut batch = Batch {
                records,
                clock: Arc::clone(&self.clock),
                last_fence: self.last_fence,
                floor: self.floor,
                dirty: false,
                broken: None,
            };
            let replies: Vec<Reply> = jobs.into_iter().map(|job| job(Some(&mut batch))).collect();
            (
                replies,
                batch.records,
                batch.last_fence,
                batch.floor,
                batch.dirty,
                batch.broken,
            )
        };
        if let Err(damage) = self.db.damage.check() {
            // redb panicked inside an operation: its transaction is not rolled back (that
            // would run redb on what the panic left), only left behind, as the file is.
            std::mem::forget(records);
            std::mem::forget(txn);
            return (replies, Err(damage));
        }
        drop(records);
        if let Some(err) = broken {
            let _ = txn.abort();
            return (replies, Err(err));
        }
        if !dirty {
            // Nothing written (replays, refusals): no commit, no fsync.
            let _ = txn.abort();
            return (replies, Ok(()));
        }
        let committed = (|| {
            // Only a batch that removed records moves the floor (claims and completions write
            // nothing but their record).
            if floor > self.floor {
                let mut meta = txn.open_table(META).map_err(storage)?;
                meta.insert(FENCE_FLOOR, floor).map_err(storage)?;
            }
            txn.commit().map_err(storage)
        })();
        if committed.is_ok() {
            self.last_fence = last_fence;
            self.floor = floor;
        }
        (replies, committed)
    }
}

impl Batch<'_> {
    /// Runs one transition on `key` against the batch's view (earlier operations of the batch
    /// included) and applies its write.
    pub(crate) fn transition<T>(
        &mut self,
        key: &RecordKey,
        decide: impl FnOnce(Option<&Record>, Timestamp, Fence) -> Result<Step<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let raw_key = codec::encode_key(key);
        let found = self
            .records
            .get(raw_key.as_slice())
            .map(|raw| raw.map(|raw| codec::decode_record(key, raw.value())));
        let existing = match found {
            Ok(found) => found.transpose()?,
            Err(err) => return Err(self.break_batch(storage(err))),
        };
        let now = self.clock.now();
        let step = decide(
            existing.as_ref(),
            now,
            Fence::new(self.last_fence.max(self.floor)).successor(),
        )?;
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => {
                let raw = codec::encode_record(&record)?;
                let inserted = self
                    .records
                    .insert(raw_key.as_slice(), raw.as_slice())
                    .map(drop);
                if let Err(err) = inserted {
                    return Err(self.break_batch(storage(err)));
                }
                self.last_fence = self.last_fence.max(record.fence.get());
                self.dirty = true;
            }
            Write::Remove => {
                let removed = self.records.remove(raw_key.as_slice()).map(drop);
                if let Err(err) = removed {
                    return Err(self.break_batch(storage(err)));
                }
                self.removed(existing.map(|record| record.fence.get()));
            }
        }
        Ok(step.answer)
    }

    pub(crate) fn delete(&mut self, key: &RecordKey) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let raw_key = codec::encode_key(key);
        let removed = self.records.remove(raw_key.as_slice()).map(|removed| {
            removed.map(|raw| (codec::expires_at(raw.value()), codec::fence(raw.value())))
        });
        let removed = match removed {
            Ok(removed) => removed,
            Err(err) => return Err(self.break_batch(storage(err))),
        };
        let Some((expires_at, fence)) = removed else {
            return Ok(false);
        };
        self.removed(fence);
        // A record that cannot be read counts as there: the operator removed something.
        Ok(expires_at.is_none_or(|at| now < at))
    }

    /// Removes up to [`SWEEP_BATCH`] expired records; returns how many.
    pub(crate) fn sweep(&mut self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let removed = self
            .records
            .extract_if(|_, raw| codec::expires_at(raw).is_some_and(|at| now >= at))
            .map(|expired| {
                expired
                    .take(SWEEP_BATCH)
                    .filter_map(Result::ok)
                    .map(|(_, raw)| codec::fence(raw.value()))
                    .collect::<Vec<_>>()
            });
        let removed = match removed {
            Ok(removed) => removed,
            Err(err) => return Err(self.break_batch(storage(err))),
        };
        for &fence in &removed {
            self.removed(fence);
        }
        Ok(removed.len())
    }

    /// Records that a record with `fence` was removed (`None`: a record whose fence cannot be
    /// read): the floor rises to it.
    pub(crate) fn removed(&mut self, fence: Option<u64>) {
        let fence = fence.unwrap_or(self.last_fence.max(self.floor));
        self.floor = self.floor.max(fence);
        self.dirty = true;
    }

    pub(crate) fn break_batch(&mut self, err: StoreError) -> StoreError {
        let message = err.to_string();
        self.broken.get_or_insert(err);
        StoreError::unavailable(message)
    }
}
