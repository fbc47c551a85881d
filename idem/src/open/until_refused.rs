//! [`UntilRefused`]: a deferred store that stops trying to connect once a try fails with an
//! error no retry cures.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Deferred, Failure, Fence, Lease, Record, RecordKey,
    ScanPage, ScanQuery, Store, StoreError, StoreStats, UnknownOutcome,
};

/// The future every [`Store`] method returns.
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Where a deferred store's connect function records the first error no retry cures.
pub(crate) type Refusal = Arc<OnceLock<String>>;

/// A [`Deferred`] store whose tries to connect end at the first one that fails with an error
/// that is not retryable (credentials the server refuses, say: at start such an error is no
/// deferral but a failure to open, and later it is no more curable): from then on every
/// operation answers that error at once, as a permanent [`StoreError::Backend`], and nothing
/// tries to connect again. The [`Deferred`] store alone would try again every second forever,
/// answering each operation as a server not reached yet.
#[derive(Debug)]
pub(crate) struct UntilRefused {
    deferred: Deferred,
    refusal: Refusal,
}

/// The error of every operation once the tries ended.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; not tried again (no retry cures it: fix the setting, then restart)",
            self.0
        )
    }
}

impl std::error::Error for Refused {}

impl UntilRefused {
    /// `deferred`, whose connect function records in `refusal` (see [`record`]) the first
    /// error no retry cures.
    pub(crate) fn new(deferred: Deferred, refusal: Refusal) -> Self {
        UntilRefused { deferred, refusal }
    }

    /// The error that ended the tries, if one did.
    fn refused(&self) -> Option<StoreError> {
        self.refusal.get().map(|why| StoreError::Backend {
            source: Box::new(Refused(why.clone())),
            retryable: false,
        })
    }

    /// Runs `op` on the deferred store unless the tries ended; an operation that failed on
    /// the try that ended them answers the refusal too.
    fn gated<'f, T: Send + 'f>(
        &'f self,
        op: impl FnOnce(&'f Deferred) -> StoreFuture<'f, T> + Send + 'f,
    ) -> StoreFuture<'f, T> {
        Box::pin(async move {
            if let Some(refused) = self.refused() {
                return Err(refused);
            }
            match op(&self.deferred).await {
                Err(err) => Err(self.refused().unwrap_or(err)),
                done => done,
            }
        })
    }
}

/// Records `error`, the error of a try to connect the store named `name`, in `refusal` when
/// no retry cures it; returns it unchanged.
pub(crate) fn record<T>(
    refusal: &Refusal,
    name: &str,
    tried: Result<T, StoreError>,
) -> Result<T, StoreError> {
    if let Err(error) = &tried {
        if !error.is_retryable() {
            // Without the "store backend error: " of the error's own words: the error of
            // every operation says it again.
            let why = match error {
                StoreError::Backend { source, .. } | StoreError::Unavailable { source } => {
                    source.to_string()
                }
                other => other.to_string(),
            };
            let _ = refusal.set(format!("{name}: {why}"));
        }
    }
    tried
}

impl Store for UntilRefused {
    fn claim<'s, 'r, 'f>(&'s self, request: &'r ClaimRequest) -> StoreFuture<'f, ClaimOutcome>
    where
        's: 'f,
        'r: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.claim(request))
    }

    fn heartbeat<'s, 'l, 'f>(&'s self, lease: &'l Lease, extend: Duration) -> StoreFuture<'f, Lease>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.heartbeat(lease, extend))
    }

    fn complete<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        result: Bytes,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.complete(lease, result, retention))
    }

    fn fail<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        failure: Failure,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.fail(lease, failure, retention))
    }

    fn release<'s, 'l, 'f>(&'s self, lease: &'l Lease) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.release(lease))
    }

    fn settle_unknown<'s, 'l, 'f>(
        &'s self,
        lease: &'l Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.settle_unknown(lease, outcome, hold, retention))
    }

    fn resolve_completed<'s, 'k, 'f>(
        &'s self,
        key: &'k RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.resolve_completed(key, fence, result, retention))
    }

    fn resolve_released<'s, 'k, 'f>(
        &'s self,
        key: &'k RecordKey,
        fence: Fence,
    ) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.resolve_released(key, fence))
    }

    fn get<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, Option<Record>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.get(key))
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k RecordKey) -> StoreFuture<'f, bool>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.delete(key))
    }

    fn scan<'s, 'q, 'f>(&'s self, query: &'q ScanQuery) -> StoreFuture<'f, ScanPage>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.gated(move |store| store.scan(query))
    }

    fn ping<'s, 'f>(&'s self) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.gated(Store::ping)
    }

    fn stats(&self) -> Option<StoreStats> {
        self.deferred.stats()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Polls `future` once: a deferred store that does not connect answers at once.
    fn now<T>(future: StoreFuture<'_, T>) -> Result<T, StoreError> {
        let mut future = future;
        let waker = std::task::Waker::noop();
        match future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
        {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => panic!("pending"),
        }
    }

    /// A store whose server went away at start (retryable), then refuses the credentials on
    /// the first try: the operation of that try and every later one answer the refusal,
    /// permanent, and the connect function is never called again. Before, `Deferred` tried
    /// again on every operation (at most once per its retry interval), each answered as a
    /// server "not reached yet".
    #[test]
    fn a_try_refused_for_good_ends_the_tries() {
        let refusal: Refusal = Arc::default();
        let tries = Arc::new(AtomicUsize::new(0));
        let (slot, counted) = (refusal.clone(), tries.clone());
        let first = StoreError::unavailable("connection refused");
        let deferred = Deferred::new("postgres://idem@db/test", &first, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let refused = StoreError::Backend {
                source: "connect: the server refused the credentials".into(),
                retryable: false,
            };
            let tried: Result<Arc<dyn Store>, StoreError> =
                record(&slot, "postgres://idem@db/test", Err(refused));
            std::future::ready(tried)
        })
        .with_retry_every(Duration::ZERO);
        let store = UntilRefused::new(deferred, refusal);
        for _ in 0..3 {
            let err = now(store.ping()).unwrap_err();
            assert!(!err.is_retryable(), "{err:?}");
            let message = err.to_string();
            assert!(
                message.contains("the server refused the credentials")
                    && message.contains("not tried again"),
                "{message}"
            );
        }
        let key = RecordKey::unscoped(idem_core::IdempotencyKey::new("k").unwrap());
        assert!(!now(store.get(&key)).unwrap_err().is_retryable());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    /// A try that fails with an error a retry may cure does not end the tries.
    #[test]
    fn a_retryable_failure_keeps_trying() {
        let refusal: Refusal = Arc::default();
        let tries = Arc::new(AtomicUsize::new(0));
        let (slot, counted) = (refusal.clone(), tries.clone());
        let first = StoreError::unavailable("connection refused");
        let deferred = Deferred::new("redis://db", &first, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let down = StoreError::unavailable("connection refused");
            let tried: Result<Arc<dyn Store>, StoreError> = record(&slot, "redis://db", Err(down));
            std::future::ready(tried)
        })
        .with_retry_every(Duration::ZERO);
        let store = UntilRefused::new(deferred, refusal);
        for _ in 0..3 {
            assert!(now(store.ping()).unwrap_err().is_retryable());
        }
        assert_eq!(tries.load(Ordering::SeqCst), 3);
    }
}
