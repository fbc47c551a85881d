//! End-to-end: the layer's behaviours (idem-http's README) through `idem serve` (in this process, on
//! the memory store) in front of the idem-fixture upstream (`--bare`), all on 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use common::{Fixture, Gateway, Http, config, eventually, free_addr, idem_command, spawn_gateway};
use http::Method;
use idem_core::{IdempotencyKey, RecordKey, State, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PAYMENTS: &str = "[[route]]\nname = \"payments\"\npath = \"/echo\"\nkey = \"required\"\n";

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

/// Waits (2 s at most) until `gateway`'s store holds a record of `key`: its request reached
/// the gateway and claimed the key.
async fn until_claimed(gateway: &Gateway, key: &str) -> bool {
    eventually(Duration::from_secs(2), || async {
        gateway.store.get(&record_key(key)).await.unwrap().is_some()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_replayed_and_the_upstream_runs_once() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, PAYMENTS)).await;
    let http = Http::new();

    let first = http
        .post_key(&gateway.url("/echo"), "pay-1", "10 EUR")
        .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(first.text(), "10 EUR");

    let retry = http
        .post_key(&gateway.url("/echo"), "pay-1", "10 EUR")
        .await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.header("content-type"), first.header("content-type"));
    assert_eq!(fixture.count().await, 1);

    // Stored under the key, completed.
    let record = gateway
        .store
        .get(&record_key("pay-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, State::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatch_missing_and_invalid_keys_are_refused_before_the_upstream() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, PAYMENTS)).await;
    let http = Http::new();
    let url = gateway.url("/echo");
    assert_eq!(http.post_key(&url, "k", "a").await.status, 201);

    let mismatch = http.post_key(&url, "k", "b").await;
    assert_eq!(mismatch.status, 422);
    assert_eq!(
        mismatch.header("content-type"),
        Some("application/problem+json")
    );

    let missing = http.send(Method::POST, &url, &[], "a").await;
    assert_eq!(missing.status, 400);
    for bad in ["", "\"a\", \"b\"", &"x".repeat(256)] {
        let reply = http
            .send(Method::POST, &url, &[("idempotency-key", bad)], "a")
            .await;
        assert_eq!(reply.status, 400, "{bad:?}");
    }
    assert_eq!(fixture.count().await, 1);
    // The original record is untouched by the mismatch.
    let replay = http.post_key(&url, "k", "a").await;
    assert!(replay.replayed() && replay.text() == "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncovered_methods_and_unkeyed_optional_routes_pass_through() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    // The default route: key optional. Without a key, each POST runs.
    for _ in 0..2 {
        assert_eq!(
            http.send(Method::POST, &gateway.url("/echo"), &[], "x")
                .await
                .status,
            201
        );
    }
    assert_eq!(fixture.count().await, 2);
    // GET is not covered: never stored, even with a key.
    let get = http
        .send(
            Method::GET,
            &gateway.url("/counter"),
            &[("idempotency-key", "g")],
            "",
        )
        .await;
    assert_eq!(get.status, 200);
    assert!(gateway.store.get(&record_key("g")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    let url = gateway.url("/slow?ms=1500");
    let first = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { http.post_key(&url, "slow-1", "").await }
    });
    assert!(until_claimed(&gateway, "slow-1").await);
    let duplicate = http.post_key(&url, "slow-1", "").await;
    assert_eq!(duplicate.status, 409);
    let retry_after: u64 = duplicate.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    // Same key, another request, while in flight: 422 wins over 409.
    assert_eq!(
        http.post_key(&gateway.url("/slow?ms=1"), "slow-1", "")
            .await
            .status,
        422
    );
    assert_eq!(first.await.unwrap().status, 200);
    assert!(http.post_key(&url, "slow-1", "").await.replayed());
    assert_eq!(fixture.count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_release_the_key_and_client_errors_are_stored() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    for _ in 0..2 {
        let reply = http.post_key(&gateway.url("/status/503"), "five", "").await;
        assert_eq!(reply.status, 503);
        assert!(!reply.replayed());
    }
    assert_eq!(
        fixture.count().await,
        2,
        "a 5xx releases the key: the retry ran"
    );
    assert_eq!(
        http.post_key(&gateway.url("/status/404"), "four", "")
            .await
            .status,
        404
    );
    let again = http.post_key(&gateway.url("/status/404"), "four", "").await;
    assert!(again.status == 404 && again.replayed());
    assert_eq!(
        http.post_key(&gateway.url("/status/429"), "many", "")
            .await
            .status,
        429
    );
    assert!(
        !http
            .post_key(&gateway.url("/status/429"), "many", "")
            .await
            .replayed()
    );
    assert_eq!(fixture.count().await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_headers_keep_order_and_repeats_without_set_cookie() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    let first = http.post_key(&gateway.url("/headers"), "h", "").await;
    assert_eq!(first.headers.get_all("set-cookie").iter().count(), 2);
    let replay = http.post_key(&gateway.url("/headers"), "h", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.status, 201);
    let multi: Vec<_> = replay.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["one", "two"]);
    assert_eq!(replay.header("etag"), Some("\"v1\""));
    assert_eq!(replay.header("location"), Some("/things/1"));
    assert!(replay.headers.get("set-cookie").is_none());
    assert_eq!(replay.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_response_is_streamed_whole_and_replayed() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    let url = gateway.url("/large?bytes=300000");
    let first = http.post_key(&url, "big", "").await;
    assert_eq!(first.body.len(), 300_000);
    let replay = http.post_key(&url, "big", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(fixture.count().await, 1);
}

/// A body of `len` printable bytes that do not compress (a stored response keeps its size).
fn incompressible(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[usize::try_from(state % 64).unwrap()])
        })
        .collect()
}

/// `[store] memory_max_bytes` is read from the config, and the memory store's byte budget
/// bounds what large responses hold: old records are evicted oldest first (their retry runs
/// again, as after their retention), the newest are replayed, and a response larger than a
/// shard's share is replayed without its body. Nothing runs twice while it is stored, and
/// nothing answers 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_byte_budget_bounds_large_responses() {
    let fixture = Fixture::start();
    let config = config(fixture.addr, "[store]\nmemory_max_bytes = \"1MiB\"\n");
    assert_eq!(config.store.memory_max_bytes.get(), 1 << 20);
    // 16 shards of 64 KiB: each holds one record of a 40,000-byte response.
    let store = idem_store_memory::MemoryStore::builder()
        .shards(std::num::NonZeroUsize::new(16).unwrap())
        .max_bytes(config.store.memory_max_bytes)
        .build();
    let gateway = Gateway::start_on(&config, store, None).await;
    let http = Http::new();
    let url = gateway.url("/echo");
    let keys = 64;
    for i in 0..keys {
        let body = incompressible(40_000, i);
        let first = http.post_key(&url, &format!("big-{i}"), &body).await;
        assert_eq!((first.status, first.body.len()), (201, 40_000), "key {i}");
        // At once, every key is replayed: its record is the newest of its shard.
        let replay = http.post_key(&url, &format!("big-{i}"), &body).await;
        assert!(replay.replayed(), "key {i}");
        assert_eq!(replay.body, first.body);
    }
    assert_eq!(fixture.count().await, keys);
    assert!(
        gateway.store.bytes() <= 1 << 20,
        "{} bytes",
        gateway.store.bytes()
    );
    assert!(gateway.store.len() <= 16, "{} records", gateway.store.len());
    // The last key is still stored; most older ones were evicted and run again.
    let last = incompressible(40_000, keys - 1);
    let replay = http
        .post_key(&url, &format!("big-{}", keys - 1), &last)
        .await;
    assert!(replay.replayed());
    assert_eq!(fixture.count().await, keys);
    for i in 0..keys {
        let body = incompressible(40_000, i);
        let retry = http.post_key(&url, &format!("big-{i}"), &body).await;
        assert_eq!(retry.status, 201);
    }
    assert!(fixture.count().await > keys + keys / 2);

    // A response over a shard's share (64 KiB) is stored without its body: the retry gets the
    // status and headers, says so, and the upstream does not run again.
    let body = incompressible(100_000, 7);
    let first = http.post_key(&url, "huge", &body).await;
    assert_eq!((first.status, first.body.len()), (201, 100_000));
    let before = fixture.count().await;
    let replay = http.post_key(&url, "huge", &body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.header("idempotency-replay"), Some("omitted"));
    assert!(replay.body.is_empty());
    assert_eq!(fixture.count().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_502_and_releases_the_key() {
    let upstream = free_addr();
    let gateway = Gateway::start(&config(upstream, "")).await;
    let http = Http::new();
    let down = http.post_key(&gateway.url("/echo"), "down-1", "x").await;
    assert_eq!(down.status, 502);
    assert_eq!(
        down.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        gateway
            .store
            .get(&record_key("down-1"))
            .await
            .unwrap()
            .is_none()
    );
    // The upstream comes up: the retry executes.
    let fixture = Fixture::start_on(&upstream.to_string());
    let retry = http.post_key(&gateway.url("/echo"), "down-1", "x").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(fixture.count().await, 1);
}

/// An upstream that answers every request with a head announcing 100 bytes, sends 3 and
/// closes the connection; returns its address and how many requests it got.
async fn cut_body_upstream() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
                    .await;
            });
        }
    });
    (addr, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_breaks_off_its_body_is_cut_off_and_holds_the_key_as_unknown() {
    let (upstream, requests) = cut_body_upstream().await;
    let gateway =
        Gateway::start_with_metrics(&config(upstream, ""), Some(common::metrics_recorder())).await;
    let http = Http::new();
    // The head and the first bytes were passed on as they came; the client's body is then
    // cut short, as the upstream's was.
    let headers = [("idempotency-key", "cut-1")];
    let cut = http
        .try_send(Method::POST, &gateway.url("/echo"), &headers, "x")
        .await;
    assert!(cut.is_err(), "the body was not cut short");
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The upstream answered, so it may have taken effect: the key is held as unknown, and a
    // retry is told so instead of running again.
    for _ in 0..3 {
        let retry = http
            .send(Method::POST, &gateway.url("/echo"), &headers, "x")
            .await;
        assert_eq!(retry.status, 409, "{}", retry.text());
        assert!(retry.text().contains("outcome-unknown"), "{}", retry.text());
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
    let record = gateway.store.get(&record_key("cut-1")).await.unwrap();
    assert_eq!(record.map(|r| r.state), Some(idem_core::State::Unknown));
    let admin = gateway.admin.clone().unwrap();
    let (failed, metrics) = common::metric_value(
        &http,
        &admin,
        "idem_gateway_upstream_errors_total{kind=\"failed\"}",
    )
    .await;
    assert!(failed.is_some_and(|n| n >= 1.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_too_slow_is_504_and_holds_the_key_as_unknown() {
    let fixture = Fixture::start();
    let mut config = config(fixture.addr, "");
    config.upstream.as_mut().unwrap().timeout = Duration::from_millis(300);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    let url = gateway.url("/slow?ms=1000");
    let slow = http.post_key(&url, "slow-504", "").await;
    assert_eq!(slow.status, 504);
    let record = gateway.store.get(&record_key("slow-504")).await.unwrap();
    assert_eq!(record.map(|r| r.state), Some(idem_core::State::Unknown));
    // The upstream had the request and may still run it: the retry is told so, not run.
    let retry = http.post_key(&url, "slow-504", "").await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    // A fast request under another key still works.
    assert_eq!(
        http.post_key(&gateway.url("/slow?ms=1"), "fast", "")
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_still_gets_its_response_stored() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let addr: SocketAddr = gateway.url.trim_start_matches("http://").parse().unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST /slow?ms=600 HTTP/1.1\r\nhost: x\r\nidempotency-key: gone\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(stream);
    let stored = eventually(Duration::from_secs(3), || async {
        gateway
            .store
            .get(&record_key("gone"))
            .await
            .unwrap()
            .is_some_and(|r| r.state == State::Completed)
    })
    .await;
    assert!(stored, "the response of the departed client was stored");
    // The same host as the departed client's (the host is in the fingerprint).
    let headers = [("idempotency-key", "gone"), ("host", "x")];
    let replay = Http::new()
        .send(Method::POST, &gateway.url("/slow?ms=600"), &headers, "")
        .await;
    assert!(replay.replayed(), "{}", replay.text());
    assert_eq!(replay.text(), "slept:600");
    assert_eq!(fixture.count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431_and_oversized_bodies_413() {
    let fixture = Fixture::start();
    let extra = "[server]\nmax_header_bytes = \"16KiB\"\n";
    // [server] appears twice if added to the common config: build the text here instead.
    let text = format!(
        "[upstream]\nurl = \"http://{}\"\n{extra}listen = \"127.0.0.1:0\"\n[admin]\nenabled = false\n[idempotency]\nrequest_body_limit = \"1KiB\"\n",
        fixture.addr
    );
    let config = idem_gateway::config::from_str("t.toml", &text, &Default::default()).unwrap();
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    let big = "v".repeat(20_000);
    let reply = http
        .send(Method::POST, &gateway.url("/echo"), &[("x-big", &big)], "x")
        .await;
    assert_eq!(reply.status, 431);
    let body = "b".repeat(2048);
    let reply = http.post_key(&gateway.url("/echo"), "too-big", &body).await;
    assert_eq!(reply.status, 413);
    assert_eq!(fixture.count().await, 0);
    assert!(
        gateway
            .store
            .get(&record_key("too-big"))
            .await
            .unwrap()
            .is_none()
    );
}

/// An upstream that answers every request with its own request head and body, as text.
async fn header_echo() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let mut text = format!("{} {}\n", request.method(), request.uri());
                        for (name, value) in request.headers() {
                            text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
                        }
                        let body = http_body_util::BodyExt::collect(request.into_body())
                            .await
                            .map(http_body_util::Collected::to_bytes)
                            .unwrap_or_default();
                        text.push_str(&format!("body: {}\n", String::from_utf8_lossy(&body)));
                        let mut response = http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(text),
                        ));
                        response
                            .headers_mut()
                            .insert("connection", http::HeaderValue::from_static("x-private"));
                        response
                            .headers_mut()
                            .insert("x-private", http::HeaderValue::from_static("1"));
                        Ok::<_, Infallible>(response)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Sends `request` (raw bytes, ending the connection) through a gateway in front of
/// [`header_echo`]; the raw answer.
async fn through_to_header_echo(request: &[u8]) -> String {
    let upstream = header_echo().await;
    let gateway = Gateway::start(&config(upstream, "")).await;
    let addr: SocketAddr = gateway.url.trim_start_matches("http://").parse().unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_are_set_host_is_kept_and_hop_by_hop_headers_are_stripped() {
    let raw = through_to_header_echo(
        b"GET /who?x=1 HTTP/1.1\r\nhost: api.example.com\r\nx-forwarded-for: 10.1.2.3\r\nx-forwarded-for: 10.4.5.6\r\nconnection: close, x-hop\r\nx-hop: secret\r\nkeep-alive: timeout=5\r\nproxy-authorization: Basic Zm9v\r\n\r\n",
    )
    .await;
    let lower = raw.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 200"), "{raw}");
    assert!(lower.contains("get /who?x=1\n"), "{raw}");
    assert!(lower.contains("host: api.example.com\n"), "{raw}");
    assert!(
        lower.contains("x-forwarded-for: 10.1.2.3, 10.4.5.6, 127.0.0.1\n"),
        "{raw}"
    );
    assert!(lower.contains("x-forwarded-proto: http\n"), "{raw}");
    assert!(
        lower.contains("x-forwarded-host: api.example.com\n"),
        "{raw}"
    );
    for hop in ["x-hop:", "keep-alive:", "proxy-authorization:"] {
        assert!(!lower.contains(hop), "{hop} forwarded: {raw}");
    }
    // The upstream's Connection-named header does not reach the client.
    assert!(!lower.contains("x-private"), "{raw}");
}

/// A GET (or HEAD, CONNECT) is passed through with the body its client sent: hyper's client
/// would send one whose length it does not know (chunked) with no body at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_a_chunked_body_is_passed_through_with_it() {
    let raw = through_to_header_echo(
        b"GET /search HTTP/1.1\r\nhost: api.example.com\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert!(
        raw.to_ascii_lowercase().starts_with("http/1.1 200"),
        "{raw}"
    );
    assert!(raw.contains("GET /search\n"), "{raw}");
    assert!(raw.contains("body: hello world\n"), "{raw}");
}

/// Sends `request` (raw bytes, ending the connection) to `gateway`, as written: an HTTP client
/// could put the path in normal form itself. The raw answer.
async fn raw_exchange(gateway: &Gateway, request: &str) -> String {
    let addr: SocketAddr = gateway.url.trim_start_matches("http://").parse().unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw
}

/// A POST of `path` as written, with the key if any, ending the connection.
fn raw_post(path: &str, key: Option<&str>) -> String {
    let key = key.map_or(String::new(), |key| format!("idempotency-key: {key}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\n{key}content-length: 1\r\nconnection: close\r\n\r\na"
    )
}

/// The paths the upstream serves as `/echo` once it normalises them: a route that requires a
/// key on `/echo` covers them all, so none reaches the upstream without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_spelling_of_the_path_does_not_bypass_a_required_key() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, PAYMENTS)).await;
    for path in [
        "//echo",
        "/./echo",
        "/x/../echo",
        "/%65cho",
        "/%65%63%68%6F",
        "/echo/",
        "//echo//7",
    ] {
        let raw = raw_exchange(&gateway, &raw_post(path, None)).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{path}: {raw}");
        assert!(raw.contains("application/problem+json"), "{path}: {raw}");
        assert!(raw.contains("Idempotency key required"), "{path}: {raw}");
    }
    // An encoded dot segment is refused outright: servers decode it before or after they
    // resolve dot segments.
    let raw = raw_exchange(&gateway, &raw_post("/x/%2e%2E/echo", None)).await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(raw.contains("resolve differently"), "{raw}");
    assert_eq!(fixture.count().await, 0);
}

/// The spellings that escaped a key-required route, through the gateway: `/Echo` escapes a
/// route that matches case as written (another path, to an upstream that does not fold case)
/// and not one with `case_insensitive = true` (before, that key was refused as unknown);
/// `/echo;x` and `/echo.json` are other paths (another segment) that the glob `/echo*/**`
/// covers, for an upstream that reads them as `/echo`, as the README says (`/echo%2F7` is
/// refused before any route, unless `allow_ambiguous_paths` is on: then the glob covers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_params_suffixes_and_encoded_slashes_are_covered_by_the_route_that_says_so() {
    /// Whether `gateway` refuses a POST of `path` without a key.
    async fn keyless(gateway: &Gateway, path: &str) -> bool {
        let raw = raw_exchange(gateway, &raw_post(path, None)).await;
        raw.starts_with("HTTP/1.1 400") && raw.contains("Idempotency key required")
    }
    let fixture = Fixture::start();
    let exact = Gateway::start(&config(fixture.addr, PAYMENTS)).await;
    let folded = Gateway::start(&config(
        fixture.addr,
        "[[route]]\npath = \"/echo\"\nkey = \"required\"\ncase_insensitive = true\n",
    ))
    .await;
    let wide = Gateway::start(&config(
        fixture.addr,
        "[[route]]\npath = \"/echo*/**\"\nkey = \"required\"\n",
    ))
    .await;
    for path in ["/Echo", "/ECHO/7", "/%45cho"] {
        assert!(!keyless(&exact, path).await, "{path} is another path");
        assert!(keyless(&folded, path).await, "{path}");
    }
    for path in ["/echo;x", "/echo.json", "/echo;x/7"] {
        assert!(!keyless(&exact, path).await, "{path} is another path");
        assert!(keyless(&wide, path).await, "{path}");
    }
    let lenient = Gateway::start(&common::config_with_server(
        fixture.addr,
        "allow_ambiguous_paths = true",
        "[[route]]\npath = \"/echo*/**\"\nkey = \"required\"\n",
    ))
    .await;
    assert!(keyless(&lenient, "/echo%2F7").await);
    assert!(keyless(&wide, "/echo").await && keyless(&folded, "/echo/7").await);
}

/// A `..` that climbs above the root is refused by the gateway itself, as nginx does: with or
/// without a key, on a route that requires one or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_above_the_root_is_400_and_never_forwarded() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, PAYMENTS)).await;
    for (path, key) in [
        ("/../echo", None),
        ("/../echo", Some("above-1")),
        ("/x/../../echo", Some("above-2")),
        ("//..//counter", None),
    ] {
        let raw = raw_exchange(&gateway, &raw_post(path, key)).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{path}: {raw}");
        assert!(raw.contains("application/problem+json"), "{path}: {raw}");
        assert!(raw.contains("above the root"), "{path}: {raw}");
        assert!(raw.contains("#variant.AboveRoot"), "{path}: {raw}");
    }
    let raw = raw_exchange(
        &gateway,
        "GET /.. HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    // A request target without a path is no route's: a 404 whose type says why.
    let raw = raw_exchange(
        &gateway,
        "OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    assert!(raw.contains("application/problem+json"), "{raw}");
    assert!(raw.contains("#variant.NotAbsolute"), "{raw}");
    assert_eq!(fixture.count().await, 0);
    for key in ["above-1", "above-2", "above-3"] {
        assert!(gateway.store.get(&record_key(key)).await.unwrap().is_none());
    }
}

/// The route is chosen by the normal form of the path, but the upstream gets the path and
/// query as sent, and the fingerprint is over them: the same key with another spelling of the
/// path is another request (422).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_the_path_as_sent() {
    let upstream = header_echo().await;
    // A prefix written with a trailing slash covers the bare path too.
    let gateway = Gateway::start(&config(
        upstream,
        "[[route]]\npath = \"/who/\"\nkey = \"required\"\n",
    ))
    .await;
    for path in ["/who", "/x/../who", "/%77ho/?q=1"] {
        let raw = raw_exchange(&gateway, &raw_post(path, None)).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{path}: {raw}");
    }
    let raw = raw_exchange(&gateway, &raw_post("/x/../%77ho/?q=1", Some("as-sent"))).await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("POST /x/../%77ho/?q=1\n"), "{raw}");
    let replay = raw_exchange(&gateway, &raw_post("/x/../%77ho/?q=1", Some("as-sent"))).await;
    assert!(
        replay
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{replay}"
    );
    let other = raw_exchange(&gateway, &raw_post("/who/?q=1", Some("as-sent"))).await;
    assert!(other.starts_with("HTTP/1.1 422"), "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_health_readiness_and_a_token() {
    let fixture = Fixture::start();
    let mut config = config(fixture.addr, "");
    config.admin.as_mut().unwrap().token = Some("s3cret".into());
    let gateway = Gateway::start(&config).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    assert_eq!(
        http.send(Method::GET, &format!("{admin}/healthz"), &[], "")
            .await
            .status,
        401
    );
    let auth = [("authorization", "Bearer s3cret")];
    assert_eq!(
        http.send(Method::GET, &format!("{admin}/healthz"), &auth, "")
            .await
            .status,
        200
    );
    assert_eq!(
        http.send(Method::GET, &format!("{admin}/readyz"), &auth, "")
            .await
            .status,
        200
    );
    let wrong = [("authorization", "Bearer s3cres")];
    assert_eq!(
        http.send(Method::GET, &format!("{admin}/readyz"), &wrong, "")
            .await
            .status,
        401
    );
    // No recorder in this process: /metrics says so.
    assert_eq!(
        http.send(Method::GET, &format!("{admin}/metrics"), &auth, "")
            .await
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish_within_the_grace() {
    let fixture = Fixture::start();
    let mut gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    let url = gateway.url("/slow?ms=700");
    let request = tokio::spawn({
        let http = http.clone();
        async move { http.post_key(&url, "drain", "").await }
    });
    assert!(until_claimed(&gateway, "drain").await);
    let drained = gateway.running.take().unwrap().stop().await.unwrap();
    assert!(drained.clean, "{drained:?}");
    assert_eq!(request.await.unwrap().status, 200);
    let record = gateway
        .store
        .get(&record_key("drain"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, State::Completed);
    // The listener is closed.
    assert!(
        http.try_send(Method::GET, &gateway.url("/counter"), &[], "")
            .await
            .is_err()
    );
}

/// Once the gateway starts shutting down, `/readyz` says so (503 `draining`) while the
/// in-flight request finishes; `/healthz` stays 200. Before, `/readyz` answered 200 until the
/// admin listener closed, while the gateway's own listener refused connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_gateway_drains() {
    let fixture = Fixture::start();
    let mut gateway = Gateway::start(&config(fixture.addr, "")).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let readyz = format!("{admin}/readyz");
    assert_eq!(http.send(Method::GET, &readyz, &[], "").await.status, 200);
    let url = gateway.url("/slow?ms=3000");
    let request = tokio::spawn({
        let http = http.clone();
        async move { http.post_key(&url, "draining", "").await }
    });
    assert!(until_claimed(&gateway, "draining").await);
    let running = gateway.running.take().unwrap();
    let stopped = tokio::spawn(running.stop());
    assert!(
        eventually(Duration::from_secs(2), || async {
            let answer = http.send(Method::GET, &readyz, &[], "").await;
            answer.status == 503 && answer.text().contains("draining")
        })
        .await
    );
    let healthz = http
        .send(Method::GET, &format!("{admin}/healthz"), &[], "")
        .await;
    assert_eq!(healthz.status, 200);
    assert_eq!(request.await.unwrap().status, 200);
    assert!(stopped.await.unwrap().unwrap().clean);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_the_grace_holds_what_the_upstream_had_as_unknown() {
    let fixture = Fixture::start();
    let text = format!(
        "[upstream]\nurl = \"http://{}\"\n[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"300ms\"\n[admin]\nenabled = false\n",
        fixture.addr
    );
    let config = idem_gateway::config::from_str("t.toml", &text, &Default::default()).unwrap();
    let mut gateway = Gateway::start(&config).await;
    let url = gateway.url("/slow?ms=5000");
    let request = tokio::spawn(async move { Http::new().post_key(&url, "cut", "").await });
    assert!(until_claimed(&gateway, "cut").await);
    let drained = gateway.running.take().unwrap().stop().await.unwrap();
    assert!(!drained.clean);
    assert_eq!(drained.abandoned, 0);
    let reply = request.await.unwrap();
    assert_eq!(reply.status, 503, "{}", reply.text());
    // The upstream had the request and may still be running it: the key is not freed.
    let record = gateway.store.get(&record_key("cut")).await.unwrap();
    assert_eq!(record.map(|r| r.state), Some(idem_core::State::Unknown));
}

/// Sends `per_key` concurrent requests for each of `keys` keys named `{prefix}-{n}` (the pool
/// opens a connection per request while all are busy, so they spread over the serving threads)
/// and checks that every answer is the first execution, a 409 with `Retry-After` or a
/// byte-identical replay, with exactly one execution per key.
async fn storm(gateway: &Gateway, prefix: &str, keys: usize, per_key: usize) {
    let http = Http::new();
    let mut tasks = Vec::new();
    for n in 0..keys * per_key {
        let http = http.clone();
        let key = format!("{prefix}-{}", n % keys);
        let url = gateway.url("/slow?ms=200");
        tasks.push(tokio::spawn(async move {
            let reply = http.post_key(&url, &key, "").await;
            (key, reply)
        }));
    }
    let mut executed = std::collections::HashMap::new();
    for task in tasks {
        let (key, reply) = task.await.unwrap();
        match reply.status {
            200 if reply.replayed() => assert_eq!(reply.text(), "slept:200"),
            200 => *executed.entry(key).or_insert(0) += 1,
            409 => assert!(reply.header("retry-after").is_some()),
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    assert_eq!(executed.len(), keys, "every key ran: {executed:?}");
    assert!(executed.values().all(|&n| n == 1), "{executed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_serving_threads_share_the_port_and_run_each_key_once() {
    let fixture = Fixture::start();
    let mut config = config(fixture.addr, PAYMENTS);
    config.server.workers = std::num::NonZeroUsize::new(4).unwrap();
    let gateway = Gateway::start(&config).await;

    storm(&gateway, "one", 1, 200).await;
    assert_eq!(fixture.count().await, 1);
    storm(&gateway, "twenty", 20, 10).await;
    assert_eq!(fixture.count().await, 21);
}

#[test]
fn a_second_gateway_on_a_taken_address_fails_instead_of_sharing_it() {
    // Serving threads bind with SO_REUSEPORT: without the probe, the second process joined
    // the first one's port and the kernel split connections between two memory stores.
    let dir = std::env::temp_dir().join(format!("idem-gateway-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two-workers.toml");
    std::fs::write(&file, "[server]\nworkers = 2\n").unwrap();
    let file = file.to_str().unwrap();
    let args = |listen: &str| {
        [
            "--config",
            file,
            "--upstream",
            "http://127.0.0.1:9",
            "--no-admin",
            "--listen",
            listen,
        ]
        .map(str::to_owned)
    };
    let (_first, addr) = spawn_gateway(&args("127.0.0.1:0").each_ref().map(String::as_str));
    let mut second = idem_command("serve")
        .args(args(&addr.to_string()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while second.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second gateway serves on the first one's address");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = second.wait_with_output().unwrap();
    common::assert_one_error_line(
        &second,
        1,
        &format!("cannot listen on {addr} (the gateway)"),
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
}
