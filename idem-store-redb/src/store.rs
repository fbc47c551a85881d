//! [`RedbStore`]: the [`Store`] in one redb file, and its builder.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::{self, LeasePolicy, Step};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Clock, Failure, Fence, Lease, Record, RecordKey, ScanPage,
    ScanQuery, Store, StoreError, StoreStats, SystemClock, Timestamp, UnknownOutcome,
};
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};
use tokio::sync::oneshot;

use crate::codec;
use crate::error::{BatchError, empty_file, in_file, open_error, storage};
use crate::guard::{Damage, Db};
use crate::writer::{Batch, Job, Writer};

/// The records: table key (see [`codec::encode_key`]) to stored record.
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem_records");
/// Store-wide values: the fence floor, the format version.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("idem_meta");
/// At least the fence of every record ever removed: new grants start above it, so fences keep
/// rising across a delete (a record that still exists carries its own fence).
pub(crate) const FENCE_FLOOR: &str = "fence_floor";
pub(crate) const FORMAT: &str = "format";

/// The most operations one write transaction (one fsync) carries.
pub(crate) const MAX_BATCH: usize = 256;
/// How many expired records one sweep transaction removes.
pub(crate) const SWEEP_BATCH: usize = 1_000;

/// The embedded durable store: one redb file. Cheap to clone: clones share the file.
///
/// See the [crate docs](crate) for durability, batching and expiry.
#[derive(Clone, Debug)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    policy: LeasePolicy,
    /// The writer's queue; `None` once the store is dropped.
    jobs: Option<Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue stops the writer after its last batch; joining it closes the file
        // before the drop returns, so the file can be opened again at once.
        drop(self.jobs.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Builds a [`RedbStore`]. Made by [`RedbStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct RedbStoreBuilder {
    clock: Arc<dyn Clock>,
    policy: LeasePolicy,
    quick_repair: bool,
    cache_size: Option<usize>,
    allow_empty_file: bool,
}

impl Default for RedbStoreBuilder {
    fn default() -> Self {
        RedbStoreBuilder {
            clock: Arc::new(SystemClock),
            policy: LeasePolicy::Lenient,
            quick_repair: true,
            cache_size: None,
            allow_empty_file: false,
        }
    }
}

impl RedbStoreBuilder {
    /// The clock (default: [`SystemClock`]). Tests pass a [`idem_core::ManualClock`].
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Refuse transitions of a holder whose lease lapsed, even if nobody took the key over
    /// (default: lenient; see [`LeasePolicy`]).
    pub fn lease_policy(mut self, policy: LeasePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Whether every commit also saves redb's allocator state with a two-phase commit (default:
    /// on). On, a file reopened after a crash (`kill -9`, power loss) needs no repair pass; off,
    /// commits are a little cheaper and the first open after a crash walks the whole file.
    pub fn quick_repair(mut self, on: bool) -> Self {
        self.quick_repair = on;
        self
    }

    /// The size of redb's page cache in bytes (default: redb's).
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = Some(bytes);
        self
    }

    /// Whether an existing file of zero bytes is taken as a new, empty store (default: off,
    /// it is refused). A store file is never empty once opened, so an empty one is a store
    /// whose records were lost (a truncation, a copy that failed, a full disk): taking it as
    /// a new store would answer every key as never seen. Turn this on only to start a new
    /// store in a file made empty on purpose. A path with no file at all is created either
    /// way.
    pub fn allow_empty_file(mut self, allow: bool) -> Self {
        self.allow_empty_file = allow;
        self
    }

    /// Opens the file at `path`, creating it if needed. Blocks while redb opens the file (and,
    /// after a crash with quick repair off, repairs it): call it at startup, or inside
    /// `spawn_blocking`.
    ///
    /// A file redb cannot make sense of (truncated, overwritten in part) is
    /// [`StoreError::Corrupt`], here or on any later operation: redb panics on such a file,
    /// and the store catches the panic (quietly: the process's panic hook does not print it)
    /// and from then on answers every operation, [`Store::ping`] included, with that error,
    /// without calling redb again. A damaged file is not written to again, not even when the
    /// store is dropped: it stays open, and locked, until the process exits. (A build with
    /// `panic = "abort"` cannot catch the panic: it aborts.)
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the file cannot be opened or created (another process
    /// holds it, no permission), [`StoreError::Backend`] if it is not a redb file, was written
    /// by a newer format, or is empty (see [`RedbStoreBuilder::allow_empty_file`]),
    /// [`StoreError::Corrupt`] if it is damaged.
    pub fn open(self, path: impl AsRef<Path>) -> Result<RedbStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        // Only an existing file is looked at: a missing one is created below.
        let empty = std::fs::metadata(&path).is_ok_and(|meta| meta.is_file() && meta.len() == 0);
        if empty && !self.allow_empty_file {
            return Err(empty_file(&path));
        }
        let mut builder = Database::builder();
        if let Some(bytes) = self.cache_size {
            builder.set_cache_size(bytes);
        }
        let damage = Damage::new(&path);
        let db = damage.guard(|| builder.create(&path).map_err(|err| open_error(&path, err)))?;
        let db = Arc::new(Db::new(db, damage));
        let floor = db
            .with(|db| prepare(db, self.quick_repair))
            .map_err(|err| in_file(&path, err))?;
        let (jobs, queue) = mpsc::channel();
        let writer = Writer {
            db: Arc::clone(&db),
            clock: Arc::clone(&self.clock),
            last_fence: floor,
            floor,
            quick_repair: self.quick_repair,
        };
        let writer = std::thread::Builder::new()
            .name("idem-redb-writer".to_owned())
            .spawn(move || writer.run(&queue))
            .map_err(StoreError::unavailable)?;
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db,
                path,
                clock: self.clock,
                policy: self.policy,
                jobs: Some(jobs),
                writer: Some(writer),
            }),
        })
    }
}

/// Creates the tables of a new file, checks the format of an old one, and reads the fence
/// floor.
fn prepare(db: &Database, quick_repair: bool) -> Result<u64, StoreError> {
    let txn = begin_write(db, quick_repair)?;
    let floor = {
        let mut meta = txn.open_table(META).map_err(storage)?;
        let format = meta.get(FORMAT).map_err(storage)?.map(|v| v.value());
        match format {
            None => {
                meta.insert(FORMAT, u64::from(codec::FORMAT))
                    .map_err(storage)?;
            }
            Some(format) if format == u64::from(codec::FORMAT) => {}
            Some(format) => {
                return Err(StoreError::Backend {
                    source: format!(
                        "the file holds records of format {format}; this build reads format {}",
                        codec::FORMAT
                    )
                    .into(),
                    retryable: false,
                });
            }
        }
        let last = meta.get(FENCE_FLOOR).map_err(storage)?.map(|v| v.value());
        last.unwrap_or(0)
    };
    txn.open_table(RECORDS).map_err(storage)?;
    txn.commit().map_err(storage)?;
    Ok(floor)
}

pub(crate) fn begin_write(
    db: &Database,
    quick_repair: bool,
) -> Result<redb::WriteTransaction, StoreError> {
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(Durability::Immediate).map_err(storage)?;
    txn.set_quick_repair(quick_repair);
    Ok(txn)
}

impl RedbStore {
    /// Opens (or creates) the store file at `path` with every default: the system clock,
    /// lenient leases, quick repair on. See [`RedbStoreBuilder::open`].
    ///
    /// # Errors
    /// As [`RedbStoreBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        RedbStore::builder().open(path)
    }

    /// A builder for a store with a manual clock, a strict lease policy or other settings.
    pub fn builder() -> RedbStoreBuilder {
        RedbStoreBuilder::default()
    }

    /// The path of the store file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Queues `op` for the writer and waits until its batch is committed (or failed). `op`
    /// runs under the guard: a panic in it is [`StoreError::Corrupt`], and fails its batch.
    async fn submit<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Batch<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = &self.inner.db;
        db.damage.check()?;
        let (answer, answered) = oneshot::channel();
        let shared = Arc::clone(db);
        let job: Job = Box::new(move |batch| {
            let result = match batch {
                Some(batch) => shared.damage.guard(|| op(batch)),
                None => Err(StoreError::unavailable(
                    "the write transaction did not open",
                )),
            };
            Box::new(move |failure| {
                let result = match (failure, shared.damage.error()) {
                    (None, _) => result,
                    // A batch failed by a damaged file answers as the file's damage.
                    (Some(_), Some(damage)) => Err(damage),
                    (Some((message, true)), None) => {
                        Err(StoreError::unavailable(BatchError(Arc::clone(message))))
                    }
                    (Some((message, false)), None) => Err(StoreError::Backend {
                        source: Box::new(BatchError(Arc::clone(message))),
                        retryable: false,
                    }),
                };
                let _ = answer.send(result);
            })
        });
        let queue = self
            .inner
            .jobs
            .as_ref()
            .ok_or_else(|| StoreError::unavailable("the store is closed"))?;
        // An operation left unanswered (its batch panicked outside the operations' guards, or
        // came once the file was known to be damaged) answers as the file's damage.
        let stopped = || {
            db.damage
                .error()
                .unwrap_or_else(|| StoreError::unavailable("the redb writer stopped"))
        };
        queue.send(job).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }

    async fn transition<T: Send + 'static>(
        &self,
        key: RecordKey,
        decide: impl FnOnce(Option<&Record>, Timestamp, Fence) -> Result<Step<T>, StoreError>
        + Send
        + 'static,
    ) -> Result<T, StoreError> {
        self.submit(move |batch| batch.transition(&key, decide))
            .await
    }

    /// Runs `read` in a read transaction on a blocking thread, under the guard: reads never
    /// wait for the writer.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&ReadTransaction, Timestamp) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let clock = Arc::clone(&self.inner.clock);
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let txn = db.begin_read().map_err(storage)?;
                read(&txn, clock.now())
            })
        })
        .await
        .map_err(|e| StoreError::Backend {
            source: Box::new(e),
            retryable: false,
        })?
    }

    /// Removes every expired record (the file keeps their space for new records; see
    /// [`RedbStore::compact`] to give it back); returns how many. Expired records count as
    /// absent whether swept or not: sweeping only keeps the file small. This is what
    /// `idem store sweep` runs.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the file cannot be written.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let removed = self.submit(|batch| batch.sweep()).await?;
            total += removed as u64;
            if removed < SWEEP_BATCH {
                return Ok(total);
            }
        }
    }

    /// Compacts the file, giving the space of removed records back to the file system; `true`
    /// if it did anything. Waits for the operations in progress and holds every other
    /// operation until it is done: run it after a [`RedbStore::sweep`], in a quiet moment.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the file cannot be written.
    pub async fn compact(&self) -> Result<bool, StoreError> {
        let db = Arc::clone(&self.inner.db);
        tokio::task::spawn_blocking(move || db.exclusive(|db| db.compact().map_err(storage)))
            .await
            .map_err(|e| StoreError::Backend {
                source: Box::new(e),
                retryable: false,
            })?
    }

    /// Stores `raw` as the value of `key` as it is, bypassing the codec and the state machine:
    /// for tests that plant a half-written or foreign record. Every later read of it answers
    /// [`StoreError::Corrupt`].
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the file cannot be written.
    #[doc(hidden)]
    pub async fn put_raw(&self, key: &RecordKey, raw: Vec<u8>) -> Result<(), StoreError> {
        let raw_key = codec::encode_key(key);
        self.submit(move |batch| {
            let inserted = batch
                .records
                .insert(raw_key.as_slice(), raw.as_slice())
                .map(drop);
            if let Err(err) = inserted {
                return Err(batch.break_batch(storage(err)));
            }
            batch.dirty = true;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl Store for RedbStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let request = request.clone();
        self.transition(request.key.clone(), move |existing, now, min_fence| {
            machine::claim(existing, &request, now, min_fence, request.grant_owner())
        })
        .await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let lease = lease.clone();
        let policy = self.inner.policy;
        self.transition(lease.key.clone(), move |existing, now, _| {
            machine::heartbeat(existing, &lease, extend, now, policy)
        })
        .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let policy = self.inner.policy;
        self.transition(lease.key.clone(), move |existing, now, _| {
            machine::complete(existing, &lease, result, retention, now, policy)
        })
        .await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let policy = self.inner.policy;
        self.transition(lease.key.clone(), move |existing, now, _| {
            machine::fail(existing, &lease, failure, retention, now, policy)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let lease = lease.clone();
        self.transition(lease.key.clone(), move |existing, now, _| {
            machine::release(existing, &lease, now)
        })
        .await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let policy = self.inner.policy;
        self.transition(lease.key.clone(), move |existing, now, _| {
            machine::settle_unknown(existing, &lease, outcome, hold, retention, now, policy)
        })
        .await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.transition(key.clone(), move |existing, now, _| {
            machine::resolve_completed(existing, fence, result, retention, now)
        })
        .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.transition(key.clone(), move |existing, now, _| {
            machine::resolve_released(existing, fence, now)
        })
        .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        let key = key.clone();
        self.read(move |txn, now| {
            let records = txn.open_table(RECORDS).map_err(storage)?;
            let raw_key = codec::encode_key(&key);
            let Some(raw) = records.get(raw_key.as_slice()).map_err(storage)? else {
                return Ok(None);
            };
            let record = codec::decode_record(&key, raw.value())?;
            Ok((!record.is_expired(now)).then_some(record))
        })
        .await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let key = key.clone();
        self.submit(move |batch| batch.delete(&key)).await
    }

    /// The records in the file, expired ones not yet swept included (redb keeps the count in
    /// the table's header: no scan). `None` while a compaction holds the file, or if the file
    /// cannot be read; bytes are not counted.
    fn stats(&self) -> Option<StoreStats> {
        let records = self.inner.db.try_with(|db| {
            let txn = db.begin_read().ok()?;
            txn.open_table(RECORDS).ok()?.len().ok()
        })?;
        Some(StoreStats::new(records, None))
    }

    /// Whether the store can serve: the file is not known to be damaged, the writer thread
    /// runs (every write waits on it), and a read transaction opens on the records. A
    /// readiness probe on a store whose writes all fail fails too.
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.db.damage.check()?;
        let stopped = self
            .inner
            .writer
            .as_ref()
            .is_none_or(JoinHandle::is_finished);
        if stopped {
            return Err(StoreError::unavailable("the redb writer stopped"));
        }
        self.read(|txn, _| txn.open_table(RECORDS).map(drop).map_err(storage))
            .await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        let query = query.clone();
        self.read(move |txn, now| {
            let records = txn.open_table(RECORDS).map_err(storage)?;
            let after = match &query.cursor {
                Some(cursor) => {
                    Some(decode_cursor(cursor).ok_or_else(|| StoreError::invalid_cursor(cursor))?)
                }
                None => None,
            };
            let range = match &after {
                Some(after) => records.range::<&[u8]>(after.as_slice()..),
                None => records.range::<&[u8]>(..),
            }
            .map_err(storage)?;
            let limit = query.page_size();
            let mut page = ScanPage::default();
            let mut last: Option<Vec<u8>> = None;
            for entry in range {
                let (raw_key, raw) = entry.map_err(storage)?;
                let raw_key = raw_key.value();
                if after.as_deref() == Some(raw_key) {
                    continue;
                }
                // A record that cannot be decoded (nor its key) is reported, not an error.
                let (key, read) = match codec::decode_key(raw_key) {
                    Ok(key) => {
                        let read = codec::decode_record(&key, raw.value()).map(Some);
                        (Some(key), read)
                    }
                    Err(err) => (None, Err(err)),
                };
                let Some(entry) = query.entry(key.as_ref(), read, now)? else {
                    continue;
                };
                if page.len() == limit {
                    page.next_cursor = last.as_deref().map(encode_cursor);
                    break;
                }
                page.push(entry);
                last = Some(raw_key.to_vec());
            }
            Ok(page)
        })
        .await
    }
}

/// A scan cursor: the table key of the last record of a page, in hex.
fn encode_cursor(raw_key: &[u8]) -> String {
    raw_key.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Option<Vec<u8>> {
    if !cursor.len().is_multiple_of(2) || !cursor.is_ascii() {
        return None;
    }
    (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        let raw = vec![0u8, 1, 0xab, 0xff];
        assert_eq!(decode_cursor(&encode_cursor(&raw)), Some(raw));
        assert_eq!(decode_cursor("abc"), None);
        assert_eq!(decode_cursor("zz"), None);
        assert_eq!(decode_cursor("é0"), None);
    }
}
