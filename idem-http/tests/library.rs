//! The layer used as a library, through tower calls (no network): axum's `Router::layer`,
//! `route_layer` and nested routers, a plain `service_fn`, extreme settings, response trailers
//! (stored and replayed, streamed or not, with or without the body), a storm of one key, a heartbeat that keeps a short lease, a streamed response over the
//! storage cap, and the axum extractor without the layer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Clock, Timestamp};
use idem_http::{Config, IdempotencyLayer, Outcome};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use tower::ServiceExt;

fn post_with_key(path: &str, key: &str, body: &'static str) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", key)
        .body(Body::from(body))
        .unwrap()
}

fn outcome_of<B>(response: &Response<B>) -> Option<Outcome> {
    response.extensions().get::<Outcome>().copied()
}

/// A lease, heartbeat or wait of `Duration::MAX` ("no end") is accepted by the builder: it
/// must not overflow the clock (a panic, answered 500) when a request uses it.
#[tokio::test(start_paused = true)]
async fn settings_as_long_as_duration_max_do_not_overflow_the_clock() {
    let config = Config::builder()
        .lease(Duration::MAX)
        .heartbeat(Duration::MAX - Duration::from_secs(1))
        .wait_for_in_flight(Duration::MAX)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/run",
            post(|| async {
                // Long enough for the heartbeat to start.
                tokio::time::sleep(Duration::from_millis(20)).await;
                "ok"
            }),
        )
        .layer(IdempotencyLayer::with_config(MemoryStore::new(), config));
    let first = app
        .clone()
        .oneshot(post_with_key("/run", "\"k\"", ""))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(outcome_of(&first), Some(Outcome::Executed));
    let replay = app
        .oneshot(post_with_key("/run", "\"k\"", ""))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

/// A `Retry-After` of `Duration::MAX` for a store that is down is a 503, not an overflow.
#[tokio::test]
async fn a_store_retry_after_of_duration_max_is_a_503() {
    let store = FaultyStore::new(MemoryStore::new());
    store.faults.claim_down.store(true, Ordering::SeqCst);
    let config = Config::builder()
        .store_retry_after(Duration::MAX)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/run", post(|| async { "ok" }))
        .layer(IdempotencyLayer::with_config(store, config));
    let answer = app
        .oneshot(post_with_key("/run", "\"k\"", ""))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.headers()["retry-after"], u64::MAX.to_string());
}

/// A handler whose body has a known length and trailers (`grpc-status`, a checksum): the
/// layer reads the body whole to store it, the first caller still gets the trailers, and so
/// does a replay.
#[tokio::test]
async fn the_first_caller_gets_the_trailers_of_a_body_of_known_length() {
    let handler = tower::service_fn(|_: Request<Full<Bytes>>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from_static(b"data"))
            .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
        Ok::<_, Infallible>(Response::new(body))
    });
    let service = tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    let request = || {
        Request::post("/")
            .header("idempotency-key", "\"t\"")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(outcome_of(&first), Some(Outcome::Executed));
    let collected = first.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    assert_eq!(collected.to_bytes(), "data");
    assert_eq!(
        trailers.as_ref().and_then(|t| t.get("grpc-status")),
        Some(&http::HeaderValue::from_static("0")),
        "the trailers were dropped"
    );
    let replay = service.oneshot(request()).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let collected = replay.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    assert_eq!(collected.to_bytes(), "data");
    assert_eq!(
        trailers.as_ref().and_then(|t| t.get("grpc-status")),
        Some(&http::HeaderValue::from_static("0")),
        "the replay has no trailers"
    );
}

/// Data frames, then one trailers frame, of unknown length (the layer streams it).
struct WithTrailers {
    frames: std::collections::VecDeque<http_body::Frame<Bytes>>,
}

impl WithTrailers {
    /// `chunks` data frames of 1000 bytes, then the trailers `x-checksum: abc`, `grpc-status:
    /// 0` and `set-cookie: s=1`.
    fn new(chunks: u32) -> Self {
        let mut frames: std::collections::VecDeque<_> = (0..chunks)
            .map(|n| http_body::Frame::data(Bytes::from(format!("{n:0>1000}"))))
            .collect();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        trailers.insert("set-cookie", http::HeaderValue::from_static("s=1"));
        frames.push_back(http_body::Frame::trailers(trailers));
        WithTrailers { frames }
    }
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

/// A layer with `config` over a handler that answers `WithTrailers::new(chunks)`, counted.
fn trailers_app(
    counter: &Arc<AtomicU64>,
    chunks: u32,
    config: Config,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<idem_http::ResponseBody<WithTrailers>>,
    Error = Infallible,
> + Clone {
    let counter = counter.clone();
    let handler = tower::service_fn(move |_: Request<Full<Bytes>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(Response::new(WithTrailers::new(chunks))) }
    });
    tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::with_config(MemoryStore::new(), config))
        .service(handler)
}

fn keyed(key: &str) -> Request<Full<Bytes>> {
    Request::post("/")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A streamed body ending in trailers: the first caller gets them as sent, the record keeps
/// them filtered as headers are (no `Set-Cookie`), and a replay ends with them.
#[tokio::test]
async fn a_streamed_body_with_trailers_is_replayed_with_them() {
    let counter = Arc::new(AtomicU64::new(0));
    let app = trailers_app(&counter, 3, Config::default());
    let first = app.clone().oneshot(keyed("\"s\"")).await.unwrap();
    assert_eq!(outcome_of(&first), Some(Outcome::Executed));
    let collected = first.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the first caller's trailers");
    assert_eq!(collected.to_bytes().len(), 3000);
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(trailers["set-cookie"], "s=1");

    let replay = app.oneshot(keyed("\"s\"")).await.unwrap();
    assert_eq!(outcome_of(&replay), Some(Outcome::Replayed));
    let collected = replay.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the replay's trailers");
    assert_eq!(collected.to_bytes().len(), 3000);
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(trailers["grpc-status"], "0");
    assert!(
        trailers.get("set-cookie").is_none(),
        "Set-Cookie was stored"
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// A streamed body over the storage cap is replayed without its body, but with its trailers
/// (a gRPC status stays a status).
#[tokio::test]
async fn a_replay_of_an_omitted_body_keeps_its_trailers() {
    let counter = Arc::new(AtomicU64::new(0));
    let config = Config::builder()
        .storage_cap(NonZeroUsize::new(256).unwrap())
        .build()
        .unwrap();
    let app = trailers_app(&counter, 100, config);
    let first = app.clone().oneshot(keyed("\"o\"")).await.unwrap();
    let collected = first.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
    assert_eq!(collected.to_bytes().len(), 100_000);

    let replay = app.oneshot(keyed("\"o\"")).await.unwrap();
    assert_eq!(replay.headers()["idempotency-replay"], "omitted");
    let collected = replay.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the replay's trailers");
    assert!(collected.to_bytes().is_empty());
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// One layer (one store) on two routers nested under different prefixes: each sees `POST /`,
/// but the key sent to both is two different requests. The second is 422, never a replay of
/// the first's response.
#[cfg(feature = "axum")]
#[tokio::test]
async fn nested_routers_sharing_a_layer_fingerprint_the_path_as_sent() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let payments = Router::new()
        .route("/", post(|| async { "payment" }))
        .layer(layer.clone());
    let refunds = Router::new()
        .route("/", post(|| async { "refund" }))
        .layer(layer);
    let app = Router::new()
        .nest("/payments", payments)
        .nest("/refunds", refunds);
    let first = app
        .clone()
        .oneshot(post_with_key("/payments", "\"n\"", ""))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let other = app
        .clone()
        .oneshot(post_with_key("/refunds", "\"n\"", ""))
        .await
        .unwrap();
    assert_eq!(outcome_of(&other), Some(Outcome::Mismatch));
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let retry = app
        .oneshot(post_with_key("/payments", "\"n\"", ""))
        .await
        .unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
}

/// `route_layer`: the layer covers the routes, an unknown path is still 404.
#[tokio::test]
async fn route_layer_covers_the_routes() {
    let app = Router::new()
        .route("/run", post(|| async { "ok" }))
        .route_layer(IdempotencyLayer::new(MemoryStore::new()));
    let first = app
        .clone()
        .oneshot(post_with_key("/run", "\"r\"", ""))
        .await
        .unwrap();
    assert_eq!(outcome_of(&first), Some(Outcome::Executed));
    let replay = app
        .clone()
        .oneshot(post_with_key("/run", "\"r\"", ""))
        .await
        .unwrap();
    assert_eq!(outcome_of(&replay), Some(Outcome::Replayed));
    let missing = app
        .oneshot(post_with_key("/nowhere", "\"r\"", ""))
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

/// A counting handler that takes `delay` to answer.
fn counting_app(counter: &Arc<AtomicU64>, delay: Duration, config: Config) -> Router {
    counting_app_on(MemoryStore::new(), counter, delay, config)
}

/// [`counting_app`] on `store`.
fn counting_app_on(
    store: MemoryStore,
    counter: &Arc<AtomicU64>,
    delay: Duration,
    config: Config,
) -> Router {
    let counter = counter.clone();
    Router::new()
        .route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                "ok"
            }),
        )
        .layer(IdempotencyLayer::with_config(store, config))
}

/// The store's clock on tokio's: under a paused clock, its leases lapse as the test's time
/// advances, not the machine's.
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX);
        Timestamp::from_micros(1_700_000_000_000_000 + elapsed)
    }
}

/// 200 concurrent requests with one key: one execution; every other answer a 409 or a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_one_key_runs_the_handler_once() {
    let counter = Arc::new(AtomicU64::new(0));
    let app = counting_app(&counter, Duration::from_millis(50), Config::default());
    let storm: Vec<_> = (0..200)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let answer = app
                    .oneshot(post_with_key("/run", "\"storm\"", "x"))
                    .await
                    .unwrap();
                (answer.status(), outcome_of(&answer))
            })
        })
        .collect();
    let mut executed = 0;
    for request in storm {
        match request.await.unwrap() {
            (StatusCode::OK, Some(Outcome::Executed)) => executed += 1,
            (StatusCode::OK, Some(Outcome::Replayed))
            | (StatusCode::CONFLICT, Some(Outcome::Conflict)) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// A handler that runs for four leases keeps its claim by heartbeat: a duplicate meanwhile is
/// 409, never a takeover and a second execution.
#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_a_long_handlers_lease() {
    let counter = Arc::new(AtomicU64::new(0));
    let config = Config::builder()
        .lease(Duration::from_millis(200))
        .heartbeat(Duration::from_millis(50))
        .build()
        .unwrap();
    let store = MemoryStore::builder()
        .clock(TokioClock(tokio::time::Instant::now()))
        .build();
    let app = counting_app_on(store, &counter, Duration::from_millis(800), config);
    let first = tokio::spawn(app.clone().oneshot(post_with_key("/run", "\"long\"", "")));
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let duplicate = app
            .clone()
            .oneshot(post_with_key("/run", "\"long\"", ""))
            .await
            .unwrap();
        assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    }
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// 100 frames of 1000 bytes, of unknown length.
struct Frames(u32);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        let frame = Bytes::from(format!("{:0>1000}", self.0));
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(frame))))
    }
}

/// A streamed response over the storage cap: the first caller gets all of it, a retry gets
/// the status and headers with `Idempotency-Replay: omitted`, and the handler ran once.
#[tokio::test]
async fn a_streamed_response_over_the_cap_is_delivered_whole_and_replayed_omitted() {
    let counter = Arc::new(AtomicU64::new(0));
    let runs = counter.clone();
    let config = Config::builder()
        .storage_cap(NonZeroUsize::new(64).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/big",
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::CREATED,
                    [("x-kind", "big")],
                    Body::new(Frames(100)),
                )
            }),
        )
        .layer(IdempotencyLayer::with_config(MemoryStore::new(), config));
    let first = app
        .clone()
        .oneshot(post_with_key("/big", "\"big\"", ""))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 100_000);
    let replay = app
        .oneshot(post_with_key("/big", "\"big\"", ""))
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotency-replay"], "omitted");
    assert_eq!(replay.headers()["x-kind"], "big");
    assert!(
        replay
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty()
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// The extractor on a route that is not behind the layer: a clean 500 naming the cause.
#[cfg(feature = "axum")]
#[tokio::test]
async fn the_extractor_without_the_layer_is_a_clean_500() {
    let app = Router::new().route(
        "/run",
        post(|ctx: idem_http::IdempotencyContext| async move { ctx.key().to_string() }),
    );
    let answer = app
        .oneshot(post_with_key("/run", "\"k\"", ""))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert!(
        std::str::from_utf8(&body)
            .unwrap()
            .contains("IdempotencyLayer"),
        "{body:?}"
    );
}
