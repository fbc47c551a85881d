//! End-to-end: what a client sends that must not reach the upstream as it came, over raw
//! HTTP/1.1 bytes and a real HTTP/2 client: a covered method in another case, HTTP/2 cookie
//! crumbs and field counts, header names with underscores, a client's `Forwarded`, `X-Real-IP`
//! and idem answer headers, a transfer coding the gateway does not carry, a malformed chunked
//! body, and paths that servers resolve differently. The gateway runs in this process on the
//! memory store; the upstream is a raw socket that records what it got.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::raw_http::{Message, RawClient, RawUpstream};
use common::{Gateway, config, config_with_server, metric_value, metrics_recorder};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// An upstream that answers `200 ran-N`.
async fn counting_upstream() -> RawUpstream {
    RawUpstream::start(|_: &Message, n| {
        let body = format!("ran-{n}");
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    })
    .await
}

/// A key-required `/payments` route and an unkeyed `/plain` one.
const ROUTES: &str = "[[route]]\nname = \"payments\"\npath = \"/payments\"\nkey = \"required\"\n\n\
     [[route]]\nname = \"plain\"\npath = \"/plain\"\nenabled = false\n";

/// Sends `head` (without its blank line) with `body` on a new connection; the status code.
async fn raw(gateway: &Gateway, head: &str, body: &str) -> (u16, Message) {
    let mut client = RawClient::connect(&gateway.url).await;
    let request = format!("{head}\r\nConnection: close\r\n\r\n{body}");
    let answer = client.exchange(&request).await.expect("an answer");
    let status = answer
        .start()
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// An HTTP/2 request (prior knowledge) with `headers`; the status and body.
async fn h2(url: &str, method: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let mut request = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(
            request
                .body(Full::new(Bytes::from_static(b"10 EUR")))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `post /payments`, `Post /payments` (HTTP/1.1) and `:method post` (HTTP/2) with one key are
/// refused with 400, never run; only `POST` runs, once. Before, each spelling ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_covered_method_in_another_case_never_runs() {
    let upstream = counting_upstream().await;
    let gateway = Gateway::start(&config(upstream.addr, ROUTES)).await;
    for method in ["post", "Post", "pOsT"] {
        for key in ["Idempotency-Key: k1\r\n", ""] {
            let head = format!("{method} /payments HTTP/1.1\r\nHost: a\r\n{key}Content-Length: 1");
            let (status, answer) = raw(&gateway, head.trim_end(), "x").await;
            assert_eq!(status, 400, "{method}: {answer:?}");
        }
    }
    let (status, body) = h2(
        &gateway.url("/payments"),
        "post",
        &[("idempotency-key", "k1")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("MethodCase"), "{body}");
    assert_eq!(upstream.runs(), 0);
    for _ in 0..2 {
        let head = "POST /payments HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k1\r\nContent-Length: 1";
        let (status, answer) = raw(&gateway, head, "x").await;
        assert_eq!(status, 200);
        assert_eq!(answer.body, b"ran-1");
    }
    assert_eq!(upstream.runs(), 1);
}

/// An HTTP/2 client's cookie crumbs reach the HTTP/1.1 upstream as one `Cookie` line joined
/// with "; " (before: one line each), and an HTTP/2 request over `max_headers` is 431 as an
/// HTTP/1.1 one is (before: 1,500 fields reached the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_cookies_are_joined_and_its_fields_counted() {
    let upstream = counting_upstream().await;
    let gateway = Gateway::start(&config(upstream.addr, ROUTES)).await;
    let cookies = [("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")];
    let (status, _) = h2(&gateway.url("/plain"), "GET", &cookies).await;
    assert_eq!(status, 200);
    let got = upstream.last_request();
    let lines: Vec<&String> = got
        .head
        .iter()
        .filter(|line| line.to_ascii_lowercase().starts_with("cookie:"))
        .collect();
    assert_eq!(lines.len(), 1, "{:?}", got.head);
    assert_eq!(got.header("cookie"), Some("a=1; b=2; c=3"));

    let names: Vec<String> = (0..150).map(|n| format!("x-field-{n}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    let runs = upstream.runs();
    let (status, _) = h2(&gateway.url("/plain"), "GET", &many).await;
    assert_eq!(status, 431);
    assert_eq!(upstream.runs(), runs);
}

/// `Idempotency_Fence`, `Idempotency_Attempt` and `X_Forwarded_For` never reach the upstream
/// (a CGI, WSGI or Rack server would read them as the real headers); a client's
/// `X-Real-IP`, its `Forwarded` taken at its word, and its `Idempotent-Replayed`,
/// `Idempotency-Replay` and `Idempotency-Status` do not either. With
/// `underscores_in_headers = true` the underscored names pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_headers_do_not_reach_the_upstream() {
    let upstream = counting_upstream().await;
    let gateway = Gateway::start(&config(upstream.addr, ROUTES)).await;
    let head = "POST /payments HTTP/1.1\r\nHost: a\r\nIdempotency-Key: forged\r\n\
                Idempotency_Fence: 88888888888888888\r\nIdempotency_Attempt: 9\r\n\
                X_Forwarded_For: 10.6.6.6\r\nX-Real-IP: 10.7.7.7\r\nForwarded: for=10.8.8.8\r\n\
                Idempotent-Replayed: true\r\nIdempotency-Replay: omitted\r\n\
                Idempotency-Status: unrecorded\r\nContent-Length: 1";
    let (status, _) = raw(&gateway, head, "x").await;
    assert_eq!(status, 200);
    let got = upstream.last_request();
    for name in [
        "idempotency_fence",
        "idempotency_attempt",
        "x_forwarded_for",
        "idempotent-replayed",
        "idempotency-replay",
        "idempotency-status",
    ] {
        assert_eq!(
            got.header(name),
            None,
            "{name} reached the upstream: {:?}",
            got.head
        );
    }
    assert_eq!(got.header("x-real-ip"), Some("127.0.0.1"));
    assert_eq!(
        got.header("forwarded"),
        Some("for=10.8.8.8, for=\"127.0.0.1\";host=\"a\";proto=http")
    );
    // The gateway's own fence is there, and it is the gateway's.
    assert_ne!(got.header("idempotency-fence"), Some("88888888888888888"));
    assert!(got.header("idempotency-fence").is_some());

    let upstream2 = counting_upstream().await;
    let kept = config_with_server(upstream2.addr, "underscores_in_headers = true", ROUTES);
    let gateway2 = Gateway::start(&kept).await;
    let head = "POST /plain HTTP/1.1\r\nHost: a\r\nX_Custom: 1\r\nContent-Length: 1";
    let (status, _) = raw(&gateway2, head, "x").await;
    assert_eq!(status, 200);
    assert_eq!(upstream2.last_request().header("x_custom"), Some("1"));
}

/// `Transfer-Encoding: gzip, chunked` is 400 and not forwarded (before: forwarded as plain
/// chunked, the gzip coding dropped); a malformed chunked body is a 400 counted in
/// `idem_gateway_client_body_errors_total`, not a 502 counted as an upstream failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_gateway_cannot_carry_is_the_clients_400() {
    let upstream = RawUpstream::start(|_: &Message, n| {
        format!("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n{n}")
    })
    .await;
    let recorder = metrics_recorder();
    let gateway = Gateway::start_with_metrics(&config(upstream.addr, ROUTES), Some(recorder)).await;
    let head = "POST /plain HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked";
    let (status, _) = raw(&gateway, head, "3\r\nabc\r\n0\r\n\r\n").await;
    assert_eq!(status, 400);
    assert_eq!(upstream.runs(), 0);

    let http = common::Http::new();
    let admin = gateway.admin.clone().unwrap();
    let series = "idem_gateway_client_body_errors_total";
    let before = metric_value(&http, &admin, series).await.0.unwrap_or(0.0);
    let upstream_failed = "idem_gateway_upstream_errors_total{kind=\"failed\"}";
    let failed_before = metric_value(&http, &admin, upstream_failed)
        .await
        .0
        .unwrap_or(0.0);
    for path in ["/plain", "/payments"] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\nIdempotency-Key: broken-{path}\r\nTransfer-Encoding: chunked"
        );
        let (status, answer) = raw(&gateway, &head, "3\r\nabc\r\nzz\r\n").await;
        assert_eq!(status, 400, "{path}: {answer:?}");
    }
    let after = metric_value(&http, &admin, series).await.0.unwrap_or(0.0);
    assert!(after > before, "{series}: {before} -> {after}");
    let failed_after = metric_value(&http, &admin, upstream_failed)
        .await
        .0
        .unwrap_or(0.0);
    assert_eq!(failed_after, failed_before);
}

/// Spellings of `/payments` that Tomcat, Spring, Windows or a C string resolve to it are 400
/// by default, never forwarded without a key (before: each escaped the key-required route);
/// `allow_ambiguous_paths = true` forwards them as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_servers_resolve_differently_are_refused() {
    let upstream = counting_upstream().await;
    let gateway = Gateway::start(&config(upstream.addr, ROUTES)).await;
    let spellings = [
        "/x/..;/payments",
        "/\\payments",
        "/payments\\",
        "/payments%5C",
        "/payments%00",
        "/payments%2E",
        "/%2Fpayments",
    ];
    for path in spellings {
        let head = format!("POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 1");
        let (status, answer) = raw(&gateway, &head, "x").await;
        assert_eq!(status, 400, "{path}: {answer:?}");
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(body.contains("resolve differently"), "{path}: {body}");
    }
    assert_eq!(upstream.runs(), 0);
    let config = config_with_server(upstream.addr, "allow_ambiguous_paths = true", ROUTES);
    let lenient = Gateway::start(&config).await;
    let head = "POST /payments%2E HTTP/1.1\r\nHost: a\r\nContent-Length: 1";
    let (status, _) = raw(&lenient, head, "x").await;
    assert_eq!(status, 200);
    assert_eq!(upstream.runs(), 1);
}
