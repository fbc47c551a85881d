//! [`Proxy`]: the service at the bottom of every route. It forwards a request to the upstream
//! over a keep-alive HTTP/1.1 connection of the serving thread's own pool (bodies streamed
//! both ways; no lock, no task per request: see the crate's `pool` module), strips hop-by-hop headers (and
//! hop-by-hop and framing fields from the trailers, both ways), removes the upstream's own
//! replay headers, sets `X-Forwarded-For`, `-Proto` and `-Host`, keeps `Host`, and bounds the
//! wait for the upstream's answer.
//!
//! An upstream that cannot be reached, or that never had the whole request, is an `Err`
//! ([`ProxyError`]), not a response: the idempotency layer releases the key on an error (so a
//! retry runs again, whatever `store_server_errors` says), and the gateway turns the error into
//! 502 or 504. An exchange whose answer was lost after the upstream had the whole request (no
//! head within `timeout`, a connection reset or closed before the head, a body that breaks
//! before its first frame) is a 502 or 504 response instead, marked [`OutcomeUnknown`] so the
//! layer holds the key as unknown, and told to the route ([`OnLost`]) for its count, log and
//! reconciliation. An upstream that breaks off its response body later is counted and logged
//! by its [`UpstreamBody`], and the layer holds that key as unknown too. A 101 (the gateway
//! carries no protocol switch) is an `Err` as well: the head is passed on only once the first
//! frame (or the end) has come.

use std::cell::RefCell;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_core::{BoxError, Fence, RecordKey, UnknownOutcome};
use idem_http::fields::{clean_trailer_header, remove_connection_fields, remove_idem_fields};
use idem_http::{IdempotencyContext, OutcomeUnknown};
use metrics::Counter;
use tokio::sync::{Notify, watch};
use tower_service::Service;

use crate::body::{Delivered, Guarded, RequestBody, SettledTrailers};
use crate::config::UpstreamConfig;
use crate::gateway::metric;
use crate::pool::{ConnectError, Pool, Sender, UpstreamRequestBody};

/// The body of an upstream response. It holds its in-flight guard until it ends, and when the
/// upstream breaks it off (a connection closed before the `Content-Length` it announced, a
/// malformed chunk) it counts the failure in `idem_gateway_upstream_errors_total{kind="failed"}`
/// and logs it. Its trailers are settled ([`SettledTrailers`]): only the fields the head's
/// `Trailer` announced, without connection or framing fields. Its first frame may have been
/// read ahead, before the head was passed on ([`Proxy::forward`]).
#[derive(Debug)]
pub(crate) struct UpstreamBody {
    /// The upstream's body; `None` for an answer of the gateway's own (the problem of an
    /// exchange whose answer was lost), all of it in `first`.
    body: Option<Guarded<SettledTrailers<Incoming>, InFlightGuard>>,
    /// The first frame, read before the head was passed on.
    first: Option<Frame<Bytes>>,
    /// The body ended while its first frame was read.
    ended: bool,
    /// The connection, until the body has ended (then it goes back to the pool) or is dropped
    /// (then it is closed: the rest of the response is never read).
    conn: Option<Sender>,
    /// The limit of a pause in the body (`body_idle_timeout`): armed when a poll finds no
    /// frame ready, disarmed by the next frame. Made at the first pause only: a body that is
    /// all ready arms no timer.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `idle` runs for the current pause.
    idle_armed: bool,
    shared: Arc<ProxyShared>,
}

/// The upstream paused its response body for longer than `body_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing of its response body for {}", humantime::format_duration(*.0))]
pub(crate) struct BodyIdle(Duration);

impl UpstreamBody {
    /// Counts and logs a body error.
    fn broke(&self, error: &(dyn std::error::Error + 'static)) {
        self.shared.body_errors.increment(1);
        let failure = ProxyError::Failed {
            upstream: self.shared.name.clone(),
            source: error_chain(error).into(),
        };
        tracing::warn!(error = %failure, "the upstream broke off its response body");
    }

    /// Reads the first frame (or the end) ahead, so that an upstream whose body breaks before
    /// its first byte gets the client a 502 rather than a head with nothing after it. The error
    /// is returned, neither counted nor logged: the caller answers it as a [`ProxyError`].
    async fn read_first(&mut self) -> Result<(), BoxError> {
        if let Some(body) = self.body.as_mut().filter(|body| !body.is_end_stream()) {
            match body.frame().await {
                Some(Ok(frame)) => self.first = Some(frame),
                Some(Err(error)) => {
                    self.conn = None;
                    return Err(error.into());
                }
                None => self.ended = true,
            }
        }
        self.give_back_at_end();
        Ok(())
    }

    /// A pause in the body: pending until `body_idle_timeout` passes with no frame, then the
    /// body breaks off (counted and logged as any broken body; the connection is closed).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let after = self.shared.upstream.body_idle_timeout;
        let until = deadline(Instant::now(), after);
        let idle = self
            .idle
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if !self.idle_armed {
            idle.as_mut().reset(until);
            self.idle_armed = true;
        }
        if idle.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.conn = None;
        let error = BodyIdle(after);
        self.broke(&error);
        Poll::Ready(Some(Err(error.into())))
    }

    /// Gives the connection back to the pool once the upstream's response has ended (hyper's
    /// server stops polling a body that says it has ended, so the end is not always a `None`).
    fn give_back_at_end(&mut self) {
        if self.ended || self.body.as_ref().is_none_or(Body::is_end_stream) {
            if let Some(sender) = self.conn.take() {
                self.shared.pool.put(sender);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(body) = this.body.as_mut().filter(|_| !this.ended) else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(error))) => {
                this.conn = None;
                this.broke(error);
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.give_back_at_end();
            }
            Poll::Ready(Some(Ok(_))) => this.give_back_at_end(),
            Poll::Pending => return this.poll_idle(cx),
        }
        this.idle_armed = false;
        polled.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && (self.ended || self.body.as_ref().is_none_or(Body::is_end_stream))
    }

    fn size_hint(&self) -> SizeHint {
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |data| data.len() as u64);
        let Some(body) = self.body.as_ref().filter(|_| !self.ended) else {
            return SizeHint::with_exact(first);
        };
        let rest = body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(first));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(first));
        }
        hint
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

/// Whether the client error `err` of an exchange is the client's request body that failed
/// (hyper reports a body stream's error as a "user" error whose source is the body's own
/// error: here the server's parse of the client's body), not the upstream.
fn client_body_failed(err: &hyper::Error) -> bool {
    err.is_user()
        && std::error::Error::source(err).is_some_and(|source| {
            source
                .downcast_ref::<hyper::Error>()
                .is_some_and(|inner| !inner.is_user())
        })
}

/// The claim a request runs under, as the proxy keeps it while the request is out (moved out of
/// the request's extensions: nothing is copied on the common path), and the note of its
/// delivery ([`Delivered`]).
#[derive(Debug)]
struct Claimed {
    context: IdempotencyContext,
    note: Arc<AtomicBool>,
}

impl Claimed {
    fn new(context: IdempotencyContext) -> Self {
        Claimed {
            context,
            note: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The upstream answered: it had the request.
    fn answered(self) -> Self {
        self.note.store(true, Ordering::Release);
        self
    }

    fn delivered(&self) -> bool {
        crate::body::was_delivered(&self.note)
    }
}

/// An exchange whose answer was lost (an unknown outcome), as the proxy tells its route
/// ([`OnLost`]): the error, and the key and fence of the claim held as unknown, for the
/// route's count and log and for reconciliation.
#[derive(Debug)]
pub(crate) struct LostAnswer {
    /// What went wrong.
    pub(crate) error: Arc<ProxyError>,
    /// The key held as unknown.
    pub(crate) key: RecordKey,
    /// Its fence.
    pub(crate) fence: Fence,
}

/// Why the upstream gave no response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProxyError {
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
    /// The upstream answered 101 (Switching Protocols): the gateway asks for no protocol
    /// change and carries none, so it is a failed exchange: 502.
    #[error("the upstream {upstream} switched protocols, which the gateway does not carry")]
    SwitchedProtocols {
        /// The upstream.
        upstream: String,
    },
    /// The gateway is shutting down and its grace period is over: 503.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// The client's request body broke while it was sent on (a malformed chunk, a connection
    /// closed before the announced length): the client's fault, not the upstream's: 400.
    #[error("the client's request body broke off: {source}")]
    ClientBody {
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl ProxyError {
    /// The status the client gets.
    #[must_use]
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ProxyError::Unreachable { .. }
            | ProxyError::Failed { .. }
            | ProxyError::SwitchedProtocols { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout { .. } | ProxyError::Timeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ClientBody { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// A short, stable name for metrics labels and logs.
    #[must_use]
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ProxyError::Unreachable { .. } => "unreachable",
            ProxyError::ConnectTimeout { .. } => "connect_timeout",
            ProxyError::Timeout { .. } => "timeout",
            // A malformed exchange, as far as the gateway is concerned.
            ProxyError::Failed { .. } | ProxyError::SwitchedProtocols { .. } => "failed",
            ProxyError::ShuttingDown => "shutting_down",
            ProxyError::ClientBody { .. } => "client_body",
        }
    }

    /// What the client is told: what went wrong, without the upstream's address or the
    /// underlying error (those are for the gateway's log: a public client learns nothing of
    /// the network behind the gateway).
    #[must_use]
    pub(crate) fn public_detail(&self) -> String {
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
            ProxyError::SwitchedProtocols { .. } => {
                "the upstream switched protocols, which the gateway does not carry".to_owned()
            }
            ProxyError::ShuttingDown => {
                "the gateway is shutting down: retry after the delay in Retry-After".to_owned()
            }
            ProxyError::ClientBody { .. } => {
                "the request body is malformed or ended before it was complete".to_owned()
            }
        }
    }

    /// The variant's name, for the problem `type` link.
    #[must_use]
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ProxyError::Unreachable { .. } => "Unreachable",
            ProxyError::ConnectTimeout { .. } => "ConnectTimeout",
            ProxyError::Timeout { .. } => "Timeout",
            ProxyError::Failed { .. } => "Failed",
            ProxyError::SwitchedProtocols { .. } => "SwitchedProtocols",
            ProxyError::ShuttingDown => "ShuttingDown",
            ProxyError::ClientBody { .. } => "ClientBody",
        }
    }
}

/// Counts upstream exchanges in flight, and tells them to give up when shutdown's grace is over.
#[derive(Debug, Clone)]
pub(crate) struct Tracker {
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
pub(crate) struct InFlightGuard {
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
    pub(crate) fn new() -> Self {
        Tracker::default()
    }

    /// How many exchanges are in flight.
    #[must_use]
    pub(crate) fn in_flight(&self) -> usize {
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
    pub(crate) fn abort(&self) {
        self.shared.abort.send_replace(true);
    }

    /// Waits until nothing is in flight, or `limit` passes; `true` if nothing is.
    pub(crate) async fn wait_idle(&self, limit: Duration) -> bool {
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
pub(crate) struct ClientAddr(pub SocketAddr);

/// The upstream client: a [`Service`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html) that is always ready and cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Proxy {
    shared: Arc<ProxyShared>,
    /// Told of every answer this proxy loses (a route's count, log and reconciliation), where
    /// it is lost: the exchange runs to its end even when the client has gone away, and so
    /// does this.
    on_lost: Option<Arc<dyn OnLost>>,
}

/// What a route does with an answer its proxy lost ([`LostAnswer`]).
pub(crate) trait OnLost: Send + Sync + std::fmt::Debug {
    /// The upstream had the request of `lost.key` and its answer was lost.
    fn lost(&self, lost: &LostAnswer);
}

#[derive(Debug)]
struct ProxyShared {
    pool: Pool,
    upstream: UpstreamConfig,
    /// The upstream's authority, the `Host` of a request that has none.
    host: HeaderValue,
    name: String,
    tracker: Tracker,
    /// `idem_gateway_upstream_errors_total{kind="failed"}`, for broken response bodies.
    body_errors: Counter,
}

/// Headers that speak to the next proxy only (RFC 9110 section 11.7), never forwarded either
/// way, besides the connection fields.
static PROXY_ONLY: [HeaderName; 2] = [header::PROXY_AUTHORIZATION, header::PROXY_AUTHENTICATE];

/// Removes hop-by-hop headers (idem-http's [`idem_http::fields::CONNECTION_FIELDS`]),
/// the headers the `Connection` header names but `Host` (the target of a request is end to
/// end, RFC 9112 section 3.2), and the proxy authentication headers. `Trailer` stays, as it
/// announces the message's trailers end to end, but names only fields a trailer section may
/// carry ([`clean_trailer_header`]); the names it keeps are returned.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) -> Vec<HeaderName> {
    strip_with(headers, &PROXY_ONLY)
}

/// Headers a request never takes to the upstream, besides the connection fields: the proxy
/// ones, and the headers only idem sets on its answers (`Idempotent-Replayed`,
/// `Idempotency-Replay`, `Idempotency-Status`), which an upstream might otherwise take for the
/// gateway's word.
static REQUEST_ONLY: [HeaderName; 5] = [
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("idempotent-replayed"),
    HeaderName::from_static("idempotency-replay"),
    HeaderName::from_static("idempotency-status"),
];

/// [`strip_hop_by_hop`] for a request: the idem answer headers go too ([`REQUEST_ONLY`]), in
/// the same walk over the fields.
fn strip_request_hop_by_hop(headers: &mut HeaderMap) -> Vec<HeaderName> {
    strip_with(headers, &REQUEST_ONLY)
}

/// Removes the connection fields and `extra`, and cleans `Trailer`; returns the trailers it
/// announces.
fn strip_with(headers: &mut HeaderMap, extra: &[HeaderName]) -> Vec<HeaderName> {
    let announced = clean_trailer_header(headers);
    remove_connection_fields(headers, extra);
    announced
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

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
/// address appended), `X-Forwarded-Proto` (`http`), `X-Forwarded-Host` (the `Host` the client
/// asked for) and `X-Real-IP` (the client's address: a client's own is replaced), appends the
/// gateway's element to a `Forwarded` the client sent (RFC 7239: `for`, `host` and `proto`, so
/// the last element is always the gateway's), and keeps `Host` (from the URI's authority for
/// an HTTP/2 request, which has none).
fn forwarded_headers(request: &mut Request<RequestBody>) {
    let client = request.extensions().get::<ClientAddr>().copied();
    if !request.headers().contains_key(header::HOST) {
        let authority = request.uri().authority().map(http::uri::Authority::as_str);
        if let Some(value) = authority.and_then(|a| HeaderValue::from_str(a).ok()) {
            request.headers_mut().insert(header::HOST, value);
        }
    }
    let headers = request.headers_mut();
    if let Some(ClientAddr(addr)) = client {
        let value = if headers.contains_key(&X_FORWARDED_FOR) {
            // Every field line the client sent, in order (a list may be split over several
            // lines, RFC 9110 section 5.3), then the client's own address.
            let mut value = String::new();
            for earlier in headers.get_all(&X_FORWARDED_FOR) {
                if let Ok(earlier) = earlier.to_str() {
                    value.push_str(earlier);
                    value.push_str(", ");
                }
            }
            value.push_str(&addr.ip().to_string());
            HeaderValue::from_str(&value).ok()
        } else {
            Some(address_value(addr.ip()))
        };
        if let Some(value) = value {
            headers.insert(X_FORWARDED_FOR, value);
        }
        headers.insert(X_REAL_IP, address_value(addr.ip()));
    } else {
        headers.remove(X_REAL_IP);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    let host = headers.get(header::HOST).cloned();
    if headers.contains_key(header::FORWARDED) {
        append_forwarded(headers, client, host.as_ref());
    }
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
}

/// Joins the `Forwarded` field lines a client sent into one and appends the gateway's element
/// (`for="ADDR";host="HOST";proto=http`; quoted, as an IPv6 address and a port need).
fn append_forwarded(
    headers: &mut HeaderMap,
    client: Option<ClientAddr>,
    host: Option<&HeaderValue>,
) {
    let mut value = String::new();
    for earlier in headers.get_all(header::FORWARDED) {
        if let Ok(earlier) = earlier.to_str() {
            value.push_str(earlier);
            value.push_str(", ");
        }
    }
    match client.map(|ClientAddr(addr)| addr.ip()) {
        Some(IpAddr::V6(ip)) => value.push_str(&format!("for=\"[{ip}]\"")),
        Some(IpAddr::V4(ip)) => value.push_str(&format!("for=\"{ip}\"")),
        None => value.push_str("for=unknown"),
    }
    if let Some(host) = host.and_then(|host| host.to_str().ok()) {
        // A Host was checked to be a host and an optional port: no quote or backslash in it.
        value.push_str(&format!(";host=\"{host}\""));
    }
    value.push_str(";proto=http");
    match HeaderValue::from_str(&value) {
        Ok(value) => {
            headers.insert(header::FORWARDED, value);
        }
        // A client's value that is not visible ASCII: it is not passed on as it came.
        Err(_) => {
            headers.remove(header::FORWARDED);
        }
    }
}

/// `ip` as a header value. The value of the address the serving thread saw last is kept and
/// shared (a clone of a `HeaderValue` is a reference count): a connection's requests, and a
/// few clients behind a load balancer, format and allocate it once.
fn address_value(ip: IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((seen, value)) if *seen == ip => value.clone(),
        _ => {
            let value = HeaderValue::from_str(&ip.to_string())
                .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
            *last = Some((ip, value.clone()));
            value
        }
    })
}

/// The latest instant a deadline `limit` after `start` may be: `Instant + Duration` panics
/// past the clock's range, and a wait of a year is forever.
fn deadline(start: Instant, limit: Duration) -> tokio::time::Instant {
    tokio::time::Instant::from_std(start) + limit.min(Duration::from_secs(365 * 24 * 60 * 60))
}

impl Proxy {
    /// The upstream's name (its URL), as errors show it.
    #[must_use]
    pub(crate) fn upstream(&self) -> &str {
        &self.shared.name
    }

    /// A proxy to `upstream`, counting its exchanges in `tracker`. Metric handles are registered
    /// now: install the recorder before.
    #[must_use]
    pub(crate) fn new(upstream: &UpstreamConfig, tracker: Tracker) -> Self {
        let authority = upstream.url.authority.as_str();
        Proxy {
            shared: Arc::new(ProxyShared {
                pool: Pool::new(upstream),
                host: HeaderValue::from_str(authority)
                    .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
                upstream: upstream.clone(),
                name: upstream.url.to_string(),
                tracker,
                body_errors: metrics::counter!(metric::UPSTREAM_ERRORS, "kind" => "failed"),
            }),
            on_lost: None,
        }
    }

    /// The same proxy (its pool and upstream shared), telling `on_lost` of every answer it
    /// loses.
    #[must_use]
    pub(crate) fn reporting(&self, on_lost: Arc<dyn OnLost>) -> Self {
        Proxy {
            shared: self.shared.clone(),
            on_lost: Some(on_lost),
        }
    }

    /// Forwards `request` and returns the upstream's response, hop-by-hop headers removed
    /// both ways (from the trailers too), and the upstream's own `Idempotent-Replayed`,
    /// `Idempotency-Replay` and `Idempotency-Status` removed (only idem sets them). The
    /// response head is returned once its body's first frame (or its end) has come, so an
    /// upstream that breaks its body off before the first byte is an error, not a head with
    /// nothing after it; the wait for both is bounded by `timeout`, and a first frame that
    /// has not come by then is streamed after the head as it comes.
    ///
    /// # Errors
    /// [`ProxyError`] when the upstream cannot be reached, answers too late, breaks the
    /// exchange or answers 101, or the gateway is shutting down.
    pub(crate) async fn forward(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let shared = &self.shared;
        let guard = shared.tracker.enter();
        let started = Instant::now();
        let (request, claimed) = self.upstream_request(request);
        let after = shared.upstream.timeout;
        // One timer and one shutdown watch for the head and the first frame: the first frame
        // is waited for until the head's deadline.
        let mut expired = std::pin::pin!(tokio::time::sleep_until(deadline(started, after)));
        let mut aborted = std::pin::pin!(shared.tracker.aborted());
        let (response, sender) = tokio::select! {
            biased;
            result = self.exchange(request, started) => match result {
                Ok(exchanged) => exchanged,
                Err((error, reached)) => return self.lost(error, reached, claimed, false),
            },
            () = &mut expired => {
                let error = ProxyError::Timeout {
                    upstream: shared.name.clone(),
                    after,
                };
                return self.lost(error, true, claimed, false);
            }
            // The upstream may still be running a request it had: not a key to free.
            () = &mut aborted => return self.lost(ProxyError::ShuttingDown, true, claimed, false),
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            return Err(ProxyError::SwitchedProtocols {
                upstream: shared.name.clone(),
            });
        }
        let (mut parts, body) = response.into_parts();
        let announced = strip_hop_by_hop(&mut parts.headers);
        remove_idem_fields(&mut parts.headers);
        let mut body = UpstreamBody {
            body: Some(Guarded::new(
                SettledTrailers::announced(body, announced),
                guard,
            )),
            first: None,
            ended: false,
            conn: Some(sender),
            idle: None,
            idle_armed: false,
            shared: self.shared.clone(),
        };
        let first = tokio::select! {
            biased;
            first = body.read_first() => first,
            // Past the deadline, the first frame is streamed after the head as it comes.
            () = &mut expired => Ok(()),
            () = &mut aborted => {
                let claimed = claimed.map(Claimed::answered);
                return self.lost(ProxyError::ShuttingDown, true, claimed, true);
            }
        };
        if let Err(err) = first {
            let error = ProxyError::Failed {
                upstream: shared.name.clone(),
                source: error_chain(err.as_ref()).into(),
            };
            // The upstream answered: it had the request, whatever its body says.
            return self.lost(error, true, claimed.map(Claimed::answered), true);
        }
        Ok(Response::from_parts(parts, body))
    }

    /// The answer to an exchange that failed with `error`: a claimed request that the upstream
    /// may have run (it had the whole request, `reached`, and did not answer, or broke off its
    /// answer, `head_seen`) is an unknown outcome, answered as a response that tells the
    /// idempotency layer so ([`OutcomeUnknown`]: the key is held, not released) and carries
    /// the error for the gateway's count and log ([`LostAnswer`]). Anything else (nothing was
    /// sent, the upstream refused the connection, the request is not claimed) is the error.
    fn lost(
        &self,
        error: ProxyError,
        reached: bool,
        claimed: Option<Claimed>,
        head_seen: bool,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let Some(claimed) = claimed.filter(|claimed| reached && claimed.delivered()) else {
            return Err(error);
        };
        let detail = error.public_detail();
        let problem = crate::gateway::proxy_error_problem(&error);
        let (mut parts, bytes) = problem.into_parts();
        let outcome = UnknownOutcome::new(format!("{detail}, after the upstream had the request"))
            .request_sent(true)
            .head_seen(head_seen);
        parts.extensions.insert(OutcomeUnknown(outcome));
        let context = &claimed.context;
        let lost = LostAnswer {
            error: Arc::new(error),
            key: RecordKey::new(context.scope().clone(), context.key().clone()),
            fence: context.fence(),
        };
        if let Some(on_lost) = &self.on_lost {
            on_lost.lost(&lost);
        }
        let body = UpstreamBody {
            body: None,
            first: Some(Frame::data(bytes)),
            ended: true,
            conn: None,
            idle: None,
            idle_armed: false,
            shared: self.shared.clone(),
        };
        Ok(Response::from_parts(parts, body))
    }

    /// Sends `request` on a connection of the pool (or a new one) and waits for the response
    /// head. A request that a connection taken from the pool returns unsent (it was closed in
    /// the meantime) goes on another one. An error comes with whether the request may have
    /// reached the upstream (it was written, or hyper does not say it was not).
    async fn exchange(
        &self,
        mut request: Request<UpstreamRequestBody>,
        now: Instant,
    ) -> Result<(Response<Incoming>, Sender), (ProxyError, bool)> {
        loop {
            let mut conn = self
                .shared
                .pool
                .checkout(now)
                .await
                .map_err(|err| (self.connect_error(err), false))?;
            request.body().dispatched();
            match conn.sender.try_send_request(request).await {
                Ok(response) => return Ok((response, conn.sender)),
                Err(mut err) => match err.take_message() {
                    Some(unsent) if conn.reused => request = unsent,
                    unsent => {
                        let err = err.into_error();
                        if client_body_failed(&err) {
                            let source = error_chain(&err).into();
                            return Err((ProxyError::ClientBody { source }, false));
                        }
                        let error = ProxyError::Failed {
                            upstream: self.shared.name.clone(),
                            source: err.into(),
                        };
                        // A request hyper gives back was never written.
                        return Err((error, unsent.is_none()));
                    }
                },
            }
        }
    }

    /// The request as the upstream gets it: hop-by-hop headers removed (from its trailers
    /// too), forwarded headers set, `TE: trailers`, the upstream's URI, HTTP/1.1; and the
    /// claim it runs under, if any.
    fn upstream_request(
        &self,
        mut request: Request<RequestBody>,
    ) -> (Request<UpstreamRequestBody>, Option<Claimed>) {
        let shared = &self.shared;
        // Hop-by-hop headers go first: the forwarded headers the gateway sets are its own, and
        // a client naming them in `Connection` only drops the values it sent.
        let announced = strip_request_hop_by_hop(request.headers_mut());
        forwarded_headers(&mut request);
        shared.upstream.fence.apply(&mut request);
        // A claimed request's delivery is noted, so a lost answer can be told from a request
        // that never reached the upstream.
        let claimed = request
            .extensions_mut()
            .remove::<IdempotencyContext>()
            .map(Claimed::new);
        // The gateway takes trailers, whoever its client is: it passes them on (to an HTTP/2
        // client, or an HTTP/1.1 one that sent `TE: trailers` itself) and stores them with
        // the response, so a replay ends with them. An HTTP/1.1 upstream sends trailers only
        // to a client that says so.
        request
            .headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
        keep_unsized_body(&mut request);
        if !request.headers().contains_key(header::HOST) {
            // An HTTP/1.0 request without one: the upstream's own name.
            request
                .headers_mut()
                .insert(header::HOST, shared.host.clone());
        }
        // The origin form (`/path?query`), which an HTTP/1.1 request to a server carries: a
        // request that came in it (every HTTP/1.1 one but the absolute form) keeps its URI.
        if request.uri().scheme().is_some() || request.uri().authority().is_some() {
            let path = request
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
            *request.uri_mut() = Uri::from(path);
        }
        *request.version_mut() = http::Version::HTTP_11;
        let note = claimed.as_ref().map(|claimed| claimed.note.clone());
        let request =
            request.map(|body| Delivered::new(SettledTrailers::announced(body, announced), note));
        (request, claimed)
    }

    /// The [`ProxyError`] of a connection that could not be made.
    fn connect_error(&self, err: ConnectError) -> ProxyError {
        let upstream = self.shared.name.clone();
        match err {
            ConnectError::Timeout => ProxyError::ConnectTimeout {
                upstream,
                after: self.shared.upstream.connect_timeout,
            },
            ConnectError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                ProxyError::ConnectTimeout {
                    upstream,
                    after: self.shared.upstream.connect_timeout,
                }
            }
            err => ProxyError::Unreachable {
                upstream,
                source: err.into(),
            },
        }
    }
}

/// The future of [`Proxy::call`].
pub(crate) type ProxyFuture =
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
        assert_eq!(h["x-real-ip"], "127.0.0.9");
        assert!(!h.contains_key(header::FORWARDED));
    }

    #[test]
    fn a_clients_forwarded_and_x_real_ip_are_not_taken_at_their_word() {
        let mut request = Request::post("/p")
            .header(header::HOST, "api.example.com:8080")
            .header("x-real-ip", "10.9.9.9")
            .header(header::FORWARDED, "for=10.0.0.1")
            .header(header::FORWARDED, "for=10.0.0.2;proto=https")
            .body(RequestBody::from(Bytes::new()))
            .unwrap();
        request
            .extensions_mut()
            .insert(ClientAddr("[::1]:5000".parse().unwrap()));
        forwarded_headers(&mut request);
        let h = request.headers();
        assert_eq!(h["x-real-ip"], "::1");
        assert_eq!(h.get_all(header::FORWARDED).iter().count(), 1);
        assert_eq!(
            h[header::FORWARDED],
            "for=10.0.0.1, for=10.0.0.2;proto=https, for=\"[::1]\";host=\"api.example.com:8080\";proto=http"
        );
    }

    #[test]
    fn idem_answer_headers_never_go_upstream_on_a_request() {
        let mut headers = HeaderMap::new();
        for name in [
            "idempotent-replayed",
            "idempotency-replay",
            "idempotency-status",
        ] {
            headers.insert(name, HeaderValue::from_static("true"));
        }
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_request_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
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
