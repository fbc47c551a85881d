//! End-to-end: an upstream that misbehaves in its framing, written byte for byte (a raw TCP
//! socket): connection fields among its trailers, an HTTP/1.0 status line, its own replay
//! headers, a 101 nobody asked for, a broken first chunk. The gateway runs in this process on
//! the memory store, on 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::raw_http::{Message, RawClient, RawUpstream};
use common::{Answer, Gateway, Http, config, try_post as post};
use http::{Method, StatusCode, Version, header};
use idem_core::{IdempotencyKey, RecordKey, Store};

/// The trailer fields that belong to a connection or to the framing: none may pass.
const HOP_TRAILERS: [&str; 7] = [
    "Connection",
    "TE",
    "Keep-Alive",
    "Upgrade",
    "Transfer-Encoding",
    "Content-Length",
    "Proxy-Connection",
];

/// An upstream that answers `201 paid`, chunked, announcing `Trailer: <F>, X-Sum` and sending
/// the trailers `<F>: v` and `X-Sum: <run>`, where F is the last path segment.
async fn hop_trailer_upstream() -> RawUpstream {
    RawUpstream::start(|request: &Message, n| {
        let field = request
            .start()
            .split(' ')
            .nth(1)
            .and_then(|path| path.rsplit('/').next())
            .unwrap_or("Connection")
            .to_owned();
        format!(
            "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nTrailer: {field}, X-Sum\r\n\
             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             4\r\npaid\r\n0\r\n{field}: v\r\nX-Sum: {n}\r\n\r\n"
        )
    })
    .await
}

/// The trailers of `answer`, which must have some, as (name, value) pairs.
fn trailer_pairs(answer: &Answer) -> Vec<(String, String)> {
    let trailers = answer.trailers.as_ref().expect("trailers");
    trailers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect()
}

/// An upstream's trailers `Connection: v` (or `TE`, `Keep-Alive`, `Upgrade`,
/// `Transfer-Encoding`, `Content-Length`, `Proxy-Connection`), announced by its `Trailer`
/// header, reach no client: an HTTP/2 client gets the whole response (before: DATA and then
/// RST_STREAM, on the first run and on every unkeyed request, although the upstream had
/// run), an HTTP/1.1 client that sent `TE: trailers` does not get `connection: v` (before, it
/// did), and a replay's trailers and `Trailer` header are the first run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_and_framing_trailers_reach_no_client_and_no_replay() {
    let upstream = hop_trailer_upstream().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let only_sum = |n: u64| vec![("x-sum".to_owned(), n.to_string())];
    for field in HOP_TRAILERS {
        let url = gateway.url(&format!("/pay/{field}"));
        let h2_key = format!("h2-{field}");
        let h2 = [("idempotency-key", h2_key.as_str())];
        let first = post(&url, &h2, true).await;
        let first = first.unwrap_or_else(|err| panic!("{field}, HTTP/2 first run: {err}"));
        assert_eq!(
            (first.status, &first.body[..]),
            (StatusCode::CREATED, &b"paid"[..])
        );
        let n = upstream.runs();
        assert_eq!(trailer_pairs(&first), only_sum(n), "{field}");
        let unkeyed = post(&url, &[], true).await;
        let unkeyed = unkeyed.unwrap_or_else(|err| panic!("{field}, HTTP/2 unkeyed: {err}"));
        assert_eq!(trailer_pairs(&unkeyed), only_sum(n + 1), "{field}");
        let replay = post(&url, &h2, true).await.unwrap();
        assert_eq!(replay.headers["idempotent-replayed"], "true", "{field}");
        assert_eq!(
            trailer_pairs(&replay),
            only_sum(n),
            "{field}: the first run's"
        );

        let h1_key = format!("h1-{field}");
        let h1 = [("idempotency-key", h1_key.as_str()), ("te", "trailers")];
        let first = post(&url, &h1, false).await.unwrap();
        let n = upstream.runs();
        assert_eq!(first.headers[header::TRAILER], "x-sum", "{field}");
        assert_eq!(trailer_pairs(&first), only_sum(n), "{field}, HTTP/1.1");
        let unkeyed = post(&url, &[("te", "trailers")], false).await.unwrap();
        assert_eq!(trailer_pairs(&unkeyed), only_sum(n + 1), "{field}");
        let replay = post(&url, &h1, false).await.unwrap();
        assert_eq!(replay.headers["idempotent-replayed"], "true", "{field}");
        assert_eq!(replay.headers[header::TRAILER], "x-sum", "{field}");
        assert_eq!(
            trailer_pairs(&replay),
            only_sum(n),
            "{field}: the first run's"
        );
    }
}

/// A client's request trailers lose their connection fields on the way to the upstream as
/// well, and its `Trailer` header announces only what may trail. Before, the upstream got
/// `connection: v` (hyper's client sends every announced trailer but the framing ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_connection_trailers_do_not_reach_the_upstream() {
    let upstream = RawUpstream::start(|_: &Message, _| {
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_owned()
    })
    .await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let mut client = RawClient::connect(&gateway.url("")).await;
    let answer = client
        .exchange(
            "POST /pay HTTP/1.1\r\nHost: api.example\r\nTrailer: Connection, X-Sum, Keep-Alive\r\n\
             Transfer-Encoding: chunked\r\n\r\n4\r\npaid\r\n0\r\nConnection: v\r\n\
             Keep-Alive: v\r\nX-Sum: 4\r\n\r\n",
        )
        .await
        .expect("an answer");
    assert!(answer.start().ends_with("200 OK"), "{answer:?}");
    let sent = upstream.last_request();
    assert_eq!(sent.body, b"paid");
    assert_eq!(sent.trailer_names(), ["x-sum"], "{sent:?}");
    assert_eq!(sent.header("trailer"), Some("x-sum"), "{sent:?}");
}

/// Behind an HTTP/1.0 upstream, an HTTP/1.1 client gets HTTP/1.1 answers on one kept-alive
/// connection: the first run, a request without a key and the replay. Before, the first two
/// came back as `HTTP/1.0 201` and the connection was closed after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_upstream_answers_an_http11_client_in_http11() {
    let upstream = RawUpstream::start(|_: &Message, n| {
        format!("HTTP/1.0 201 Created\r\nContent-Type: text/plain\r\n\r\npaid-{n}")
    })
    .await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let mut client = RawClient::connect(&gateway.url("")).await;
    let request = |key: &str| {
        format!("POST /pay HTTP/1.1\r\nHost: api.example\r\n{key}Content-Length: 2\r\n\r\n10")
    };
    for (what, key, body) in [
        ("the first run", "Idempotency-Key: v10\r\n", "paid-1"),
        ("a request without a key", "", "paid-2"),
        ("the replay", "Idempotency-Key: v10\r\n", "paid-1"),
    ] {
        let answer = client.exchange(&request(key)).await;
        let answer = answer.unwrap_or_else(|| panic!("{what}: the connection was closed"));
        assert_eq!(answer.start(), "HTTP/1.1 201 Created", "{what}");
        assert_eq!(answer.body, body.as_bytes(), "{what}");
        assert_ne!(answer.header("connection"), Some("close"), "{what}");
    }
    // Over HTTP/2 too, whatever the upstream spoke.
    let h2 = post(&gateway.url("/pay"), &[], true).await.unwrap();
    assert_eq!(h2.version, Version::HTTP_2);
    assert_eq!(upstream.runs(), 3);
}

/// An upstream's own `Idempotent-Replayed`, `Idempotency-Replay` and `Idempotency-Status`
/// reach no client on a fresh run, keyed or not, on a route with the layer or without, and
/// are not stored: the replay carries idem's `Idempotent-Replayed: true` alone. Before, the
/// upstream's were passed on, and stored and replayed with the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_replay_headers_are_never_passed_on() {
    let upstream = RawUpstream::start(|_: &Message, n| {
        format!(
            "HTTP/1.1 201 Created\r\nIdempotent-Replayed: true\r\nIdempotency-Replay: omitted\r\n\
             Idempotency-Status: unrecorded\r\nContent-Length: 6\r\nConnection: close\r\n\r\npaid-{n}"
        )
    })
    .await;
    let routes = "[[route]]\nname = \"plain\"\npath = \"/plain\"\nenabled = false\n";
    let gateway = Gateway::start(&config(upstream.addr, routes)).await;
    let http = Http::new();
    let forged = [
        "idempotent-replayed",
        "idempotency-replay",
        "idempotency-status",
    ];
    let fresh = [
        http.post_key(&gateway.url("/pay"), "forged-1", "x").await,
        http.send(Method::POST, &gateway.url("/pay"), &[], "x")
            .await,
        http.post_key(&gateway.url("/plain"), "forged-2", "x").await,
    ];
    for (n, reply) in fresh.iter().enumerate() {
        assert_eq!(reply.status, 201);
        assert_eq!(reply.text(), format!("paid-{}", n + 1));
        for name in forged {
            assert_eq!(reply.header(name), None, "{name} in {:?}", reply.headers);
        }
    }
    let replay = http.post_key(&gateway.url("/pay"), "forged-1", "x").await;
    assert_eq!(replay.text(), "paid-1");
    assert!(replay.replayed());
    assert_eq!(
        replay.header("idempotency-replay"),
        None,
        "{:?}",
        replay.headers
    );
    assert_eq!(
        replay.header("idempotency-status"),
        None,
        "{:?}",
        replay.headers
    );
    assert_eq!(upstream.runs(), 3);
    let key = RecordKey::unscoped(IdempotencyKey::new("forged-1").unwrap());
    let record = gateway.store.get(&key).await.unwrap().expect("the record");
    let stored = idem_http::codec::decode(record.result.as_ref().unwrap()).unwrap();
    let names: Vec<&str> = stored.headers.iter().map(|(n, _)| n.as_str()).collect();
    for name in forged {
        assert!(!names.contains(&name), "{name} stored: {names:?}");
    }
}

/// Sends a keyed request to `url` twice and one without a key: each must get the gateway's
/// 502 problem, and each keyed one reach the upstream (the key was released); returns the
/// problems' details.
async fn three_502s(upstream: &RawUpstream, url: &str) -> Vec<String> {
    let http = Http::new();
    let runs = upstream.runs();
    let mut details = Vec::new();
    for (attempt, key) in [(1, Some("k-502")), (2, Some("k-502")), (3, None)] {
        let headers: Vec<_> = key
            .map(|key| ("idempotency-key", key))
            .into_iter()
            .collect();
        let reply = http.try_send(Method::POST, url, &headers, "x").await;
        let reply = reply.unwrap_or_else(|err| panic!("attempt {attempt}: {err}"));
        assert_eq!(reply.status, 502, "attempt {attempt}: {reply:?}");
        let problem = reply.header("content-type") == Some("application/problem+json");
        assert!(problem, "attempt {attempt}: {reply:?}");
        assert_eq!(upstream.runs(), runs + attempt, "attempt {attempt} runs");
        details.push(reply.text());
    }
    details
}

/// An upstream that answers 101 to a request that asked for no upgrade (the gateway carries
/// none) gets the client a 502 problem, and the key is released: a retry runs again. Before,
/// the 101 was relayed to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_101_is_a_502_that_releases_the_key() {
    let upstream = RawUpstream::start(|_: &Message, _| {
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            .to_owned()
    })
    .await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    for detail in three_502s(&upstream, &gateway.url("/pay")).await {
        assert!(detail.contains("switched protocols"), "{detail}");
    }
}

/// An upstream that sends a chunked head and then a malformed first chunk gets the client a
/// 502 problem (before: an empty reply, no status line). Once a first chunk went out with the
/// head, a broken body can only be broken off. Either way the upstream answered, so it had
/// the request: the key is held as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_first_chunk_is_a_502_and_a_broken_later_chunk_holds_the_key() {
    let upstream = RawUpstream::start(|request: &Message, _| {
        let first = if request.start().contains("/later") { "4\r\npaid\r\n" } else { "" };
        format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{first}zz\r\n"
        )
    })
    .await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let http = Http::new();
    let headers = [("idempotency-key", "chunk-1")];
    let broken = http
        .send(Method::POST, &gateway.url("/pay"), &headers, "x")
        .await;
    assert_eq!(broken.status, 502, "{}", broken.text());
    assert_eq!(
        broken.header("content-type"),
        Some("application/problem+json")
    );
    // The upstream answered its head: it had the request, so the key is held as unknown.
    let retry = http
        .send(Method::POST, &gateway.url("/pay"), &headers, "x")
        .await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    assert_eq!(upstream.runs(), 1);

    // A body that breaks after its first bytes were passed on: held the same way.
    let later = [("idempotency-key", "chunk-2")];
    let broken = http
        .try_send(Method::POST, &gateway.url("/later"), &later, "x")
        .await;
    assert!(broken.is_err(), "{broken:?}");
    let retry = http
        .send(Method::POST, &gateway.url("/later"), &later, "x")
        .await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    assert!(retry.text().contains("outcome-unknown"), "{}", retry.text());
    assert_eq!(upstream.runs(), 2, "each broken stream ran once");
}
