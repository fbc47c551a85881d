//! The lease keeper and the metered store that idem's HTTP layer
//! ([idem-http](https://docs.rs/idem-http)) and job guard
//! ([idem-worker](https://docs.rs/idem-worker)) share, so that both behave the same on a store
//! error and report into the same series with the same labels.
//!
//! - [`LeaseKeeper`] holds one lease while its work runs: it heartbeats, sends a settle again
//!   while the store answers a retryable error, and releases a claim dropped unsettled. **A
//!   lease that could not be extended before it ends is lost**: a refused heartbeat loses it at
//!   once; a heartbeat that fails with a retryable error (the store is down or slow) is tried
//!   again until the lease ends, and if none succeeded by then the lease is lost. A loss counts
//!   once in `idem_lease_losses_total`, fires [`LeaseKeeper::lost`] and stops the heartbeat.
//! - [`BeatTimer`] wakes many holders shortly before their first heartbeat, from one task, so
//!   that work which ends before its first beat (most of it) arms no timer of its own.
//! - [`Metered`] wraps a [`Store`](idem_core::Store) and times every operation into
//!   `idem_store_operation_seconds{store, op}` and counts its errors into
//!   `idem_store_errors_total{store, op, kind}`; [`describe`] gives their help texts.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
//! use idem_lease::{KeeperConfig, LeaseKeeper, Metered};
//! use idem_store_memory::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Every operation of this store is timed under `store="memory"`.
//! let store: Arc<dyn Store> = Arc::new(Metered::new(MemoryStore::new(), "memory"));
//! let config = Arc::new(KeeperConfig::new(Duration::from_secs(30), Duration::from_secs(10)));
//! let key = RecordKey::unscoped(IdempotencyKey::new("order-1")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"body"]), config.lease());
//! let sent = tokio::time::Instant::now();
//! let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else {
//!     unreachable!("a fresh key is free");
//! };
//! let keeper = LeaseKeeper::new(store.clone(), config, lease, sent);
//! // Dropped unsettled (the work panicked, say), the keeper releases the claim.
//! drop(keeper);
//! for _ in 0..10 {
//!     tokio::task::yield_now().await;
//! }
//! let again = store.claim(&request).await?;
//! assert!(matches!(again, ClaimOutcome::Acquired { .. }), "{again:?}");
//! # Ok(())
//! # }
//! ```

mod bound;
mod keeper;
mod metered;
mod timer;

pub use bound::{BoundCounter, BoundHistogram};
pub use keeper::{KeeperConfig, LeaseKeeper, saturating_deadline};
pub use metered::{Metered, StoreOp, describe, register_at_zero};
pub use timer::{BeatTimer, Due};

/// The README's code blocks, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
