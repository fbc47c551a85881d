//! [`PgTxService`]: opens the transaction of a claimed request, runs the handler with it, and
//! records the response in it before committing.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use idem_core::{BoxError, Lease, RecordKey, StoreError, TransitionRejection};
use idem_http::codec::{self, StoredResponse};
use idem_http::{Config, IdempotencyContext, fields};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::deadpool_postgres::Object;
use tower_service::Service;

use crate::store::{Leases, Settled};

/// The body of a response through [`PgTxService`]: the handler's, buffered when it ran in a
/// transaction (the caller gets it only once its record has committed).
pub type TxBody = UnsyncBoxBody<Bytes, BoxError>;

/// What every [`PgTxService`] of one layer shares.
#[derive(Debug)]
pub(crate) struct TxShared {
    pub(crate) store: PostgresStore,
    pub(crate) leases: Arc<Leases>,
    pub(crate) config: Config,
    pub(crate) commit_timeout: Duration,
}

/// The handler's PostgreSQL transaction: the connection on which `BEGIN` ran for the claimed
/// request, as a shared reference. Run statements with it (`tx.execute(..)`, `tx.query(..)`,
/// `tx.prepare_cached(..)`; `&*tx` is a [`GenericClient`]); there is no way to commit it or
/// roll it back: [`PgTxService`] commits once the response is recorded in it, and rolls it
/// back otherwise.
///
/// Take it out of the request's extensions (`request.extensions_mut().remove::<Tx>()`), or,
/// with the `axum` feature, as an extractor. Drop it before answering: a copy kept past the
/// answer (moved into a spawned task) rolls the transaction back and the request answers 500.
/// Never send `COMMIT`, `ROLLBACK` or `BEGIN` as SQL on it.
///
/// [`GenericClient`]: https://docs.rs/deadpool-postgres/0.14/deadpool_postgres/trait.GenericClient.html
#[derive(Clone, Debug)]
pub struct Tx(Arc<Object>);

impl Deref for Tx {
    type Target = Object;

    fn deref(&self) -> &Object {
        &self.0
    }
}

/// The transaction of one request, until it is committed or rolled back. Dropped open (the
/// handler panicked, or the request's future was dropped), it closes its connection, and the
/// server rolls the transaction back.
struct OpenTx(Option<Arc<Object>>);

impl OpenTx {
    fn handle(&self) -> Option<Tx> {
        self.0.clone().map(Tx)
    }

    /// The connection, once the handler let go of every copy of its [`Tx`].
    fn reclaim(&mut self) -> Option<Object> {
        let shared = self.0.take()?;
        match Arc::try_unwrap(shared) {
            Ok(object) => Some(object),
            Err(shared) => {
                self.0 = Some(shared);
                None
            }
        }
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else { return };
        match Arc::try_unwrap(shared) {
            // Out of the pool, closed: the server rolls back.
            Ok(object) => drop(Object::take(object)),
            // A copy of the handler's lives on: roll back under it.
            Err(shared) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = shared.batch_execute("ROLLBACK").await;
                    });
                }
            }
        }
    }
}

/// Runs `sql` on `client` within `timeout`; on failure the connection is discarded (its state
/// is unknown), not returned to the pool.
async fn finish(client: Object, sql: &str, timeout: Duration) -> bool {
    let done = tokio::time::timeout(timeout, client.batch_execute(sql)).await;
    if matches!(done, Ok(Ok(()))) {
        true
    } else {
        drop(Object::take(client));
        false
    }
}

/// The service under the idempotency layer of [`PgIdempotencyLayer`](crate::PgIdempotencyLayer):
/// for a request the layer holds a claim for, it opens a transaction, hands the handler its
/// [`Tx`], and, if the layer stores the response's status, records the response in that
/// transaction with a compare-and-set fenced by the claim, then commits. Other requests pass
/// through untouched (and get no [`Tx`]).
pub struct PgTxService<S> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<TxShared>,
}

impl<S: Clone> Clone for PgTxService<S> {
    fn clone(&self) -> Self {
        PgTxService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for PgTxService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTxService")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PgTxService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<TxBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<TxBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let claim = request.extensions().get::<IdempotencyContext>().map(|ctx| {
            let key = RecordKey::new(ctx.scope().clone(), ctx.key().clone());
            shared.leases.lease(&key, ctx.fence())
        });
        Box::pin(async move {
            match claim {
                // No claim (no key, or run unrecorded): no transaction.
                None => passed(inner, request).await,
                Some(None) => Ok(problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "No claim for the transaction",
                    "the request carries an idempotency context that PgIdempotencyLayer did not grant: put PgTxService under PgIdempotencyLayer only",
                    None,
                )),
                Some(Some(lease)) => in_tx(inner, &shared, request, &lease).await,
            }
        })
    }
}

async fn passed<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<TxBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.call(request).await?;
    Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
}

/// Runs the handler in a transaction of its own and settles it: see the crate documentation
/// for what commits when.
async fn in_tx<S, ReqBody, ResBody>(
    mut inner: S,
    shared: &TxShared,
    mut request: Request<ReqBody>,
    lease: &Lease,
) -> Result<Response<TxBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Some(client) = begin(shared).await else {
        // Nothing ran: the layer gives the key back (a 5xx is not stored).
        return Ok(unavailable("the transaction could not be opened"));
    };
    let mut open = OpenTx(Some(Arc::new(client)));
    if let Some(tx) = open.handle() {
        request.extensions_mut().insert(tx);
    }
    let response = inner.call(request).await?;
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        shared.leases.settle(lease, Settled::RolledBack);
        return Ok(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Response body failed",
            "the handler's response body failed: its writes were rolled back",
            None,
        ));
    };
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    let Some(client) = open.reclaim() else {
        shared.leases.settle(lease, Settled::RolledBack);
        return Ok(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Transaction kept past the answer",
            "the handler kept its transaction (Tx) after answering: its writes were rolled back",
            None,
        ));
    };
    Ok(settle(shared, lease, client, parts, bytes, trailers).await)
}

/// Opens the handler's transaction (READ COMMITTED), within the commit timeout; `None` if the
/// pool or the server did not answer.
async fn begin(shared: &TxShared) -> Option<Object> {
    let begun = tokio::time::timeout(shared.commit_timeout, async {
        let client = shared
            .store
            .pool()
            .get()
            .await
            .map_err(StoreError::unavailable)?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(StoreError::unavailable)?;
        Ok::<_, StoreError>(client)
    })
    .await;
    begun.ok()?.ok()
}

/// Settles the handler's transaction once it has answered: records the response in it and
/// commits, or rolls its writes back if the response is not stored or cannot be recorded.
async fn settle(
    shared: &TxShared,
    lease: &Lease,
    client: Object,
    parts: http::response::Parts,
    bytes: Bytes,
    trailers: Option<HeaderMap>,
) -> Response<TxBody> {
    let timeout = shared.commit_timeout;
    let config = &shared.config;
    if !config.stores_status(parts.status) {
        // Not stored, so not done: the writes go, and the layer gives the key back.
        shared.leases.settle(lease, Settled::RolledBack);
        finish(client, "ROLLBACK", timeout).await;
        return buffered(Response::from_parts(parts, bytes), trailers);
    }
    let record = encode(
        config,
        &parts.headers,
        &bytes,
        trailers.as_ref(),
        parts.status,
    );
    let completed = shared
        .store
        .complete_in(&client, lease, record, config.retention())
        .await;
    match completed {
        Ok(()) => {}
        Err(StoreError::Rejected(rejection)) => {
            shared.leases.settle(lease, Settled::RolledBack);
            finish(client, "ROLLBACK", timeout).await;
            return superseded(&rejection);
        }
        Err(_) => {
            shared.leases.settle(lease, Settled::RolledBack);
            finish(client, "ROLLBACK", timeout).await;
            return unavailable(
                "the response could not be recorded: the handler's writes were rolled back",
            );
        }
    }
    if finish(client, "COMMIT", timeout).await {
        shared.leases.settle(lease, Settled::Committed);
        buffered(Response::from_parts(parts, bytes), trailers)
    } else {
        shared.leases.settle(lease, Settled::Unknown);
        tracing::warn!(
            fence = lease.fence.get(),
            "the commit of a handler's writes and its response got no answer: committed or not, the key is left to its lease"
        );
        commit_unknown(shared)
    }
}

/// The record of the response, as the layer would store it: idem's own fields and those of
/// the connection left out, the body omitted over the storage cap.
fn encode(
    config: &Config,
    head: &HeaderMap,
    body: &Bytes,
    trailers: Option<&HeaderMap>,
    status: StatusCode,
) -> Bytes {
    let mut head = head.clone();
    fields::remove_idem_fields(&mut head);
    fields::clean_trailer_header(&mut head);
    let storable = |fields: &HeaderMap| -> Vec<(HeaderName, HeaderValue)> {
        let listed = fields::connection_listed(fields);
        fields
            .iter()
            .filter(|(name, _)| config.stores_header(name) && !listed.contains(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    };
    let trailers = trailers.cloned().map(|mut trailers| {
        fields::strip_trailer_fields(&mut trailers);
        trailers
    });
    let mut stored = StoredResponse {
        status,
        headers: storable(&head),
        body: Some(body.clone()),
        trailers: trailers.as_ref().map(storable).unwrap_or_default(),
    };
    let encoded = codec::encode(&stored);
    if encoded.len() <= config.storage_cap() {
        return encoded;
    }
    stored.body = None;
    codec::encode(&stored)
}

fn buffered(response: Response<Bytes>, trailers: Option<HeaderMap>) -> Response<TxBody> {
    response.map(|bytes| {
        Full::new(bytes)
            .map_err(|never| match never {})
            .with_trailers(std::future::ready(trailers.map(Ok)))
            .boxed_unsync()
    })
}

/// An RFC 9457 answer of this crate's own.
fn problem(
    status: StatusCode,
    title: &str,
    detail: &str,
    retry_after: Option<u64>,
) -> Response<TxBody> {
    let body = format!(
        r#"{{"type":"https://docs.rs/idem-http-postgres/latest/idem_http_postgres/","title":"{title}","status":{},"detail":"{detail}"}}"#,
        status.as_u16()
    );
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(secs) = retry_after {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    buffered(response, None)
}

/// The transaction failed before anything committed: the layer gives the key back.
fn unavailable(detail: &str) -> Response<TxBody> {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Transaction failed",
        detail,
        Some(1),
    )
}

/// The commit's answer was lost: the client retries after the lease, and gets the stored
/// response if it committed, or a fresh run if it did not.
fn commit_unknown(shared: &TxShared) -> Response<TxBody> {
    let lease = shared.config.lease().as_secs().max(1);
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Commit outcome unknown",
        "the commit of the handler's writes and its response got no answer: retry with the same key after Retry-After; a retry gets the stored response if it committed, or runs the handler again if it did not",
        Some(lease),
    )
}

/// Another attempt took the key over while this one ran: its writes were rolled back.
fn superseded(rejection: &TransitionRejection) -> Response<TxBody> {
    tracing::warn!(%rejection, "the handler's response was refused by its record: its writes were rolled back");
    problem(
        StatusCode::CONFLICT,
        "Claim lost",
        "another attempt holds this key now (this one's lease lapsed): this attempt's writes were rolled back; a retry gets the other attempt's answer",
        Some(1),
    )
}
