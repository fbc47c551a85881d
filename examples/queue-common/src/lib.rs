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
use idem_core::{Bytes, Fingerprint, IdempotencyKey, Store};
use idem_store_memory::MemoryStore;
use idem_store_redb::RedbStore;
use idem_worker::{Disposition, JobError, JobGuard, JobOutcome, ResultExt};
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

/// The store of the demo job: the memory store (the default; a restarted worker forgets what
/// it shipped), or, with `--redb PATH` among `args`, the durable redb store in that file (a
/// restarted worker answers the messages it already shipped as duplicates).
///
/// # Errors
/// An unknown argument, `--redb` without a path, or a redb file that cannot be opened.
pub fn demo_store(
    mut args: impl Iterator<Item = String>,
) -> Result<(Arc<dyn Store>, &'static str), Error> {
    match args.next().as_deref() {
        None => Ok((Arc::new(MemoryStore::new()), "memory")),
        Some("--redb") => {
            let path = args
                .next()
                .ok_or("--redb needs the path of the store file")?;
            Ok((Arc::new(RedbStore::open(path)?), "redb"))
        }
        Some(other) => Err(format!("unknown argument {other:?} (expected --redb PATH)").into()),
    }
}

/// What the demo job did with the messages it was handed: the summary a worker prints when it
/// stops.
#[derive(Debug, Default)]
pub struct Tally {
    processed: AtomicU64,
    shipped: AtomicU64,
    duplicates: AtomicU64,
}

impl Tally {
    /// Counts one message and what the guard made of it.
    pub fn count<T>(&self, outcome: &JobOutcome<T>) {
        self.processed.fetch_add(1, Ordering::Relaxed);
        let counter = match outcome {
            JobOutcome::Executed(_) => &self.shipped,
            JobOutcome::Replayed(_) => &self.duplicates,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Messages handed to the job so far.
    #[must_use]
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Messages whose order was shipped (the job ran).
    #[must_use]
    pub fn shipped(&self) -> u64 {
        self.shipped.load(Ordering::Relaxed)
    }

    /// Duplicates answered from the store: the order was shipped before, the job did not run.
    #[must_use]
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// One line: processed, shipped, duplicates answered, and the rest (in flight in another
    /// delivery, mismatched, failed, or a store error: the broker redelivers or dead-letters
    /// those).
    #[must_use]
    pub fn summary(&self) -> String {
        let (processed, shipped, duplicates) =
            (self.processed(), self.shipped(), self.duplicates());
        let other = processed.saturating_sub(shipped + duplicates);
        format!(
            "processed {processed} messages: shipped {shipped}, answered {duplicates} duplicates \
             without shipping again, {other} other (in flight in another delivery and sent back \
             for later, mismatched, failed, or a store error)"
        )
    }
}

/// The demo job of the example binaries: "ships" an order (prints it) once per key, through
/// a guard on `store` (its metrics label `label`); a payload that is not JSON is a permanent
/// failure. The [`Tally`] counts what it did.
///
/// # Errors
/// Never in practice: the guard's default configuration is valid.
pub fn ship_orders(
    store: Arc<dyn Store>,
    label: &'static str,
) -> Result<(impl Fn(Job) -> DispositionFuture + Clone, Arc<Tally>), Error> {
    let guard = JobGuard::builder(store)
        .job_type("ship_order")
        .store_label(label)
        .build()?;
    let tally = Arc::new(Tally::default());
    let counted = tally.clone();
    let handler = move |job: Job| -> DispositionFuture {
        let (guard, tally) = (guard.clone(), counted.clone());
        Box::pin(async move {
            let run = guard
                .run_delivery(&job.key, job.fingerprint, job.delivery, |ctx| async move {
                    let order: serde_json::Value =
                        serde_json::from_slice(&job.payload).permanent()?;
                    println!("shipped {} (fence {})", ctx.key(), ctx.fence());
                    Ok::<_, JobError>(order)
                })
                .await;
            if let JobOutcome::Replayed(_) = run.outcome {
                println!(
                    "duplicate {}: shipped before, answered from the store",
                    job.key
                );
            }
            tally.count(&run.outcome);
            run.disposition
        })
    };
    Ok((handler, tally))
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
