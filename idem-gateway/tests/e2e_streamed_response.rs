//! End-to-end: a large upstream response is streamed through the idempotency layer, not
//! collected. The upstream (a raw TCP socket) announces 5 MiB and holds back its last chunk
//! until the client has received the first bytes; the gateway runs in this process on the
//! memory store, on 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, Http, config};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The length of the upstream's body.
const LEN: usize = 5 * 1024 * 1024;
/// The part of it the upstream holds back.
const LAST: usize = 64 * 1024;
/// Bounds the exchange: a gateway that collects the body before passing it on never sends the
/// first byte, and the test fails at this bound instead of hanging.
const HANG: Duration = Duration::from_secs(60);

/// The byte at `at` of the upstream's body.
fn byte(at: usize) -> u8 {
    (at % 251) as u8
}

/// An upstream that answers each connection's request `201` with a body of [`LEN`] bytes
/// (`Content-Length`), sends all but the last [`LAST`] bytes, and those only once `release` is
/// notified. Counts its runs.
async fn held_back_upstream(release: Arc<Notify>, runs: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body: Vec<u8> = (0..LEN).map(byte).collect();
    let body = Bytes::from(body);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (release, runs, body) = (release.clone(), runs.clone(), body.clone());
            tokio::spawn(async move {
                // The request: its head, then as many bytes as its Content-Length says.
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while request.len() < head_end + length {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                runs.fetch_add(1, Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 201 Created\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {LEN}\r\nConnection: close\r\n\r\n"
                );
                if socket.write_all(head.as_bytes()).await.is_err()
                    || socket.write_all(&body[..LEN - LAST]).await.is_err()
                {
                    return;
                }
                release.notified().await;
                let _ = socket.write_all(&body[LEN - LAST..]).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    addr
}

/// A keyed request whose upstream response is 5 MiB: the client receives its first bytes while
/// the upstream still holds back its last chunk (the upstream sends that chunk only once the
/// client has them), then all of it, byte for byte. A retry gets the stored status and headers
/// with `Idempotency-Replay: omitted` (5 MiB is over the default cap of 1 MiB), and the
/// upstream ran once. Before, a known length up to 16 times the storage cap was read whole
/// before its first byte went out: the exchange never finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_response_reaches_the_client_before_its_last_byte_leaves_the_upstream() {
    let release = Arc::new(Notify::new());
    let runs = Arc::new(AtomicU64::new(0));
    let upstream = held_back_upstream(release.clone(), runs.clone()).await;
    let gateway = Gateway::start(&config(upstream, "")).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method(Method::POST)
        .uri(gateway.url("/upload"))
        .header("idempotency-key", "\"big-1\"")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let exchange = async {
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 201);
        let mut body = response.into_body();
        let mut received = Vec::with_capacity(LEN);
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                if received.is_empty() && !data.is_empty() {
                    // The first bytes are here: only now does the upstream send its last chunk.
                    release.notify_one();
                }
                received.extend_from_slice(&data);
            }
        }
        received
    };
    let received = tokio::time::timeout(HANG, exchange)
        .await
        .expect("the client got no first bytes while the upstream held back its last chunk");
    assert_eq!(received.len(), LEN);
    assert!(received.iter().enumerate().all(|(at, b)| *b == byte(at)));

    let replay = Http::new()
        .post_key(&gateway.url("/upload"), "big-1", "{}")
        .await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.header("idempotency-replay"), Some("omitted"));
    assert!(replay.body.is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
