//! Scopes for applications that authenticate by cookie or API-key header: the same key and
//! body from another principal is executed, never replayed the first principal's response; and
//! the credential is never written to the store as it was sent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use idem_core::Store;
use idem_http::{Config, ConfigBuilder, IdempotencyContext, IdempotencyLayer, ScopePart};
use idem_store_memory::MemoryStore;
use tower::ServiceExt;

/// An app that answers `ran {n} in {scope}`, behind the layer built from `config`.
fn app(config: ConfigBuilder, store: MemoryStore) -> Router {
    let runs = Arc::new(AtomicU64::new(0));
    Router::new()
        .route(
            "/pay",
            post(
                move |axum::Extension(ctx): axum::Extension<IdempotencyContext>| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("ran {n} in {:?}", ctx.scope().as_str())
                },
            ),
        )
        .layer(IdempotencyLayer::with_config(
            store,
            config.build().unwrap(),
        ))
}

/// The body of `POST /pay` with the key `k`, the body `{}` and `headers`.
async fn pay(app: &Router, headers: &[(&str, &str)]) -> String {
    let mut request = Request::post("/pay").header("idempotency-key", "k");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from("{}")).unwrap())
        .await
        .unwrap();
    let body = axum::body::to_bytes(Body::new(response.into_body()), 1024)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn under_a_cookie_scope_another_cookie_is_executed_not_replayed() {
    let store = MemoryStore::new();
    let app = app(
        Config::builder().scope_by_cookie("session").unwrap(),
        store.clone(),
    );
    let alice = pay(&app, &[("cookie", "theme=dark; session=alice-secret")]).await;
    assert!(alice.starts_with("ran 1 in "), "{alice}");
    let mallory = pay(&app, &[("cookie", "session=mallory")]).await;
    assert!(mallory.starts_with("ran 2 in "), "{mallory}");
    // Alice's retry is hers: replayed.
    let retry = pay(&app, &[("cookie", "session=alice-secret; theme=dark")]).await;
    assert_eq!(retry, alice);
    // The cookie's value is hashed, never stored as sent.
    let page = store.scan(&idem_core::ScanQuery::default()).await.unwrap();
    assert_eq!(page.records.len(), 2);
    for record in &page.records {
        let scope = record.key.scope.as_str();
        assert!(!scope.is_empty() && !scope.contains("alice"), "{scope}");
    }
}

#[tokio::test]
async fn a_combined_scope_tells_every_source_apart() {
    let parts = [
        ScopePart::authorization(),
        ScopePart::cookie("session").unwrap(),
        ScopePart::header("x-api-key").unwrap(),
    ];
    let app = app(
        Config::builder().scope_by_all(parts).unwrap(),
        MemoryStore::new(),
    );
    let first = pay(&app, &[("x-api-key", "key-a")]).await;
    assert!(first.starts_with("ran 1 "), "{first}");
    // Another API key, another cookie, an empty key: each its own scope.
    let others = [
        ("x-api-key", "key-b"),
        ("cookie", "session=key-a"),
        ("x-api-key", ""),
    ];
    for (n, header) in others.into_iter().enumerate() {
        let answer = pay(&app, &[header]).await;
        assert!(
            answer.starts_with(&format!("ran {} ", n + 2)),
            "{header:?}: {answer}"
        );
    }
    // The same sources again: a replay.
    assert_eq!(pay(&app, &[("x-api-key", "key-a")]).await, first);
    // With the same API key and a cookie besides, it is another principal.
    let with_cookie = pay(&app, &[("x-api-key", "key-a"), ("cookie", "session=s")]).await;
    assert!(with_cookie.starts_with("ran 5 "), "{with_cookie}");
}

#[tokio::test]
async fn an_api_key_header_as_the_one_scope_is_hashed() {
    let app = app(
        Config::builder().scope_by_header("X-Api-Key").unwrap(),
        MemoryStore::new(),
    );
    let answer = pay(&app, &[("x-api-key", "sk_live_123")]).await;
    assert!(
        answer.starts_with("ran 1 ") && !answer.contains("sk_live"),
        "{answer}"
    );
}
