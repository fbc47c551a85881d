//! [`JobContext`]: what a guarded job knows about its claim.

use idem_core::{Fence, IdempotencyKey, Lease, RecordKey};
use tokio_util::sync::CancellationToken;

/// Handed to the job: the key and fence to pass downstream, and a token that fires when the
/// lease is lost.
///
/// A downstream service with its own idempotency keys should get [`JobContext::key`]; one that
/// can refuse stale writers should get [`JobContext::fence`] (it only ever grows per key).
#[derive(Clone, Debug)]
pub struct JobContext {
    pub(crate) key: RecordKey,
    pub(crate) fence: Fence,
    pub(crate) lease_attempt: u32,
    pub(crate) delivery: u32,
    pub(crate) cancel: CancellationToken,
}

impl JobContext {
    /// The context of a job run under `lease` for delivery `delivery`, whose lease loss
    /// `cancel` signals. The guard makes these; a variant of the guard (see
    /// [`crate::JobGuard::answer`]) makes its own.
    #[must_use]
    pub fn new(lease: &Lease, delivery: u32, cancel: CancellationToken) -> Self {
        JobContext {
            key: lease.key.clone(),
            fence: lease.fence,
            lease_attempt: lease.attempt,
            delivery,
            cancel,
        }
    }

    /// The idempotency key of the job.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key.key
    }

    /// The key with its scope, as the store holds it.
    #[must_use]
    pub fn record_key(&self) -> &RecordKey {
        &self.key
    }

    /// The fence of this attempt: strictly greater than every earlier grant of the key.
    #[must_use]
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// How many times the store has granted this key in a row (1; more after takeovers of a
    /// crashed or stalled holder).
    #[must_use]
    pub fn lease_attempt(&self) -> u32 {
        self.lease_attempt
    }

    /// The delivery number the queue gave (1 for the first delivery).
    #[must_use]
    pub fn delivery(&self) -> u32 {
        self.delivery
    }

    /// Fires when the lease is lost (a heartbeat was refused, or the store stayed unreachable
    /// for a whole lease): another attempt may now hold the key, and whatever this job records
    /// will be refused. Stop as soon as you can.
    #[must_use]
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether the lease is lost.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the lease is lost.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }
}
