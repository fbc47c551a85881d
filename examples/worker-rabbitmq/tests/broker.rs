//! Against the real RabbitMQ broker (`IDEM_TEST_AMQP_URL`, default guest@127.0.0.1:5672): ack,
//! a delayed retry through the retry queue, and dead letters through the dead-letter exchange.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_testkit::probe::{require_tcp, service_url};
use lapin::options::{BasicGetOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use queue_common::scenario::{self, Tally};
use tokio_util::sync::CancellationToken;
use worker_rabbitmq::{consume, declare, publish};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispositions_map_to_ack_retry_and_dead_letter() {
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
    if !require_tcp("RabbitMQ", &host_port) {
        return;
    }
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let queue = format!("idem.test.{}.{}", std::process::id(), scenario::unique());
    let names = declare(&channel, &queue).await.unwrap();
    for (key, body) in scenario::messages() {
        publish(&channel, &queue, key.as_deref(), body.as_bytes())
            .await
            .unwrap();
    }

    let tally = Tally::default();
    let stop = CancellationToken::new();
    let consuming = tokio::spawn({
        let (handler, stop, queue) = (tally.handler(), stop.clone(), queue.clone());
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
        .basic_get(names.dead.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        dead += 1;
    }
    assert_eq!(dead, 2);
    for q in [&names.queue, &names.retry, &names.dead] {
        channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    channel
        .exchange_delete(names.dlx.as_str().into(), Default::default())
        .await
        .unwrap();
}
