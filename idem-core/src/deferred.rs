//! [`Deferred`]: a store whose server did not answer when the program started, connected on
//! first use.
//!
//! A program in front of a Redis or PostgreSQL server that comes up after it (a container
//! starting in any order, a restart of the database) should not exit: it starts on a
//! [`Deferred`] store, which answers every operation [`StoreError::Unavailable`] (a fail-closed
//! HTTP layer answers 503 + `Retry-After`, and runs nothing) until a try to connect succeeds,
//! then forwards every operation to the connected store.
//!
//! ```
//! use std::sync::Arc;
//! use std::task::{Context, Poll, Waker};
//! use idem_core::{Deferred, Store, StoreError};
//!
//! let first = StoreError::unavailable("connection refused");
//! let store = Deferred::new("redis://127.0.0.1:1", &first, || async {
//!     Err::<Arc<dyn Store>, _>(StoreError::unavailable("connection refused"))
//! });
//! assert!(!store.is_connected());
//! let mut ping = store.ping();
//! let Poll::Ready(Err(err)) = ping.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
//!     panic!("a store that is not connected answers at once");
//! };
//! assert!(err.is_retryable());
//! assert!(err.to_string().contains("connection refused"), "{err}");
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StoreError;
use crate::key::RecordKey;
use crate::record::{Failure, Record, UnknownOutcome};
use crate::store::{ClaimOutcome, ClaimRequest, Lease, ScanPage, ScanQuery, Store, StoreStats};
use crate::token::Fence;

/// One try to connect: the connected store, or why it is not.
type Connecting = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, StoreError>> + Send>>;

/// A store that connects on first use: one try at a time, at most one per
/// [`Deferred::RETRY_EVERY`] (or [`Deferred::with_retry_every`]); every operation meanwhile fails with
/// [`StoreError::Unavailable`], naming the store and the last reason. Once connected it
/// forwards every operation to the connected store.
///
/// A try is as long as the connect function makes it: bound it there (with a timeout) if the
/// server may accept a connection and never answer.
pub struct Deferred {
    name: String,
    connect: Box<dyn Fn() -> Connecting + Send + Sync>,
    store: OnceLock<Arc<dyn Store>>,
    /// Set by the one operation that tries to connect; the others do not wait for it.
    connecting: AtomicBool,
    /// When the last try failed, and why.
    last: Mutex<(Instant, String)>,
    retry_every: Duration,
}

impl fmt::Debug for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deferred")
            .field("store", &self.name)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

/// Clears the connecting flag when the try ends, also when its future is dropped.
struct TryGuard<'a>(&'a AtomicBool);

impl Drop for TryGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Deferred {
    /// The least time between two tries to connect.
    pub const RETRY_EVERY: Duration = Duration::from_secs(1);

    /// A store named `name` (in its errors: a URL without its password, say) that is not
    /// connected yet: `first` is why the first try failed, just now. `connect` makes one try.
    pub fn new<F, Fut>(name: impl Into<String>, first: &StoreError, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn Store>, StoreError>> + Send + 'static,
    {
        Deferred {
            name: name.into(),
            connect: Box::new(move || Box::pin(connect())),
            store: OnceLock::new(),
            connecting: AtomicBool::new(false),
            last: Mutex::new((Instant::now(), reason(first))),
            retry_every: Deferred::RETRY_EVERY,
        }
    }

    /// The least time between two tries to connect instead of [`Deferred::RETRY_EVERY`]
    /// (`Duration::ZERO`: every operation tries while none is trying).
    #[must_use]
    pub fn with_retry_every(mut self, every: Duration) -> Self {
        self.retry_every = every;
        self
    }

    /// Whether it has connected.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.store.get().is_some()
    }

    /// The connected store, connecting now if no other operation is trying and the last try
    /// is old enough ([`Deferred::with_retry_every`]).
    async fn store(&self) -> Result<&Arc<dyn Store>, StoreError> {
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        if self.connecting.swap(true, Ordering::AcqRel) {
            return Err(self.down("connecting"));
        }
        let _try = TryGuard(&self.connecting);
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        let due = self.last().0.elapsed() >= self.retry_every;
        if !due {
            return Err(self.down("not reached"));
        }
        match (self.connect)().await {
            Ok(store) => Ok(self.store.get_or_init(|| store)),
            Err(err) => {
                *self.last() = (Instant::now(), reason(&err));
                Err(self.down("not reached"))
            }
        }
    }

    fn last(&self) -> std::sync::MutexGuard<'_, (Instant, String)> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The error of an operation while the store is not connected.
    fn down(&self, state: &str) -> StoreError {
        let why = self.last().1.clone();
        StoreError::unavailable(format!("{} {state} yet: {why}", self.name))
    }
}

/// Why a store did not connect, without the "store unavailable" that the error of each
/// operation says again.
fn reason(err: &StoreError) -> String {
    match err {
        StoreError::Unavailable { source } => source.to_string(),
        other => other.to_string(),
    }
}

#[async_trait]
impl Store for Deferred {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.store().await?.claim(request).await
    }

    async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.store().await?.heartbeat(lease, extend).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store().await?.complete(lease, result, retention).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store().await?.fail(lease, failure, retention).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store().await?.release(lease).await
    }

    async fn settle_unknown(
        &self,
        lease: &Lease,
        outcome: UnknownOutcome,
        hold: Option<Duration>,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store()
            .await?
            .settle_unknown(lease, outcome, hold, retention)
            .await
    }

    async fn resolve_completed(
        &self,
        key: &RecordKey,
        fence: Fence,
        result: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store()
            .await?
            .resolve_completed(key, fence, result, retention)
            .await
    }

    async fn resolve_released(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.store().await?.resolve_released(key, fence).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.store().await?.get(key).await
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        self.store().await?.delete(key).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<ScanPage, StoreError> {
        self.store().await?.scan(query).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store().await?.ping().await
    }

    fn stats(&self) -> Option<StoreStats> {
        self.store.get().and_then(|store| store.stats())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// A store that answers every operation `Unavailable` (what the connect function hands
    /// over in these tests, so that forwarding is seen).
    #[derive(Debug)]
    struct Answering;

    #[async_trait]
    impl Store for Answering {
        async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn heartbeat(&self, _: &Lease, _: Duration) -> Result<Lease, StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn complete(&self, _: &Lease, _: Bytes, _: Duration) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn fail(&self, _: &Lease, _: Failure, _: Duration) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn release(&self, _: &Lease) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn settle_unknown(
            &self,
            _: &Lease,
            _: UnknownOutcome,
            _: Option<Duration>,
            _: Duration,
        ) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn resolve_completed(
            &self,
            _: &RecordKey,
            _: Fence,
            _: Bytes,
            _: Duration,
        ) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn resolve_released(&self, _: &RecordKey, _: Fence) -> Result<(), StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
            Ok(None)
        }
        async fn delete(&self, _: &RecordKey) -> Result<bool, StoreError> {
            Ok(false)
        }
        async fn scan(&self, _: &ScanQuery) -> Result<ScanPage, StoreError> {
            Err(StoreError::unavailable("answered"))
        }
        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn now<T>(future: Pin<Box<dyn Future<Output = T> + Send + '_>>) -> T {
        let mut future = future;
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("these futures are ready at once"),
        }
    }

    #[test]
    fn unavailable_until_a_try_connects_then_forwards() {
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        let store = Deferred::new("db", &StoreError::unavailable("refused"), move || {
            let up = counted.fetch_add(1, Ordering::SeqCst) >= 1;
            async move {
                if up {
                    Ok(Arc::new(Answering) as Arc<dyn Store>)
                } else {
                    Err(StoreError::unavailable("still refused"))
                }
            }
        })
        .with_retry_every(Duration::ZERO);
        let err = now(store.ping()).unwrap_err();
        assert!(err.is_retryable());
        assert!(
            err.to_string()
                .contains("db not reached yet: still refused"),
            "{err}"
        );
        assert!(!store.is_connected());
        assert!(now(store.ping()).is_ok());
        assert!(store.is_connected());
        assert!(now(store.ping()).is_ok());
        assert_eq!(
            tries.load(Ordering::SeqCst),
            2,
            "a connected store tries no more"
        );
    }

    #[test]
    fn no_try_before_the_interval() {
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        let store = Deferred::new("db", &StoreError::unavailable("refused"), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok(Arc::new(Answering) as Arc<dyn Store>) }
        })
        .with_retry_every(Duration::from_secs(3600));
        let err = now(store.ping()).unwrap_err();
        assert!(
            err.to_string().contains("db not reached yet: refused"),
            "{err}"
        );
        assert_eq!(tries.load(Ordering::SeqCst), 0);
    }
}
