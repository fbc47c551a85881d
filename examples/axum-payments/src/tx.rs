//! `--tx` (with `--store postgres://...`): the payments live in PostgreSQL, and each one is
//! INSERTed in the transaction that records its response (idem-http-postgres), so a crash at
//! any moment never doubles or loses a payment.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::postgres::{PostgresConfig, PostgresStore};
use idem_http::{Config, IdempotencyContext};
use idem_http_postgres::{PgIdempotencyLayer, Tx};

use crate::{Db, NAMESPACE, NewPayment, Payment, create_order, invalid, problem};

/// The payments table, in the store's schema.
const TABLE: &str = "CREATE TABLE IF NOT EXISTS axum_payments.payments (
    id bigserial PRIMARY KEY,
    amount bigint NOT NULL,
    currency text NOT NULL,
    order_id text,
    provider_key text NOT NULL
)";

#[derive(Clone)]
struct Ledger {
    store: PostgresStore,
    provider_latency: Duration,
}

async fn create_payment(
    State(ledger): State<Ledger>,
    ctx: IdempotencyContext,
    tx: Tx,
    Json(new): Json<NewPayment>,
) -> Response {
    if let Some(refused) = invalid(&new) {
        return refused;
    }
    let Ok(amount) = i64::try_from(new.amount) else {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "amount too large");
    };
    tokio::time::sleep(ledger.provider_latency).await;
    let provider_key = format!("{}#{}", ctx.key(), ctx.fence());
    let currency = new.currency.to_ascii_uppercase();
    // The payment, in the transaction that records this response: both commit, or neither.
    let inserted = tx
        .query_one(
            "INSERT INTO axum_payments.payments (amount, currency, order_id, provider_key)
             VALUES ($1, $2, $3, $4) RETURNING id",
            &[&amount, &currency, &new.order_id, &provider_key],
        )
        .await;
    let Ok(row) = inserted else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the payment could not be written: retry with the same key",
        );
    };
    let id = format!("pay_{}", row.get::<_, i64>(0));
    let payment = Payment {
        id: id.clone(),
        amount: new.amount,
        currency,
        order_id: new.order_id,
        status: "captured",
        provider_key,
    };
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{id}"))],
        Json(payment),
    )
        .into_response()
}

async fn get_payment(State(ledger): State<Ledger>, Path(id): Path<String>) -> Response {
    let Some(n) = id.strip_prefix("pay_").and_then(|n| n.parse::<i64>().ok()) else {
        return problem(StatusCode::NOT_FOUND, "no such payment");
    };
    let Ok(client) = ledger.store.pool().get().await else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable",
        );
    };
    let found = client
        .query_opt(
            "SELECT amount, currency, order_id, provider_key FROM axum_payments.payments WHERE id = $1",
            &[&n],
        )
        .await;
    match found {
        Ok(Some(row)) => Json(Payment {
            id,
            amount: u64::try_from(row.get::<_, i64>(0)).unwrap_or_default(),
            currency: row.get(1),
            order_id: row.get(2),
            status: "captured",
            provider_key: row.get(3),
        })
        .into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, "no such payment"),
        Err(_) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable",
        ),
    }
}

async fn stats(State(ledger): State<Ledger>) -> Response {
    let Ok(client) = ledger.store.pool().get().await else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable",
        );
    };
    match client
        .query_one("SELECT count(*) FROM axum_payments.payments", &[])
        .await
    {
        Ok(row) => Json(serde_json::json!({ "charges": row.get::<_, i64>(0) })).into_response(),
        Err(_) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable",
        ),
    }
}

/// The API of `--tx` on the PostgreSQL server at `url`: the payments in its `axum_payments`
/// schema, next to the records.
pub(crate) async fn app(url: &str, provider_latency: Duration) -> Result<Router, String> {
    let config = PostgresConfig::new(url)
        .and_then(|config| config.with_schema(NAMESPACE))
        .map_err(|e| e.to_string())?;
    let store = PostgresStore::connect(config)
        .await
        .map_err(|e| format!("cannot open {url}: {e}"))?;
    let client = store.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(TABLE)
        .await
        .map_err(|e| e.to_string())?;
    let config = Config::builder()
        .require_key()
        .store_label("postgres")
        .build()
        .map_err(|e| e.to_string())?;
    let layer = PgIdempotencyLayer::new(store.clone(), config);
    // Orders have no table: they run in a transaction too, and write nothing to it.
    let orders = Router::new()
        .route("/orders", post(create_order))
        .with_state(Db::default());
    Ok(Router::new()
        .route("/payments", post(create_payment))
        .merge(orders)
        .route_layer(layer)
        .route("/payments/{id}", get(get_payment))
        .route("/stats", get(stats))
        .with_state(Ledger {
            store,
            provider_latency,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use idem_testkit::probe::{require_tcp, service_url};
    use tower::ServiceExt;

    async fn call(app: &Router, method: &str, path: &str, key: &str) -> (StatusCode, String) {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(r#"{"amount": 1250, "currency": "eur"}"#))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn with_tx_a_payment_and_its_answer_commit_together() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        if !require_tcp("PostgreSQL", "127.0.0.1:5432") {
            return;
        }
        let app = app(&url, Duration::ZERO).await.unwrap();
        let key = format!(
            "tx-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let (status, first) = call(&app, "POST", "/payments", &key).await;
        assert_eq!(status, StatusCode::CREATED, "{first}");
        let (status, retry) = call(&app, "POST", "/payments", &key).await;
        assert_eq!((status, &retry), (StatusCode::CREATED, &first));
        let id = first.split('"').nth(3).unwrap().to_owned();
        let (status, payment) = call(&app, "GET", &format!("/payments/{id}"), &key).await;
        assert_eq!(status, StatusCode::OK, "{payment}");
        assert_eq!(payment, first);
        let (status, _) = call(&app, "POST", "/orders", &format!("{key}-order")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "no items");
        // Leaves the shared schema as it was: the payment and its record go.
        let store = PostgresStore::connect(
            PostgresConfig::new(&url)
                .unwrap()
                .with_schema(NAMESPACE)
                .unwrap(),
        )
        .await
        .unwrap();
        let client = store.pool().get().await.unwrap();
        let deleted = client
            .execute(
                "DELETE FROM axum_payments.payments WHERE provider_key LIKE $1 || '#%'",
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(deleted, 1, "one payment for the key");
        let record = idem::RecordKey::unscoped(idem::IdempotencyKey::new(&key).unwrap());
        assert!(idem::Store::delete(&store, &record).await.unwrap());
    }
}
