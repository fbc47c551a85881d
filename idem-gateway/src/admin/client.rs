//! The client side of the key API: what `idem keys ... --admin URL` uses to reach a running
//! gateway (the only way to the records of a gateway on the memory store). Plain `http://`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{RecordKey, ScanQuery};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use super::api::PREFIX;
use crate::commands::Failure;
use crate::config::GatewayConfigError;
use crate::proxy::error_chain;

/// What [`encode`] escapes: everything but the unreserved characters of RFC 3986
/// (`A-Z a-z 0-9 - . _ ~`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes `text` for a URL path segment or a query value (a key in the key API's
/// path, a cursor in its query).
#[must_use]
pub(crate) fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// How long one admin request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one gateway's admin listener.
#[derive(Clone)]
pub(crate) struct AdminClient {
    base: String,
    token: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// A client of the admin listener at `url` (`http://HOST:PORT`, a path prefix allowed),
    /// sending `token` as a bearer token when given.
    ///
    /// # Errors
    /// [`GatewayConfigError`] naming `--admin` when the URL is not an `http://` URL.
    pub(crate) fn new(url: &str, token: Option<String>) -> Result<Self, GatewayConfigError> {
        let bad = |why: &str| {
            GatewayConfigError::new(
                Some("--admin".to_owned()),
                format!("{why} in {url:?}: expected http://HOST:PORT"),
            )
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("not an http:// URL"));
        }
        if uri.authority().is_none() {
            return Err(bad("no host"));
        }
        if uri.query().is_some() {
            return Err(bad("a query"));
        }
        Ok(AdminClient {
            base: url.trim_end_matches('/').to_owned(),
            token,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// Sends one request; returns the status and the JSON body.
    async fn call(&self, method: Method, path_and_query: &str) -> Result<Value, Failure> {
        self.call_with(method, path_and_query, Bytes::new()).await
    }

    /// [`AdminClient::call`] with a JSON body (empty: none).
    async fn call_with(
        &self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
    ) -> Result<Value, Failure> {
        let url = format!("{}{path_and_query}", self.base);
        let mut request = Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Failure::runtime("the admin token is not a valid header value"))?;
            request = request.header(header::AUTHORIZATION, value);
        }
        if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body))
            .map_err(|err| Failure::runtime(format!("admin {url}: {err}")))?;
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        };
        let (status, body) = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| Failure::runtime(format!("admin {url}: no answer within {TIMEOUT:?}")))?
            .map_err(|err| Failure::runtime(format!("admin {url}: {}", error_chain(&*err))))?;
        if status == StatusCode::UNAUTHORIZED {
            return Err(Failure::runtime(if self.token.is_some() {
                format!(
                    "admin {url}: 401: the admin listener refused the token (from --admin-token, IDEM_ADMIN_TOKEN or the file's [admin] token)"
                )
            } else {
                format!(
                    "admin {url}: 401: the admin listener wants a token (--admin-token or IDEM_ADMIN_TOKEN)"
                )
            }));
        }
        let value: Value = serde_json::from_slice(&body).map_err(|_| {
            Failure::runtime(format!(
                "admin {url}: {status} and not the key API's JSON (an older gateway?): {}",
                String::from_utf8_lossy(&body).trim()
            ))
        })?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(value);
        }
        Err(Failure::runtime(format!(
            "admin {url}: {status}: {}",
            value["error"].as_str().unwrap_or("no error message")
        )))
    }

    fn key_path(key: &RecordKey) -> String {
        format!(
            "{PREFIX}/{}?scope={}",
            encode(key.key.as_str()),
            encode(key.scope.as_str())
        )
    }

    /// The record at `key` as JSON, if there is one.
    ///
    /// # Errors
    /// [`Failure::Runtime`]: unreachable, refused, or a store error on the gateway.
    pub(crate) async fn get(&self, key: &RecordKey) -> Result<Option<Value>, Failure> {
        let value = self.call(Method::GET, &Self::key_path(key)).await?;
        Ok(value.get("key").is_some().then_some(value))
    }

    /// Deletes the record at `key`; `true` if there was one.
    ///
    /// # Errors
    /// [`Failure::Runtime`]: unreachable, refused, or a store error on the gateway.
    pub(crate) async fn delete(&self, key: &RecordKey) -> Result<bool, Failure> {
        let value = self.call(Method::DELETE, &Self::key_path(key)).await?;
        Ok(value["deleted"].as_bool().unwrap_or(false))
    }

    /// Resolves the unknown outcome at `key` ([`crate::resolve`]); the answer's JSON.
    ///
    /// # Errors
    /// [`Failure::Runtime`]: unreachable, refused, no record (404), a record that is not
    /// unknown (409), or a store error on the gateway.
    pub(crate) async fn resolve(
        &self,
        key: &RecordKey,
        request: &crate::resolve::ResolveRequest,
    ) -> Result<Value, Failure> {
        let body = serde_json::to_vec(request)
            .map_err(|err| Failure::runtime(format!("a resolution as JSON: {err}")))?;
        let value = self
            .call_with(Method::POST, &Self::key_path(key), Bytes::from(body))
            .await?;
        if value.get("resolved").is_none() {
            let error = value["error"].as_str().unwrap_or("no error message");
            return Err(Failure::runtime(format!("admin: {error}")));
        }
        Ok(value)
    }

    /// One page of records as JSON, followed by the records the store could not read (the
    /// page's `unreadable`, absent from an older gateway's answer), and the cursor of the next.
    ///
    /// # Errors
    /// [`Failure::Runtime`]: unreachable, refused, or a store error on the gateway.
    pub(crate) async fn scan(
        &self,
        query: &ScanQuery,
    ) -> Result<(Vec<Value>, Option<String>), Failure> {
        let mut path = format!("{PREFIX}?limit={}", query.page_size());
        if let Some(state) = query.state {
            path.push_str(&format!("&state={state}"));
        }
        if let Some(age) = query.min_age {
            path.push_str(&format!("&older_than={}ms", age.as_millis()));
        }
        if let Some(cursor) = &query.cursor {
            path.push_str(&format!("&cursor={}", encode(cursor)));
        }
        let mut value = self.call(Method::GET, &path).await?;
        let mut records = match value["records"].take() {
            Value::Array(records) => records,
            _ => return Err(Failure::runtime("admin: a list without records")),
        };
        if let Value::Array(unreadable) = value["unreadable"].take() {
            records.extend(unreadable);
        }
        let cursor = value["next_cursor"].as_str().map(str::to_owned);
        Ok((records, cursor))
    }
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn encoding_escapes_all_but_the_unreserved() {
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(encode("Az09-._~"), "Az09-._~");
        assert_eq!(encode("?&=%+é"), "%3F%26%3D%25%2B%C3%A9");
    }
}
