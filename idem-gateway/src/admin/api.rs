//! The key API of the admin listener, JSON over HTTP (what `idem keys --admin URL` calls):
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/keys?state=S&older_than=D&limit=N&cursor=C` | `{"records": [...], "unreadable": [...], "next_cursor": C or null}`, one page of at most `N` (1 to 100; 0 is 400) |
//! | `GET /api/keys/KEY?scope=S` | the record, or 404 `{"error": ...}` |
//! | `HEAD` of either | the `GET`'s status and headers, without the body |
//! | `DELETE /api/keys/KEY?scope=S` | `{"deleted": true or false}` |
//! | `POST /api/keys/KEY?scope=S`, JSON `{"resolve": "release"}` or `{"resolve": "completed", "status": 201, "headers": [["content-type", "application/json"]], "body": "..."}`, optional `"fence"` | resolves an unknown outcome: `{"key", "scope", "fence", "resolved"}`; 404 without a record, 409 for a record that is not unknown (at that fence) |
//!
//! `KEY` is percent-encoded; a record is the JSON of [`crate::records::record_json`]. A page
//! lists the records the store could not read (corrupt ones) apart, in `unreadable`, as
//! [`crate::records::unreadable_json`] renders them (`"state": "unreadable"`, the key where
//! the store could read it, the key as stored, the reason): the page is still 200, and `limit`
//! counts them too. A bad
//! argument (a `limit` of 0, a `cursor` the store never gave) is 400 and a store error 503,
//! each `{"error": "..."}`; an error names the query parameter (`state: ...`), or `key` for the
//! path's key, and shows at most the first 64 characters of a bad cursor.

use axum::Router;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::header::{self, HeaderValue};
use http::{Method, StatusCode};
use idem_core::{RecordKey, Store, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Admin, only};
use crate::config::GatewayConfigError;
use crate::records::{ArgNames, record_json, record_key, scan_query, unreadable_json};
use crate::resolve::{ResolveRequest, resolved_json};

/// The path prefix of the key API.
pub(crate) const PREFIX: &str = "/api/keys";

/// A JSON response.
#[must_use]
pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut response = (status, value.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A JSON error: `{"error": MESSAGE}`.
pub(crate) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    json_response(status, &json!({ "error": message.to_string() }))
}

fn bad_request(err: &GatewayConfigError) -> Response {
    error(StatusCode::BAD_REQUEST, err)
}

/// The query parameters of the key API (each optional; others are ignored).
#[derive(Debug, Default, Deserialize)]
struct Params {
    state: Option<String>,
    older_than: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
    scope: Option<String>,
}

/// A request the key API refuses before asking the store: 400 and its reason, answered as
/// `{"error": REASON}`.
struct BadRequest(String);

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        error(StatusCode::BAD_REQUEST, self.0)
    }
}

/// The query parameters, or why the query does not read as them (a parameter given twice).
fn params(query: Result<Query<Params>, QueryRejection>) -> Result<Params, BadRequest> {
    query
        .map(|Query(params)| params)
        .map_err(|rejection| BadRequest(rejection.body_text()))
}

/// The routes under [`PREFIX`]: the list, and one record by its percent-encoded key.
pub(super) fn routes() -> Router<Admin> {
    let list_route = || {
        only(get(list), "GET, HEAD", || {
            error(StatusCode::METHOD_NOT_ALLOWED, "GET lists the records")
        })
    };
    let key_route = only(
        get(one).delete(one).post(resolve),
        "GET, HEAD, DELETE, POST",
        || error(StatusCode::METHOD_NOT_ALLOWED, "GET, DELETE or POST"),
    );
    Router::new()
        .route(PREFIX, list_route())
        .route(&format!("{PREFIX}/"), list_route())
        .route(&format!("{PREFIX}/{{*key}}"), key_route)
}

/// The record key a request names: the path's key (percent-decoded by axum) and the `scope`
/// parameter.
fn key_of(
    key: Result<Path<String>, PathRejection>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<RecordKey, BadRequest> {
    let Ok(Path(key)) = key else {
        return Err(BadRequest(
            "key: not a percent-encoded key (a key holds only printable ASCII)".to_owned(),
        ));
    };
    let scope = params(query)?.scope.unwrap_or_default();
    record_key(&key, &scope, ArgNames::PARAMS).map_err(|err| BadRequest(err.to_string()))
}

/// `GET` (and `HEAD`) or `DELETE` `/api/keys/KEY?scope=S`.
async fn one(
    State(admin): State<Admin>,
    method: Method,
    key: Result<Path<String>, PathRejection>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, BadRequest> {
    let key = key_of(key, query)?;
    if method != Method::DELETE {
        return Ok(get_record(&*admin.store, &key).await);
    }
    Ok(match admin.store.delete(&key).await {
        Ok(deleted) => {
            if deleted {
                tracing::info!(key = %key, "admin: record deleted");
            }
            json_response(StatusCode::OK, &json!({ "deleted": deleted }))
        }
        Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}")),
    })
}

/// `POST /api/keys/KEY?scope=S` with a [`ResolveRequest`]: resolves an unknown outcome.
async fn resolve(
    State(admin): State<Admin>,
    key: Result<Path<String>, PathRejection>,
    query: Result<Query<Params>, QueryRejection>,
    body: Result<bytes::Bytes, BytesRejection>,
) -> Result<Response, BadRequest> {
    let key = key_of(key, query)?;
    let body = body.map_err(|err| BadRequest(format!("body: {}", err.body_text())))?;
    let request: ResolveRequest = serde_json::from_slice(&body)
        .map_err(|err| BadRequest(format!("body: not a resolution: {err}")))?;
    let (resolution, fence) = request.parse().map_err(BadRequest)?;
    let resolved =
        crate::resolve::resolve(&*admin.store, &key, fence, &resolution, admin.retention).await;
    Ok(match resolved {
        Ok(fence) => {
            admin.unknowns.resolved(&key);
            json_response(StatusCode::OK, &resolved_json(&key, fence, &resolution))
        }
        Err(err) => error(err.status(), err),
    })
}

/// The record at `key` as JSON, or 404.
async fn get_record(store: &dyn Store, key: &RecordKey) -> Response {
    match store.get(key).await {
        Ok(Some(record)) => json_response(StatusCode::OK, &record_json(&record)),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no record at {key}")),
        Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}")),
    }
}

/// The most characters of a caller's value an error shows.
const SHOWN: usize = 64;

/// `value` as an error shows it: quoted, its first [`SHOWN`] characters, and its length when it
/// is longer.
fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN) {
        Some((end, _)) => format!(
            "{:?}... ({} bytes)",
            value.get(..end).unwrap_or_default(),
            value.len()
        ),
        None => format!("{value:?}"),
    }
}

/// `GET` (and `HEAD`) `/api/keys?state=S&older_than=D&limit=N&cursor=C`.
async fn list(
    State(admin): State<Admin>,
    query: Result<Query<Params>, QueryRejection>,
) -> Response {
    let params = match params(query) {
        Ok(params) => params,
        Err(refused) => return refused.into_response(),
    };
    let limit = match params.limit.as_deref().map(str::parse::<usize>) {
        None => idem_core::ScanQuery::DEFAULT_LIMIT,
        Some(Ok(limit)) => limit,
        Some(Err(err)) => {
            return bad_request(&GatewayConfigError::new(
                Some("limit".to_owned()),
                err.to_string(),
            ));
        }
    };
    let mut query = match scan_query(
        params.state.as_deref(),
        params.older_than.as_deref(),
        limit,
        ArgNames::PARAMS,
    ) {
        Ok(query) => query,
        Err(err) => return bad_request(&err),
    };
    query.cursor = params.cursor;
    match admin.store.scan(&query).await {
        Ok(page) => {
            let records: Vec<Value> = page.records.iter().map(record_json).collect();
            let unreadable: Vec<Value> = page.unreadable.iter().map(unreadable_json).collect();
            json_response(
                StatusCode::OK,
                &json!({
                    "records": records,
                    "unreadable": unreadable,
                    "next_cursor": page.next_cursor,
                }),
            )
        }
        // A cursor this store never gave is the caller's mistake, not an outage. Its start
        // is shown, not all of it: the answer stays small whatever the caller sent.
        Err(StoreError::InvalidCursor { cursor }) => error(
            StatusCode::BAD_REQUEST,
            format!(
                "cursor: not a scan cursor of this store: {}",
                shown(&cursor)
            ),
        ),
        Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}")),
    }
}
