//! The embedded durable store of idem, on [redb](https://www.redb.org): one file that keeps
//! every acknowledged record across restarts, crashes and `kill -9`.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-redb = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```
//! use std::time::Duration;
//! use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
//! use idem_store_redb::RedbStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("idem.redb");
//! let store = RedbStore::open(&path)?;
//! let key = RecordKey::unscoped(IdempotencyKey::new("payment:42:capture")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"amount=10"]), Duration::from_secs(30));
//!
//! let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else { unreachable!() };
//! // ... the side effect ...
//! store.complete(&lease, Bytes::from("captured"), Duration::from_secs(86_400)).await?;
//! // `complete` returned: the record is on disk (fsync'd).
//! drop(store);
//!
//! // After a restart (or a crash), a retry is answered from the file.
//! let store = RedbStore::open(&path)?;
//! assert!(matches!(store.claim(&request).await?, ClaimOutcome::Completed(_)));
//! # Ok(())
//! # }
//! ```
//!
//! # Durability
//!
//! Every write transaction commits with `Durability::Immediate` (fsync before the commit
//! returns) and, by default, redb's quick repair (a two-phase commit that also saves the
//! allocator state), so a file reopened after `kill -9` or a power loss holds every transition
//! that was acknowledged, nothing half-written, and opens without a repair pass. An operation
//! answers only after its transaction committed.
//!
//! # One writer, batched commits
//!
//! redb is synchronous and has one writer at a time. The store runs a writer thread that takes
//! every operation queued since its last commit, applies each one atomically in turn (read the
//! record, run the state machine of [`idem_core::machine`], write), and commits them together:
//! one fsync for the batch (group commit), so throughput grows with concurrency while each
//! operation stays atomic and is acknowledged only once durable. A batch that writes nothing
//! (replays, refusals) is not committed at all. Reads ([`Store::get`], [`Store::scan`]) run in
//! read transactions on the blocking thread pool and never wait for the writer.
//!
//! # Expiry, sweep, compaction
//!
//! A record whose retention ended counts as absent on every read. [`RedbStore::sweep`]
//! (`idem store sweep`) removes expired records; [`RedbStore::compact`] gives their space back
//! to the file system. Fences keep rising after a delete or a sweep: the file keeps a fence
//! floor at or above the fence of every record it removed, and new grants start above it.
//!
//! # A damaged or emptied file
//!
//! redb panics, rather than answering an error, on a file it cannot make sense of (one cut
//! short, or with foreign bytes over its pages). Every call into redb runs under a guard that
//! catches the panic, without the panic hook printing it: the open, or the operation, answers
//! [`StoreError::Corrupt`](idem_core::StoreError::Corrupt) naming the file, and from then on
//! the store answers every operation, [`Store::ping`] included, with that error without
//! calling redb again. The file is not written to again (see [`RedbStoreBuilder::open`]).
//!
//! An existing file of zero bytes is refused by default: a store file is never empty once
//! opened, so an empty one lost its records, and taking it as a new store would answer every
//! key as never seen. [`RedbStoreBuilder::allow_empty_file`] starts a new store in it; a path
//! with no file is created as always.
//!
//! # Encoding
//!
//! Records use a small versioned binary format of this crate (see the `codec` module's
//! source), decoded defensively: a truncated, foreign or future-format record is reported as
//! [`StoreError::Corrupt`](idem_core::StoreError::Corrupt), never a panic.
//!
//! [`Store::get`]: idem_core::Store::get
//! [`Store::scan`]: idem_core::Store::scan
//! [`Store::ping`]: idem_core::Store::ping

mod codec;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod store;
mod writer;

pub use store::{RedbStore, RedbStoreBuilder};
