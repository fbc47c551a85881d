//! A NATS JetStream pull consumer behind idem-worker.
//!
//! Each message names its business operation: the `Idempotency-Key` header, or the `key`
//! field of a JSON body. [`consume`] hands every message to a handler that runs it through a
//! [`JobGuard`](idem_worker::JobGuard) and maps the [`Disposition`] onto JetStream:
//!
//! | disposition | JetStream |
//! |---|---|
//! | ack | `double_ack` (waits for the server's confirmation, so a lost ack is noticed) |
//! | retry after a delay | `nak` with that delay |
//! | dead-letter | `term` (no more redelivery; the server emits a `MSG_TERMINATED` advisory) |
//!
//! While a message's handler runs, [`consume`] tells JetStream it is in progress (`+WPI`) every
//! half of the consumer's `ack_wait`, so a job longer than `ack_wait` is not delivered again to
//! another worker while it runs (the guard would answer that copy as in flight, but it costs a
//! delivery and a nak each time); a worker that dies stops the in-progress acks, and the
//! message comes back after `ack_wait` as before.
//!
//! A message without a usable key is terminated at once. The delivery count the handler gets
//! is JetStream's own (`info.delivered`), so the guard's retry policy bounds it; give the
//! consumer a `max_deliver` above the policy's attempts.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use idem_store_memory::MemoryStore;
//! use idem_worker::{JobError, JobGuard};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = async_nats::connect("127.0.0.1:4222").await?;
//! let consumer = worker_nats::ensure_consumer(&client, "JOBS", "jobs.>", "workers", 10, Duration::from_secs(10)).await?;
//! let guard = JobGuard::builder(Arc::new(MemoryStore::new())).job_type("email").build()?;
//! worker_nats::consume(consumer, 16, CancellationToken::new(), move |job| {
//!     let guard = guard.clone();
//!     async move {
//!         let run = guard
//!             .run_delivery(&job.key, job.fingerprint, job.delivery, |ctx| async move {
//!                 // The side effect, with ctx.key() passed downstream.
//!                 Ok::<_, JobError>(format!("sent {}", ctx.key()))
//!             })
//!             .await;
//!         run.disposition
//!     }
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind, stream};
use async_nats::{Client, HeaderMap};
use idem_core::{Bytes, IdempotencyKey};
use idem_worker::Disposition;
pub use queue_common::{Error, Job, KEY_HEADER};
use tokio_util::sync::CancellationToken;

/// The key of a message: its `Idempotency-Key` header, else the `key` field of its JSON body.
#[must_use]
pub fn message_key(headers: Option<&HeaderMap>, payload: &[u8]) -> Option<IdempotencyKey> {
    match headers.and_then(|h| h.get(KEY_HEADER)) {
        Some(value) => IdempotencyKey::new(value.as_str()).ok(),
        None => queue_common::key_from_json(payload),
    }
}
/// Creates (or finds) the stream `stream` over `subjects` and the durable pull consumer
/// `durable` on it, with explicit acks, at most `max_deliver` deliveries per message (-1: no
/// limit) and `ack_wait` before a message in the hands of a dead worker comes back (make it
/// longer than a job).
///
/// # Errors
/// JetStream's refusal, or a lost connection.
pub async fn ensure_consumer(
    client: &Client,
    stream: &str,
    subjects: &str,
    durable: &str,
    max_deliver: i64,
    ack_wait: Duration,
) -> Result<PullConsumer, Error> {
    let js = jetstream::new(client.clone());
    let stream = js
        .get_or_create_stream(stream::Config {
            name: stream.to_owned(),
            subjects: vec![subjects.to_owned()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            durable,
            pull::Config {
                durable_name: Some(durable.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ack_wait,
                max_deliver,
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

/// Publishes `(key, payload)` messages on `subject`, the key in the `Idempotency-Key` header
/// (none: no header), and waits for the stream's acks, a batch at a time (the client bounds
/// the acks it keeps pending: awaiting them all at the end would stall a large batch).
///
/// # Errors
/// The server's refusal, or a lost connection.
pub async fn publish<I>(js: &jetstream::Context, subject: &str, messages: I) -> Result<(), Error>
where
    I: IntoIterator<Item = (Option<String>, Bytes)>,
{
    const BATCH: usize = 256;
    let mut acks = Vec::with_capacity(BATCH);
    let mut messages = messages.into_iter().peekable();
    while let Some((key, payload)) = messages.next() {
        let mut headers = HeaderMap::new();
        if let Some(key) = key {
            headers.insert(KEY_HEADER, key.as_str());
        }
        acks.push(
            js.publish_with_headers(subject.to_owned(), headers, payload)
                .await?,
        );
        if acks.len() == BATCH || messages.peek().is_none() {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    Ok(())
}

/// Applies `disposition` to `message`: ack, nak with a delay, or term.
///
/// # Errors
/// The server's refusal, or a lost connection (the message is then redelivered after the
/// consumer's ack wait: the guard answers the redelivery).
pub async fn settle(message: &jetstream::Message, disposition: Disposition) -> Result<(), Error> {
    match disposition {
        Disposition::Ack => message.double_ack().await,
        Disposition::Retry { after } => message.ack_with(AckKind::Nak(Some(after))).await,
        Disposition::DeadLetter => message.ack_with(AckKind::Term).await,
    }
}

/// Pulls messages until `stop` fires, handing each to `handle` (at most `concurrency` at a
/// time) and settling it with the disposition `handle` returns. Waits for the messages in
/// hand before returning.
///
/// # Errors
/// The message stream failed to start.
pub async fn consume<F, Fut>(
    consumer: PullConsumer,
    concurrency: usize,
    stop: CancellationToken,
    handle: F,
) -> Result<(), Error>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Disposition> + Send + 'static,
{
    let progress_every = progress_interval(consumer.cached_info().config.ack_wait);
    let messages = consumer.messages().await?;
    queue_common::dispatch(messages, concurrency, stop, move |message: jetstream::Message| {
        let job = job_of(&message);
        let handled = job.map(&handle);
        async move {
            let disposition = match handled {
                Some(handled) => in_progress(&message, progress_every, handled).await,
                None => {
                    tracing::warn!(subject = %message.subject, "message without a usable key: terminated");
                    Disposition::DeadLetter
                }
            };
            if let Err(error) = settle(&message, disposition).await {
                tracing::warn!(%error, %disposition, "settling the message failed; it will be redelivered");
            }
        }
    })
    .await;
    Ok(())
}

/// How often a message in hand is reported in progress: half the consumer's `ack_wait` (the
/// server's default of 30 s when the consumer has none), at least 100 ms.
fn progress_interval(ack_wait: Duration) -> Duration {
    let ack_wait = if ack_wait.is_zero() {
        Duration::from_secs(30)
    } else {
        ack_wait
    };
    (ack_wait / 2).max(Duration::from_millis(100))
}

/// Runs `work`, acking `message` as in progress every `every` until it ends.
async fn in_progress<T>(
    message: &jetstream::Message,
    every: Duration,
    work: impl Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticks.tick() => {
                if let Err(error) = message.ack_with(AckKind::Progress).await {
                    tracing::warn!(%error, "the in-progress ack failed; the message may be delivered again");
                }
            }
        }
    }
}

fn job_of(message: &jetstream::Message) -> Option<Job> {
    let key = message_key(message.headers.as_ref(), &message.payload)?;
    let delivery = message
        .info()
        .ok()
        .map_or(1, |info| u32::try_from(info.delivered).unwrap_or(u32::MAX));
    Some(Job::new(key, Bytes::clone(&message.payload), delivery))
}
