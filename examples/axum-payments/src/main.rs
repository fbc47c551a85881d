//! A small payments API behind the idem idempotency layer: create a payment, create an order,
//! read a payment. Every POST requires an `Idempotency-Key`, so a client that retries after a
//! timeout never charges twice. See the README for a walk through it with curl.
//!
//! ```text
//! axum-payments [--listen ADDR] [--store memory|redis://HOST:PORT|postgres://USER@HOST/DB|redb:PATH] [--tx] [--provider-latency-ms N]
//! ```
//!
//! `--tx` (PostgreSQL only) keeps the payments in PostgreSQL and INSERTs each one in the
//! transaction that records its response (idem-http-postgres): a crash never doubles or loses
//! a payment.
//!
//! A charge at the simulated payment provider takes `--provider-latency-ms` (default 2000), long
//! enough to send a concurrent retry by hand.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use idem_http::{Config, IdempotencyContext, IdempotencyLayer};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

#[cfg(feature = "postgres")]
mod tx;

/// A payment request.
#[derive(Debug, Deserialize)]
struct NewPayment {
    /// Minor units (cents).
    amount: u64,
    currency: String,
    #[serde(default)]
    order_id: Option<String>,
}

/// A payment as stored and returned.
#[derive(Clone, Debug, Serialize)]
struct Payment {
    id: String,
    amount: u64,
    currency: String,
    order_id: Option<String>,
    status: &'static str,
    /// The key the charge was sent to the payment provider with.
    provider_key: String,
}

/// An order request.
#[derive(Debug, Deserialize)]
struct NewOrder {
    items: Vec<String>,
    total: u64,
}

/// An order as returned.
#[derive(Debug, Serialize)]
struct Order {
    id: String,
    items: Vec<String>,
    total: u64,
}

/// The "database": payments by id, and the number of charges sent to the provider.
#[derive(Clone, Default)]
struct Db {
    payments: Arc<Mutex<HashMap<String, Payment>>>,
    next_id: Arc<AtomicU64>,
    charges: Arc<AtomicU64>,
    /// How long a charge at the (simulated) provider takes.
    provider_latency: Duration,
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({ "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The answer to a payment request that is refused before anything runs.
fn invalid(new: &NewPayment) -> Option<Response> {
    (new.amount == 0 || new.currency.len() != 3).then(|| {
        problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount > 0 and a 3-letter currency",
        )
    })
}

async fn create_payment(
    State(db): State<Db>,
    ctx: IdempotencyContext,
    Json(new): Json<NewPayment>,
) -> Response {
    if let Some(refused) = invalid(&new) {
        return refused;
    }
    // The side effect: a charge at the provider, sent with the same idempotency key, so even
    // the provider sees one operation.
    tokio::time::sleep(db.provider_latency).await;
    db.charges.fetch_add(1, Ordering::SeqCst);
    let id = format!("pay_{}", db.next_id.fetch_add(1, Ordering::SeqCst) + 1);
    let payment = Payment {
        id: id.clone(),
        amount: new.amount,
        currency: new.currency.to_ascii_uppercase(),
        order_id: new.order_id,
        status: "captured",
        provider_key: format!("{}#{}", ctx.key(), ctx.fence()),
    };
    db.payments.lock().await.insert(id.clone(), payment.clone());
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{id}"))],
        Json(payment),
    )
        .into_response()
}

async fn create_order(State(db): State<Db>, Json(new): Json<NewOrder>) -> Response {
    if new.items.is_empty() {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "an order has at least one item",
        );
    }
    let id = format!("ord_{}", db.next_id.fetch_add(1, Ordering::SeqCst) + 1);
    let order = Order {
        id: id.clone(),
        items: new.items,
        total: new.total,
    };
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{id}"))],
        Json(order),
    )
        .into_response()
}

async fn get_payment(State(db): State<Db>, Path(id): Path<String>) -> Response {
    match db.payments.lock().await.get(&id) {
        Some(payment) => Json(payment.clone()).into_response(),
        None => problem(StatusCode::NOT_FOUND, "no such payment"),
    }
}

async fn stats(State(db): State<Db>) -> Response {
    Json(serde_json::json!({ "charges": db.charges.load(Ordering::SeqCst) })).into_response()
}

/// The API: POSTs behind the layer (key required, scoped by `Authorization`), GETs outside.
/// The layer is a route layer: a path no route serves is 404 with or without a key, and
/// nothing is stored for it.
fn app(layer: IdempotencyLayer, provider_latency: Duration) -> Router {
    let writes = Router::new()
        .route("/payments", post(create_payment))
        .route("/orders", post(create_order))
        .route_layer(layer);
    writes
        .route("/payments/{id}", get(get_payment))
        .route("/stats", get(stats))
        .with_state(Db {
            provider_latency,
            ..Db::default()
        })
}

/// The namespace of the records in a shared store: the Redis key prefix, the PostgreSQL
/// schema (the README names it).
const NAMESPACE: &str = "axum_payments";

/// The layer over the store named on the command line: `memory`, `redis://...`,
/// `postgres://...` or `redb:PATH`.
async fn layer(store: &str) -> Result<IdempotencyLayer, String> {
    let opened = idem::open(store, NAMESPACE)
        .await
        .map_err(|e| format!("--{e}"))?;
    let config = Config::builder()
        .require_key()
        .store_label(opened.label)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(IdempotencyLayer::from_arc(opened.store, config))
}

/// The API of `--tx`: PostgreSQL only.
async fn tx_app(store: &str, latency: Duration) -> Result<Router, String> {
    #[cfg(feature = "postgres")]
    if store.starts_with("postgres://") || store.starts_with("postgresql://") {
        return tx::app(store, latency).await;
    }
    let _ = latency;
    Err(format!(
        "--tx needs --store postgres://... (and the postgres feature), not {store:?}"
    ))
}

async fn run() -> Result<(), String> {
    let mut listen = "127.0.0.1:3000".to_owned();
    let mut store = "memory".to_owned();
    let mut latency = Duration::from_secs(2);
    let mut in_tx = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--tx" {
            in_tx = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = value,
            "--store" => store = value,
            "--provider-latency-ms" => {
                let ms = value.parse().map_err(|_| {
                    format!("--provider-latency-ms takes milliseconds, not {value:?}")
                })?;
                latency = Duration::from_millis(ms);
            }
            other => {
                return Err(format!(
                    "unknown flag {other}; usage: axum-payments [--listen ADDR] [--store memory|redis://HOST:PORT|postgres://USER@HOST/DB|redb:PATH] [--tx] [--provider-latency-ms N]"
                ));
            }
        }
    }
    let app = if in_tx {
        tx_app(&store, latency).await?
    } else {
        app(layer(&store).await?, latency)
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("payments API on http://{address} (store: {store})");
    // As a production server does (the layer's answers leave in one write either way).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("axum-payments: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn call(
        app: &Router,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> (StatusCode, String) {
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .header("authorization", "Bearer demo");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_readme_walk_through() {
        let app = app(layer("memory").await.unwrap(), Duration::ZERO);
        let pay = r#"{"amount": 1250, "currency": "eur"}"#;
        let (status, first) = call(&app, "POST", "/payments", Some("\"pay-42\""), pay).await;
        assert_eq!(status, StatusCode::CREATED, "{first}");
        assert!(first.contains(r#""provider_key":"pay-42#"#), "{first}");
        let (status, retry) = call(&app, "POST", "/payments", Some("\"pay-42\""), pay).await;
        assert_eq!((status, &retry), (StatusCode::CREATED, &first));
        let changed = r#"{"amount": 9999, "currency": "eur"}"#;
        let (status, _) = call(&app, "POST", "/payments", Some("\"pay-42\""), changed).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        let (status, _) = call(&app, "POST", "/payments", None, pay).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (_, stats) = call(&app, "GET", "/stats", None, "").await;
        assert_eq!(stats, r#"{"charges":1}"#);
        let (status, payment) = call(&app, "GET", "/payments/pay_1", None, "").await;
        assert_eq!(status, StatusCode::OK, "{payment}");
        let (status, _) = call(
            &app,
            "POST",
            "/orders",
            Some("\"order-1\""),
            r#"{"items":["book"],"total":1250}"#,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }

    /// A mistyped path is 404, not "Idempotency key required", and no record is kept for it:
    /// the same key then works on the right path.
    #[tokio::test]
    async fn a_path_no_route_serves_is_404_and_stores_nothing() {
        let app = app(layer("memory").await.unwrap(), Duration::ZERO);
        let pay = r#"{"amount": 7, "currency": "eur"}"#;
        let (status, _) = call(&app, "POST", "/payment", None, pay).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = call(&app, "POST", "/payment", Some("\"typo-1\""), pay).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, body) = call(&app, "POST", "/payments", Some("\"typo-1\""), pay).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// The README tells an operator where the records are: the namespace it names is the one
    /// the records are written under.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn records_on_redis_are_in_the_namespace_the_readme_names() {
        use idem::Store;
        use idem::redis::{RedisConfig, RedisStore};
        use idem_testkit::probe::{require_tcp, service_url};

        let readme = include_str!("../README.md");
        assert!(
            readme.contains(&format!("(namespace `{NAMESPACE}`")),
            "the README names another namespace"
        );
        let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let host_port = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        if !require_tcp("Redis", &host_port) {
            return;
        }
        let app = app(layer(&url).await.unwrap(), Duration::ZERO);
        let key = format!("readme-{:016x}", rand_key());
        let pay = r#"{"amount": 5, "currency": "eur"}"#;
        let (status, body) = call(&app, "POST", "/payments", Some(&key), pay).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");

        let config = RedisConfig::new(url.as_str())
            .unwrap()
            .with_namespace(NAMESPACE)
            .unwrap();
        let store = RedisStore::connect(config).await.unwrap();
        let mut query = idem::ScanQuery::all();
        let mut found = None;
        loop {
            let page = store.scan(&query).await.unwrap();
            found = found.or(page.records.into_iter().find(|r| r.key.key.as_str() == key));
            match page.next_cursor {
                Some(cursor) if found.is_none() => query.cursor = Some(cursor),
                _ => break,
            }
        }
        let record = found.expect("the payment's record in the namespace the README names");
        assert!(store.delete(&record.key).await.unwrap());
    }

    /// A key of this test run: the time in nanoseconds, unique enough for one test.
    #[cfg(feature = "redis")]
    fn rand_key() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    }
}
