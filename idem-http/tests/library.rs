//! The layer used as a library, through tower calls (no network).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
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
#[tokio::test]
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
/// layer reads the body whole to store it, and the first caller still gets the trailers.
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
    assert_eq!(
        replay.into_body().collect().await.unwrap().to_bytes(),
        "data"
    );
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
