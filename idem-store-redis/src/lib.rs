//! The Redis store of idem, for a single Redis node and for Redis Cluster: every transition of
//! the record state machine is one Lua script, run atomically by the server in one round trip.
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
//! One HASH per record at `idem:{<namespace>:<scope>:<digest>}`: the scope percent-escaped,
//! the key as 84 bits of its SHA-256 in 14 base64url characters (raw client input is never part
//! of a Redis key). The braces are a Cluster hash tag around the whole identity: a record lives
//! on one node, and every script touches one slot (no `CROSSSLOT`). The fields are one letter
//! each: `m` the meta (state, result codec, attempt, fence, and created, lease-end and expiry
//! times in microseconds, then the 16-byte owner token, then a settled record's completion
//! time, packed big-endian: 50 bytes in flight, 57 settled), `p` the fingerprint (32 bytes),
//! `k`/`g` the key and scope as given, `e` a failure message; the result is cut into pieces of
//! at most 63 bytes (fields `0`, `1`, ...) while it is at most 2 KiB, so a small record keeps
//! Redis's compact listpack encoding. A settled record keeps the owner and the lease of the
//! attempt that settled it: `get` answers what [`idem_core::machine`] leaves, as every store
//! does. Results over the compression threshold (1 KiB by default) are lz4-compressed when that
//! makes them smaller, and flagged in the meta.
//!
//! # Scripts and time
//! Claim, heartbeat, complete, fail and release are one `EVALSHA` each (the scripts are loaded
//! at connect and reloaded on `NOSCRIPT`); `get` and `delete` are scripts too, so they judge
//! expiry on the server's clock. Inside Redis a claim or a completion runs four commands
//! (`TIME`, one read, one `HSET`, one `PEXPIRE`). Every script reads the time with `TIME` on
//! the server, never from the client, and implements exactly the transitions of
//! [`idem_core::machine`]: a fingerprint mismatch first, a lapsed lease taken over with a higher
//! fence, the owner and fence checked on every holder's step, a re-sent complete answered `Ok`, a
//! retryable failure freeing the key, a permanent one kept. Every script is safe to re-send
//! (the Cluster client retries after a dropped connection): the same owner and fence get the
//! same answer, and a re-sent claim whose first copy was applied gets the same grant back.
//!
//! Fences are `max(previous + 1, server time in microseconds)`. A key whose record is released,
//! failed with a retryable failure, deleted or expired keeps a tombstone with its last fence for
//! the *fence memory* (60 s by default), so a new grant's fence is higher even when the server
//! clock has not moved between the two scripts or stepped back.
//!
//! Retention is the key's TTL: a record's key expires one fence memory after the record does.
//!
//! # Scans
//! [`Store::scan`] walks `SCAN` over the namespace (every primary of a Cluster in turn) and
//! reads each batch's records in one pipeline. A page that ends in the middle of a batch carries
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
//! script is safe to re-send (a claim carries its owner, so a re-sent claim is answered the
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

pub use config::{ClockOffset, ConfigError, RedisConfig};
pub use store::RedisStore;

#[doc(no_inline)]
pub use idem_core::{Store, StoreError};

/// The README's code blocks, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
