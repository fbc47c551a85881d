//! [`Claim`]: the claim of one request while its handler runs: the heartbeat that keeps its
//! lease, the completion that stores the response, and the release of a claim left unsettled.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Lease, Rejection, Store, StoreError};
use tokio::time::Instant;

use crate::codec::{self, StoredResponse};
use crate::detach::Work;
use crate::layer::Shared;
use crate::metrics::{self, Op};
use crate::service::{after, log_key};

/// A held claim: keeps its lease by heartbeat while the handler runs, and is released if
/// dropped unsettled (the handler panicked or its task was cancelled).
pub(crate) struct Claim {
    shared: Arc<Shared>,
    lease: Lease,
    /// The heartbeat, polled alongside the handler ([`Claim::beating`]); it is made (and sets
    /// its timer) only when the handler first has to wait, so a handler that answers at once
    /// costs no timer and no allocation.
    heartbeat: Beat,
    settled: bool,
    /// When the key was claimed: how long it was held counts in the layer's recent durations.
    claimed_at: Instant,
}

/// The state of a claim's heartbeat.
enum Beat {
    /// Not started: the handler has not had to wait yet.
    Idle,
    /// Running.
    Running(Work),
    /// Stopped: the lease was lost, or the claim is settled.
    Stopped,
}

impl Claim {
    pub(crate) fn new(shared: Arc<Shared>, lease: Lease) -> Self {
        Claim {
            shared,
            lease,
            heartbeat: Beat::Idle,
            settled: false,
            claimed_at: Instant::now(),
        }
    }

    /// Runs `future` while the heartbeat keeps the lease.
    pub(crate) async fn beating<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let Claim {
            shared,
            lease,
            heartbeat: beat,
            ..
        } = self;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(output) = future.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
            if let Beat::Idle = beat {
                *beat = Beat::Running(Box::pin(heartbeat(shared.clone(), lease.clone())));
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
        if !self.settled {
            self.shared.durations.record(self.claimed_at.elapsed());
        }
        self.heartbeat = Beat::Stopped;
        self.settled = true;
    }

    /// Gives the key back so a retry runs the handler again.
    pub(crate) async fn release(&mut self, kind: &'static str) {
        self.settle();
        metrics::failure(kind);
        let config = &self.shared.config;
        let released = self.shared.store.release(&self.lease);
        let released = self.shared.store_metrics.time(Op::Release, released).await;
        tracing::debug!(
            idempotency_key = %log_key(config, &self.lease.key),
            fence = self.lease.fence.get(),
            reason = kind,
            state_after = "absent",
            "idempotency claim released"
        );
        match released {
            Ok(()) => {}
            // Another attempt holds the key, or the record is settled: nothing of this claim's
            // is left to release.
            Err(error @ StoreError::Rejected(_)) => tracing::warn!(
                idempotency_key = %log_key(config, &self.lease.key),
                error = %error.redacted(!config.log_keys),
                "the claim was no longer held when it was released: nothing was released"
            ),
            Err(error) => tracing::warn!(
                idempotency_key = %log_key(config, &self.lease.key),
                error = %error.redacted(!config.log_keys),
                "releasing the claim failed: the key stays blocked until its lease ends"
            ),
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
        let store_metrics = &self.shared.store_metrics;
        let mut result = store_metrics
            .time(
                Op::Complete,
                store.complete(&self.lease, encoded.clone(), config.retention),
            )
            .await;
        if matches!(result, Err(StoreError::TooLarge { .. })) && stored.body.is_some() {
            // The store takes less than the cap: keep status, headers and trailers at least.
            stored.body = None;
            metrics::increment(metrics::key!(metrics::OMITTED));
            encoded = codec::encode(&stored);
            result = store_metrics
                .time(
                    Op::Complete,
                    store.complete(&self.lease, encoded.clone(), config.retention),
                )
                .await;
        }
        match result {
            Ok(()) => tracing::debug!(
                idempotency_key = %log_key(config, &self.lease.key),
                fence = self.lease.fence.get(),
                attempt = self.lease.attempt,
                status = status.as_u16(),
                state_after = "completed",
                "idempotency record completed"
            ),
            Err(error) if error.is_retryable() => {
                tracing::warn!(
                    idempotency_key = %log_key(config, &self.lease.key),
                    fence = self.lease.fence.get(),
                    error = %error.redacted(!config.log_keys),
                    "storing the response failed; retrying until the lease ends"
                );
                return Some(encoded);
            }
            Err(error) => self.not_stored(&error),
        }
        None
    }

    /// Logs why the store refused the response, and what a retry will find.
    fn not_stored(&self, error: &StoreError) {
        let config = &self.shared.config;
        tracing::warn!(
            idempotency_key = %log_key(config, &self.lease.key),
            fence = self.lease.fence.get(),
            error = %error.redacted(!config.log_keys),
            "{}",
            not_stored_message(error)
        );
    }

    /// Tries again to store a response the store failed to take, backing off, until it takes
    /// it, refuses it (the lease was lost), or one lease has passed: after that, another
    /// attempt may hold the key, and this one's completion would be refused anyway.
    pub(crate) async fn retry_complete(&mut self, encoded: Bytes) {
        let config = &self.shared.config;
        let deadline = after(config.lease);
        let mut pause = Duration::from_millis(50);
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            let stored = self
                .shared
                .store
                .complete(&self.lease, encoded.clone(), config.retention);
            match self.shared.store_metrics.time(Op::Complete, stored).await {
                Ok(()) => {
                    tracing::info!(
                        idempotency_key = %log_key(config, &self.lease.key),
                        fence = self.lease.fence.get(),
                        state_after = "completed",
                        "the response was stored on a retry"
                    );
                    return;
                }
                Err(error) if error.is_retryable() => {}
                Err(error) => {
                    self.not_stored(&error);
                    return;
                }
            }
        }
        tracing::warn!(
            idempotency_key = %log_key(config, &self.lease.key),
            fence = self.lease.fence.get(),
            "storing the response failed for a whole lease: a retry after the lease may run the handler again"
        );
    }
}

/// What a store's refusal to take a response means for the caller's retries. A record that is
/// gone (deleted by an operator while the request ran, or expired) holds no lease: nothing
/// blocks a retry, which runs the handler again.
fn not_stored_message(error: &StoreError) -> &'static str {
    match error {
        StoreError::Rejected(Rejection::NotFound) => {
            "the record was deleted while the request ran (by an operator, or it expired): the \
             response was not stored, and a retry will run the handler again"
        }
        StoreError::Rejected(Rejection::Superseded { .. }) => {
            "another attempt holds the key now (this one's lease lapsed, or its record was \
             deleted and the key claimed again): the response was not stored, and a retry is \
             answered from the other attempt"
        }
        StoreError::Rejected(Rejection::LeaseExpired) => {
            "the lease ran out before the response was stored: the response was not stored, and \
             a retry may run the handler again"
        }
        StoreError::Rejected(Rejection::AlreadySettled { .. }) => {
            "the record was already settled by another outcome: the response was not stored"
        }
        _ => "storing the response failed: a retry after the lease may run the handler again",
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        metrics::failure("panic");
        let shared = self.shared.clone();
        let lease = self.lease.clone();
        tracing::warn!(
            idempotency_key = %log_key(&shared.config, &lease.key),
            fence = lease.fence.get(),
            "the handler ended without an answer (panic or cancellation): releasing its claim"
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let released = shared.store.release(&lease);
                let _ = shared.store_metrics.time(Op::Release, released).await;
            });
        }
    }
}

/// Extends the lease every heartbeat interval until dropped or refused.
async fn heartbeat(shared: Arc<Shared>, lease: Lease) {
    let config = &shared.config;
    let every = config.heartbeat;
    let mut ticker = tokio::time::interval_at(after(every), every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let beat = shared.store.heartbeat(&lease, config.lease);
        match shared.store_metrics.time(Op::Heartbeat, beat).await {
            Ok(_) => {}
            Err(StoreError::Rejected(rejection)) => {
                metrics::increment(metrics::key!(metrics::LEASE_LOSSES));
                tracing::warn!(
                    idempotency_key = %log_key(config, &lease.key),
                    fence = lease.fence.get(),
                    %rejection,
                    "the lease was lost while the handler runs"
                );
                return;
            }
            Err(error) => tracing::warn!(
                idempotency_key = %log_key(config, &lease.key),
                error = %error.redacted(!config.log_keys),
                "heartbeat failed; retrying at the next beat"
            ),
        }
    }
}
