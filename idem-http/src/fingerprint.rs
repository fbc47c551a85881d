//! The fingerprint of a request: SHA-256 over its method, its path and query, and its body
//! bytes as received (de-chunked), computed before the handler runs.
//!
//! ```
//! use http::{Method, Uri};
//! use idem_http::fingerprint::request_fingerprint;
//!
//! let uri: Uri = "/payments?currency=eur".parse()?;
//! let a = request_fingerprint(&Method::POST, &uri, b"{\"amount\":10}");
//! assert_eq!(a, request_fingerprint(&Method::POST, &uri, b"{\"amount\":10}"));
//! assert_ne!(a, request_fingerprint(&Method::POST, &uri, b"{\"amount\":11}"));
//! assert_ne!(a, request_fingerprint(&Method::PATCH, &uri, b"{\"amount\":10}"));
//! # Ok::<(), http::uri::InvalidUri>(())
//! ```

use http::{Method, Uri};
use idem_core::Fingerprint;

/// The fingerprint of a request. Only the path and query of `uri` count (not its scheme or
/// authority), so an absolute-form request line and an origin-form one match. Headers do not
/// count: the scope (the `Authorization` header by default) separates principals instead.
///
/// The layer passes the URI as the client sent it. Behind axum's `Router::nest` a request's
/// URI has lost the nest's prefix: with the `axum` feature the layer fingerprints axum's
/// `OriginalUri` instead; without it, apply the layer to the outer router, or two nested
/// routers sharing a store would take the same key on `POST /a/x` and `POST /b/x` for the
/// same request (a replay of the other's response instead of 422).
#[must_use]
pub fn request_fingerprint(method: &Method, uri: &Uri, body: &[u8]) -> Fingerprint {
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
    Fingerprint::builder()
        .part(method.as_str().as_bytes())
        .part(path_and_query.as_bytes())
        .part(body)
        .finish()
}

/// [`request_fingerprint`] with the request's host as one more part: `host` is its `Host`
/// (or the authority of an HTTP/2 request), in lower case. With `None`, the same as
/// [`request_fingerprint`].
#[must_use]
pub fn request_fingerprint_with_host(
    method: &Method,
    uri: &Uri,
    host: Option<&str>,
    body: &[u8],
) -> Fingerprint {
    let Some(host) = host else {
        return request_fingerprint(method, uri, body);
    };
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
    Fingerprint::builder()
        .part(method.as_str().as_bytes())
        .part(path_and_query.as_bytes())
        .part(body)
        .part(b"host")
        .part(host.as_bytes())
        .finish()
}

/// The host a request was sent to, in lower case: its `Host` header, else the authority of
/// its URI (an HTTP/2 request's `:authority`); `None` when it names none (an HTTP/1.0 request
/// without `Host`) or the `Host` is not text.
#[must_use]
pub fn request_host(parts: &http::request::Parts) -> Option<std::borrow::Cow<'_, str>> {
    let host = match parts.headers.get(http::header::HOST) {
        Some(value) => value.to_str().ok()?,
        None => parts.uri.authority()?.as_str(),
    };
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    })
}

/// The fingerprint of a request whose body arrives as `body`: read as the layer reads it (up
/// to `limit` bytes, de-chunked), then [`request_fingerprint`]. `None` if the body is over the
/// limit or fails. For the fuzz targets (the `fuzzing` feature); not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub async fn captured_fingerprint<B>(
    method: &Method,
    uri: &Uri,
    body: B,
    limit: usize,
) -> Option<Fingerprint>
where
    B: http_body::Body,
    B::Error: Into<idem_core::BoxError>,
{
    let bytes = crate::body::capture(body, limit).await.ok()?;
    Some(request_fingerprint(method, uri, &bytes))
}
