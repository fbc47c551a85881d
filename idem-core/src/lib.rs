//! The contract of idem: idempotency keys, fingerprints, records, the state machine and the
//! [`Store`] trait that every backend implements.
//!
//! Delivery is at least once: clients retry, queues redeliver, webhook senders resend. An
//! operation with a side effect therefore carries an [`IdempotencyKey`] naming the business
//! operation, and a store records per key whether it is in flight, done (with its result) or
//! failed, so exactly one attempt runs the side effect and every other gets the recorded answer.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! bytes = "1"
//! ```
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use idem_core::machine::{self, LeasePolicy, Write};
//! use idem_core::{ClaimOutcome, ClaimRequest, Fence, Fingerprint, IdempotencyKey, OwnerToken,
//!                 RecordKey, Timestamp};
//!
//! // The decision logic is pure: a store applies these steps atomically.
//! let key = RecordKey::unscoped(IdempotencyKey::new("payment:42:capture")?);
//! let request = ClaimRequest::new(key, Fingerprint::of(&[b"amount=10"]), Duration::from_secs(30));
//! let now = Timestamp::from_micros(1_000_000);
//!
//! let step = machine::claim(None, &request, now, Fence::MIN, OwnerToken::random())?;
//! let ClaimOutcome::Acquired { lease, .. } = step.answer else { unreachable!() };
//! let Write::Put(record) = step.write else { unreachable!() };
//!
//! // A duplicate while the first attempt runs is told to come back later.
//! let dup = machine::claim(Some(&record), &request, now, Fence::MIN, OwnerToken::random())?;
//! assert!(matches!(dup.answer, ClaimOutcome::InFlight { .. }));
//!
//! // The holder completes; a retry is answered with the stored result.
//! let done = machine::complete(Some(&record), &lease, Bytes::from("charged"), Duration::from_secs(86_400), now, LeasePolicy::Lenient)?;
//! let Write::Put(record) = done.write else { unreachable!() };
//! let retry = machine::claim(Some(&record), &request, now, Fence::MIN, OwnerToken::random())?;
//! assert!(matches!(retry.answer, ClaimOutcome::Completed(r) if r.result.as_deref() == Some(&b"charged"[..])));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The pieces:
//! - [`IdempotencyKey`], [`Scope`], [`RecordKey`]: where a record lives;
//! - [`Fingerprint`]: the identity of a request, to catch a reused key with another payload;
//! - [`Record`] and [`State`]: what a store keeps; [`UnknownOutcome`]: what a record whose
//!   outcome was lost keeps ([`State::Unknown`]);
//! - [`machine`]: the transitions, as pure functions;
//! - [`Store`], [`StoreError`]: the contract of every backend;
//! - [`atomic::Primitives`] and [`Driven`]: the atomic operations of a remote store, and the one
//!   driver that makes them a [`Store`] by calling the machine;
//! - [`ClockEstimate`]: a remote store's clock, estimated with a bounded error;
//! - [`OwnerToken`], [`Fence`], [`Lease`]: the identity of one attempt;
//! - [`Clock`], [`SystemClock`], [`ManualClock`]: store time, injectable for tests;
//! - [`Deferred`]: a store whose server was down at start, connected on first use.

pub mod atomic;
pub mod codec;
mod deferred;
mod driver;
mod error;
mod estimate;
mod fingerprint;
mod key;
pub mod machine;
pub mod metrics;
mod record;
mod store;
mod time;
mod token;

pub use deferred::Deferred;
pub use driver::Driven;
pub use error::{BoxError, RedactedError, StoreError, TransitionRejection};
pub use estimate::ClockEstimate;
pub use fingerprint::{Fingerprint, FingerprintBuilder, ParseFingerprintError};
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN, RecordKey, Scope};
pub use record::{Failure, ParseStateError, Record, State, UnknownOutcome};
pub use store::{
    ClaimOutcome, ClaimRequest, Lease, ScanEntry, ScanPage, ScanQuery, Store, StoreStats,
    UnreadableRecord,
};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use token::{Fence, OwnerToken, ParseOwnerTokenError};

/// Re-exported so stores and users name the same `Bytes`.
pub use bytes::Bytes;
