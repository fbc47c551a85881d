//! Every behaviour of the layer (idem-http's README), black-box: the fixture binary on 127.0.0.1:0, a real
//! HTTP client, on every store the build has: memory always; Redis, PostgreSQL and redb with
//! the fixture's features of those names (a missing server fails the test; outside CI,
//! `IDEM_TEST_SKIP_MISSING=1` skips it loudly).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use support::{Answer, Fixture, quoted, unique};

/// Expands each behaviour into one test per store.
macro_rules! on_every_store {
    ($($behaviour:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour("memory").await;
                }
            )*
        }

        #[cfg(feature = "redis")]
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(url) = super::support::redis_url() else { return };
                    super::$behaviour(&url).await;
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(url) = super::support::postgres_url() else { return };
                    super::$behaviour(&url).await;
                }
            )*
        }

        #[cfg(feature = "redb")]
        mod redb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let file = super::support::TempFile::new(stringify!($behaviour));
                    super::$behaviour(&format!("redb:{}", file.path())).await;
                }
            )*
        }
    };
}

on_every_store!(
    quoted_and_bare_keys_are_the_same_key,
    invalid_keys_are_400_and_run_nothing,
    uncovered_methods_pass_through_without_a_key,
    patch_is_covered_like_post,
    unknown_paths_are_404_outside_the_layer,
    a_missing_key_is_400_where_required,
    replay_is_faithful,
    four_xx_is_stored_and_408_425_429_5xx_released,
    mismatch_is_422_and_does_not_poison_the_record,
    mismatch_wins_over_in_flight,
    in_flight_is_409_with_retry_after,
    heartbeat_keeps_the_lease_of_a_long_handler,
    scopes_are_isolated_by_authorization,
    client_disconnect_still_executes_once_and_replays,
    request_body_over_the_limit_is_413,
    chunked_and_sized_bodies_share_a_fingerprint,
    large_responses_are_never_re_executed,
    compressible_large_responses_replay_in_full,
    records_expire_after_retention,
    storm_of_200_on_one_key_executes_once,
    storm_on_20_keys_executes_20_times,
);

/// The store going down under a running fixture: every keyed request is 503 with
/// `Retry-After`, and the handler does not run. A Redis server of the test's own, on a free
/// port, is started and shut down (the shared server is left alone).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_down_is_503_and_the_handler_does_not_run() {
    if support::redis_url().is_none() {
        return;
    }
    let port = free_port();
    let server = idem_testkit::redis_server::ServerProcess::start_on(port, &[]);
    let url = format!("redis://127.0.0.1:{port}");
    let fixture = Fixture::start(&url, &[]);
    let key = unique("down");
    assert_eq!(
        fixture.post("/echo", &key, "a").await.status,
        StatusCode::CREATED
    );
    server.kill();
    assert_store_down(&fixture).await;
    let replay = fixture.post("/echo", &key, "a").await;
    assert_problem(&replay, 503);
    assert_eq!(
        fixture.counter().await,
        1,
        "no handler ran while the store was down"
    );
}

/// A port nothing listens on (bound, then let go).
#[cfg(any(feature = "redis", feature = "postgres"))]
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// Every keyed request is a 503 problem with `Retry-After` of at least 1 s, and runs nothing.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn assert_store_down(fixture: &Fixture) {
    for path in ["/echo", "/status/200"] {
        let answer = fixture.post(path, &unique("down-new"), "a").await;
        assert_problem(&answer, 503);
        let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
        assert!(retry_after >= 1);
    }
}

/// A Redis server that does not answer when the fixture starts (nothing on its port): the
/// fixture starts all the same, keyed requests are 503 with `Retry-After` and run nothing, and
/// once a server listens there the fixture connects without a restart.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_is_503_until_it_answers() {
    if support::redis_url().is_none() {
        return;
    }
    let port = free_port();
    let fixture = Fixture::start(&format!("redis://127.0.0.1:{port}"), &[]);
    assert_store_down(&fixture).await;
    assert_eq!(
        fixture.counter().await,
        0,
        "no handler ran while the store was down"
    );
    let server = idem_testkit::redis_server::ServerProcess::start_on(port, &[]);
    let key = unique("up-later");
    let mut first = fixture.post("/echo", &key, "a").await;
    for _ in 0..100 {
        if first.status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        first = fixture.post("/echo", &key, "a").await;
    }
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let replay = fixture.post("/echo", &key, "a").await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(fixture.counter().await, 1);
    server.kill();
}

/// A PostgreSQL server that does not answer when the fixture starts (a closed port): the
/// fixture starts, and keyed requests are 503 with `Retry-After` and run nothing.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_at_start_is_503_and_runs_nothing() {
    let port = free_port();
    let fixture = Fixture::start(&format!("postgres://postgres@127.0.0.1:{port}/test"), &[]);
    assert_store_down(&fixture).await;
    assert_eq!(
        fixture.counter().await,
        0,
        "no handler ran while the store was down"
    );
}

fn assert_problem(answer: &Answer, status: u16) {
    assert_eq!(answer.status.as_u16(), status, "{answer:?}");
    assert_eq!(
        answer.header("content-type").as_deref(),
        Some("application/problem+json"),
        "{answer:?}"
    );
    let text = answer.text();
    assert!(text.contains(&format!("\"status\":{status}")), "{text}");
    assert!(text.contains("\"type\":\"https://"), "{text}");
}

async fn quoted_and_bare_keys_are_the_same_key(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("same");
    let first = fixture.post("/echo", &key, "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    let bare = fixture
        .send(
            Method::POST,
            "/echo",
            &[("idempotency-key", key.as_bytes())],
            "a",
        )
        .await;
    assert_eq!(bare.status, StatusCode::CREATED);
    assert!(
        bare.is_replay(),
        "a bare key names the same record: {bare:?}"
    );
    // Escapes are undone: "a\"b" is the key a"b.
    let escaped = fixture
        .send(
            Method::POST,
            "/echo",
            &[("idempotency-key", format!("\"{key}\\\\x\"").as_bytes())],
            "a",
        )
        .await;
    assert_eq!(escaped.status, StatusCode::CREATED);
    assert!(!escaped.is_replay());
    assert_eq!(fixture.counter().await, 2);
}

async fn invalid_keys_are_400_and_run_nothing(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let long = quoted(&"k".repeat(256));
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("empty", vec![b"".to_vec()]),
        ("empty string", vec![b"\"\"".to_vec()]),
        ("256 bytes", vec![long.into_bytes()]),
        ("control byte (tab)", vec![b"\"a\tb\"".to_vec()]),
        ("non-ASCII", vec!["\"caf\u{e9}\"".as_bytes().to_vec()]),
        (
            "two field lines",
            vec![b"\"a\"".to_vec(), b"\"b\"".to_vec()],
        ),
        (
            "two equal field lines",
            vec![b"\"a\"".to_vec(), b"\"a\"".to_vec()],
        ),
        ("a list", vec![b"\"a\", \"b\"".to_vec()]),
        ("a bare list", vec![b"a, b".to_vec()]),
        ("parameters", vec![b"\"a\";p=1".to_vec()]),
        ("unterminated", vec![b"\"abc".to_vec()]),
    ];
    for (case, values) in cases {
        let headers: Vec<(&str, &[u8])> = values
            .iter()
            .map(|v| ("idempotency-key", v.as_slice()))
            .collect();
        let answer = fixture.send(Method::POST, "/echo", &headers, "x").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{case}: {answer:?}");
        assert_problem(&answer, 400);
    }
    // 255 bytes is the longest key (unique, so a record of an earlier run is not replayed).
    let mut longest = unique("longest");
    longest.extend(std::iter::repeat_n('k', 255 - longest.len()));
    assert_eq!(
        fixture.post("/echo", &longest, "x").await.status,
        StatusCode::CREATED
    );
    // A control byte that is not a tab never reaches the layer: the HTTP parser refuses it.
    let (status, _) = fixture
        .raw(b"POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"a\x01b\"\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx")
        .await;
    assert_eq!(status, 400);
    assert_eq!(fixture.counter().await, 1, "only the 255-byte key ran");
}

/// GET, PUT, DELETE and HEAD are not covered: they reach the handler with no key, with an
/// invalid one, or with a key already used, and run every time; nothing is stored or replayed.
async fn uncovered_methods_pass_through_without_a_key(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = quoted(&unique("uncovered"));
    let headers: [&[(&str, &[u8])]; 3] = [
        &[],
        &[("idempotency-key", b"\"a\", \"b\"")],
        &[("idempotency-key", key.as_bytes())],
    ];
    let mut expected = 0;
    for method in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
        for headers in headers {
            for _ in 0..2 {
                let answer = fixture.send(method.clone(), "/echo", headers, "x").await;
                expected += 1;
                assert_eq!(answer.status, StatusCode::CREATED, "{method}: {answer:?}");
                assert!(!answer.is_replay(), "{method}: {answer:?}");
            }
        }
    }
    assert_eq!(fixture.counter().await, expected);
    // The key a GET carried was never claimed: a POST with it runs.
    let post = fixture
        .send(
            Method::POST,
            "/echo",
            &[("idempotency-key", key.as_bytes())],
            "x",
        )
        .await;
    assert_eq!(post.status, StatusCode::CREATED);
    assert!(!post.is_replay());
    let counter = fixture
        .send(Method::GET, "/counter", &[], Bytes::new())
        .await;
    assert_eq!(counter.status, StatusCode::OK);
    assert!(!counter.is_replay());
    // /reset is outside the layer: no key needed.
    let reset = fixture
        .send(Method::POST, "/reset", &[], Bytes::new())
        .await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT);
}

/// PATCH is covered like POST: refused without a key, run once and then replayed with one, and
/// its record is its own (a POST with the same key is another request: 422).
async fn patch_is_covered_like_post(store: &str) {
    let fixture = Fixture::start(store, &[]);
    assert_problem(&fixture.send(Method::PATCH, "/echo", &[], "x").await, 400);
    let key = quoted(&unique("patch"));
    let headers: &[(&str, &[u8])] = &[("idempotency-key", key.as_bytes())];
    let first = fixture.send(Method::PATCH, "/echo", headers, "x").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    let replay = fixture.send(Method::PATCH, "/echo", headers, "x").await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.text(), "x");
    assert_problem(
        &fixture.send(Method::POST, "/echo", headers, "x").await,
        422,
    );
    assert_eq!(fixture.counter().await, 1);
}

/// A path the fixture does not serve is a plain 404, with or without a key: the layer sits on
/// the routes only, so it neither asks for a key nor stores the 404 (a retry is not a replay).
async fn unknown_paths_are_404_outside_the_layer(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = quoted(&unique("nowhere"));
    let keyed: &[(&str, &[u8])] = &[("idempotency-key", key.as_bytes())];
    for (method, path, headers) in [
        (Method::POST, "/nope", &[][..]),
        (Method::POST, "/nope", keyed),
        (Method::POST, "/nope", keyed),
        (Method::PATCH, "/echo/extra", keyed),
        (Method::GET, "/nope", &[][..]),
    ] {
        let answer = fixture.send(method.clone(), path, headers, "x").await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {answer:?}"
        );
        assert!(!answer.is_replay(), "{method} {path}: {answer:?}");
        assert!(answer.text().contains("no route"), "{answer:?}");
    }
    assert_eq!(fixture.counter().await, 0);
}

async fn a_missing_key_is_400_where_required(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let answer = fixture.send(Method::POST, "/echo", &[], "x").await;
    assert_problem(&answer, 400);
    assert_eq!(fixture.counter().await, 0);
}

async fn replay_is_faithful(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("faithful");
    let first = fixture.post("/headers", &key, Bytes::new()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("set-cookie").as_deref(), Some("a=1"));
    let replay = fixture.post("/headers", &key, Bytes::new()).await;
    assert!(replay.is_replay());
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.text(), r#"{"ok":true}"#);
    let without_cookies: Vec<_> = first
        .stable_headers()
        .into_iter()
        .filter(|(n, _)| n != "set-cookie")
        .collect();
    assert_eq!(replay.stable_headers(), without_cookies);
    let multi: Vec<_> = replay
        .headers
        .iter()
        .filter(|(n, _)| n == "x-multi")
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(multi, [b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(replay.header("location").as_deref(), Some("/things/1"));
    assert_eq!(replay.header("etag").as_deref(), Some("\"v1\""));
    assert!(replay.header("set-cookie").is_none(), "{replay:?}");
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    // The echoed body and Content-Type come back byte for byte.
    let bytes: Vec<u8> = (0..=255).collect();
    let key = unique("bytes");
    let headers = [
        ("idempotency-key", quoted(&key).into_bytes()),
        ("content-type", b"application/x-test".to_vec()),
    ];
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
    let first = fixture
        .send(Method::POST, "/echo", &headers, bytes.clone())
        .await;
    let replay = fixture
        .send(Method::POST, "/echo", &headers, bytes.clone())
        .await;
    assert!(replay.is_replay());
    assert_eq!(replay.body.as_ref(), bytes.as_slice());
    assert_eq!(
        replay.header("content-type").as_deref(),
        Some("application/x-test")
    );
    assert_eq!(replay.stable_headers(), first.stable_headers());
    assert_eq!(fixture.counter().await, 2);
}

async fn four_xx_is_stored_and_408_425_429_5xx_released(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let mut expected = 0;
    for code in [400u16, 404, 409, 410, 422, 301] {
        let key = unique("stored");
        let path = format!("/status/{code}");
        let first = fixture.post(&path, &key, Bytes::new()).await;
        let second = fixture.post(&path, &key, Bytes::new()).await;
        expected += 1;
        assert_eq!(first.status.as_u16(), code);
        assert_eq!(second.status.as_u16(), code);
        assert!(second.is_replay(), "{code} is stored: {second:?}");
        assert_eq!(second.text(), format!("status:{code}"));
    }
    // 204 and 304 carry no content, first or replayed (and 204 no Content-Length).
    for code in [204u16, 304] {
        let key = unique("empty");
        let path = format!("/status/{code}");
        let first = fixture.post(&path, &key, Bytes::new()).await;
        let second = fixture.post(&path, &key, Bytes::new()).await;
        expected += 1;
        assert!(second.is_replay(), "{code} is stored: {second:?}");
        for answer in [&first, &second] {
            assert_eq!(answer.status.as_u16(), code);
            assert!(answer.body.is_empty(), "{code}: {answer:?}");
        }
        if code == 204 {
            assert_eq!(first.header("content-length"), None);
            assert_eq!(second.header("content-length"), None);
        }
    }
    for code in [408u16, 425, 429, 500, 502, 503] {
        let key = unique("released");
        let path = format!("/status/{code}");
        for _ in 0..2 {
            let answer = fixture.post(&path, &key, Bytes::new()).await;
            expected += 1;
            assert_eq!(answer.status.as_u16(), code);
            assert!(!answer.is_replay(), "{code} is released: {answer:?}");
        }
    }
    assert_eq!(fixture.counter().await, expected);
}

async fn mismatch_is_422_and_does_not_poison_the_record(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("mismatch");
    assert_eq!(
        fixture.post("/echo", &key, "a").await.status,
        StatusCode::CREATED
    );
    assert_problem(&fixture.post("/echo", &key, "b").await, 422);
    assert_problem(&fixture.post("/echo?x=1", &key, "a").await, 422);
    assert_problem(&fixture.post("/status/201", &key, "a").await, 422);
    let replay = fixture.post("/echo", &key, "a").await;
    assert!(replay.is_replay());
    assert_eq!(replay.text(), "a");
    assert_eq!(fixture.counter().await, 1);
}

async fn mismatch_wins_over_in_flight(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("inflight-mismatch");
    let slow = {
        let key = key.clone();
        let fixture = &fixture;
        async move { fixture.post("/slow?ms=1500", &key, Bytes::new()).await }
    };
    let probe = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let other = fixture.post("/slow?ms=1500", &key, "changed").await;
        let same = fixture.post("/slow?ms=1500", &key, Bytes::new()).await;
        (other, same)
    };
    let (original, (other, same)) = tokio::join!(slow, probe);
    assert_problem(&other, 422);
    assert_problem(&same, 409);
    assert_eq!(original.text(), "slept:1500");
    let replay = fixture.post("/slow?ms=1500", &key, Bytes::new()).await;
    assert!(replay.is_replay());
    assert_eq!(replay.text(), "slept:1500");
    assert_eq!(fixture.counter().await, 1);
}

async fn in_flight_is_409_with_retry_after(store: &str) {
    let fixture = Fixture::start(store, &["--lease-ms", "5000"]);
    let key = unique("conflict");
    let slow = fixture.post("/slow?ms=1000", &key, Bytes::new());
    let probe = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fixture.post("/slow?ms=1000", &key, Bytes::new()).await
    };
    let (original, conflict) = tokio::join!(slow, probe);
    assert_eq!(original.status, StatusCode::OK);
    assert_problem(&conflict, 409);
    let retry_after: u64 = conflict
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!((1..=5).contains(&retry_after), "Retry-After {retry_after}");
    let replay = fixture.post("/slow?ms=1000", &key, Bytes::new()).await;
    assert!(replay.is_replay());
    assert_eq!(fixture.counter().await, 1);
}

async fn heartbeat_keeps_the_lease_of_a_long_handler(store: &str) {
    // A 600 ms lease, beaten every 200 ms, under a 1.5 s handler: a retry at 1 s still meets
    // the live claim instead of taking it over.
    let fixture = Fixture::start(store, &["--lease-ms", "600"]);
    let key = unique("heartbeat");
    let slow = fixture.post("/slow?ms=1500", &key, Bytes::new());
    let probe = async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        fixture.post("/slow?ms=1500", &key, Bytes::new()).await
    };
    let (original, retry) = tokio::join!(slow, probe);
    assert_eq!(original.status, StatusCode::OK);
    assert_problem(&retry, 409);
    assert_eq!(fixture.counter().await, 1);
}

async fn scopes_are_isolated_by_authorization(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = quoted(&unique("scoped"));
    let as_user = |auth: &'static str, body: &'static str| {
        let key = key.clone();
        let fixture = &fixture;
        async move {
            let mut headers: Vec<(&str, &[u8])> = vec![("idempotency-key", key.as_bytes())];
            if !auth.is_empty() {
                headers.push(("authorization", auth.as_bytes()));
            }
            fixture.send(Method::POST, "/echo", &headers, body).await
        }
    };
    let alice = as_user("Bearer alice", "alice's").await;
    let bob = as_user("Bearer bob", "bob's").await;
    let anonymous = as_user("", "anonymous").await;
    for answer in [&alice, &bob, &anonymous] {
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(
            !answer.is_replay(),
            "another principal's record was used: {answer:?}"
        );
    }
    assert_eq!(as_user("Bearer alice", "alice's").await.text(), "alice's");
    let bob_again = as_user("Bearer bob", "bob's").await;
    assert!(bob_again.is_replay());
    assert_eq!(bob_again.text(), "bob's");
    assert_eq!(fixture.counter().await, 3);
}

async fn client_disconnect_still_executes_once_and_replays(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("disconnect");
    let request = format!(
        "POST /slow?ms=700 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {}\r\nContent-Length: 0\r\n\r\n",
        quoted(&key)
    );
    {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The client goes away while the handler runs.
    }
    fixture.wait_for_counter(1).await;
    let mut replay = fixture.post("/slow?ms=700", &key, Bytes::new()).await;
    for _ in 0..50 {
        if replay.is_replay() {
            break;
        }
        assert_eq!(replay.status, StatusCode::CONFLICT, "{replay:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        replay = fixture.post("/slow?ms=700", &key, Bytes::new()).await;
    }
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.text(), "slept:700");
    assert_eq!(fixture.counter().await, 1);
}

async fn request_body_over_the_limit_is_413(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let limit = 1024 * 1024;
    // Sized: refused from the Content-Length, before the body is read. Sent raw, so a server
    // that answers before the client has written the whole body does not fail the client.
    let key = quoted(&unique("big"));
    let mut raw = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        limit + 1
    )
    .into_bytes();
    raw.resize(raw.len() + limit + 1, b'b');
    let (status, text) = fixture.raw(&raw).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    // Chunked, so the size is only known while reading.
    let key = quoted(&unique("chunked-big"));
    let mut raw = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..17 {
        raw.extend_from_slice(format!("{:x}\r\n", 65536).as_bytes());
        raw.extend_from_slice(&[b'c'; 65536]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let (status, _) = fixture.raw(&raw).await;
    assert_eq!(status, 413);
    assert_eq!(fixture.counter().await, 0, "nothing ran");
    let at_limit = fixture
        .post("/echo", &unique("limit"), vec![b'b'; limit])
        .await;
    assert_eq!(at_limit.status, StatusCode::CREATED);
    assert_eq!(at_limit.body.len(), limit);
}

async fn chunked_and_sized_bodies_share_a_fingerprint(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("dechunked");
    let raw = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n",
        quoted(&key)
    );
    let (status, text) = fixture.raw(raw.as_bytes()).await;
    assert_eq!(status, 201, "{text}");
    let replay = fixture.post("/echo", &key, "hello").await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.text(), "hello");
    assert_eq!(fixture.counter().await, 1);
}

async fn large_responses_are_never_re_executed(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("large");
    // 20 MB: far over the 1 MiB cap.
    let path = "/large?bytes=20000000";
    let first = fixture.post(path, &key, Bytes::new()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.len(), 20_000_000, "the first caller gets it all");
    assert!(first.body.iter().all(|&b| b == b'x'));
    let retry = fixture.post(path, &key, Bytes::new()).await;
    assert!(retry.is_replay());
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(
        retry.header("idempotency-replay").as_deref(),
        Some("omitted")
    );
    assert_eq!(
        retry.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert!(retry.body.is_empty());
    assert_eq!(fixture.counter().await, 1);
}

/// A body up to the cap (1 MiB) is stored, compressed: it replays in full. One over the cap
/// is not captured, however well it would compress: it is replayed omitted.
async fn compressible_large_responses_replay_in_full(store: &str) {
    let fixture = Fixture::start(store, &[]);
    let key = unique("compressible");
    let path = "/large?bytes=1000000";
    let first = fixture.post(path, &key, Bytes::new()).await;
    let retry = fixture.post(path, &key, Bytes::new()).await;
    assert!(retry.is_replay());
    assert!(retry.header("idempotency-replay").is_none());
    assert_eq!(retry.body, first.body);
    let key = unique("compressible-over");
    let path = "/large?bytes=3000000";
    let first = fixture.post(path, &key, Bytes::new()).await;
    assert_eq!(first.body.len(), 3_000_000);
    let retry = fixture.post(path, &key, Bytes::new()).await;
    assert!(retry.is_replay());
    assert_eq!(
        retry.header("idempotency-replay").as_deref(),
        Some("omitted")
    );
    assert_eq!(fixture.counter().await, 2);
}

async fn records_expire_after_retention(store: &str) {
    let fixture = Fixture::start(store, &["--retention-ms", "1500"]);
    let key = unique("expiry");
    assert!(!fixture.post("/echo", &key, "a").await.is_replay());
    assert!(fixture.post("/echo", &key, "a").await.is_replay());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let after = fixture.post("/echo", &key, "a").await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.is_replay(), "expired: runs again");
    assert_eq!(fixture.counter().await, 2);
}

/// Fires `per_key` concurrent requests for each of `keys` keys at once; checks every answer is
/// the executed one, a byte-identical replay, or a 409, and that each key ran once.
async fn storm(store: &str, keys: usize, per_key: usize) {
    let fixture = Arc::new(Fixture::start(store, &[]));
    let names: Vec<String> = (0..keys).map(|i| unique(&format!("storm{i}"))).collect();
    let mut set = tokio::task::JoinSet::new();
    for name in &names {
        for _ in 0..per_key {
            let (fixture, name) = (fixture.clone(), name.clone());
            set.spawn(async move {
                let answer = fixture.post("/slow?ms=30", &name, Bytes::new()).await;
                (name, answer)
            });
        }
    }
    let answers = set.join_all().await;
    assert_eq!(answers.len(), keys * per_key);
    let mut conflicts = 0;
    for (name, answer) in &answers {
        match answer.status {
            StatusCode::OK => assert_eq!(answer.body.as_ref(), b"slept:30", "{name}"),
            StatusCode::CONFLICT => conflicts += 1,
            other => panic!("{name}: unexpected {other}: {answer:?}"),
        }
    }
    assert_eq!(
        fixture.counter().await,
        keys as u64,
        "{conflicts} conflicts"
    );
    // Afterwards every key replays the same bytes.
    for name in &names {
        let replay = fixture.post("/slow?ms=30", name, Bytes::new()).await;
        assert!(replay.is_replay());
        assert_eq!(replay.body.as_ref(), b"slept:30");
    }
    assert_eq!(fixture.counter().await, keys as u64);
}

async fn storm_of_200_on_one_key_executes_once(store: &str) {
    storm(store, 1, 200).await;
}

async fn storm_on_20_keys_executes_20_times(store: &str) {
    storm(store, 20, 10).await;
}

/// `--memory-capacity N` bounds the memory store (the steady-size row of `bench/http.sh`): with
/// room for two records, a third key evicts a settled one, whose retry runs again, while the
/// newest key is still replayed. A bound of 0, or on another store, is refused.
#[tokio::test]
async fn memory_capacity_bounds_the_memory_store() {
    let fixture = Fixture::start("memory", &["--memory-capacity", "2"]);
    let keys: Vec<String> = (0..3).map(|i| unique(&format!("bounded{i}"))).collect();
    for key in &keys {
        assert!(!fixture.post("/echo", key, "a").await.is_replay());
    }
    assert!(fixture.post("/echo", &keys[2], "a").await.is_replay());
    assert_eq!(fixture.counter().await, 3);
    let mut replays = 0;
    for key in &keys[..2] {
        if fixture.post("/echo", key, "a").await.is_replay() {
            replays += 1;
        }
    }
    assert!(replays < 2, "no record was evicted");
    for args in [
        &["--memory-capacity", "0"][..],
        &["--memory-capacity", "2", "--store", "redb:/nonexistent/x"][..],
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_idem-fixture"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--memory-capacity"),
            "{args:?}"
        );
    }
}

/// The fixture's own bad inputs are a 400 with a `text/plain` reason from the route, never a
/// 500 or a crash, and count nothing: a status outside 200..=599 (HTTP defines none above 599,
/// and 1xx is not a final answer), a number that is not one, out of range or missing.
#[tokio::test]
async fn bad_fixture_arguments_are_400_and_count_nothing() {
    let fixture = Fixture::start("memory", &[]);
    for path in [
        "/status/99",
        "/status/100",
        "/status/600",
        "/status/999",
        "/status/1000",
        "/status/abc",
        "/status/-1",
        "/slow",
        "/slow?ms=abc",
        "/slow?ms=-1",
        "/slow?ms=600001",
        "/large?bytes=-1",
        "/large?bytes=",
        "/large?bytes=99999999999999999999999",
    ] {
        let answer = fixture.post(path, &unique("bad-arg"), Bytes::new()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}: {answer:?}");
        assert_eq!(
            answer.header("content-type").as_deref(),
            Some("text/plain"),
            "{path}"
        );
        assert!(!answer.text().is_empty(), "{path}");
    }
    assert_eq!(fixture.counter().await, 0);
    // /reset is outside the layer: a key, valid or not, is ignored.
    for key in [&b"\"r\""[..], b""] {
        let reset = fixture
            .send(
                Method::POST,
                "/reset",
                &[("idempotency-key", key)],
                Bytes::new(),
            )
            .await;
        assert_eq!(reset.status, StatusCode::NO_CONTENT);
    }
}

/// `--help` prints the usage on stdout and exits 0; a bad flag, a bad value or a store that
/// cannot be opened is one line on stderr naming the flag, and exit code 2.
#[test]
fn help_and_bad_command_lines() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem-fixture"))
            .args(args)
            .output()
            .unwrap()
    };
    for help in ["--help", "-h"] {
        let output = run(&[help]);
        assert_eq!(output.status.code(), Some(0), "{help}");
        assert!(String::from_utf8_lossy(&output.stdout).starts_with("usage: idem-fixture"));
    }
    for (args, names) in [
        (&["--bogus"][..], "--bogus"),
        (&["--lease-ms"], "--lease-ms"),
        (&["--lease-ms", "0"], "--lease-ms"),
        (&["--retention-ms", "abc"], "--retention-ms"),
        (&["--listen", "nonsense"], "nonsense"),
        (&["--store", "mysql://x"], "--store"),
        (&["--store", "redis://"], "--store"),
        (&["--namespace", "other"], "--namespace"),
        (&["--bare", "--floor"], "--floor"),
        (
            &["--store", "redb:/nonexistent/x", "--namespace", "other"],
            "--namespace",
        ),
    ] {
        let output = run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}

/// `--namespace` keeps fixtures that share a Redis server apart: the same key runs once per
/// namespace, and a second fixture on the same namespace replays the first one's record.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_namespaces_keep_fixtures_apart() {
    let Some(url) = support::redis_url() else {
        return;
    };
    let key = unique("namespaced");
    let one = Fixture::start(&url, &["--namespace", "idem_fixture_test_one"]);
    let two = Fixture::start(&url, &["--namespace", "idem_fixture_test_two"]);
    assert!(!one.post("/echo", &key, "a").await.is_replay());
    assert!(!two.post("/echo", &key, "a").await.is_replay());
    assert_eq!(one.counter().await + two.counter().await, 2);
    let again = Fixture::start(&url, &["--namespace", "idem_fixture_test_one"]);
    let replay = again.post("/echo", &key, "a").await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(again.counter().await, 0);
}

/// `--store redis+cluster://...` puts the fixture's records on a Redis Cluster (the form the
/// gateway takes too; the fixture used to refuse it as an unknown store): the storms run each
/// key once, a replay is faithful, and keys with `{` and `}` in them (a Cluster's hash tag
/// braces) are keys like any other.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_store_runs_each_key_once() {
    if support::redis_url().is_none() {
        return;
    }
    let Some(cluster) = idem_testkit::redis_server::Cluster::start() else {
        return;
    };
    let url = cluster.url();
    storm(&url, 1, 200).await;
    storm(&url, 20, 10).await;
    replay_is_faithful(&url).await;
    in_flight_is_409_with_retry_after(&url).await;
    let fixture = Fixture::start(&url, &[]);
    let keys = ["{a}", "{a}x", "x{a}", "{}", "}{", "{{a}}", "a{b}c{d}"];
    for key in keys {
        let key = format!("{key}{}", unique("braces"));
        let first = fixture.post("/echo", &key, key.clone()).await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}: {first:?}");
        let replay = fixture.post("/echo", &key, key.clone()).await;
        assert!(replay.is_replay(), "{key}: {replay:?}");
        assert_eq!(replay.body, key.as_bytes(), "{key}");
    }
    assert_eq!(fixture.counter().await, keys.len() as u64);
}

/// `--floor` (benchmarks only) stands in for the layer with the least any layer does: one
/// execution per key, the retry answered from what it kept, another body 422, no key 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_runs_a_key_once() {
    floor_runs_a_key_once("memory").await;
}

/// The same with `--store redis://...`: the floor keeps its records in Redis (`SET NX GET`,
/// then `SET`), and a retry gets the status, headers and body back from there, also from
/// another fixture process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_on_redis_runs_a_key_once() {
    let Some(url) = support::redis_url() else {
        return;
    };
    floor_runs_a_key_once(&url).await;
}

async fn floor_runs_a_key_once(store: &str) {
    let fixture = Fixture::start(store, &["--floor"]);
    let key = unique("floor");
    let first = fixture.post("/echo", &key, "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = fixture.post("/echo", &key, "a").await;
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.header("content-type"), first.header("content-type"));
    assert_eq!(
        fixture.post("/echo", &key, "b").await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (status, _) = fixture
        .raw(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(status, 400);
    assert_eq!(fixture.counter().await, 1);
    if store != "memory" {
        // The record is in Redis, not in the process: another fixture replays it.
        let second = Fixture::start(store, &["--floor"]);
        let replay = second.post("/echo", &key, "a").await;
        assert_eq!((replay.status, &replay.body), (first.status, &first.body));
        assert_eq!(second.counter().await, 0);
    }
}
