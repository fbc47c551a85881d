//! Job guard for queue consumers and webhook receivers, on idem.
//!
//! Queues deliver at least once: a worker crashes after the side effect and before the ack, a
//! publisher resends after a timeout, two workers get the same message. A [`JobGuard`] makes
//! such a consumer take effect once per business key, and tells it what to do with the
//! message.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-core = "0.1"
//! idem-store-memory = "0.1" # or a durable store: idem-store-redb, idem-store-postgres
//! idem-worker = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, IdempotencyKey};
//! use idem_store_memory::MemoryStore;
//! use idem_worker::{Disposition, JobError, JobGuard, JobOutcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
//!     .job_type("send_invoice")
//!     .build()?;
//!
//! // The message: its business key and its payload.
//! let key = IdempotencyKey::new("invoice:42:send")?;
//! let payload = br#"{"invoice":42}"#;
//! let fingerprint = Fingerprint::of(&[payload]);
//!
//! let run = guard
//!     .run(&key, fingerprint, |ctx| async move {
//!         // The side effect; pass ctx.key() downstream as its idempotency key.
//!         let receipt: String = format!("sent {} with fence {}", ctx.key(), ctx.fence());
//!         Ok::<_, JobError>(receipt)
//!     })
//!     .await;
//! assert!(matches!(run.outcome, JobOutcome::Executed(_)));
//! assert_eq!(run.disposition, Disposition::Ack);
//!
//! // The same message again (a redelivery): the job does not run, the result is replayed.
//! let again = guard
//!     .run(&key, fingerprint, |_ctx| async { Err::<String, _>(JobError::permanent("never runs")) })
//!     .await;
//! assert!(matches!(again.outcome, JobOutcome::Replayed(ref receipt) if receipt.starts_with("sent")));
//! assert_eq!(again.disposition, Disposition::Ack);
//! # Ok(())
//! # }
//! ```
//!
//! # What happens
//! [`JobGuard::run`] claims the key in the store (one round trip), then:
//!
//! | the store has | outcome | disposition |
//! |---|---|---|
//! | nothing (or a lapsed claim) | the job runs: see below | |
//! | a completed record | [`JobOutcome::Replayed`] with its result | [`Disposition::Ack`] |
//! | a live claim | [`JobOutcome::InFlight`] | [`Disposition::Retry`] with backoff, at most until the holder's lease lapses |
//! | another fingerprint | [`JobOutcome::Mismatch`] | [`Disposition::DeadLetter`] |
//! | a permanent failure | [`JobOutcome::Failed`] | [`Disposition::DeadLetter`] |
//! | an unknown outcome (an earlier attempt lost the answer of its effect) | [`JobOutcome::Unknown`] | [`Disposition::DeadLetter`]: the job does not run again until the record is resolved |
//! | an error a retry may cure (unreachable, timed out) | [`JobOutcome::Error`] | retry with backoff, dead-letter once the attempts are spent |
//! | an error no retry cures (a corrupt record) | [`JobOutcome::Error`] | [`Disposition::DeadLetter`] |
//! | a result that does not decode into `T` ([`RunError::Decode`]) | [`JobOutcome::Error`] | [`Disposition::DeadLetter`]: the job ran before, it does not run again |
//!
//! A claim whose answer times out may have been granted all the same; the guard sends it once
//! more with the same owner token, and the store answers that grant (the job runs) or grants
//! it now. Only a second timeout is answered as an error.
//!
//! While the job runs, a heartbeat extends the lease every [`JobGuard::heartbeat_interval`]
//! (default: a third of the lease). When a heartbeat is refused (another attempt took the key
//! over), the job's [`JobContext::cancellation`] token fires; a result it returns anyway is
//! refused by the store and reported as [`RunError::LeaseLost`], never recorded. A claim whose
//! lease is lost before its job starts (see [`JobGuard::admit`]) does not run the job.
//!
//! | the job returns | the key | outcome | disposition |
//! |---|---|---|---|
//! | `Ok(result)` | completed with the result (serde_json) | [`JobOutcome::Executed`] | ack |
//! | [`JobError::transient`] | released | [`RunError::Transient`] | retry with backoff |
//! | [`JobError::permanent`] | failed, kept | [`JobOutcome::Failed`] | dead-letter |
//! | [`JobError::unknown`] | recorded as unknown | [`RunError::UnknownOutcome`] | dead-letter |
//! | a panic | released | [`RunError::Panicked`] | retry with backoff |
//! | `Ok(result)` that does not encode | failed, kept | [`RunError::Encode`] | dead-letter |
//! | `Ok(result)` over the store's size limit | failed, kept | [`JobOutcome::Failed`] | dead-letter |
//!
//! # Unknown outcomes
//! A job that sent its side effect and lost the answer (a provider call that timed out)
//! returns [`JobError::unknown`]: nobody knows whether the effect happened, so running the job
//! again could take effect twice. The guard records the key as unknown
//! ([`idem_core::State::Unknown`]) and dead-letters the message; every later delivery is
//! answered [`JobOutcome::Unknown`] (dead-letter too) and the job does not run. The message is
//! set aside rather than acknowledged so that nothing is lost: an operator (or a reconciler)
//! finds out what happened, resolves the record with [`JobGuard::resolve_completed`] (the
//! effect happened: later deliveries are replayed with that result) or
//! [`JobGuard::resolve_released`] (it did not: the next delivery runs), then redelivers the
//! dead-lettered message. With [`JobGuardBuilder::unknown_hold`], a delivery after the hold
//! takes the key over and runs the job again without a resolution. If the store cannot record
//! the unknown outcome, the run ends with [`RunError::Store`] and the claim lapses with its
//! lease (a retry after it runs the job again).
//!
//! Retries are bounded by the [`RetryPolicy`]: past its attempts, the disposition is
//! dead-letter. A dropped run future releases the key from a spawned task and records
//! nothing.
//!
//! A receiver that must answer before the job runs (a webhook receiver) splits the run in two:
//! [`JobGuard::admit`] claims and starts the heartbeat, [`JobClaim::run`] runs the job later.
//!
//! # Observability
//! Metrics go through the `metrics` facade with a `job_type` label: see [`metrics`]. Every
//! run has a `tracing` span `idem_job` with the fields `idempotency_key` (a digest with
//! [`JobGuardBuilder::redact_keys`]), `job_type`, `worker_id`, `attempt` (the delivery),
//! `fence`, `lease_attempt`, `state_before`, `state_after`, `outcome` and `disposition`.

mod builder;
mod claim;
mod context;
mod error;
mod guard;
pub mod metrics;
mod outcome;
mod retry;
mod unwind;

pub use builder::{GuardConfigError, JobGuardBuilder};
pub use claim::JobClaim;
pub use context::JobContext;
pub use error::{ErrorClass, JobError, ResultExt};
pub use guard::{Admission, JobGuard};
pub use outcome::{JobOutcome, Run, RunError};
pub use retry::{Disposition, RetryPolicy, RetryPolicyError};
pub use unwind::catch_unwind;

#[doc(no_inline)]
pub use idem_core::{Fingerprint, IdempotencyKey, Store};
#[doc(no_inline)]
pub use tokio_util::sync::CancellationToken;
