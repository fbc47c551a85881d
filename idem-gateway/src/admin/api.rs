//! The key API of the admin listener, JSON over HTTP (what `idem keys --admin URL` calls):
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/keys?state=S&older_than=D&limit=N&cursor=C` | `{"records": [...], "unreadable": [...], "next_cursor": C or null}`, one page of at most `N` (1 to 100; 0 is 400) |
//! | `GET /api/keys/KEY?scope=S` | the record, or 404 `{"error": ...}` |
//! | `HEAD` of either | the `GET`'s status and headers, without the body |
//! | `DELETE /api/keys/KEY?scope=S` | `{"deleted": true or false}` |
//!
//! `KEY` is percent-encoded; a record is the JSON of [`crate::records::record_json`]. A page
//! lists the records the store could not read (corrupt ones) apart, in `unreadable`, as
//! [`crate::records::unreadable_json`] renders them (`"state": "unreadable"`, the key where
//! the store could read it, the key as stored, the reason): the page is still 200, and `limit`
//! counts them too. A bad
//! argument (a `limit` of 0, a `cursor` the store never gave) is 400 and a store error 503,
//! each `{"error": "..."}`; an error names the query parameter (`state: ...`), or `key` for the
//! path's key, and shows at most the first 64 characters of a bad cursor.

use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use idem_core::{RecordKey, Store, StoreError};
use serde_json::{Value, json};

use super::form;
use crate::body::{GatewayBody, full};
use crate::config::ConfigError;
use crate::records::{ArgNames, record_json, record_key, scan_query, unreadable_json};

/// The path prefix of the key API.
pub const PREFIX: &str = "/api/keys";

/// A JSON response.
#[must_use]
pub fn json_response(status: StatusCode, value: &Value) -> Response<GatewayBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A JSON error: `{"error": MESSAGE}`.
pub(crate) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<GatewayBody> {
    json_response(status, &json!({ "error": message.to_string() }))
}

fn bad_request(err: &ConfigError) -> Response<GatewayBody> {
    error(StatusCode::BAD_REQUEST, err)
}

/// Answers a request whose path starts with [`PREFIX`].
pub async fn handle(
    store: &dyn Store,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Response<GatewayBody> {
    let params = form::pairs(query.unwrap_or_default());
    let rest = path.strip_prefix(PREFIX).unwrap_or_default();
    if rest.is_empty() || rest == "/" {
        if method != Method::GET && method != Method::HEAD {
            return super::with_allow(
                error(StatusCode::METHOD_NOT_ALLOWED, "GET lists the records"),
                "GET, HEAD",
            );
        }
        return list(store, &params).await;
    }
    let Some(encoded) = rest.strip_prefix('/') else {
        return error(StatusCode::NOT_FOUND, "GET or DELETE /api/keys/KEY");
    };
    let Some(key) = form::decode(encoded, false) else {
        return error(
            StatusCode::BAD_REQUEST,
            "key: not a percent-encoded key (a key holds only printable ASCII)",
        );
    };
    let scope = form::value(&params, "scope").unwrap_or_default();
    let key = match record_key(&key, scope, ArgNames::PARAMS) {
        Ok(key) => key,
        Err(err) => return bad_request(&err),
    };
    match *method {
        Method::GET | Method::HEAD => get(store, &key).await,
        Method::DELETE => match store.delete(&key).await {
            Ok(deleted) => {
                if deleted {
                    tracing::info!(key = %key, "admin: record deleted");
                }
                json_response(StatusCode::OK, &json!({ "deleted": deleted }))
            }
            Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}")),
        },
        _ => super::with_allow(
            error(StatusCode::METHOD_NOT_ALLOWED, "GET or DELETE"),
            "GET, HEAD, DELETE",
        ),
    }
}

async fn get(store: &dyn Store, key: &RecordKey) -> Response<GatewayBody> {
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

async fn list(store: &dyn Store, params: &[(String, String)]) -> Response<GatewayBody> {
    let limit = match form::value(params, "limit").map(str::parse::<usize>) {
        None => idem_core::ScanQuery::DEFAULT_LIMIT,
        Some(Ok(limit)) => limit,
        Some(Err(err)) => {
            return bad_request(&ConfigError::new(Some("limit".to_owned()), err.to_string()));
        }
    };
    let mut query = match scan_query(
        form::value(params, "state"),
        form::value(params, "older_than"),
        limit,
        ArgNames::PARAMS,
    ) {
        Ok(query) => query,
        Err(err) => return bad_request(&err),
    };
    query.cursor = form::value(params, "cursor").map(str::to_owned);
    match store.scan(&query).await {
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
