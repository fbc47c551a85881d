//! The PostgreSQL store of idem: records that survive, can be audited with SQL, and can commit
//! together with the business write.
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
//! cache, and re-exports the driver: [`tokio_postgres`] here is the driver the store uses, so
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
//! # One statement per transition
//!
//! Each transition is ONE statement and one round trip, and applies the state machine of
//! [`idem_core::machine`]. The claim is an `INSERT ... ON CONFLICT DO NOTHING RETURNING` (a new
//! key), an `UPDATE ... WHERE` that takes over an expired record or a lapsed lease with the same
//! fingerprint, and a read of the record when neither wrote, all in one statement: a duplicate
//! is answered without a write (and without a WAL flush). Only when a concurrent claim created
//! or took over the record after the statement's snapshot does the claim run the statement
//! again. The holder's transitions (heartbeat, complete, fail, release) update the row only
//! `WHERE` owner, fence, state and lease allow it, and return the row as the statement's
//! snapshot saw it. When a statement wrote, the database checked on the latest row exactly
//! what the state machine checks; when it did not, the Rust side runs the pure state machine on
//! the row returned to answer (in flight, completed, mismatch, the exact rejection), and runs
//! the statement again in the one case where that row is older than the one the database saw
//! (a concurrent transition of the same key).
//!
//! Time is the server's `clock_timestamp()`, never the client's. A record whose `expires_at`
//! has passed counts as absent. Release, retryable failures and [`Store::delete`] do not
//! delete the row: they expire it at once (a delete also clears its owner, so its holder is
//! refused), and the next grant reads `max(previous + 1, now in µs)` under the row's lock. Only
//! [`PostgresStore::sweep`] (`idem store sweep`) deletes rows, a minute after they expired
//! (and a delete, a row that breaks the record invariants), and they raise a fence floor
//! (`<schema>.idem_fence_floor`) that every new row's fence starts above, so fences keep
//! rising after a sweep even if the server's clock steps back.
//!
//! # In the caller's transaction
//!
//! [`PostgresStore::claim_in`], [`PostgresStore::complete_in`], [`PostgresStore::fail_in`]
//! and [`PostgresStore::release_in`] run the same statements in a transaction of yours: a
//! business write made in it and the completion commit together or not at all, which closes
//! the window where the side effect is done but the record is not (a crash between the two).
//! While that transaction is open, other claims of the key wait for it (row lock) instead of
//! answering "in flight".
//!
//! # Errors
//!
//! A refused or lost connection is [`StoreError::Unavailable`]; an operation over its timeout
//! (pool wait plus statement, [`PostgresConfig::with_op_timeout`]) is [`StoreError::Timeout`];
//! a row that cannot be decoded or breaks the record invariants is [`StoreError::Corrupt`];
//! serialization failures and deadlocks are retryable [`StoreError::Backend`] errors. The
//! store never panics on what the database returns.
//!
//! # Tests
//!
//! [`PostgresStore::advance_clock`] moves the store's clock by an offset added to
//! `clock_timestamp()`, so lease and retention tests run without sleeping.
//!
//! [`StoreError::Unavailable`]: idem_core::StoreError::Unavailable
//! [`StoreError::Timeout`]: idem_core::StoreError::Timeout
//! [`StoreError::Corrupt`]: idem_core::StoreError::Corrupt
//! [`StoreError::Backend`]: idem_core::StoreError::Backend
//! [`Store::delete`]: idem_core::Store::delete

mod config;
mod error;
mod primitives;
mod row;
mod schema;
mod store;
mod transaction;

pub use config::{ConfigError, PostgresConfig};
pub use schema::MigrationReport;
pub use store::{PostgresStore, migrate};

/// The pool crate the store uses, re-exported so callers name the same types.
pub use deadpool_postgres;
/// The driver the store uses, re-exported so callers name the same `Transaction` type.
pub use deadpool_postgres::tokio_postgres;
