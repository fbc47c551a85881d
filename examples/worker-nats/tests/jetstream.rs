//! Against the real NATS JetStream server (`IDEM_TEST_NATS_URL`, default 127.0.0.1:4222): each
//! disposition becomes ack, nak with delay or term, and duplicates take effect once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use idem_testkit::probe::{require_tcp, service_url};
use queue_common::scenario::{self, Tally};
use tokio_util::sync::CancellationToken;
use worker_nats::{consume, ensure_consumer};

/// A fresh stream over its own subject and a durable consumer `w` on it (at most 10
/// deliveries, `ack_wait`); `None` (outside CI) when no server listens.
struct Fixture {
    js: async_nats::jetstream::Context,
    stream: String,
    subject: String,
    consumer: async_nats::jetstream::consumer::PullConsumer,
}

impl Fixture {
    async fn new(ack_wait: Duration) -> Option<Fixture> {
        let url = service_url("IDEM_TEST_NATS_URL", "127.0.0.1:4222");
        if !require_tcp("NATS", url.trim_start_matches("nats://")) {
            return None;
        }
        let client = async_nats::connect(&url).await.unwrap();
        let run = format!("{}_{}", std::process::id(), scenario::unique());
        let stream = format!("IDEM_TEST_{run}");
        let subject = format!("idem.test.{run}");
        let consumer =
            ensure_consumer(&client, &stream, &format!("{subject}.>"), "w", 10, ack_wait)
                .await
                .unwrap();
        let js = async_nats::jetstream::new(client);
        Some(Fixture {
            js,
            stream,
            subject,
            consumer,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispositions_map_to_ack_nak_and_term() {
    let Some(Fixture {
        js,
        stream,
        subject,
        consumer,
    }) = Fixture::new(Duration::from_secs(10)).await
    else {
        return;
    };
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

/// A job longer than the consumer's `ack_wait` is not delivered again while it runs: the
/// consumer reports it in progress. (Without that, JetStream hands the message to the next
/// free slot after `ack_wait`, and the handler is called twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_ack_wait_is_delivered_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let ack_wait = Duration::from_secs(1);
    let Some(Fixture {
        js,
        stream,
        subject,
        consumer,
    }) = Fixture::new(ack_wait).await
    else {
        return;
    };
    let message = (Some("long".to_owned()), "{}".into());
    worker_nats::publish(&js, &format!("{subject}.job"), [message])
        .await
        .unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    let consuming = tokio::spawn(consume(consumer.clone(), 8, stop.clone(), {
        let (calls, finished) = (calls.clone(), finished.clone());
        move |_job| {
            let (calls, finished) = (calls.clone(), finished.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                // Three and a half ack waits.
                tokio::time::sleep(ack_wait * 7 / 2).await;
                finished.notify_one();
                idem_worker::Disposition::Ack
            }
        }
    }));
    finished.notified().await;
    // Past another ack wait, a redelivery would have arrived.
    tokio::time::sleep(ack_wait * 3 / 2).await;
    stop.cancel();
    consuming.await.unwrap().unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the message was delivered again"
    );
    let mut consumer = consumer;
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(info.num_ack_pending, 0, "the message was settled");
    js.delete_stream(&stream).await.unwrap();
}
