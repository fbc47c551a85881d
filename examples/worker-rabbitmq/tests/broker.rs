//! Against the real RabbitMQ broker (`IDEM_TEST_AMQP_URL`, default guest@127.0.0.1:5672): ack,
//! a delayed retry through the retry queue, and dead letters through the dead-letter exchange.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_testkit::probe::{require_tcp, service_url};
use std::time::Duration;

use lapin::options::{BasicGetOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use queue_common::scenario::{self, Tally};
use tokio_util::sync::CancellationToken;
use worker_rabbitmq::{DELIVERY_LIMIT, consume, declare, delivery_count_of, publish};

/// The broker's URL, or `None` (outside CI) when nothing listens there.
fn broker() -> Option<String> {
    let url = service_url(
        "IDEM_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let host_port = url
        .trim_start_matches("amqp://")
        .rsplit('@')
        .next()
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    require_tcp("RabbitMQ", &host_port).then_some(url)
}

/// A connection, a confirming channel and a freshly declared work queue named after `prefix`.
struct Broker {
    connection: std::sync::Arc<Connection>,
    channel: lapin::Channel,
    queue: String,
    names: worker_rabbitmq::Topology,
}

impl Broker {
    /// `None` (outside CI) when no broker listens.
    async fn with_queue(prefix: &str) -> Option<Broker> {
        let url = broker()?;
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let queue = format!("{prefix}.{}.{}", std::process::id(), scenario::unique());
        let names = declare(&channel, &queue).await.unwrap();
        Some(Broker {
            connection: std::sync::Arc::new(connection),
            channel,
            queue,
            names,
        })
    }

    /// Deletes the queues and the exchange `declare` made.
    async fn delete(&self) {
        let names = &self.names;
        for q in [&names.queue, &names.retry, &names.dead] {
            self.channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
        }
        self.channel
            .exchange_delete(names.dlx.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispositions_map_to_ack_retry_and_dead_letter() {
    let Some(broker) = Broker::with_queue("idem.test").await else {
        return;
    };
    let (channel, queue) = (&broker.channel, &broker.queue);
    for (key, body) in scenario::messages() {
        publish(channel, queue, key.as_deref(), body.as_bytes())
            .await
            .unwrap();
    }

    let tally = Tally::default();
    let stop = CancellationToken::new();
    let consuming = tokio::spawn({
        let (handler, stop, queue) = (tally.handler(), stop.clone(), queue.clone());
        let connection = broker.connection.clone();
        async move {
            consume(&connection, &queue, 8, stop, handler)
                .await
                .unwrap()
        }
    });
    tally.wait().await;
    stop.cancel();
    consuming.await.unwrap();
    tally.check();

    // The dead letters: the permanent failure and the message without a key.
    let mut dead = 0;
    while let Some(_message) = channel
        .basic_get(
            broker.names.dead.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        dead += 1;
    }
    assert_eq!(dead, 2);
    broker.delete().await;
}

/// A message whose consumer dies before settling it (its channel closes) comes back with the
/// broker's count, which the delivery count includes, and once it has been delivered
/// `DELIVERY_LIMIT` times without being settled, the work queue dead-letters it: a poison
/// message that crashes every worker ends in the dead-letter queue instead of looping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_crashing_its_consumer_is_dead_lettered() {
    let Some(broker) = Broker::with_queue("idem.test.poison").await else {
        return;
    };
    let (connection, names) = (&broker.connection, &broker.names);
    publish(&broker.channel, &broker.queue, Some("poison"), b"{}")
        .await
        .unwrap();

    let limit = u32::try_from(DELIVERY_LIMIT).unwrap();
    let mut deliveries = 0u32;
    let dead = loop {
        // Wherever the broker put the message: back on the work queue, or dead-lettered.
        let (consumer, message, dead) = 'found: {
            for _ in 0..200 {
                let consumer = connection.create_channel().await.unwrap();
                for (q, dead) in [(&names.queue, false), (&names.dead, true)] {
                    if let Some(message) = consumer
                        .basic_get(q.as_str().into(), BasicGetOptions { no_ack: false })
                        .await
                        .unwrap()
                    {
                        break 'found (consumer, message, dead);
                    }
                }
                consumer.close(200, "empty".into()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the message is neither on the work queue nor dead-lettered");
        };
        if dead {
            break message;
        }
        deliveries += 1;
        let count = delivery_count_of(
            message.delivery.properties.headers().as_ref(),
            message.delivery.redelivered,
        );
        assert_eq!(
            count, deliveries,
            "the delivery count of delivery {deliveries}"
        );
        assert!(
            deliveries <= limit + 1,
            "the message was never dead-lettered"
        );
        // The consumer dies: its channel closes with the message unsettled.
        consumer.close(200, "crashed".into()).await.unwrap();
    };
    assert!(
        deliveries >= limit,
        "dead-lettered after {deliveries} deliveries"
    );
    assert_eq!(&dead.delivery.data[..], b"{}");
    broker.delete().await;
}

/// A retried message is the same message: the copy that goes through the retry queue keeps the
/// original's properties (content type, message id, correlation id...) beside the key header,
/// with the next delivery count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_message_keeps_its_properties() {
    use lapin::BasicProperties;
    use lapin::options::BasicPublishOptions;
    use lapin::types::{AMQPValue, FieldTable, LongString};
    use worker_rabbitmq::{DELIVERY_HEADER, KEY_HEADER, settle};

    let Some(broker) = Broker::with_queue("idem.test.props").await else {
        return;
    };
    let (channel, names) = (&broker.channel, &broker.names);
    let mut headers = FieldTable::default();
    headers.insert(
        KEY_HEADER.into(),
        AMQPValue::LongString(LongString::from("props:1")),
    );
    let properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id("msg-1".into())
        .with_correlation_id("corr-1".into())
        .with_app_id("billing".into());
    channel
        .basic_publish(
            "".into(),
            broker.queue.as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let get = |queue: String| async move {
        for _ in 0..200 {
            if let Some(message) = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap()
            {
                return message;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("nothing on {queue}");
    };
    let first = get(broker.queue.clone()).await;
    settle(
        channel,
        names,
        &first.delivery,
        idem_worker::Disposition::Retry {
            after: Duration::from_millis(1),
        },
    )
    .await
    .unwrap();
    // Back on the work queue once its delay ran out in the retry queue.
    let again = get(broker.queue.clone()).await;
    let props = &again.delivery.properties;
    assert_eq!(
        props.content_type().as_ref().map(|v| v.as_str()),
        Some("application/json")
    );
    assert_eq!(
        props.message_id().as_ref().map(|v| v.as_str()),
        Some("msg-1")
    );
    assert_eq!(
        props.correlation_id().as_ref().map(|v| v.as_str()),
        Some("corr-1")
    );
    assert_eq!(props.app_id().as_ref().map(|v| v.as_str()), Some("billing"));
    let headers = props.headers().as_ref().unwrap().inner();
    assert!(headers.contains_key(KEY_HEADER));
    assert_eq!(
        delivery_count_of(props.headers().as_ref(), again.delivery.redelivered),
        2
    );
    assert!(headers.contains_key(DELIVERY_HEADER));
    again
        .delivery
        .ack(lapin::options::BasicAckOptions::default())
        .await
        .unwrap();
    broker.delete().await;
}
