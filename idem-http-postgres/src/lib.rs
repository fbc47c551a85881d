//! Exactly-once HTTP handlers on PostgreSQL: the handler's writes and its stored idempotent
//! response commit in one transaction.
//!
//! Behind idem-http's plain layer, a handler that commits its payment and dies before the layer
//! stores the response leaves an in-flight record; after the lease, a retry runs the payment
//! again. [`PgIdempotencyLayer`] closes that window when the handler's effects are writes to the
//! PostgreSQL database of the store: the handler gets a transaction ([`Tx`]) in which nothing
//! can commit it, and the layer records the response in that same transaction, with a
//! compare-and-set fenced by the request's claim, before it commits. The writes and the record
//! commit together or not at all.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! idem-http = "0.1"
//! idem-http-postgres = { version = "0.1", features = ["axum"] }
//! idem-store-postgres = "0.1"
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! # the example below also sends requests by hand:
//! http = "1"
//! tower = { version = "0.5", features = ["util"] }
//! ```
//!
//! ```
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use idem_http::Config;
//! use idem_http_postgres::{PgIdempotencyLayer, Tx};
//! use idem_store_postgres::{PostgresConfig, PostgresStore};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
//! # let schema = format!("idem_doc_{:016x}", rand::random::<u64>());
//! let store_config = PostgresConfig::new(&url)?.with_schema(&schema)?;
//! # let Ok(store) = PostgresStore::connect(store_config).await else { return Ok(()) }; // no server here
//! # /*
//! let store = PostgresStore::connect(store_config).await?;
//! # */
//! # store.pool().get().await?.batch_execute(&format!("CREATE TABLE {schema}.payments (amount text)")).await?;
//! # let insert: &'static str = format!("INSERT INTO {schema}.payments VALUES ($1)").leak();
//! # /*
//! let insert = "INSERT INTO payments VALUES ($1)";
//! # */
//!
//! // The handler's writes go to its transaction; it cannot commit it.
//! let pay = move |tx: Tx, amount: String| async move {
//!     match tx.execute(insert, &[&amount]).await {
//!         Ok(_) => (http::StatusCode::CREATED, format!("paid {amount}")),
//!         Err(_) => (http::StatusCode::SERVICE_UNAVAILABLE, "try again".to_owned()),
//!     }
//! };
//! let config = Config::builder().require_key().build()?;
//! let app = Router::new()
//!     .route("/payments", post(pay))
//!     .layer(PgIdempotencyLayer::new(store.clone(), config));
//!
//! let request = || Request::post("/payments").header("Idempotency-Key", "pay-1").body(Body::from("10 EUR"));
//! assert_eq!(app.clone().oneshot(request()?).await?.status(), 201);
//! // The retry is answered from the record that committed with the payment.
//! let retry = app.oneshot(request()?).await?;
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # let client = store.pool().get().await?;
//! # let n: i64 = client.query_one(&format!("SELECT count(*) FROM {schema}.payments"), &[]).await?.get(0);
//! # assert_eq!(n, 1);
//! # client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Without axum, a handler behind the layer takes its [`Tx`] out of the request's extensions
//! (`request.extensions_mut().remove::<Tx>()`): the layer wraps any tower service.
//!
//! # How a request goes
//!
//! 1. idem-http's layer claims the key in a short statement of its own, committed before the
//!    handler runs: a concurrent duplicate gets 409 at once (or waits, in wait mode), it does
//!    not queue behind a row lock. A replay, a mismatch and every other answer of the layer are
//!    the plain layer's.
//! 2. [`PgTxService`] opens a transaction (`READ COMMITTED`) on a connection of the store's
//!    pool and hands it to the handler as a [`Tx`]: statements, but no commit or rollback.
//! 3. When the handler has answered and its body is read, the status rules of idem-http
//!    decide: a status the layer stores is recorded in the transaction (the record
//!    as the layer would store it) with the completion's compare-and-set, fenced by the claim,
//!    then the transaction commits, and only then does the caller get its answer. A stale
//!    attempt whose lease was taken over fails the compare-and-set, and its writes roll back.
//!
//! # What commits
//! | the handler | the transaction | the record | the caller gets |
//! |---|---|---|---|
//! | answers a status the layer stores (2xx, 3xx, 4xx but 408, 425, 429) | the writes and the response commit | completed: retries replay it | the answer |
//! | answers a status the layer does not store (5xx, 408, 425, 429) | rolled back | released: a retry runs the handler again | the answer |
//! | fails, panics, or its future is dropped | rolled back (a dropped transaction closes its connection) | released | the layer's 500 |
//! | lost its lease to a takeover before recording | rolled back (the compare-and-set fails) | the other attempt's | 409, `Claim lost` |
//! | its response cannot be recorded (the store fails) | rolled back | released | 503, `Transaction failed` |
//! | the commit fails or outlasts the commit timeout | unknown: committed or not | completed, or in flight until the lease ends (left to the lease) | 503, `Commit outcome unknown`, `Retry-After` the lease |
//!
//! After an unknown commit, a retry with the same key gets 409 until the lease ends, then the
//! stored response if the commit took effect, or a fresh run of the handler if it did not:
//! never a second effect, never an answer whose writes rolled back.
//!
//! # What stays outside
//!
//! Only writes to the store's PostgreSQL database, made through the [`Tx`], commit with the
//! response. An effect outside the database (an email, a call to a payment provider) can still
//! happen twice after a crash; pass [`idem_http::IdempotencyContext`]'s key and fence on to it.
//! The response is buffered whole before the commit, and the transaction holds its connection
//! and row locks for the length of the handler.

mod service;
mod store;

use std::sync::Arc;
use std::time::Duration;

use idem_http::{Config, Idempotency, IdempotencyLayer};
use idem_store_postgres::PostgresStore;
use tower_layer::Layer;

pub use service::{PgTxService, Tx, TxBody};

use crate::service::TxShared;
use crate::store::{Leases, TxStore};

/// How long the commit (and opening the transaction) may take before its outcome counts as
/// unknown, by default.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// idem-http's idempotency layer over a PostgreSQL store, whose handlers run in a transaction
/// that commits together with their stored response: see the [crate documentation](crate).
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct PgIdempotencyLayer {
    idempotency: IdempotencyLayer,
    shared: Arc<TxShared>,
}

impl PgIdempotencyLayer {
    /// The layer over `store`, configured as idem-http's layer by `config`.
    #[must_use]
    pub fn new(store: PostgresStore, config: Config) -> Self {
        Self::with_commit_timeout(store, config, DEFAULT_COMMIT_TIMEOUT)
    }

    /// As [`PgIdempotencyLayer::new`], with the time a commit may take before its outcome counts
    /// as unknown ([`DEFAULT_COMMIT_TIMEOUT`] by default). Keep it well under the lease.
    #[must_use]
    pub fn with_commit_timeout(store: PostgresStore, config: Config, timeout: Duration) -> Self {
        let leases = Arc::new(Leases::default());
        let tx_store = TxStore {
            store: store.clone(),
            leases: leases.clone(),
        };
        PgIdempotencyLayer {
            idempotency: IdempotencyLayer::with_config(tx_store, config.clone()),
            shared: Arc::new(TxShared {
                store,
                leases,
                config,
                commit_timeout: timeout,
            }),
        }
    }
}

impl<S> Layer<S> for PgIdempotencyLayer {
    type Service = Idempotency<PgTxService<S>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.idempotency.layer(PgTxService {
            inner,
            shared: self.shared.clone(),
        })
    }
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::FromRequestParts;
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use crate::Tx;

    /// The handler asked for a [`Tx`] the request does not carry: the route is not behind
    /// [`PgIdempotencyLayer`](crate::PgIdempotencyLayer), its request had no key (an optional
    /// key: require one), the store could not be reached and the request runs unrecorded
    /// (fail open), or a second extractor took it already. Answers 500 with an RFC 9457 body.
    #[derive(Clone, Copy, Debug)]
    pub struct MissingTx;

    const MISSING_TX: &str = concat!(
        r#"{"type":"https://docs.rs/idem-http-postgres/latest/idem_http_postgres/struct.MissingTx.html","#,
        r#""title":"Transaction missing","status":500,"#,
        r#""detail":"the handler asked for its transaction, but the request holds no claim of PgIdempotencyLayer: the route is not behind it, the request had no key, or the store could not be reached"}"#
    );

    impl IntoResponse for MissingTx {
        fn into_response(self) -> Response {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/problem+json"),
                )],
                MISSING_TX,
            )
                .into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for Tx {
        type Rejection = MissingTx;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            // Taken, not cloned: the handler holds the only copy, and lets go when it answers.
            parts.extensions.remove::<Tx>().ok_or(MissingTx)
        }
    }
}

#[cfg(feature = "axum")]
pub use extract::MissingTx;

/// The README's code blocks, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
