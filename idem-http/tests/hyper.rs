//! The layer in plain hyper 1: a `service_fn` served by `hyper::server::conn::http1` (and
//! `http2`, for trailers) through hyper-util's `TowerToHyperService`, called over 127.0.0.1:0
//! with a real client.
//!
//! hyper's `Incoming` cannot be built from bytes, and the layer hands the handler the body it
//! read as a `ReqBody::from(bytes)`: the request body is wrapped, on the way in, into the
//! crate's `RequestBody`, which can be either.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use idem_http::{IdempotencyLayer, Outcome, RequestBody};
use idem_store_memory::MemoryStore;
use tower::ServiceBuilder;

/// Serves `service` on 127.0.0.1:0, over HTTP/1.1 or HTTP/2 (prior knowledge) as each client
/// speaks: its address, and the accept loop to abort at the end.
async fn serve<S, B>(service: S) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>)
where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, server)
}

#[tokio::test]
async fn the_layer_serves_a_plain_hyper_service_fn() {
    let counter = Arc::new(AtomicU64::new(0));
    let runs = counter.clone();
    let handler = tower::service_fn(move |request: Request<RequestBody<Incoming>>| {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let body = request.into_body().collect().await?.to_bytes();
            let mut response = Response::new(Full::new(Bytes::from(format!("{n}:{body:?}"))));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, idem_core::BoxError>(response)
        }
    });
    let service = ServiceBuilder::new()
        .map_request(|request: Request<Incoming>| request.map(RequestBody::new))
        .map_response(|response: Response<_>| {
            let outcome = response.extensions().get::<Outcome>().copied();
            let mut response = response;
            let value = outcome.map_or("none", Outcome::as_str);
            response
                .headers_mut()
                .insert("x-outcome", http::HeaderValue::from_static(value));
            response
        })
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);

    let (addr, server) = serve(service).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = |key: &str, body: &'static str| {
        let request = Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        }
    };
    let (first, first_body) = send("\"h\"", "10 EUR").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["x-outcome"], "executed");
    assert_eq!(first_body, r#"1:b"10 EUR""#);
    let (replay, replay_body) = send("\"h\"", "10 EUR").await;
    assert_eq!(replay.headers["x-outcome"], "replayed");
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay_body, first_body);
    let (other, _) = send("\"h\"", "99 EUR").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.headers["content-type"], "application/problem+json");
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    server.abort();
}

/// Posts `10 EUR` to `/pay` at `addr` under `key`, asking for trailers, and reads the whole
/// answer, which must come over `version`: its head, its body and its trailers.
async fn post_reading_trailers(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: std::net::SocketAddr,
    key: &str,
    version: http::Version,
) -> (http::response::Parts, Bytes, Option<http::HeaderMap>) {
    let request = Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", key)
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"10 EUR")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), version);
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (parts, collected.to_bytes(), trailers)
}

/// Serves, behind the layer on a memory store, a handler that answers `paid` and then the
/// trailers `trailers` makes of the run's number (from 1), with the headers `head` sets: its
/// address, the accept loop to abort at the end, and the count of runs.
async fn serve_paid_with_trailers(
    trailers: fn(u64) -> http::HeaderMap,
    head: fn(&mut http::HeaderMap),
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<()>,
    Arc<AtomicU64>,
) {
    let counter = Arc::new(AtomicU64::new(0));
    let runs = counter.clone();
    let handler = tower::service_fn(move |_: Request<RequestBody<Incoming>>| {
        let trailers = trailers(runs.fetch_add(1, Ordering::SeqCst) + 1);
        async move {
            let body = Full::new(Bytes::from_static(b"paid"))
                .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
            let mut response = Response::new(body);
            head(response.headers_mut());
            Ok::<_, hyper::Error>(response)
        }
    });
    let service = ServiceBuilder::new()
        .map_request(|request: Request<Incoming>| request.map(RequestBody::new))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    let (addr, server) = serve(service).await;
    (addr, server, counter)
}

/// Over real HTTP/2 (where trailers travel as a last HEADERS frame), a handler's trailers
/// reach the first caller and, stored with the response, the caller of a replay.
#[tokio::test]
async fn a_replay_over_http2_carries_the_trailers() {
    let (addr, server, counter) = serve_paid_with_trailers(
        |n| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            trailers.insert("x-run", http::HeaderValue::from(n));
            trailers
        },
        |_| {},
    )
    .await;

    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let send = || post_reading_trailers(&client, addr, "\"h2\"", http::Version::HTTP_2);
    let (first, first_body, first_trailers) = send().await;
    assert!(first.headers.get("idempotent-replayed").is_none());
    assert_eq!(first_body, "paid");
    let first_trailers = first_trailers.expect("the first caller's trailers");
    assert_eq!(first_trailers["grpc-status"], "0");
    assert_eq!(first_trailers["x-run"], "1");

    let (replay, replay_body, replay_trailers) = send().await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay_body, "paid");
    let replay_trailers = replay_trailers.expect("the replay's trailers");
    assert_eq!(replay_trailers["grpc-status"], "0");
    assert_eq!(
        replay_trailers["x-run"], "1",
        "not the first run's trailers"
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    server.abort();
}

/// Over HTTP/1.1, trailers travel only after a chunked body, and a server sends only those the
/// `Trailer` header names to a client that sent `TE: trailers`: the first caller and the
/// caller of a replay both get them. Before, the layer answered both with a `Content-Length`
/// (the body's length is known once read) and a replay had no `Trailer` header (it is never
/// stored), so hyper dropped the trailers.
#[tokio::test]
async fn a_replay_over_http1_carries_the_trailers() {
    let (addr, server, counter) = serve_paid_with_trailers(
        |n| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-run", http::HeaderValue::from(n));
            trailers.append("x-sum", http::HeaderValue::from_static("a"));
            trailers.append("x-sum", http::HeaderValue::from_static("b"));
            trailers
        },
        |head| {
            let announced = http::HeaderValue::from_static("x-run, x-sum");
            head.insert(http::header::TRAILER, announced);
        },
    )
    .await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = || post_reading_trailers(&client, addr, "\"h1\"", http::Version::HTTP_11);
    let (first, first_body, first_trailers) = send().await;
    assert_eq!(first_body, "paid");
    assert!(first.headers.get("content-length").is_none());
    let first_trailers = first_trailers.expect("the first caller's trailers");
    assert_eq!(first_trailers["x-run"], "1");

    let (replay, replay_body, replay_trailers) = send().await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay_body, "paid");
    assert_eq!(replay.headers["trailer"], "x-run, x-sum");
    let replay_trailers = replay_trailers.expect("the replay's trailers");
    assert_eq!(
        replay_trailers["x-run"], "1",
        "not the first run's trailers"
    );
    let sums: Vec<_> = replay_trailers.get_all("x-sum").iter().collect();
    assert_eq!(sums, ["a", "b"]);
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    server.abort();
}

/// The headers only idem sets.
const FORGED: [&str; 3] = [
    "idempotent-replayed",
    "idempotency-replay",
    "idempotency-status",
];

/// A handler's own `Idempotent-Replayed`, `Idempotency-Replay` and `Idempotency-Status` reach
/// no caller of a fresh run (keyed or not) and are not stored: only the layer sets them. Its
/// trailers lose their connection fields (an HTTP/2 peer resets a stream whose trailers hold
/// one), so the first caller gets the whole response and the replay's trailers are its own.
/// Before, the forged headers were passed on, stored and replayed, and the first caller got
/// DATA and then RST_STREAM.
#[tokio::test]
async fn a_handlers_replay_headers_and_connection_trailers_never_reach_a_caller() {
    let (addr, server, counter) = serve_paid_with_trailers(
        |n| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("connection", http::HeaderValue::from_static("x-hop"));
            trailers.insert("x-hop", http::HeaderValue::from_static("v"));
            trailers.insert("keep-alive", http::HeaderValue::from_static("v"));
            trailers.insert("x-run", http::HeaderValue::from(n));
            trailers
        },
        |head| {
            for name in FORGED {
                head.insert(name, http::HeaderValue::from_static("true"));
            }
        },
    )
    .await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();

    let (first, first_body, first_trailers) =
        post_reading_trailers(&client, addr, "\"forged\"", http::Version::HTTP_2).await;
    assert_eq!(first_body, "paid");
    for name in FORGED {
        assert!(
            first.headers.get(name).is_none(),
            "{name}: {:?}",
            first.headers
        );
    }
    let first_trailers = first_trailers.expect("the first caller's trailers");
    assert_eq!(first_trailers.len(), 1, "{first_trailers:?}");
    assert_eq!(first_trailers["x-run"], "1");

    let (replay, _, replay_trailers) =
        post_reading_trailers(&client, addr, "\"forged\"", http::Version::HTTP_2).await;
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert!(replay.headers.get("idempotency-replay").is_none());
    assert!(replay.headers.get("idempotency-status").is_none());
    assert_eq!(replay_trailers, Some(first_trailers));

    let unkeyed = Request::post(format!("http://{addr}/pay"))
        .body(Full::new(Bytes::from_static(b"10 EUR")))
        .unwrap();
    let unkeyed = client.request(unkeyed).await.unwrap();
    for name in FORGED {
        assert!(unkeyed.headers().get(name).is_none(), "{name}");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 2);
    server.abort();
}
