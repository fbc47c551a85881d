//! The PostgreSQL store of idem: records that survive, can be audited with SQL, and can commit
//! together with the business write.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-postgres = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
//! use idem_store_postgres::{PostgresConfig, PostgresStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = PostgresConfig::new("postgres://postgres@127.0.0.1:5432/test")?;
//! let store = PostgresStore::connect(config).await?; // applies the migrations
//!
//! let key = RecordKey::unscoped(IdempotencyKey::new("payment:42:capture")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"amount=10"]), Duration::from_secs(30));
//!
//! // The side effect and its completion in ONE transaction: both commit, or neither does.
//! let mut client = store.pool().get().await?;
//! let tx = client.transaction().await?;
//! if let ClaimOutcome::Acquired { lease, .. } = store.claim_in(&tx, &request).await? {
//!     tx.execute("INSERT INTO payments (order_id, amount) VALUES (42, 10)", &[]).await?;
//!     store.complete_in(&tx, &lease, Bytes::from("captured"), Duration::from_secs(86_400)).await?;
//! }
//! tx.commit().await?;
//!
//! // Outside a transaction it is an ordinary `Store`: a retry is answered from the record.
//! assert!(matches!(store.claim(&request).await?, ClaimOutcome::Completed(_)));
//! # Ok(())
//! # }
//! ```
//!
//! # Why tokio-postgres and deadpool-postgres
//!
//! The store needs a handful of hand-written statements, prepared once per connection, and a
//! way to run them inside the caller's transaction. tokio-postgres does exactly that with a
//! small dependency tree, no macros and no database at compile time (sqlx's checked queries
//! need a live database or offline data at build time, and sqlx 0.9 a newer Rust).
//! deadpool-postgres adds a pool with wait/create timeouts and a per-connection statement
//! cache, and re-exports the driver: [`tokio_postgres`][tokio-postgres] here is the driver the store uses, so
//! callers name the same `Transaction` type. Connections are plain TCP (`NoTls`); put TLS in
//! front (a local socket, a sidecar) or open an issue if you need it in the store.
//!
//! # The table
//!
//! One table, `<schema>.idem_records` (schema `idem` by default, [`PostgresConfig::with_schema`]),
//! keyed by `(scope, key)`, with indexes for scans by state and age (`state, created_at`) and
//! for the sweep (`expires_at`). The embedded migrations keep their own bookkeeping table
//! (`<schema>.idem_migrations`) and run in one transaction under `pg_advisory_xact_lock`, so
//! instances starting together apply each migration once: [`migrate`] (`idem store migrate`).
//! A schema already up to date is only read (no lock, no DDL), so a role that may only use
//! the records connects with migrations on.
//!
//! # Primitives, and one decision point
//!
//! The store offers idem-core's atomic primitives ([`idem_core::atomic::Primitives`]), each
//! ONE statement on one row, and [`idem_core::Driven`] runs the state machine on them: the
//! statements compare a version and write what the machine decided, and none names a state or
//! computes an expiry or a fence. Create-if-absent is an `INSERT ... ON CONFLICT DO NOTHING`
//! that answers the row its statement saw, so a claim is one round trip (a replay, a conflict
//! and a mismatch are answered from that row without a write, and without a WAL flush); a
//! takeover adds an `UPDATE ... WHERE version = $v`. Heartbeat, complete, fail and release are
//! one such compare-and-set against the version the lease carries, without a read first. A
//! compare-and-set that loses answers the row its snapshot saw, and the machine decides again
//! from it; a create that found the key taken by a claim committed after its snapshot reads it
//! once more. Every row carries a `version` raised by each write (migration 2), and a row that
//! breaks the record invariants is never written over.
//!
//! Time is the server's `clock_timestamp()`, estimated as the local clock plus an offset
//! measured before the first operation and every 30 s ([`idem_core::ClockEstimate`]: half the
//! measurement's round trip plus 5 ms, a bound a takeover waits out). A record whose
//! `expires_at` has passed counts as absent. Release, retryable failures and
//! [`Store::delete`] do not delete the row: they expire it (as of two bounds back, so every
//! handle reads the key as free at once), and the next grant reads `max(previous + 1, now in
//! µs)` from it. Only [`PostgresStore::sweep`] (`idem store sweep`) deletes rows, a minute after
//! they expired (and a delete, a row that breaks the record invariants), and they raise a fence
//! floor (`<schema>.idem_fence_floor`) that a new row's fence must be above, so fences keep
//! rising after a sweep even if the server's clock steps back.
//!
//! # In the caller's transaction
//!
//! [`PostgresStore::claim_in`], [`PostgresStore::complete_in`], [`PostgresStore::fail_in`]
//! and [`PostgresStore::release_in`] run the same driver and statements in a transaction of
//! yours: a
//! business write made in it and the completion commit together or not at all, which closes
//! the window where the side effect is done but the record is not (a crash between the two).
//! While that transaction is open, other claims of the key wait for it (row lock) instead of
//! answering "in flight".
//!
//! # Errors
//!
//! Credentials the server refuses (SQLSTATE 28P01 or 28000), or a password it asks for that
//! the URL does not have, are a permanent [`StoreError::Backend`] error whose source is a
//! [`CredentialsRefused`], whenever they happen (at connect, or on a new connection of the
//! pool later): no retry helps. A refused or lost connection is [`StoreError::Unavailable`]; an operation over its timeout
//! (pool wait plus statement, [`PostgresConfig::with_op_timeout`]) is [`StoreError::Timeout`];
//! a row that cannot be decoded or breaks the record invariants is [`StoreError::Corrupt`];
//! serialization failures and deadlocks are retryable [`StoreError::Backend`] errors. The
//! store never panics on what the database returns.
//!
//! # Tests
//!
//! [`PostgresStore::advance_clock`] moves the store's clock by an offset added to its estimate
//! of `clock_timestamp()`, so lease and retention tests run without sleeping.
//! [`PostgresStore::round_trips`] counts the statements the primitives sent.
//!
//! [`StoreError::Unavailable`]: idem_core::StoreError::Unavailable
//! [`StoreError::Timeout`]: idem_core::StoreError::Timeout
//! [`StoreError::Corrupt`]: idem_core::StoreError::Corrupt
//! [`StoreError::Backend`]: idem_core::StoreError::Backend
//! [`Store::delete`]: idem_core::Store::delete
//! [tokio-postgres]: https://docs.rs/tokio-postgres/0.7/tokio_postgres/

mod config;
mod error;
mod primitives;
mod row;
mod schema;
mod store;
mod transaction;

pub use config::{PostgresConfig, PostgresConfigError};
pub use error::CredentialsRefused;
pub use schema::MigrationReport;
pub use store::{PostgresStore, migrate};

/// The pool crate the store uses, re-exported so callers name the same types.
pub use deadpool_postgres;
/// The driver the store uses, re-exported so callers name the same `Transaction` type.
pub use deadpool_postgres::tokio_postgres;
