//! End-to-end: what the proxy does to headers and trailers, against an upstream written here
//! (hyper's HTTP/1.1 server) that sends trailers and a proxy challenge and records what it
//! was sent. The gateway runs in this process on the memory store, on 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use common::{Answer, Fixture, Gateway, Http, config, free_addr, try_post};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// An upstream whose every answer is `200 paid-N` (N counts its executions) with the trailer
/// `x-checksum: N`, announced by `Trailer`, and a `Proxy-Authenticate` challenge. It keeps the
/// headers of every request it gets.
struct Upstream {
    addr: SocketAddr,
    runs: Arc<AtomicU64>,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let runs = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (counter, log) = (runs.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (counter, log) = (counter.clone(), log.clone());
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    log.lock().unwrap().push(request.headers().clone());
                    async move {
                        let mut trailers = HeaderMap::new();
                        trailers.insert("x-checksum", HeaderValue::from(n));
                        let body = Chunked {
                            data: Some(Bytes::from(format!("paid-{n}"))),
                            trailers: Some(trailers),
                        };
                        let response = Response::builder()
                            .header(header::CONTENT_TYPE, "text/plain")
                            .header(header::TRAILER, "x-checksum")
                            .header(header::PROXY_AUTHENTICATE, "Basic realm=\"upstream\"")
                            .body(body)
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, runs, seen }
    }

    fn last_request_headers(&self) -> HeaderMap {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

/// A body of one data frame and then trailers, of no announced length: an HTTP/1.1 server
/// sends it chunked, the only framing with room for trailers.
struct Chunked {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        Poll::Ready(match this.data.take() {
            Some(data) => Some(Ok(Frame::data(data))),
            None => this.trailers.take().map(|t| Ok(Frame::trailers(t))),
        })
    }
}

/// POSTs `10 EUR` to `url` with `headers`, over HTTP/2 (prior knowledge) when `http2`, else
/// HTTP/1.1.
async fn post(url: &str, headers: &[(&str, &str)], http2: bool) -> Answer {
    try_post(url, headers, http2).await.unwrap()
}

/// The upstream's trailers reach an HTTP/1.1 client that asks for them (`TE: trailers`), on
/// the first execution and on its replay, where they are the first run's; the gateway asks the
/// upstream for trailers whether or not its client did. Before, the gateway dropped `Trailer`
/// as if it were hop-by-hop, so hyper's server sent no trailer at all, and a replay announced
/// a body length, after which HTTP/1.1 has no place for trailers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_an_http1_client_on_the_first_run_and_the_replay() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let url = gateway.url("/pay");
    let asks = [("idempotency-key", "tr-1"), ("te", "trailers")];

    let first = post(&url, &asks, false).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "paid-1");
    let trailers = first.trailers.expect("the first run's trailers");
    assert_eq!(trailers["x-checksum"], "1");
    assert_eq!(
        upstream.last_request_headers()[header::TE],
        "trailers",
        "the upstream is asked for its trailers"
    );

    let replay = post(&url, &asks, false).await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, "paid-1");
    assert_eq!(replay.headers[header::TRAILER], "x-checksum");
    let trailers = replay.trailers.expect("the replay's trailers");
    assert_eq!(trailers["x-checksum"], "1", "the first run's trailers");
    assert_eq!(upstream.runs.load(Ordering::SeqCst), 1);

    // A request the layer does not cover (no key) passes them on as well; a client that did
    // not ask for trailers gets the body without them, and the upstream is asked all the same.
    let plain = post(&url, &[("te", "trailers")], false).await;
    assert_eq!(plain.body, "paid-2");
    assert_eq!(plain.trailers.expect("trailers")["x-checksum"], "2");
    let unasked = post(&url, &[("idempotency-key", "tr-2")], false).await;
    assert_eq!(unasked.body, "paid-3");
    assert!(unasked.trailers.is_none());
    assert_eq!(upstream.last_request_headers()[header::TE], "trailers");
    let replay = post(
        &url,
        &[("idempotency-key", "tr-2"), ("te", "trailers")],
        false,
    )
    .await;
    assert_eq!(replay.trailers.expect("trailers")["x-checksum"], "3");
}

/// Over HTTP/2 the trailers need no asking: the first run and the replay end with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_an_http2_client_on_the_first_run_and_the_replay() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let url = gateway.url("/pay");
    let key = [("idempotency-key", "tr-h2")];
    let first = post(&url, &key, true).await;
    assert_eq!(first.trailers.expect("trailers")["x-checksum"], "1");
    let replay = post(&url, &key, true).await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.trailers.expect("trailers")["x-checksum"], "1");
    assert_eq!(upstream.runs.load(Ordering::SeqCst), 1);
}

/// `Proxy-Authenticate` is the upstream's challenge to the next proxy, the gateway: it is not
/// passed on to the client (nor stored), as `Proxy-Authorization` is not passed upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_authentication_headers_stop_at_the_gateway_both_ways() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let url = gateway.url("/pay");
    for key in [None, Some("pa-1"), Some("pa-1")] {
        let mut headers = vec![("proxy-authorization", "Basic Zm9vOmJhcg==")];
        headers.extend(key.map(|key| ("idempotency-key", key)));
        let answer = post(&url, &headers, false).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(
            !answer.headers.contains_key(header::PROXY_AUTHENTICATE),
            "{:?}",
            answer.headers
        );
    }
    let sent = upstream.last_request_headers();
    assert!(!sent.contains_key(header::PROXY_AUTHORIZATION), "{sent:?}");
}

/// A 502 or 504 tells the client what went wrong, not where the upstream is nor what the
/// connection said: those are the log's. Before, the detail was the log line itself
/// ("cannot reach the upstream http://10.0.0.5:3000: ...").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_or_504_does_not_show_the_upstream_to_the_client() {
    let http = Http::new();
    let down = free_addr();
    let gateway = Gateway::start(&config(down, "")).await;
    let unreachable = http.post_key(&gateway.url("/pay"), "gone-1", "x").await;
    assert_eq!(unreachable.status, 502);
    let detail = unreachable.text();
    assert!(
        detail.contains("the upstream cannot be reached"),
        "{detail}"
    );
    assert!(!detail.contains(&down.to_string()), "{detail}");
    assert!(!detail.contains("Connect"), "{detail}");

    let fixture = Fixture::start();
    let mut settings = config(fixture.addr, "");
    settings.upstream.as_mut().unwrap().timeout = std::time::Duration::from_millis(300);
    let slow_gateway = Gateway::start(&settings).await;
    let timed_out = http
        .post_key(&slow_gateway.url("/slow?ms=3000"), "slow-1", "")
        .await;
    assert_eq!(timed_out.status, 504);
    let detail = timed_out.text();
    assert!(detail.contains("did not answer within 300ms"), "{detail}");
    assert!(!detail.contains(&fixture.addr.to_string()), "{detail}");
}

/// A client that names the forwarded headers and `Host` in `Connection` drops only the values
/// it sent: the upstream still gets `Host` as asked and the client's address in
/// `X-Forwarded-For`. Before, the gateway set its forwarded headers and then removed the
/// headers `Connection` named, so such a client reached the upstream with no
/// `X-Forwarded-For` at all (hiding its address) and with the upstream's address as `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cannot_remove_host_or_the_forwarded_headers() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let url = gateway.url("/pay");
    for key in [None, Some("fw-1")] {
        let mut headers = vec![
            (
                "connection",
                "x-forwarded-for, x-forwarded-proto, x-forwarded-host, host",
            ),
            ("host", "api.example.com"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
        ];
        headers.extend(key.map(|key| ("idempotency-key", key)));
        let answer = post(&url, &headers, false).await;
        assert_eq!(answer.status, StatusCode::OK);
        let sent = upstream.last_request_headers();
        assert_eq!(sent[header::HOST], "api.example.com", "{sent:?}");
        assert_eq!(sent.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(sent["x-forwarded-for"], "127.0.0.1", "{sent:?}");
        assert_eq!(sent["x-forwarded-proto"], "http", "{sent:?}");
        assert_eq!(sent["x-forwarded-host"], "api.example.com", "{sent:?}");
    }
}

/// Sends `head` (a request head, without its blank line) and `Connection: close` to the
/// gateway at `url` over a plain TCP connection, byte for byte as written (a client library
/// would not send two `Host` lines), and returns the answer's status.
async fn raw_status(url: &str, head: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("{head}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

/// The gateway refuses, with 400 and without calling the upstream, a request whose `Host` the
/// gateway and the upstream could read differently (RFC 9112 section 3.2): two `Host` lines, a
/// `Host` that is not a host and a port, an HTTP/1.1 request without one. A request in absolute
/// form reaches the upstream with the target's host as `Host` (section 3.2.2). Before, all of
/// them were forwarded: both `Host` lines (the gateway's `X-Forwarded-Host` naming the first,
/// the upstream free to take the second), the bad value as it came, the upstream's own address
/// as the `Host` of a request without one, and the `Host` line of an absolute-form request
/// whose target named another host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_an_ambiguous_host_is_refused() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config(upstream.addr, "")).await;
    let url = gateway.url("");
    for head in [
        "POST /pay HTTP/1.1\r\nHost: a.example\r\nHost: b.example",
        "POST /pay HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: host-1\r\nHost: b.example",
        "POST /pay HTTP/1.1\r\nHost: a b",
        "POST /pay HTTP/1.1\r\nHost: user@a.example",
        "POST /pay HTTP/1.1",
    ] {
        assert_eq!(raw_status(&url, head).await, 400, "{head}");
    }
    assert_eq!(upstream.runs.load(Ordering::SeqCst), 0);

    let head = "POST http://api.example.com/pay HTTP/1.1\r\nHost: other.example";
    assert_eq!(raw_status(&url, head).await, 200);
    let sent = upstream.last_request_headers();
    assert_eq!(sent.get_all(header::HOST).iter().count(), 1);
    assert_eq!(sent[header::HOST], "api.example.com", "{sent:?}");
    assert_eq!(sent["x-forwarded-host"], "api.example.com", "{sent:?}");
    // An HTTP/1.0 request may come without a Host.
    assert_eq!(raw_status(&url, "POST /pay HTTP/1.0").await, 200);

    // Over HTTP/2, a Host must name the :authority's host (case aside).
    let runs = upstream.runs.load(Ordering::SeqCst);
    let other = post(&gateway.url("/pay"), &[("host", "other.example")], true).await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);
    assert_eq!(upstream.runs.load(Ordering::SeqCst), runs);
    let authority = gateway.url("").trim_start_matches("http://").to_owned();
    let same = post(&gateway.url("/pay"), &[("host", &authority)], true).await;
    assert_eq!(same.status, StatusCode::OK);
}
