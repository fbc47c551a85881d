//! idem: an idempotency engine. Delivery is at least once (clients retry, queues redeliver,
//! webhook senders resend), so an operation with a side effect carries an idempotency key that
//! names the business operation, and a store records per key whether it is in flight, done (with
//! its result) or failed: exactly one attempt runs the side effect, every other attempt gets the
//! recorded answer.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem = "0.1" # the memory store; features = ["redis", "http", ...] add the rest
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
#![cfg_attr(feature = "memory", doc = "```")]
#![cfg_attr(not(feature = "memory"), doc = "```ignore")]
//! use std::time::Duration;
//! use idem::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, MemoryStore,
//!            RecordKey, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let key = RecordKey::unscoped(IdempotencyKey::new("payment:42:capture")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"amount=10"]), Duration::from_secs(30));
//!
//! // The first delivery gets the key, runs the side effect and records its result.
//! let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else {
//!     return Err("the first claim of a fresh key is acquired".into());
//! };
//! let receipt = Bytes::from("captured 10");
//! store.complete(&lease, receipt.clone(), Duration::from_secs(24 * 3600)).await?;
//!
//! // A redelivery of the same operation is answered from the record: no second capture.
//! match store.claim(&request).await? {
//!     ClaimOutcome::Completed(record) => assert_eq!(record.result, Some(receipt)),
//!     other => return Err(format!("expected the recorded result, got {other:?}").into()),
//! }
//!
//! // The same key with another payload is refused, and the record is left as it was.
//! let other = ClaimRequest::new(request.key.clone(), Fingerprint::of(&[b"amount=11"]), request.lease);
//! assert_eq!(store.claim(&other).await?, ClaimOutcome::Mismatch);
//! # Ok(())
//! # }
//! ```
//!
//! This crate is a facade: it re-exports the contract of [`idem_core`] (keys, fingerprints,
//! records, the [`machine`] and the [`Store`] trait) and, behind features, the stores and
//! integrations, so an application depends on one crate and compiles only what it uses.
//!
//! | feature | default | what it brings |
//! |---|---|---|
//! | `memory` | yes | [`MemoryStore`], the embedded in-memory store (`idem-store-memory`) |
//! | `redis` | no | `idem::redis`: the Redis store (`idem-store-redis`) |
//! | `postgres` | no | `idem::postgres`: the PostgreSQL store (`idem-store-postgres`) |
//! | `redb` | no | `idem::redb`: the embedded durable store (`idem-store-redb`) |
//! | `http` | no | `idem::http`: the `Idempotency-Key` tower layer (`idem-http`) |
//! | `worker` | no | `idem::worker`: the job guard for queue consumers (`idem-worker`) |
//! | `serde` | no | `Deserialize` for [`StoreSpec`], from a string in a configuration file |
//!
//! [`StoreSpec`] parses the store a URL names (`memory`, `redis://...`, `postgres://...`,
//! `redb:PATH`), and [`OpenOptions`] opens it, among the stores the build has.

pub use idem_core::*;

mod open;
mod spec;
pub use open::{OpenError, OpenOptions, OpenedStore, open, open_or_defer};
pub use spec::{StoreSpec, StoreSpecError};

/// The embedded in-memory store (feature `memory`, on by default).
#[cfg(feature = "memory")]
pub use idem_store_memory::{MemoryStore, MemoryStoreBuilder};

/// The Redis store (feature `redis`).
#[cfg(feature = "redis")]
pub use idem_store_redis as redis;

/// The PostgreSQL store (feature `postgres`).
#[cfg(feature = "postgres")]
pub use idem_store_postgres as postgres;

/// The embedded durable store on redb (feature `redb`).
#[cfg(feature = "redb")]
pub use idem_store_redb as redb;

/// The `Idempotency-Key` HTTP semantics as a tower layer (feature `http`).
#[cfg(feature = "http")]
pub use idem_http as http;

/// The job guard for queue consumers and webhook receivers (feature `worker`).
#[cfg(feature = "worker")]
pub use idem_worker as worker;
