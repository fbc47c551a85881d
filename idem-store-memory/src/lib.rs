//! [`MemoryStore`]: the embedded default store of idem. No server, no I/O: records live in
//! sharded maps in this process, and are gone when it exits.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-memory = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```
//! use std::time::Duration;
//! use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
//! use idem_store_memory::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let key = RecordKey::unscoped(IdempotencyKey::new("order:7:ship")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"order 7"]), Duration::from_secs(30));
//!
//! // The first attempt gets the key and records its result...
//! let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else { unreachable!() };
//! store.complete(&lease, Bytes::from("shipped"), Duration::from_secs(3600)).await?;
//!
//! // ...and every retry gets that result instead of shipping twice.
//! match store.claim(&request).await? {
//!     ClaimOutcome::Completed(record) => assert_eq!(record.result.as_deref(), Some(&b"shipped"[..])),
//!     other => panic!("expected the stored result, got {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Bounds
//! [`MemoryStoreBuilder::capacity`] caps the number of records. When the store is full, a new
//! claim first reclaims expired records (when a sweep of its shard is due), then evicts settled
//! records (completed or failed), oldest first within a shard, in the order they settled: O(1)
//! per claim, however large the capacity. An in-flight record is never evicted, not even one whose lease
//! lapsed (its holder may still complete it; it expires one lease after its lease ends), and
//! neither is an unknown record ([`idem_core::State::Unknown`]: evicting it would let a retry
//! run an operation that may have happened; it goes when it is resolved or expires): a store
//! full of in-flight and unknown records answers [`StoreError::Capacity`], a retryable error.
//! Evicting a settled record means a late retry of that key runs again: size the capacity for
//! the retention you need.
//!
//! [`MemoryStoreBuilder::max_bytes`] caps the bytes the records hold (each record's key, result,
//! failure message and unknown outcome's reason, plus a fixed overhead), so large results cannot outgrow the machine's
//! memory before a record count is reached. Each shard keeps to its share of the budget: a
//! write that would take its shard over it first evicts the shard's settled records, oldest
//! first, and never an in-flight or unknown one; a result larger than the share is refused with
//! [`StoreError::TooLarge`] (the HTTP layer then keeps the status and headers without the
//! body), and a write that only evicting in-flight records could make room for is refused
//! with [`StoreError::Capacity`].
//!
//! Every eviction is counted: [`MemoryStore::evicted`], and the [`EVICTIONS`] counter of the
//! `metrics` facade (labelled by the bound that evicted), since an evicted key's retry runs
//! again.
//!
//! # Expiry
//! Expired records are treated as absent at once, and reclaimed by an incremental sweep: each
//! shard sweeps itself after as many writes as it holds records (amortised O(1) per write), so
//! memory follows the live set. [`MemoryStore::purge_expired`] sweeps everything now.

mod hashed;
mod shard;
mod store;

pub use store::{EVICTION_BOUNDS, EVICTIONS, MemoryStore, MemoryStoreBuilder};

#[doc(no_inline)]
pub use idem_core::StoreError;
