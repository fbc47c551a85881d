//! [`Claim`]: the claim of one request while its handler runs: the heartbeat that keeps its
//! lease, the completion that stores the response, and the release of a claim left unsettled.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use idem_core::{Lease, StoreError, TransitionRejection};
use idem_lease::{Due, LeaseKeeper};
use tokio::time::Instant;

use crate::codec::{self, StoredResponse};
use crate::detach::Work;
use crate::layer::Shared;
use crate::metrics;
use crate::service::log_key;

/// A held claim: keeps its lease by heartbeat while the handler runs, and is released if
/// dropped unsettled (the handler panicked or its task was cancelled). The heartbeat, the
/// retried completion and the release on drop are idem-lease's [`LeaseKeeper`], the same as
/// the job guard's: a lease that could not be extended before it ends (refused, or the store
/// unreachable until then) is lost and counted in `idem_lease_losses_total`; the handler goes
/// on (it is never cancelled, as for a caller that went away), its response goes to the
/// caller, and the store refuses to record it if another attempt took the key over.
pub(crate) struct Claim {
    shared: Arc<Shared>,
    keeper: LeaseKeeper,
    /// The heartbeat, polled alongside the handler ([`Claim::beating`]). A handler that has to
    /// wait registers with the layer's [`BeatTimer`](idem_lease::BeatTimer) until shortly
    /// before its first beat, and only then makes its heartbeat (which keeps a timer of its
    /// own, and beats at the same instants as from the claim on): a handler that answers before
    /// that, as most do, costs no timer and no allocation.
    heartbeat: Beat,
    /// When the key was claimed: how long it was held counts in the layer's recent durations.
    claimed_at: Instant,
}

/// The state of a claim's heartbeat.
enum Beat {
    /// Not started: the handler has not had to wait yet.
    Idle,
    /// The handler waits; the first beat is not due yet.
    Waiting(Due),
    /// Running.
    Running(Work),
    /// Stopped: the lease was lost, or the claim is settled.
    Stopped,
}

impl Claim {
    /// Holds `lease`, granted just now: the lease is counted from here, which overestimates it
    /// by the claim's answer's way back from the store.
    pub(crate) fn new(shared: Arc<Shared>, lease: Lease) -> Self {
        let sent = Instant::now();
        let keeper = LeaseKeeper::new(shared.store.clone(), shared.keeper.clone(), lease, sent);
        Claim {
            shared,
            keeper,
            heartbeat: Beat::Idle,
            claimed_at: sent,
        }
    }

    fn lease(&self) -> &Lease {
        self.keeper.lease()
    }

    /// Runs `future` while the heartbeat keeps the lease.
    pub(crate) async fn beating<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let Claim {
            shared,
            keeper,
            heartbeat: beat,
            claimed_at,
        } = self;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(output) = future.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
            let first = || idem_lease::saturating_deadline(*claimed_at, shared.config.heartbeat);
            if let Beat::Idle = beat {
                // Woken at most one period after this, so before the first beat is due.
                let wake = first()
                    .checked_sub(shared.beats.period())
                    .unwrap_or(*claimed_at);
                *beat = Beat::Waiting(shared.beats.register(wake, cx));
            }
            if let Beat::Waiting(due) = beat {
                if due.poll_due(cx).is_pending() {
                    return Poll::Pending;
                }
                *beat = Beat::Running(Box::pin(keeper.heartbeat_at(first())));
            }
            if let Beat::Running(running) = beat {
                if running.as_mut().poll(cx).is_ready() {
                    // The lease was lost; the handler goes on, its completion will be refused.
                    *beat = Beat::Stopped;
                }
            }
            Poll::Pending
        })
        .await
    }

    pub(crate) fn settle(&mut self) {
        if !self.keeper.is_settled() {
            self.shared.durations.record(self.claimed_at.elapsed());
        }
        self.heartbeat = Beat::Stopped;
        self.keeper.disarm();
    }

    /// Gives the key back so a retry runs the handler again.
    pub(crate) async fn release(&mut self, kind: &'static str) {
        // Boxed, as is [`Claim::retry_complete`]: a path off the common one keeps its state
        // out of the futures of every request, which are moved around whole.
        Box::pin(self.release_boxed(kind)).await;
    }

    async fn release_boxed(&mut self, kind: &'static str) {
        self.settle();
        metrics::failure(kind);
        let config = &self.shared.config;
        let store = &self.shared.store;
        let lease = self.keeper.lease().clone();
        let released = self.keeper.settle_with(1, || store.release(&lease)).await;
        tracing::debug!(
            idempotency_key = %log_key(config, &lease.key),
            fence = lease.fence.get(),
            reason = kind,
            state_after = "absent",
            "idempotency claim released"
        );
        match released {
            Ok(()) => {}
            // Another attempt holds the key, or the record is settled: nothing of this claim's
            // is left to release.
            Err(error @ StoreError::Rejected(_)) => tracing::warn!(
                idempotency_key = %log_key(config, &lease.key),
                error = %error.redacted(!config.log_keys),
                "the claim was no longer held when it was released: nothing was released"
            ),
            Err(error) => tracing::warn!(
                idempotency_key = %log_key(config, &lease.key),
                error = %error.redacted(!config.log_keys),
                "releasing the claim failed: the key stays blocked until its lease ends"
            ),
        }
    }

    /// Settles the record as unknown (the effect may have happened and its answer was lost),
    /// held for the configured [`crate::ConfigBuilder::unknown_hold`]. A store that refuses or
    /// fails leaves the claim to lapse with its lease (logged): the one way back to a re-run.
    pub(crate) async fn settle_unknown(&mut self, outcome: idem_core::UnknownOutcome) {
        Box::pin(self.settle_unknown_boxed(outcome)).await;
    }

    async fn settle_unknown_boxed(&mut self, outcome: idem_core::UnknownOutcome) {
        self.settle();
        metrics::failure("unknown");
        let config = &self.shared.config;
        let store = &self.shared.store;
        let lease = self.keeper.lease().clone();
        let (hold, retention) = (config.unknown_hold, config.retention);
        tracing::warn!(
            idempotency_key = %log_key(config, &lease.key),
            fence = lease.fence.get(),
            reason = %outcome.reason,
            "the outcome of a request is unknown: its key is held, never run again until resolved"
        );
        let settled = self
            .keeper
            .settle_with(3, || {
                store.settle_unknown(&lease, outcome.clone(), hold, retention)
            })
            .await;
        if let Err(error) = settled {
            tracing::error!(
                idempotency_key = %log_key(config, &lease.key),
                error = %error.redacted(!config.log_keys),
                "the store did not record the unknown outcome: the key is free again once its lease ends"
            );
        }
    }

    /// Stores the response (without its body if it is over the cap; its status, headers and
    /// trailers are kept). When the store fails with a retryable error (it is down, or slow),
    /// returns the encoded response for [`Claim::retry_complete`]: a record left in flight
    /// would let a retry after the lease run the handler again.
    pub(crate) async fn complete(&mut self, mut stored: StoredResponse) -> Option<Bytes> {
        self.settle();
        let config = &self.shared.config;
        let status = stored.status;
        let mut encoded = codec::encode(&stored);
        if stored.body.is_some() && encoded.len() > config.storage_cap {
            stored.body = None;
            encoded = codec::encode(&stored);
        }
        if stored.body.is_none() {
            metrics::increment(metrics::key!(metrics::OMITTED));
        }
        let store = &self.shared.store;
        let lease = self.keeper.lease();
        let mut result = store
            .complete(lease, encoded.clone(), config.retention)
            .await;
        if matches!(result, Err(StoreError::TooLarge { .. })) && stored.body.is_some() {
            // The store takes less than the cap: keep status, headers and trailers at least.
            stored.body = None;
            metrics::increment(metrics::key!(metrics::OMITTED));
            encoded = codec::encode(&stored);
            result = store
                .complete(lease, encoded.clone(), config.retention)
                .await;
        }
        match result {
            Ok(()) => tracing::debug!(
                idempotency_key = %log_key(config, &self.lease().key),
                fence = self.lease().fence.get(),
                attempt = self.lease().attempt,
                status = status.as_u16(),
                state_after = "completed",
                "idempotency record completed"
            ),
            Err(error) if error.is_retryable() => {
                tracing::warn!(
                    idempotency_key = %log_key(config, &self.lease().key),
                    fence = self.lease().fence.get(),
                    error = %error.redacted(!config.log_keys),
                    "storing the response failed; retrying until the lease ends"
                );
                return Some(encoded);
            }
            Err(error) => self.not_stored(&error),
        }
        None
    }

    /// Logs why the store refused the response, and what a retry will find; a refusal means
    /// the lease was lost, and counts as such (once, if the heartbeat had not noticed).
    fn not_stored(&self, error: &StoreError) {
        if error.rejection().is_some() {
            self.keeper.lose(error);
        }
        let config = &self.shared.config;
        tracing::warn!(
            idempotency_key = %log_key(config, &self.lease().key),
            fence = self.lease().fence.get(),
            error = %error.redacted(!config.log_keys),
            "{}",
            not_stored_message(error)
        );
    }

    /// Tries again to store a response the store failed to take, backing off, until it takes
    /// it, refuses it (the lease was lost), or the lease has ended: after that, another
    /// attempt may hold the key, and this one's completion would be refused anyway.
    pub(crate) async fn retry_complete(&mut self, encoded: Bytes) {
        Box::pin(self.retry_complete_boxed(encoded)).await;
    }

    async fn retry_complete_boxed(&mut self, encoded: Bytes) {
        let config = &self.shared.config;
        let store = &self.shared.store;
        let lease = self.keeper.lease().clone();
        let stored = self
            .keeper
            .settle_with(u32::MAX, || {
                store.complete(&lease, encoded.clone(), config.retention)
            })
            .await;
        match stored {
            Ok(()) => tracing::info!(
                idempotency_key = %log_key(config, &lease.key),
                fence = lease.fence.get(),
                state_after = "completed",
                "the response was stored on a retry"
            ),
            Err(error) if error.is_retryable() => tracing::warn!(
                idempotency_key = %log_key(config, &lease.key),
                fence = lease.fence.get(),
                "storing the response failed for a whole lease: a retry after the lease may run the handler again"
            ),
            Err(error) => self.not_stored(&error),
        }
    }
}

/// What a store's refusal to take a response means for the caller's retries. A record that is
/// gone (deleted by an operator while the request ran, or expired) holds no lease: nothing
/// blocks a retry, which runs the handler again.
fn not_stored_message(error: &StoreError) -> &'static str {
    match error {
        StoreError::Rejected(TransitionRejection::NotFound) => {
            "the record was deleted while the request ran (by an operator, or it expired): the \
             response was not stored, and a retry will run the handler again"
        }
        StoreError::Rejected(TransitionRejection::Superseded { .. }) => {
            "another attempt holds the key now (this one's lease lapsed, or its record was \
             deleted and the key claimed again): the response was not stored, and a retry is \
             answered from the other attempt"
        }
        StoreError::Rejected(TransitionRejection::LeaseExpired) => {
            "the lease ran out before the response was stored: the response was not stored, and \
             a retry may run the handler again"
        }
        StoreError::Rejected(TransitionRejection::AlreadySettled { .. }) => {
            "the record was already settled by another outcome: the response was not stored"
        }
        _ => "storing the response failed: a retry after the lease may run the handler again",
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.keeper.is_settled() {
            return;
        }
        // The keeper releases the claim as it is dropped.
        metrics::failure("panic");
        tracing::warn!(
            idempotency_key = %log_key(&self.shared.config, &self.lease().key),
            fence = self.lease().fence.get(),
            "the handler ended without an answer (panic or cancellation): releasing its claim"
        );
    }
}
