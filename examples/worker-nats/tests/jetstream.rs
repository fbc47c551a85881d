//! Against the real NATS JetStream server (`IDEM_TEST_NATS_URL`, default 127.0.0.1:4222): each
//! disposition becomes ack, nak with delay or term, and duplicates take effect once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use idem_testkit::probe::{require_tcp, service_url};
use queue_common::scenario::{self, Tally};
use tokio_util::sync::CancellationToken;
use worker_nats::{consume, ensure_consumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispositions_map_to_ack_nak_and_term() {
    let url = service_url("IDEM_TEST_NATS_URL", "127.0.0.1:4222");
    if !require_tcp("NATS", url.trim_start_matches("nats://")) {
        return;
    }
    let client = async_nats::connect(&url).await.unwrap();
    let run = format!("{}_{}", std::process::id(), scenario::unique());
    let stream = format!("IDEM_TEST_{run}");
    let subject = format!("idem.test.{run}");
    let consumer = ensure_consumer(
        &client,
        &stream,
        &format!("{subject}.>"),
        "w",
        10,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let messages = scenario::messages()
        .into_iter()
        .map(|(key, body)| (key, body.into()));
    worker_nats::publish(&js, &format!("{subject}.job"), messages)
        .await
        .unwrap();

    let tally = Tally::default();
    let stop = CancellationToken::new();
    let consuming = tokio::spawn(consume(consumer.clone(), 8, stop.clone(), tally.handler()));
    tally.wait().await;
    stop.cancel();
    consuming.await.unwrap().unwrap();
    tally.check();

    let mut consumer = consumer;
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(info.num_ack_pending, 0, "every message settled");
    assert_eq!(info.num_pending, 0);
    js.delete_stream(&stream).await.unwrap();
}
