//! The `Retry-After` of a 409: an estimate of when the original finishes, from the layer's
//! recent durations, less how long the original has run; with no history, or once the
//! original has run past that estimate, the original's age; bounded by its lease, at least 1 s. On tokio's paused clock (the layer's durations)
//! and a `ManualClock` (the store's leases), moved together.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_core::{Clock, ManualClock, SystemClock};
use idem_http::{Config, IdempotencyLayer};
use idem_store_memory::MemoryStore;
use tokio::sync::mpsc;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

type App = BoxCloneService<
    Request<Full<Bytes>>,
    Response<idem_http::ResponseBody<Full<Bytes>>>,
    std::convert::Infallible,
>;

/// A layer (lease 30 s) over a handler that says it started, then takes the number of seconds
/// its body names.
fn app(clock: &ManualClock) -> (App, mpsc::UnboundedReceiver<()>) {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let config = Config::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let (started, running) = mpsc::unbounded_channel();
    let handler = tower::service_fn(move |request: Request<Full<Bytes>>| {
        let started = started.clone();
        async move {
            let _ = started.send(());
            let body = http_body_util::BodyExt::collect(request.into_body())
                .await
                .unwrap();
            let secs: u64 = std::str::from_utf8(&body.to_bytes())
                .unwrap()
                .parse()
                .unwrap();
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("done"))))
        }
    });
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::with_config(store, config))
        .service(handler);
    (BoxCloneService::new(service), running)
}

fn post(key: &str, secs: u64) -> Request<Full<Bytes>> {
    Request::post("/pay")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(secs.to_string())))
        .unwrap()
}

/// Starts a request of `secs` under `key`, lets `ran` pass on both clocks, and answers the
/// `Retry-After` of a duplicate.
async fn retry_after_of_a_duplicate(
    app: &App,
    running: &mut mpsc::UnboundedReceiver<()>,
    clock: &ManualClock,
    key: &str,
    secs: u64,
    ran: Duration,
) -> String {
    let original = tokio::spawn(app.clone().oneshot(post(key, secs)));
    running.recv().await.unwrap();
    tokio::time::advance(ran).await;
    clock.advance(ran);
    let duplicate = app.clone().oneshot(post(key, secs)).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    let retry_after = duplicate.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(original.await.unwrap().unwrap().status(), StatusCode::OK);
    retry_after
}

#[tokio::test(start_paused = true)]
async fn a_409_estimates_when_the_original_finishes_from_recent_durations() {
    let clock = ManualClock::new(SystemClock.now());
    let (app, mut running) = app(&clock);
    // No history yet: as long again as the original has run (3 s).
    let first =
        retry_after_of_a_duplicate(&app, &mut running, &clock, "a", 5, Duration::from_secs(3))
            .await;
    assert_eq!(first, "3");
    // Requests here take 5 s: one that has run 1 s finishes in about 4.
    let second =
        retry_after_of_a_duplicate(&app, &mut running, &clock, "b", 5, Duration::from_secs(1))
            .await;
    assert_eq!(second, "4");
    // One that has run past the estimate: as long again as it has run (before: 1 s, so its
    // duplicates came back every second).
    let late =
        retry_after_of_a_duplicate(&app, &mut running, &clock, "c", 9, Duration::from_secs(7))
            .await;
    assert_eq!(late, "7");
}

#[tokio::test(start_paused = true)]
async fn the_estimate_is_bounded_by_the_lease_left() {
    let clock = ManualClock::new(SystemClock.now());
    let (app, mut running) = app(&clock);
    // A request that held its key 100 s (its lease renewed by heartbeats).
    let _ = retry_after_of_a_duplicate(
        &app,
        &mut running,
        &clock,
        "slow",
        100,
        Duration::from_secs(1),
    )
    .await;
    let bounded = retry_after_of_a_duplicate(
        &app,
        &mut running,
        &clock,
        "next",
        5,
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(bounded, "28");
}
