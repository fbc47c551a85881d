//! The Redis store of idem, for a single Redis node and for Redis Cluster: Redis offers atomic
//! primitives, one plain command each, and idem-core's state machine decides every transition
//! ([`idem_core::Driven`] on [`idem_core::atomic::Primitives`]).
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-redis = "0.1" # features = ["tls"] for rediss:// URLs
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
//! use idem_store_redis::{RedisConfig, RedisStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RedisConfig::new("redis://127.0.0.1:6379")?.with_namespace("shop")?;
//! let store = RedisStore::connect(config).await?;
//!
//! let key = RecordKey::unscoped(IdempotencyKey::new("order:7:ship")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"order 7"]), Duration::from_secs(30));
//!
//! // The first attempt gets the key and records its result...
//! if let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? {
//!     store.complete(&lease, Bytes::from("shipped"), Duration::from_secs(86_400)).await?;
//! }
//! // ...and every retry, from any process, gets that result instead of shipping twice.
//! match store.claim(&request).await? {
//!     ClaimOutcome::Completed(record) => assert_eq!(record.result.as_deref(), Some(&b"shipped"[..])),
//!     other => panic!("expected the stored result, got {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! One STRING per record at `idem:{<namespace>:<scope>:<digest>}`: the scope percent-escaped,
//! the key as 84 bits of its SHA-256 in 14 base64url characters (raw client input is never part
//! of a Redis key). The braces are a Cluster hash tag around the whole identity: a record lives
//! on one node, and every command touches one slot (no `CROSSSLOT`). The value (see the
//! README's "Record layout") is a layout version byte, then a tombstone (the last fence) or a
//! record: its key, and idem-core's binary record format ([`idem_core::codec`]), its result as
//! it is, or lz4-compressed over the compression threshold when one is set (none by default:
//! idem-http compresses response bodies itself) and that makes it smaller.
//!
//! # Commands and time
//! A claim is one `SET key value NX GET PX ttl`: it creates the in-flight record on an absent
//! key, or hands back what is there (a replay, a conflict, a mismatch: answered from it). A
//! takeover (of a lapsed lease, an expired record still present, a tombstone) adds one
//! compare-and-set. Heartbeat, complete, fail and release are one compare-and-set each, against
//! the version the lease carries ([`idem_core::atomic::Held`]), without a read first; `get` is
//! one `GET`. Compare-and-set is a five-line script (compare the whole value, then `SET ...
//! PX`) or, on a server that has it (Redis 8.4, Valkey 8.1), `SET ... IFEQ`; it names no state
//! and computes no expiry or fence, and a lost one is decided again from the value that won.
//! Every command is safe to re-send.
//!
//! Store time is the server's `TIME`, estimated as the local clock plus an offset measured at
//! connect and every 30 s ([`idem_core::ClockEstimate`], whose error bound a claim waits out
//! before it takes over a lapsed lease), so every handle of a key decides on one clock.
//!
//! Fences are `max(previous + 1, store time in microseconds)`. A key whose record is released,
//! failed with a retryable failure or deleted keeps a tombstone with its last fence for the
//! *fence memory* (60 s by default), and a record's key expires one fence memory after the
//! record does, so a new grant's fence is higher even when the clock has not moved.
//!
//! # Scans
//! [`Store::scan`] walks `SCAN` over the namespace (every primary of a Cluster in turn) and
//! reads each batch's records in one pipeline of `GET`s. A page that ends in the middle of a batch carries
//! the rest of it in its cursor, so no `SCAN` cursor is sent twice: a record present for the
//! whole scan is returned, and only once unless `SCAN` itself repeats it (which Redis allows
//! when the keyspace shrinks while you page).
//!
//! # Errors and reconnects
//! Every operation is bounded by the command timeout ([`StoreError::Timeout`]); a refused or
//! lost connection is [`StoreError::Unavailable`]. The store reconnects by itself: the same
//! value works again once the server is back. An operation that finds its connection already
//! dead (the server restarted since the last operation) reconnects and is sent once more,
//! within the same command timeout, so the first operations after a restart succeed; every
//! command is safe to re-send (a claim carries its owner, so a re-sent claim is answered the
//! same grant). On a Cluster the same holds after the whole Cluster restarted (the client's own
//! retries are spent on the other nodes' dead connections) and after one node restarted; `ping`
//! and the reads of a scan are re-sent too. Nothing is re-sent after a timeout, a refused
//! connection, or an error the server answered. A record that cannot be decoded, or breaks the
//! record invariants, is [`StoreError::Corrupt`] (never a panic); [`Store::delete`] removes it.
//!
//! # Deployment
//! - Redis must not evict these keys: run it with `maxmemory-policy noeviction` (or give idem
//!   an instance of its own). Every record has a TTL, so a `volatile-*` policy would drop
//!   in-flight and completed records under memory pressure, and their retries would run again.
//! - What Redis loses in a crash or a failover (without AOF, the writes since the last
//!   snapshot; with `appendfsync everysec`, up to a second; on a Cluster failover, the writes
//!   not yet replicated) are records, and their retries run again. Where that is not
//!   acceptable, use AOF with `appendfsync always`, or a PostgreSQL or redb store.
//!
//! # Features
//! - `tls`: `rediss://` URLs (rustls with the ring provider and the system's roots).

mod clock;
mod codec;
mod config;
mod conn;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod layout;
mod primitives;
mod scan;
mod scripts;
mod store;

pub use config::{ClockOffset, RedisConfig, RedisConfigError};
pub use store::RedisStore;

#[doc(no_inline)]
pub use idem_core::{Store, StoreError};

/// The README's code blocks, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
