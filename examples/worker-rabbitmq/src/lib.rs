//! A RabbitMQ consumer (lapin) behind idem-worker.
//!
//! [`declare`] sets up, for a work queue `Q`:
//! - `Q`, a quorum queue (durable, replicated where the broker is a cluster), whose rejected
//!   messages go to the dead-letter exchange `Q.dlx`, and which dead-letters by itself a message
//!   delivered [`DELIVERY_LIMIT`] times without being settled: a poison message that crashes
//!   every worker that takes it (nothing reports its failure, so no retry policy can count it)
//!   ends in `Q.dead` instead of crashing workers forever;
//! - `Q.dlx` (fanout) and the queue `Q.dead` bound to it: the dead letters, for an operator;
//! - `Q.retry`, a queue without consumers whose expired messages go back to `Q`: a delay line.
//!
//! [`consume`] hands every delivery to a handler that runs it through a
//! [`JobGuard`](idem_worker::JobGuard), and maps the [`Disposition`]:
//!
//! | disposition | RabbitMQ |
//! |---|---|
//! | ack | `basic.ack` |
//! | retry after a delay | a copy (the same properties and headers) goes to `Q.retry` with that per-message TTL and the next delivery count in `x-idem-delivery` (publisher-confirmed), then `basic.ack`; if that publish fails, `basic.nack` with requeue |
//! | dead-letter | `basic.nack` without requeue: the broker routes it through `Q.dlx` to `Q.dead` |
//!
//! The key is the `Idempotency-Key` header, else the `key` field of a JSON body; a message
//! without one is dead-lettered. Per-message TTLs expire at the head of `Q.retry` only, so a
//! long delay holds back the shorter ones behind it: fine for backoff, where delays grow.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_store_memory::MemoryStore;
//! use idem_worker::{JobError, JobGuard};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let connection = lapin::Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", Default::default()).await?;
//! let channel = connection.create_channel().await?;
//! worker_rabbitmq::declare(&channel, "emails").await?;
//! let guard = JobGuard::builder(Arc::new(MemoryStore::new())).job_type("email").build()?;
//! worker_rabbitmq::consume(&connection, "emails", 16, CancellationToken::new(), move |job| {
//!     let guard = guard.clone();
//!     async move {
//!         guard
//!             .run_delivery(&job.key, job.fingerprint, job.delivery, |ctx| async move {
//!                 Ok::<_, JobError>(format!("sent {}", ctx.key()))
//!             })
//!             .await
//!             .disposition
//!     }
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use idem_core::{Bytes, IdempotencyKey};
use idem_worker::Disposition;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind};
pub use queue_common::{Error, Job, KEY_HEADER};
use tokio_util::sync::CancellationToken;

/// The header that carries the delivery count of a retried message.
pub const DELIVERY_HEADER: &str = "x-idem-delivery";

/// The header a quorum queue sets on a message it delivers again after a consumer left it
/// unsettled (a crash, a closed channel, a requeue): how many times that happened.
pub const BROKER_DELIVERY_HEADER: &str = "x-delivery-count";

/// How many times the work queue delivers a message that its consumers leave unsettled before
/// it dead-letters it (`x-delivery-limit`). Settled deliveries do not count: a retry is a new
/// copy with its own count, bounded by the guard's retry policy.
pub const DELIVERY_LIMIT: i32 = 20;

/// The names of the queues and exchange of work queue `queue`.
#[derive(Clone, Debug)]
pub struct Topology {
    /// The work queue.
    pub queue: String,
    /// The dead-letter exchange.
    pub dlx: String,
    /// The queue of dead letters.
    pub dead: String,
    /// The delay line of retries.
    pub retry: String,
}

impl Topology {
    /// The names for work queue `queue`.
    #[must_use]
    pub fn of(queue: &str) -> Self {
        Topology {
            queue: queue.to_owned(),
            dlx: format!("{queue}.dlx"),
            dead: format!("{queue}.dead"),
            retry: format!("{queue}.retry"),
        }
    }
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(ShortString::from(*name), value.clone());
    }
    table
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Declares the work queue `queue`, its dead-letter exchange and queue, and its retry queue.
///
/// # Errors
/// The broker's refusal (a queue declared before with other arguments), or a lost connection.
pub async fn declare(channel: &Channel, queue: &str) -> Result<Topology, Error> {
    let names = Topology::of(queue);
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .exchange_declare(
            names.dlx.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(names.dead.as_str().into(), durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            names.dead.as_str().into(),
            names.dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            names.queue.as_str().into(),
            durable,
            table(&[
                ("x-queue-type", text("quorum")),
                ("x-delivery-limit", AMQPValue::LongInt(DELIVERY_LIMIT)),
                ("x-dead-letter-exchange", text(&names.dlx)),
            ]),
        )
        .await?;
    channel
        .queue_declare(
            names.retry.as_str().into(),
            durable,
            table(&[
                ("x-dead-letter-exchange", text("")),
                ("x-dead-letter-routing-key", text(&names.queue)),
            ]),
        )
        .await?;
    Ok(names)
}

/// Publishes `payload` onto `queue` (through the default exchange) with the key header, and
/// waits for the broker's confirmation (the channel must be in confirm mode).
///
/// # Errors
/// The broker's refusal, or a lost connection.
pub async fn publish(
    channel: &Channel,
    queue: &str,
    key: Option<&str>,
    payload: &[u8],
) -> Result<(), Error> {
    let headers = key.map_or_else(FieldTable::default, |key| table(&[(KEY_HEADER, text(key))]));
    let properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            properties,
        )
        .await?
        .await?;
    Ok(())
}

/// The key of a delivery: its `Idempotency-Key` header, else the `key` field of its JSON body.
#[must_use]
pub fn message_key(headers: Option<&FieldTable>, payload: &[u8]) -> Option<IdempotencyKey> {
    if let Some(value) = headers.and_then(|h| h.inner().get(KEY_HEADER)) {
        return match value {
            AMQPValue::LongString(text) => IdempotencyKey::from_bytes(text.as_bytes()).ok(),
            AMQPValue::ShortString(text) => IdempotencyKey::new(text.as_str()).ok(),
            _ => None,
        };
    }
    queue_common::key_from_json(payload)
}

fn delivery_count(delivery: &Delivery) -> u32 {
    delivery_count_of(delivery.properties.headers().as_ref(), delivery.redelivered)
}

/// The delivery count (1-based) of a message with `headers`: the count of its copy
/// ([`DELIVERY_HEADER`], 1 when absent) plus the times the broker delivered this copy before
/// ([`BROKER_DELIVERY_HEADER`] on a quorum queue; else 1 if `redelivered`).
#[must_use]
pub fn delivery_count_of(headers: Option<&FieldTable>, redelivered: bool) -> u32 {
    let header = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(|value| match value {
                AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
                AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
                AMQPValue::LongUInt(n) => Some(*n),
                AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
                AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
                _ => None,
            })
    };
    let copy = header(DELIVERY_HEADER).unwrap_or(1).max(1);
    let before = header(BROKER_DELIVERY_HEADER).unwrap_or(u32::from(redelivered));
    copy.saturating_add(before)
}

/// Applies `disposition` to `delivery`, publishing retries on `channel` (in confirm mode).
///
/// # Errors
/// The broker's refusal, or a lost connection (the message then comes back to another
/// consumer, whose guard answers it).
pub async fn settle(
    channel: &Channel,
    names: &Topology,
    delivery: &Delivery,
    disposition: Disposition,
) -> Result<(), Error> {
    match disposition {
        Disposition::Ack => {
            delivery.ack(BasicAckOptions::default()).await?;
        }
        Disposition::DeadLetter => {
            delivery
                .nack(BasicNackOptions {
                    requeue: false,
                    ..BasicNackOptions::default()
                })
                .await?;
        }
        Disposition::Retry { after } => {
            // The copy starts a fresh broker count: what the broker counted is in `next`.
            let mut headers: FieldTable = delivery
                .properties
                .headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .filter(|(name, _)| name.as_str() != BROKER_DELIVERY_HEADER)
                        .map(|(name, value)| (name.clone(), value.clone()))
                        .collect::<std::collections::BTreeMap<_, _>>()
                        .into()
                })
                .unwrap_or_default();
            let next = i64::from(delivery_count(delivery).saturating_add(1));
            headers.insert(DELIVERY_HEADER.into(), AMQPValue::LongLongInt(next));
            let millis = after.as_millis().max(1).to_string();
            // The same message: its properties (content type, message id...) go along; only
            // the headers, the persistence and the delay are the copy's own.
            let properties = delivery
                .properties
                .clone()
                .with_headers(headers)
                .with_delivery_mode(2)
                .with_expiration(millis.as_str().into());
            let delayed = async {
                channel
                    .basic_publish(
                        "".into(),
                        names.retry.as_str().into(),
                        BasicPublishOptions::default(),
                        &delivery.data,
                        properties,
                    )
                    .await?
                    .await
            }
            .await;
            match delayed {
                // The copy is safe in the delay line: drop the original. (A crash between
                // the two leaves two copies: the guard answers the second.)
                Ok(_) => {
                    delivery.ack(BasicAckOptions::default()).await?;
                }
                Err(error) => {
                    tracing::warn!(%error, "delayed retry failed: requeueing at once");
                    delivery
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..BasicNackOptions::default()
                        })
                        .await?;
                }
            }
        }
    }
    Ok(())
}

/// Consumes `queue` (declared with [`declare`]) until `stop` fires, handing each delivery to
/// `handle` (at most `concurrency` at a time, also the prefetch) and settling it with the
/// disposition `handle` returns. Waits for the deliveries in hand before returning.
///
/// # Errors
/// The channel or the consumer could not be set up.
pub async fn consume<F, Fut>(
    connection: &Connection,
    queue: &str,
    concurrency: u16,
    stop: CancellationToken,
    handle: F,
) -> Result<(), Error>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Disposition> + Send + 'static,
{
    let names = Arc::new(Topology::of(queue));
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(concurrency.max(1), BasicQosOptions::default())
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let deliveries = channel
        .basic_consume(
            queue.into(),
            ShortString::from(format!("idem-{}", std::process::id())),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    queue_common::dispatch(deliveries, usize::from(concurrency), stop, move |delivery: Delivery| {
        let handled = job_of(&delivery).map(&handle);
        let (channel, names) = (channel.clone(), names.clone());
        async move {
            let disposition = match handled {
                Some(handled) => handled.await,
                None => {
                    tracing::warn!("delivery without a usable key: dead-lettered");
                    Disposition::DeadLetter
                }
            };
            if let Err(error) = settle(&channel, &names, &delivery, disposition).await {
                tracing::warn!(%error, %disposition, "settling the delivery failed; it will be redelivered");
            }
        }
    })
    .await;
    Ok(())
}

fn job_of(delivery: &Delivery) -> Option<Job> {
    let key = message_key(delivery.properties.headers().as_ref(), &delivery.data)?;
    Some(Job::new(
        key,
        Bytes::copy_from_slice(&delivery.data),
        delivery_count(delivery),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
        table(entries)
    }

    #[test]
    fn the_delivery_count_adds_the_brokers_count_to_the_copys() {
        assert_eq!(delivery_count_of(None, false), 1);
        assert_eq!(delivery_count_of(None, true), 2);
        let retried = headers(&[(DELIVERY_HEADER, AMQPValue::LongLongInt(3))]);
        assert_eq!(delivery_count_of(Some(&retried), false), 3);
        assert_eq!(delivery_count_of(Some(&retried), true), 4);
        // A quorum queue says how often: the flag adds nothing more.
        let crashed = headers(&[
            (DELIVERY_HEADER, AMQPValue::LongLongInt(3)),
            (BROKER_DELIVERY_HEADER, AMQPValue::LongLongInt(5)),
        ]);
        assert_eq!(delivery_count_of(Some(&crashed), true), 8);
        let odd = headers(&[
            (DELIVERY_HEADER, AMQPValue::LongLongInt(-1)),
            (BROKER_DELIVERY_HEADER, text("x")),
        ]);
        assert_eq!(delivery_count_of(Some(&odd), false), 1);
    }
}
