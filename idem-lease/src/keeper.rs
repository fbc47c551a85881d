//! [`LeaseKeeper`]: holds one lease while its work runs: the heartbeat that extends it, the
//! settle retried while the store answers a retryable error, and the release of a claim
//! dropped unsettled.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use idem_core::metrics::LEASE_LOSSES;
use idem_core::{Lease, RecordKey, Store, StoreError};
use metrics::{Key, Label};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metered::increment;

/// The settings every [`LeaseKeeper`] of one layer or guard keeps its lease by.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    lease: Duration,
    heartbeat: Duration,
    settle_tries: u32,
    redact_keys: bool,
    losses: Key,
}

impl KeeperConfig {
    /// Leases of `lease`, extended every `heartbeat`; one try to release a dropped claim; keys
    /// redacted in the logs; lease losses counted without labels.
    #[must_use]
    pub fn new(lease: Duration, heartbeat: Duration) -> Self {
        KeeperConfig {
            lease,
            heartbeat,
            settle_tries: 1,
            redact_keys: true,
            losses: Key::from_static_name(LEASE_LOSSES),
        }
    }

    /// How many times the release of a claim dropped unsettled is sent while the store answers
    /// a retryable error (at least 1).
    #[must_use]
    pub fn settle_tries(mut self, tries: u32) -> Self {
        self.settle_tries = tries.max(1);
        self
    }

    /// Whether the keeper's log lines leave the record's key out (a digest instead).
    #[must_use]
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.redact_keys = redact;
        self
    }

    /// Adds the label `name=value` to `idem_lease_losses_total` (the job guard's `job_type`).
    #[must_use]
    pub fn loss_label(mut self, name: &'static str, value: impl Into<String>) -> Self {
        let mut labels: Vec<Label> = self.losses.labels().cloned().collect();
        labels.push(Label::new(name, value.into()));
        self.losses = Key::from_parts(LEASE_LOSSES, labels);
        self
    }

    /// The lease a claim asks for and a heartbeat extends to.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The heartbeat interval.
    #[must_use]
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// How many times a dropped claim's release is sent.
    #[must_use]
    pub fn tries(&self) -> u32 {
        self.settle_tries
    }

    /// Whether keys are redacted in the logs.
    #[must_use]
    pub fn redacts_keys(&self) -> bool {
        self.redact_keys
    }

    /// `key` as the keeper's log lines show it.
    fn shown(&self, key: &RecordKey) -> String {
        if self.redact_keys {
            key.digest_hex()
        } else {
            key.to_string()
        }
    }
}

/// What a lease's heartbeat shares with its keeper.
#[derive(Debug)]
struct Beat {
    /// When the lease ends, as far as this process knows (the last extension granted).
    deadline: Mutex<Instant>,
    /// The error that ended the lease, once it did.
    loss: Mutex<Option<StoreError>>,
    /// Fired when the lease is lost.
    lost: CancellationToken,
    /// Whether the loss was counted (once, by whichever noticed first).
    counted: AtomicBool,
}

/// The lock of `mutex`, whether or not a holder panicked (the data is a plain value).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The instant `by` after `from`, saturated: a lease, heartbeat or wait as long as
/// `Duration::MAX` means "no end in sight" (about 30 years on), never an `Instant` overflow,
/// which panics. For the deadlines the HTTP layer and the job guard keep in process time.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
///
/// let now = Instant::now();
/// assert!(idem_lease::saturating_deadline(now, Duration::MAX) > now);
/// ```
#[must_use]
pub fn saturating_deadline(from: Instant, by: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);
    from.checked_add(by)
        .or_else(|| from.checked_add(FAR_FUTURE))
        .unwrap_or(from)
}

/// Holds one lease while its work runs (an HTTP handler, a job).
///
/// - **Heartbeat.** [`LeaseKeeper::heartbeat`] extends the lease every heartbeat interval. A
///   refused heartbeat loses the lease at once. A heartbeat that fails with a retryable error
///   (the store is down, or slow) is tried again after an interval, but no later than the end
///   of the lease: a lease that could not be extended before it ends is **lost**, since
///   another attempt may take the key over from then on. Either way the loss counts once in
///   `idem_lease_losses_total`, fires [`LeaseKeeper::lost`] and the heartbeat stops.
/// - **Settle.** [`LeaseKeeper::settle_with`] sends a completion, failure or release again
///   while the store answers a retryable error, backing off, up to a number of tries and
///   never starting one after the lease has ended (the first always goes).
/// - **Drop.** A keeper dropped unsettled (a panic, a cancelled future) releases its claim
///   from a spawned task, so the key is not blocked until the lease ends; without a runtime
///   the key lapses with its lease.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
/// use idem_lease::{KeeperConfig, LeaseKeeper};
/// use idem_store_memory::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let config = Arc::new(KeeperConfig::new(Duration::from_secs(30), Duration::from_secs(10)));
/// let key = RecordKey::unscoped(IdempotencyKey::new("order-1")?);
/// let request = ClaimRequest::new(key, Fingerprint::of(&[b"body"]), config.lease());
/// let sent = tokio::time::Instant::now();
/// let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else {
///     unreachable!("a fresh key is free");
/// };
/// let mut keeper = LeaseKeeper::new(store.clone(), config, lease, sent);
/// // The work runs while the heartbeat keeps the lease (here: at once).
/// let work = async { "done" };
/// let result = tokio::select! {
///     result = work => result,
///     () = keeper.heartbeat() => "lease lost",
/// };
/// let lease = keeper.lease().clone();
/// keeper
///     .settle_with(3, || store.complete(&lease, result.into(), Duration::from_secs(60)))
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct LeaseKeeper {
    store: Arc<dyn Store>,
    config: Arc<KeeperConfig>,
    lease: Lease,
    /// When the lease ends as granted (before any heartbeat).
    granted_until: Instant,
    /// What the heartbeat shares, made when first needed: a claim settled before its work had
    /// to wait costs no allocation for it.
    beat: OnceLock<Arc<Beat>>,
    settled: bool,
}

impl fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("lease", &self.lease)
            .field("lost", &self.is_lost())
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl LeaseKeeper {
    /// Holds `lease` on `store`, granted by a claim sent at `sent` (the lease is counted from
    /// there: the store started it later, so this never overestimates it).
    #[must_use]
    pub fn new(
        store: Arc<dyn Store>,
        config: Arc<KeeperConfig>,
        lease: Lease,
        sent: Instant,
    ) -> Self {
        let granted_until = saturating_deadline(sent, config.lease);
        LeaseKeeper {
            store,
            config,
            lease,
            granted_until,
            beat: OnceLock::new(),
            settled: false,
        }
    }

    /// What the heartbeat shares, made now if it was not yet.
    fn beat(&self) -> &Arc<Beat> {
        self.beat.get_or_init(|| {
            Arc::new(Beat {
                deadline: Mutex::new(self.granted_until),
                loss: Mutex::new(None),
                lost: CancellationToken::new(),
                counted: AtomicBool::new(false),
            })
        })
    }

    /// When the lease ends, as far as this process knows.
    fn ends(&self) -> Instant {
        self.beat
            .get()
            .map_or(self.granted_until, |beat| *lock(&beat.deadline))
    }

    /// The lease held.
    #[must_use]
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &KeeperConfig {
        &self.config
    }

    /// The token fired when the lease is lost (by the heartbeat, or [`LeaseKeeper::lose`]).
    #[must_use]
    pub fn lost(&self) -> &CancellationToken {
        &self.beat().lost
    }

    /// Whether the lease was lost.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.beat.get().is_some_and(|beat| beat.lost.is_cancelled())
    }

    /// The error that lost the lease (taken once; a generic one after that, or if the lease
    /// was not lost).
    #[must_use]
    pub fn take_loss(&self) -> StoreError {
        self.beat
            .get()
            .and_then(|beat| lock(&beat.loss).take())
            .unwrap_or_else(|| StoreError::unavailable("the lease was lost"))
    }

    /// How long the lease has left, as far as this process knows.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.ends().saturating_duration_since(Instant::now())
    }

    /// Records that the store refused a transition of this lease with `error` (the heartbeat
    /// had not noticed yet): counts the loss, unless it was counted already, and fires
    /// [`LeaseKeeper::lost`].
    pub fn lose(&self, error: &StoreError) {
        lost(&self.config, &self.lease, self.beat(), None, error);
    }

    /// Marks the claim settled: a drop no longer releases it.
    pub fn disarm(&mut self) {
        self.settled = true;
    }

    /// Whether the claim is settled (a drop releases it unless it is).
    #[must_use]
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Extends the lease every heartbeat interval; ends only when the lease is lost (see
    /// [`LeaseKeeper`]). Poll it alongside the work, or spawn it and abort it when the work
    /// is done.
    pub fn heartbeat(&self) -> impl Future<Output = ()> + Send + 'static {
        self.heartbeat_at(saturating_deadline(Instant::now(), self.config.heartbeat))
    }

    /// [`LeaseKeeper::heartbeat`], whose first beat goes at `first` (then every interval): for
    /// a holder that waited without a timer of its own until shortly before its first beat
    /// ([`crate::BeatTimer`]).
    pub fn heartbeat_at(&self, first: Instant) -> impl Future<Output = ()> + Send + 'static {
        heartbeat(
            self.store.clone(),
            self.config.clone(),
            self.lease.clone(),
            self.beat().clone(),
            first,
        )
    }

    /// Sends `send` (a completion, failure or release of this lease), again while the store
    /// answers a retryable error: at most `tries` times in all (at least once), backing off
    /// from 40 ms to 1 s, and no try starts after the lease has ended, as far as this process
    /// knows. Marks the claim settled once the store answered, whatever the answer: a claim
    /// whose settle failed lapses with its lease (dropped before the answer, it is released).
    ///
    /// # Errors
    /// The store's last answer.
    pub async fn settle_with<F, Fut>(&mut self, tries: u32, send: F) -> Result<(), StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let settled = settle(&self.config, self.ends(), tries, send).await;
        self.settled = true;
        settled
    }
}

/// See [`LeaseKeeper::settle_with`].
async fn settle<F, Fut>(
    config: &KeeperConfig,
    ends: Instant,
    tries: u32,
    mut send: F,
) -> Result<(), StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut tried = 0u32;
    loop {
        tried += 1;
        match send().await {
            Err(error) if error.is_retryable() && tried < tries => {
                let pause =
                    Duration::from_millis(20u64 << tried.min(6)).min(Duration::from_secs(1));
                if Instant::now() + pause >= ends {
                    return Err(error);
                }
                let error = error.redacted(config.redact_keys);
                tracing::debug!(%error, tries = tried, "settle failed, trying again");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Dropped before the work ended (a panic, a cancelled future, a shutdown): nothing to
        // record, so give the key back. Without a runtime the key lapses with its lease.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let config = self.config.clone();
        let ends = self.ends();
        let lease = self.lease.clone();
        tracing::debug!(
            fence = lease.fence.get(),
            "claim dropped unsettled: releasing"
        );
        runtime.spawn(async move {
            let released = settle(&config, ends, config.settle_tries, || store.release(&lease));
            if let Err(error) = released.await {
                tracing::warn!(
                    error = %error.redacted(config.redact_keys),
                    idempotency_key = %config.shown(&lease.key),
                    fence = lease.fence.get(),
                    "release of a dropped claim failed; the key lapses with its lease"
                );
            }
        });
    }
}

/// See [`LeaseKeeper::heartbeat`].
async fn heartbeat(
    store: Arc<dyn Store>,
    config: Arc<KeeperConfig>,
    lease: Lease,
    beat: Arc<Beat>,
    first: Instant,
) {
    let interval = config.heartbeat;
    let mut next = first;
    loop {
        tokio::time::sleep_until(next).await;
        if beat.lost.is_cancelled() {
            // Lost by a refused settle meanwhile: counted there.
            return;
        }
        let sent = Instant::now();
        match store.heartbeat(&lease, config.lease).await {
            Ok(_) => {
                *lock(&beat.deadline) = saturating_deadline(sent, config.lease);
                next = saturating_deadline(sent, interval);
            }
            Err(error) => {
                let ends = *lock(&beat.deadline);
                let now = Instant::now();
                if error.is_retryable() && now < ends {
                    tracing::warn!(
                        error = %error.redacted(config.redact_keys),
                        idempotency_key = %config.shown(&lease.key),
                        fence = lease.fence.get(),
                        "heartbeat failed; trying again until the lease ends"
                    );
                    // Again after an interval, but no later than the lease's end: a store
                    // still unreachable then means the lease is lost, and the work learns it
                    // when the lease ends, not up to an interval later.
                    next = saturating_deadline(now, interval).min(ends);
                    continue;
                }
                *lock(&beat.loss) = Some(error);
                if let Some(error) = lock(&beat.loss).as_ref() {
                    lost(&config, &lease, &beat, Some("heartbeat"), error);
                }
                return;
            }
        }
    }
}

/// Counts the loss of `lease`, logs it and fires its token, unless that was done already.
fn lost(
    config: &KeeperConfig,
    lease: &Lease,
    beat: &Beat,
    by: Option<&'static str>,
    error: &StoreError,
) {
    if beat.counted.swap(true, Ordering::SeqCst) {
        return;
    }
    increment(&config.losses);
    tracing::warn!(
        error = %error.redacted(config.redact_keys),
        idempotency_key = %config.shown(&lease.key),
        fence = lease.fence.get(),
        by = by.unwrap_or("settle"),
        "lease lost"
    );
    beat.lost.cancel();
}
