//! [`Proxy`]: the service at the bottom of every route. It forwards a request to the upstream
//! over a pooled keep-alive client (bodies streamed both ways), strips hop-by-hop headers, sets
//! `X-Forwarded-For`, `-Proto` and `-Host`, keeps `Host`, and bounds the wait for the
//! upstream's answer.
//!
//! An upstream that cannot be reached or answers too late is an `Err` ([`ProxyError`]), not a
//! response: the idempotency layer releases the key on an error (so a retry runs again, whatever
//! `store_server_errors` says), and the gateway turns the error into 502 or 504. An upstream
//! that breaks off its response body is counted and logged by its [`UpstreamBody`]; the layer
//! answers it `Rejection::ResponseBodyFailed`, which the gateway turns into 502 too.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::BoxError;
use metrics::Counter;
use tokio::sync::{Notify, watch};
use tower_service::Service;

use crate::body::{Guarded, RequestBody};
use crate::config::UpstreamConfig;
use crate::gateway::metric;

/// The body of an upstream response. It holds its in-flight guard until it ends, and when the
/// upstream breaks it off (a connection closed before the `Content-Length` it announced, a
/// malformed chunk) it counts the failure in `idem_gateway_upstream_errors_total{kind="failed"}`
/// and logs it.
#[derive(Debug)]
pub struct UpstreamBody {
    body: Guarded<Incoming, InFlightGuard>,
    shared: Arc<ProxyShared>,
}

impl UpstreamBody {
    /// Counts and logs a body error.
    fn broke(&self, error: &hyper::Error) {
        self.shared.body_errors.increment(1);
        let failure = ProxyError::Failed {
            upstream: self.shared.name.clone(),
            source: error_chain(error).into(),
        };
        tracing::warn!(error = %failure, "the upstream broke off its response body");
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Err(error))) = &polled {
            this.broke(error);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An error and its sources, joined by ": " (hyper's own message leaves out the cause):
/// `client error (Connect): tcp connect error: Connection refused`.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(err) = current {
        text.push_str(": ");
        text.push_str(&err.to_string());
        current = err.source();
    }
    text
}

/// Why the upstream gave no response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The upstream refused or dropped the connection: 502.
    #[error("cannot reach the upstream {upstream}: {source}")]
    Unreachable {
        /// The upstream.
        upstream: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The connection was not made within `connect_timeout`: 504.
    #[error("the upstream {upstream} did not accept a connection within {after:?}")]
    ConnectTimeout {
        /// The upstream.
        upstream: String,
        /// The limit.
        after: Duration,
    },
    /// No response head within `timeout`: 504.
    #[error("the upstream {upstream} did not answer within {after:?}")]
    Timeout {
        /// The upstream.
        upstream: String,
        /// The limit.
        after: Duration,
    },
    /// The upstream broke the exchange (a malformed or cut response): 502.
    #[error("the upstream {upstream} failed: {source}")]
    Failed {
        /// The upstream.
        upstream: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The gateway is shutting down and its grace period is over: 503.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

impl ProxyError {
    /// The status the client gets.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Unreachable { .. } | ProxyError::Failed { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout { .. } | ProxyError::Timeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A short, stable name for metrics labels and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::Unreachable { .. } => "unreachable",
            ProxyError::ConnectTimeout { .. } => "connect_timeout",
            ProxyError::Timeout { .. } => "timeout",
            ProxyError::Failed { .. } => "failed",
            ProxyError::ShuttingDown => "shutting_down",
        }
    }

    /// What the client is told: what went wrong, without the upstream's address or the
    /// underlying error (those are for the gateway's log: a public client learns nothing of
    /// the network behind the gateway).
    #[must_use]
    pub fn public_detail(&self) -> String {
        match self {
            ProxyError::Unreachable { .. } => "the upstream cannot be reached".to_owned(),
            ProxyError::ConnectTimeout { after, .. } => format!(
                "the upstream did not accept a connection within {}",
                humantime::format_duration(*after)
            ),
            ProxyError::Timeout { after, .. } => format!(
                "the upstream did not answer within {}",
                humantime::format_duration(*after)
            ),
            ProxyError::Failed { .. } => "the upstream broke off the exchange".to_owned(),
            ProxyError::ShuttingDown => {
                "the gateway is shutting down: retry after the delay in Retry-After".to_owned()
            }
        }
    }

    /// The variant's name, for the problem `type` link.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            ProxyError::Unreachable { .. } => "Unreachable",
            ProxyError::ConnectTimeout { .. } => "ConnectTimeout",
            ProxyError::Timeout { .. } => "Timeout",
            ProxyError::Failed { .. } => "Failed",
            ProxyError::ShuttingDown => "ShuttingDown",
        }
    }
}

/// Counts upstream exchanges in flight, and tells them to give up when shutdown's grace is over.
#[derive(Debug, Clone)]
pub struct Tracker {
    shared: Arc<TrackerShared>,
}

#[derive(Debug)]
struct TrackerShared {
    count: AtomicUsize,
    idle: Notify,
    abort: watch::Sender<bool>,
}

/// Held while one upstream exchange runs (until its response body ends or is dropped).
#[derive(Debug)]
pub struct InFlightGuard {
    shared: Arc<TrackerShared>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.shared.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.idle.notify_waiters();
        }
    }
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            shared: Arc::new(TrackerShared {
                count: AtomicUsize::new(0),
                idle: Notify::new(),
                abort: watch::channel(false).0,
            }),
        }
    }
}

impl Tracker {
    /// A tracker with nothing in flight.
    #[must_use]
    pub fn new() -> Self {
        Tracker::default()
    }

    /// How many exchanges are in flight.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.shared.count.load(Ordering::Acquire)
    }

    fn enter(&self) -> InFlightGuard {
        self.shared.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard {
            shared: self.shared.clone(),
        }
    }

    /// Makes every exchange still waiting for its upstream give up with
    /// [`ProxyError::ShuttingDown`], so the idempotency layer releases its key.
    pub fn abort(&self) {
        self.shared.abort.send_replace(true);
    }

    /// Waits until nothing is in flight, or `limit` passes; `true` if nothing is.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        // `Instant + Duration` panics past the clock's range; a wait of a year is forever.
        let limit = limit.min(Duration::from_secs(365 * 24 * 60 * 60));
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the count is read, so a guard dropped in between still wakes
            // this waiter.
            let idle = self.shared.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }

    async fn aborted(&self) {
        let mut abort = self.shared.abort.subscribe();
        // An error means the sender is gone, which never happens while `self` lives.
        let _ = abort.wait_for(|aborted| *aborted).await;
    }
}

/// The peer address of a client connection, put in the request extensions by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// The upstream client: a [`Service`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html) that is always ready and cheap to clone.
#[derive(Clone, Debug)]
pub struct Proxy {
    shared: Arc<ProxyShared>,
}

#[derive(Debug)]
struct ProxyShared {
    client: Client<HttpConnector, RequestBody>,
    upstream: UpstreamConfig,
    name: String,
    tracker: Tracker,
    /// `idem_gateway_upstream_errors_total{kind="failed"}`, for broken response bodies.
    body_errors: Counter,
}

/// Headers that describe one connection (RFC 9110 section 7.6.1) or speak to the next proxy
/// only (`Proxy-Authorization` and `Proxy-Authenticate`, RFC 9110 section 11.7), never
/// forwarded either way. `Trailer` is not among them: it announces the trailer fields of the
/// message, end to end, and an HTTP/1.1 server sends trailers only where it is set.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, and the headers the `Connection` header names, but `Host`: the
/// target of a request is end to end (RFC 9112 section 3.2), and the gateway keeps it whatever
/// a client's `Connection` says.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .filter(|name| *name != header::HOST)
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Asks for a chunked body where the client sent a body of no declared length. hyper's client
/// adds `Transfer-Encoding: chunked` itself for such a body, except on a GET, HEAD or CONNECT,
/// which it sends with no body at all (they "almost never have bodies"): the body the client
/// sent would be dropped on the way.
fn keep_unsized_body(request: &mut Request<RequestBody>) {
    let body = request.body();
    if !body.is_end_stream()
        && body.size_hint().exact().is_none()
        && !request.headers().contains_key(header::CONTENT_LENGTH)
    {
        request.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
}

/// Sets `X-Forwarded-For` (the field lines the client sent, joined into one, and the client's
/// address appended), `X-Forwarded-Proto` (`http`) and `X-Forwarded-Host` (the `Host` the
/// client asked for), and keeps `Host` (from the URI's authority for an HTTP/2 request, which
/// has none).
fn forwarded_headers(request: &mut Request<RequestBody>) {
    let client = request.extensions().get::<ClientAddr>().copied();
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    let headers = request.headers_mut();
    if !headers.contains_key(header::HOST) {
        if let Some(value) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            headers.insert(header::HOST, value);
        }
    }
    if let Some(ClientAddr(addr)) = client {
        // Every field line the client sent, in order (a list may be split over several lines,
        // RFC 9110 section 5.3), then the client's own address.
        let mut value = String::new();
        for earlier in headers.get_all(&X_FORWARDED_FOR) {
            if let Ok(earlier) = earlier.to_str() {
                value.push_str(earlier);
                value.push_str(", ");
            }
        }
        value.push_str(&addr.ip().to_string());
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(X_FORWARDED_FOR, value);
        }
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if let Some(host) = headers.get(header::HOST).cloned() {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Whether the error chain holds an I/O timeout (a connect timeout of the connector).
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(err) = current {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        current = err.source();
    }
    false
}

impl Proxy {
    /// The upstream's name (its URL), as errors show it.
    #[must_use]
    pub fn upstream(&self) -> &str {
        &self.shared.name
    }

    /// A proxy to `upstream`, counting its exchanges in `tracker`. Metric handles are registered
    /// now: install the recorder before.
    #[must_use]
    pub fn new(upstream: &UpstreamConfig, tracker: Tracker) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(upstream.connect_timeout));
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(upstream.pool_idle_timeout)
            .pool_max_idle_per_host(upstream.pool_max_idle)
            .build(connector);
        Proxy {
            shared: Arc::new(ProxyShared {
                client,
                upstream: upstream.clone(),
                name: upstream.url.to_string(),
                tracker,
                body_errors: metrics::counter!(metric::UPSTREAM_ERRORS, "kind" => "failed"),
            }),
        }
    }

    /// Forwards `request` and returns the upstream's response, hop-by-hop headers removed.
    ///
    /// # Errors
    /// [`ProxyError`] when the upstream cannot be reached, answers too late or breaks the
    /// exchange, or the gateway is shutting down.
    pub async fn forward(
        &self,
        mut request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let shared = &self.shared;
        let guard = shared.tracker.enter();
        // Hop-by-hop headers go first: the forwarded headers the gateway sets are its own, and
        // a client naming them in `Connection` only drops the values it sent.
        strip_hop_by_hop(request.headers_mut());
        forwarded_headers(&mut request);
        // The gateway takes trailers, whoever its client is: it passes them on (to an HTTP/2
        // client, or an HTTP/1.1 one that sent `TE: trailers` itself) and stores them with
        // the response, so a replay ends with them. An HTTP/1.1 upstream sends trailers only
        // to a client that says so.
        request
            .headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
        keep_unsized_body(&mut request);
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        let uri = Uri::builder()
            .scheme(shared.upstream.url.scheme.clone())
            .authority(shared.upstream.url.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|err| ProxyError::Failed {
                upstream: shared.name.clone(),
                source: err.into(),
            })?;
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_11;

        let after = shared.upstream.timeout;
        let exchange = tokio::time::timeout(after, shared.client.request(request));
        let result = tokio::select! {
            result = exchange => result,
            () = shared.tracker.aborted() => return Err(ProxyError::ShuttingDown),
        };
        let response = match result {
            Err(_elapsed) => {
                return Err(ProxyError::Timeout {
                    upstream: shared.name.clone(),
                    after,
                });
            }
            Ok(Err(err)) if err.is_connect() && is_timeout(&err) => {
                return Err(ProxyError::ConnectTimeout {
                    upstream: shared.name.clone(),
                    after: shared.upstream.connect_timeout,
                });
            }
            Ok(Err(err)) if err.is_connect() => {
                return Err(ProxyError::Unreachable {
                    upstream: shared.name.clone(),
                    source: err.into(),
                });
            }
            Ok(Err(err)) => {
                return Err(ProxyError::Failed {
                    upstream: shared.name.clone(),
                    source: err.into(),
                });
            }
            Ok(Ok(response)) => response,
        };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let body = UpstreamBody {
            body: Guarded::new(body, guard),
            shared: self.shared.clone(),
        };
        Ok(Response::from_parts(parts, body))
    }
}

/// The future of [`Proxy::call`].
pub type ProxyFuture =
    Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, ProxyError>> + Send + 'static>>;

impl Service<Request<RequestBody>> for Proxy {
    type Response = Response<UpstreamBody>;
    type Error = ProxyError;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let proxy = self.clone();
        Box::pin(async move { proxy.forward(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"proxy\""),
        );
        headers.insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 2);
        assert!(headers.contains_key(header::CONTENT_TYPE));
        // `Trailer` announces the message's trailers end to end: it stays.
        assert!(headers.contains_key(header::TRAILER));
    }

    #[test]
    fn forwarded_headers_append_and_keep_host() {
        let mut request = Request::post("/p")
            .header(header::HOST, "api.example.com")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-forwarded-for", "10.0.0.2, 10.0.0.3")
            .body(RequestBody::from(Bytes::new()))
            .unwrap();
        request
            .extensions_mut()
            .insert(ClientAddr("127.0.0.9:5000".parse().unwrap()));
        forwarded_headers(&mut request);
        let h = request.headers();
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            h["x-forwarded-for"],
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.9"
        );
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example.com");
        assert_eq!(h[header::HOST], "api.example.com");
    }

    #[test]
    fn connection_never_removes_host() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("host, x-a"));
        headers.insert(header::HOST, HeaderValue::from_static("api.example.com"));
        headers.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers[header::HOST], "api.example.com");
    }
}
