//! End-to-end: an upstream whose response body is slow. The head and the bytes that came are
//! passed on at once (a keyed response included), and a body that stops for longer than
//! `body_idle_timeout` is broken off and its key released, instead of holding the client and
//! the key for as long as the upstream keeps the connection open.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, config};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_core::{IdempotencyKey, RecordKey, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// An upstream that answers each request with a 20-byte body announced by `Content-Length`:
/// the head and 10 bytes at once, the other 10 once `more` is notified (never, if it is not).
/// Counts the requests it got.
async fn half_body_upstream(more: Arc<Notify>) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let counted = runs.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (more, counted) = (more.clone(), counted.clone());
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let _ = stream.read(&mut request).await;
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n0123456789")
                    .await;
                more.notified().await;
                let _ = stream.write_all(b"abcdefghij").await;
                // Held open: the gateway must not wait for the close.
                tokio::time::sleep(Duration::from_secs(600)).await;
            });
        }
    });
    (addr, runs)
}

fn keyed(url: &str, key: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap()
}

/// The head and the first 10 bytes of a keyed response reach the client before the upstream
/// sends the rest (the upstream sends it only once the client has the head: before, the
/// gateway held the head until the whole body came, so this waited forever); the whole
/// response is then stored and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_keyed_body_passes_its_head_on_and_is_stored_whole() {
    let more = Arc::new(Notify::new());
    let (upstream, runs) = half_body_upstream(more.clone()).await;
    let gateway = Gateway::start(&config(upstream, "")).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(keyed(&gateway.url("/pay"), "slow-1")),
    )
    .await
    .expect("the head was held back until the whole body came")
    .unwrap();
    assert_eq!(response.status(), 200);
    more.notify_one();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"0123456789abcdefghij");
    let replay = client
        .request(keyed(&gateway.url("/pay"), "slow-1"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = replay.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(replayed, body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body that stops halfway is broken off after `body_idle_timeout` (the client's body is
/// cut short), and its key is held as unknown: the upstream answered, so it may have taken
/// effect, and a retry is told so rather than run again. Before, the key stayed in flight,
/// kept by heartbeats, for as long as the upstream held the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_is_broken_off_after_the_idle_timeout() {
    let (upstream, runs) = half_body_upstream(Arc::new(Notify::new())).await;
    let mut config = config(upstream, "");
    config.upstream.as_mut().unwrap().body_idle_timeout = Duration::from_millis(300);
    let gateway = Gateway::start(&config).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(keyed(&gateway.url("/pay"), "stalled")),
    )
    .await
    .expect("the head came")
    .unwrap();
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the body was broken off");
    assert!(body.is_err(), "a body cut short");
    let key = RecordKey::unscoped(IdempotencyKey::new("stalled").unwrap());
    let held = common::eventually(Duration::from_secs(10), || async {
        let record = gateway.store.get(&key).await.unwrap();
        record.is_some_and(|r| r.state == idem_core::State::Unknown)
    })
    .await;
    assert!(held, "the key was not held as unknown");
    let retry = client
        .request(keyed(&gateway.url("/pay"), "stalled"))
        .await
        .unwrap();
    assert_eq!(retry.status(), 409);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
