//! With `log_keys(false)`, no log line shows a key as sent: not in its key field (a digest),
//! and not inside a store error's message (a corrupt record's error names its key).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use idem_http::{Config, IdempotencyLayer};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use idem_testkit::logs::CapturedLogs;
use tower::ServiceExt;

/// The log lines of one request with key `key` to an app whose store answers every claim
/// with a corrupt record.
async fn logs_of_a_corrupt_claim(log_keys: bool, key: &str) -> String {
    let (logs, _capturing) = CapturedLogs::start();
    let store = FaultyStore::new(MemoryStore::new());
    store.faults.claim_corrupt.store(true, Ordering::SeqCst);
    let config = Config::builder().log_keys(log_keys).build().unwrap();
    let app = Router::new()
        .route("/pay", post(|| async { "paid" }))
        .layer(IdempotencyLayer::with_config(store, config));
    let request = Request::post("/pay")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Body::from("{}"))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    logs.text()
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_error_logged_with_keys_redacted_does_not_show_the_key() {
    let shown = logs_of_a_corrupt_claim(true, "order-7781-capture").await;
    assert!(
        shown.contains("corrupt record at order-7781-capture"),
        "{shown}"
    );

    let redacted = logs_of_a_corrupt_claim(false, "order-7781-capture").await;
    assert!(
        redacted.contains("corrupt record (key redacted)"),
        "{redacted}"
    );
    assert!(!redacted.contains("order-7781-capture"), "{redacted}");
}
