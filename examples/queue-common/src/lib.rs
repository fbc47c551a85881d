//! What the queue worker examples (`worker-nats`, `worker-rabbitmq`) share: the [`Job`] a
//! message becomes, the bounded [`dispatch`] loop, the demo job of their binaries and the
//! [`scenario`] their tests run against the real brokers.
//!
//! ```
//! use queue_common::key_from_json;
//!
//! assert_eq!(key_from_json(br#"{"key":"order:1"}"#).unwrap().as_str(), "order:1");
//! assert!(key_from_json(b"not json").is_none());
//! ```

pub mod scenario;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::{Stream, StreamExt};
use idem_core::{Bytes, Fingerprint, IdempotencyKey};
use idem_store_memory::MemoryStore;
use idem_worker::{Disposition, JobError, JobGuard, ResultExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Any error of the examples.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The header that carries the idempotency key of a message.
pub const KEY_HEADER: &str = "Idempotency-Key";

/// One delivery of a message, ready for the guard.
#[derive(Clone, Debug)]
pub struct Job {
    /// The business key of the message.
    pub key: IdempotencyKey,
    /// The fingerprint of the payload (a reused key with another payload is a mismatch).
    pub fingerprint: Fingerprint,
    /// The payload.
    pub payload: Bytes,
    /// The broker's delivery count (1 for the first delivery).
    pub delivery: u32,
}

impl Job {
    /// A job from its key, payload and delivery count.
    #[must_use]
    pub fn new(key: IdempotencyKey, payload: Bytes, delivery: u32) -> Self {
        Job {
            key,
            fingerprint: Fingerprint::of(&[&payload]),
            payload,
            delivery: delivery.max(1),
        }
    }
}

/// The `key` field of a JSON payload, if it is a valid key.
#[must_use]
pub fn key_from_json(payload: &[u8]) -> Option<IdempotencyKey> {
    let body: serde_json::Value = serde_json::from_slice(payload).ok()?;
    IdempotencyKey::new(body.get("key")?.as_str()?).ok()
}

/// Takes messages from `messages` until `stop` fires or the stream ends, running `handle` on
/// each in its own task, at most `concurrency` at a time. Waits for the messages in hand
/// before returning.
pub async fn dispatch<S, M, E, F, Fut>(
    mut messages: S,
    concurrency: usize,
    stop: CancellationToken,
    handle: F,
) where
    S: Stream<Item = Result<M, E>> + Unpin,
    E: std::fmt::Display,
    M: Send + 'static,
    F: Fn(M) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handle = Arc::new(handle);
    let permits = u32::try_from(concurrency.clamp(1, 4_096)).unwrap_or(1);
    let limit = Arc::new(Semaphore::new(permits as usize));
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => break,
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                tracing::warn!(%error, "receiving failed");
                continue;
            }
            None => break,
        };
        let Ok(permit) = limit.clone().acquire_owned().await else {
            break;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _permit = permit;
            handle(message).await;
        });
    }
    let _all = limit.acquire_many(permits).await;
}

/// A token that fires on Ctrl-C.
#[must_use]
pub fn ctrl_c() -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            stop.cancel();
        }
    });
    stop
}

/// The demo job of the example binaries: "ships" an order (prints it) once per key, through
/// a guard on the memory store; a payload that is not JSON is a permanent failure.
///
/// # Errors
/// Never in practice: the guard's default configuration is valid.
pub fn ship_orders() -> Result<impl Fn(Job) -> DispositionFuture + Clone, Error> {
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("ship_order")
        .store_label("memory")
        .build()?;
    let shipped = Arc::new(AtomicU64::new(0));
    Ok(move |job: Job| -> DispositionFuture {
        let (guard, shipped) = (guard.clone(), shipped.clone());
        Box::pin(async move {
            guard
                .run_delivery(&job.key, job.fingerprint, job.delivery, |ctx| async move {
                    let order: serde_json::Value =
                        serde_json::from_slice(&job.payload).permanent()?;
                    let n = shipped.fetch_add(1, Ordering::SeqCst) + 1;
                    println!("shipped {} (fence {}, {n} so far)", ctx.key(), ctx.fence());
                    Ok::<_, JobError>(order)
                })
                .await
                .disposition
        })
    })
}

/// The future of a handler's disposition.
pub type DispositionFuture = std::pin::Pin<Box<dyn Future<Output = Disposition> + Send>>;

/// The messages of the demo: `count` orders, a fifth of them published twice. Each is
/// `(key, payload)`.
#[must_use]
pub fn demo_orders(count: u64) -> Vec<(String, String)> {
    (0..count)
        .flat_map(|n| {
            let copies = if n % 5 == 0 { 2 } else { 1 };
            (0..copies).map(move |_| (format!("order:{n}:ship"), format!(r#"{{"order":{n}}}"#)))
        })
        .collect()
}
