//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (the store answers, and the gateway is not shutting down), the key API under `/api/keys` (see [`api`]) and the
//! operator's page `/ui` (see [`ui`]). When a token is set, every request needs
//! `Authorization: Bearer TOKEN` (401 otherwise); `/ui` also accepts the session cookie that
//! its login form sets (see [`session`]). Without a token, the key API and `/ui` answer only
//! requests addressed to an IP address or `localhost` (see [`addressed_directly`]), and
//! `/readyz` says why the store is not ready only to such a request from this machine.
//!
//! Whatever the token: a request with two `Host` lines is 400 ([`one_host`]), and one that
//! changes something (`POST`, `DELETE`) sent by a browser from another site is 403
//! ([`cross_site`]).
//!
//! An axum router: one guard middleware decides who may ask (the checks above, and the
//! throttle on wrong tokens, see [`Throttle`]), then one handler per resource answers; a
//! method a resource does not take is 405 with its `Allow` header.

pub(crate) mod access;
pub(crate) mod api;
pub(crate) mod client;
pub(crate) mod monitor;
pub(crate) mod session;
pub(crate) mod ui;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{MethodRouter, get};
use http::header::{self, HeaderValue};
use http::{HeaderMap, StatusCode};
use idem_core::Store;
use tokio::net::TcpListener;

use access::{Throttle, addressed_directly, cross_site, one_host, same};
use monitor::Monitor;
use session::Sessions;

/// Renders the metrics as Prometheus text (the binary passes its exporter's handle).
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest form body `/ui` reads (a larger one reads as an empty form).
const MAX_FORM: usize = 16 * 1024;

/// What the admin listener serves.
#[derive(Clone)]
pub(crate) struct Admin {
    store: Arc<dyn Store>,
    token: Option<Arc<str>>,
    metrics: Option<RenderMetrics>,
    monitor: Arc<Monitor>,
    sessions: Arc<Sessions>,
    throttle: Arc<Throttle>,
    draining: Arc<AtomicBool>,
    /// How long an operator's completed resolution is kept.
    retention: std::time::Duration,
    /// The unknown outcomes the gateway has seen, for their gauges.
    unknowns: Arc<crate::unknowns::UnknownBook>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("store", &self.store)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("metrics", &self.metrics.is_some())
            .field("sessions", &self.sessions)
            .field("draining", &self.draining.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A plain-text answer.
fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (status, body.into()).into_response()
}

/// `response`, a 405, with the `Allow` header RFC 9110 section 15.5.6 requires of it: the
/// methods `allow` the resource takes.
fn with_allow(mut response: Response, allow: &'static str) -> Response {
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// `route`, answering any other method with `refusal`, a 405 naming the methods `allow`.
fn only(
    route: MethodRouter<Admin>,
    allow: &'static str,
    refusal: fn() -> Response,
) -> MethodRouter<Admin> {
    route.fallback(move || async move { with_allow(refusal(), allow) })
}

/// The body of a 405 of `/ui`.
const NOT_ALLOWED: &str = "method not allowed\n";

/// The answer to a peer that sent too many wrong tokens.
const TOO_MANY: &str = "too many wrong tokens from this address: try again later";

/// What a token check decided.
enum Access {
    /// The token is right, or none is needed.
    Granted,
    /// No token, or a wrong one.
    Refused,
    /// Not checked: the peer sent too many wrong tokens; it may try again after this long.
    Throttled(Duration),
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme is case-insensitive, RFC
/// 9110 section 11.1); empty for any other value.
fn bearer_token(value: &[u8]) -> &[u8] {
    match value.split_at_checked(7) {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => token.trim_ascii(),
        _ => &[],
    }
}

/// A refusal: the key API's JSON error for `key_api`, plain text otherwise.
fn refusal(key_api: bool, status: StatusCode, message: &str) -> Response {
    if key_api {
        api::error(status, message)
    } else {
        text(status, format!("{message}\n"))
    }
}

/// `response` with `Retry-After` for `wait` (in whole seconds, at least 1).
fn throttled(mut response: Response, wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    response
}

/// The message of a key API or `/ui` request refused by [`addressed_directly`].
const NOT_DIRECT: &str = "without an admin token, the key API and /ui answer only requests \
    addressed to an IP address or localhost (a guard against DNS rebinding): use the \
    listener's address, or set [admin] token";

/// `response`, a 401, with the challenge RFC 9110 section 11.6.1 requires of every 401: the
/// bearer scheme, which `/ui`'s login page answers too (a browser shows no dialog for it).
fn challenge(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"idem admin\""),
    );
    response
}

/// The 401 of a request without the token.
fn unauthorized() -> Response {
    challenge(text(
        StatusCode::UNAUTHORIZED,
        "a bearer token is required\n",
    ))
}

/// The address of the peer that sent `request`, when the listener knows it.
fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip())
}

/// Who sent a request to `/ui`, as the guard found it (handed to the page's handlers).
#[derive(Clone, Debug)]
struct Visitor {
    /// The peer's address, when known (wrong tokens are counted by peer).
    peer: Option<IpAddr>,
    /// The session the cookie names, live or not.
    session_id: Option<String>,
    /// How the visitor may see the page and send its forms; `None` when it may not.
    grant: Option<Grant>,
}

/// How a visitor of `/ui` may see the page and send its forms.
#[derive(Clone, Debug)]
enum Grant {
    /// It came with the cookie of a live session: a form must carry the session's CSRF token.
    Session {
        /// The session's CSRF token.
        csrf: String,
    },
    /// It came with the right bearer header: a form needs no CSRF token (a browser never
    /// sends the header on its own, so no other site can make it send one).
    Bearer,
    /// No token is set and it came without a live session: the page opens one for it (its
    /// forms carry that session's CSRF token); a form without a session is refused.
    Open,
}

impl Admin {
    /// The admin endpoints over `store`; `metrics` renders `/metrics` (404 without it).
    #[must_use]
    pub(crate) fn new(
        store: Arc<dyn Store>,
        token: Option<String>,
        metrics: Option<RenderMetrics>,
    ) -> Self {
        Admin {
            store,
            token: token.map(Into::into),
            metrics,
            monitor: Arc::new(Monitor::new()),
            sessions: Arc::new(Sessions::new()),
            throttle: Arc::new(Throttle::new()),
            draining: Arc::new(AtomicBool::new(false)),
            retention: crate::config::internal::defaults::RETENTION,
            unknowns: Arc::default(),
        }
    }

    /// The same admin, its unknown-outcome gauges reporting `book` (the serving threads').
    #[must_use]
    pub(crate) fn with_unknowns(mut self, book: Arc<crate::unknowns::UnknownBook>) -> Self {
        self.unknowns = book;
        self
    }

    /// The same admin, keeping an operator's completed resolution for `retention` (the
    /// gateway passes its routes' longest).
    #[must_use]
    pub(crate) fn with_retention(mut self, retention: std::time::Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The same admin, its in-flight gauges reporting the claims of `index` (the index the
    /// gateway's store keeps: [`crate::in_flight::Watched`]). Without it they are not set.
    #[must_use]
    pub(crate) fn with_in_flight(mut self, index: Arc<crate::in_flight::InFlightIndex>) -> Self {
        self.monitor = Arc::new(Monitor::watching(index));
        self
    }

    /// Says that the gateway is shutting down (it no longer accepts and finishes its in-flight
    /// requests): from now on `/readyz` answers 503 `draining`, on this admin and its clones,
    /// so a load balancer that still asks stops sending. `/healthz` stays 200 until the end.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Checks the bearer token in `headers` from `peer`: a peer that sent too many wrong
    /// tokens gets 429 for a wrong one (see [`Throttle`]) until its window ends; the right one
    /// is accepted all the same.
    fn bearer(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Access {
        let Some(token) = &self.token else {
            return Access::Granted;
        };
        let Some(given) = headers.get(header::AUTHORIZATION) else {
            return Access::Refused;
        };
        self.check(bearer_token(given.as_bytes()), token, peer)
    }

    /// Compares a token `given` by `peer` with the listener's, counting a wrong one. The right
    /// token is always accepted: only wrong ones are throttled, so a peer that sends wrong
    /// tokens from the operator's address cannot lock the operator out. That a right guess is
    /// let through even then tells a guesser nothing worth having: the token is at least
    /// [`MIN_TOKEN_LEN`](crate::config::MIN_TOKEN_LEN) bytes, too many to guess at any rate.
    fn check(&self, given: &[u8], token: &str, peer: Option<IpAddr>) -> Access {
        if same(given, token.as_bytes()) {
            return Access::Granted;
        }
        if let Some(wait) = self.throttle.wait(peer) {
            return Access::Throttled(wait);
        }
        self.throttle.failed(peer);
        tracing::warn!(peer = ?peer, "admin: a wrong token");
        Access::Refused
    }

    /// Who sent a request to `/ui` with `headers` from `peer`: a live session's cookie, or the
    /// bearer header (or no token set) grants the page. `Err` is how long a peer that sent
    /// too many wrong tokens must wait, when it sent another.
    fn visitor(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<Visitor, Duration> {
        let session_id = session::cookie_of(headers);
        let session_csrf = session_id
            .as_deref()
            .and_then(|id| self.sessions.csrf_of(id));
        let grant = match session_csrf {
            Some(csrf) => Some(Grant::Session { csrf }),
            None if self.token.is_none() => Some(Grant::Open),
            None => match self.bearer(headers, peer) {
                Access::Granted => Some(Grant::Bearer),
                Access::Refused => None,
                Access::Throttled(wait) => return Err(wait),
            },
        };
        Ok(Visitor {
            peer,
            session_id,
            grant,
        })
    }

    /// The admin listener's routes, behind [`guard`].
    fn router(self) -> Router {
        let probe = |route: MethodRouter<Admin>| {
            only(route, "GET, HEAD", || {
                text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n")
            })
        };
        Router::new()
            .route(
                "/healthz",
                probe(get(|| async { text(StatusCode::OK, "ok\n") })),
            )
            .route("/readyz", probe(get(readyz)))
            .route("/metrics", probe(get(metrics)))
            .merge(api::routes())
            .merge(ui::routes())
            .fallback(|| async {
                text(
                    StatusCode::NOT_FOUND,
                    "GET /metrics, /healthz, /readyz, /api/keys or /ui\n",
                )
            })
            .layer(middleware::from_fn_with_state(self.clone(), guard))
            .layer(DefaultBodyLimit::max(MAX_FORM))
            .with_state(self)
    }

    /// Serves the admin endpoints on `listener` until `shutdown` resolves.
    pub(crate) async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        // Samples the counters for the rates of `/ui`.
        let sampler = self.metrics.as_ref().map(|_| {
            let monitor = self.monitor.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(monitor::SAMPLE_EVERY);
                loop {
                    every.tick().await;
                    monitor.sample();
                }
            })
        });
        let app = self
            .router()
            .into_make_service_with_connect_info::<SocketAddr>();
        // On `shutdown` the listener stops accepting; the connections it accepted finish on
        // their own tasks.
        tokio::select! {
            _ = axum::serve(listener, app) => {}
            () = shutdown => {}
        }
        if let Some(sampler) = sampler {
            sampler.abort();
        }
    }
}

/// Runs before every route: refuses a request with two `Host` lines (400, see [`one_host`])
/// and a state-changing request from another site (403, see [`cross_site`]); refuses a key
/// API or `/ui` request addressed by a host name when no token is set (see
/// [`addressed_directly`]); finds the [`Visitor`] of `/ui`, which checks its own session or
/// token; and checks the bearer token of everything else (401, or 429 for a throttled peer).
async fn guard(State(admin): State<Admin>, mut request: Request, next: Next) -> Response {
    let peer = peer_of(&request);
    let path = request.uri().path();
    let ui = path == "/ui" || path.starts_with("/ui/");
    let key_api = path
        .strip_prefix(api::PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    if !one_host(&request) {
        tracing::warn!(
            path,
            "admin: refused a request with more than one Host line"
        );
        return refusal(
            key_api,
            StatusCode::BAD_REQUEST,
            "more than one Host field line",
        );
    }
    if cross_site(&request) {
        tracing::warn!(
            path,
            method = %request.method(),
            "admin: refused a request a browser sent from another site"
        );
        return refusal(key_api, StatusCode::FORBIDDEN, CROSS_SITE);
    }
    if (ui || key_api) && admin.token.is_none() && !addressed_directly(&request) {
        tracing::warn!(
            path,
            "admin: refused a request addressed by a host name, without a token"
        );
        return refusal(key_api, StatusCode::FORBIDDEN, NOT_DIRECT);
    }
    if ui {
        match admin.visitor(request.headers(), peer) {
            Ok(visitor) => {
                request.extensions_mut().insert(visitor);
            }
            Err(wait) => return ui::too_many(wait),
        }
    } else {
        match admin.bearer(request.headers(), peer) {
            Access::Granted => {}
            Access::Refused => return unauthorized(),
            Access::Throttled(wait) => {
                let refused = refusal(key_api, StatusCode::TOO_MANY_REQUESTS, TOO_MANY);
                return throttled(refused, wait);
            }
        }
    }
    next.run(request).await
}

/// The message of a state-changing request refused by [`cross_site`].
const CROSS_SITE: &str = "refused: a browser sent this request from another site (its \
    Sec-Fetch-Site or Origin header says so); the admin listener takes changes only from its \
    own pages, or from clients that are not browsers";

/// Whether the answer to `request` may say why the store is not ready (its error can name
/// hosts, users and paths): to a request that passed the token, or, without a token, to one
/// from this machine addressed by IP address or `localhost` (not a page that rebound its host
/// name to this machine, nor a proxy on it that forwards other hosts' requests).
fn may_see_details(admin: &Admin, request: &Request) -> bool {
    admin.token.is_some()
        || (peer_of(request).is_some_and(|peer| peer.to_canonical().is_loopback())
            && addressed_directly(request))
}

/// `GET /readyz`: 200 when the store answers and the gateway is not draining, 503 otherwise;
/// why the store is not ready only to those who may see it ([`may_see_details`]).
async fn readyz(State(admin): State<Admin>, request: Request) -> Response {
    if admin.draining.load(Ordering::Acquire) {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: the gateway is shutting down\n",
        );
    }
    let why = match tokio::time::timeout(READY_TIMEOUT, admin.store.ping()).await {
        Ok(Ok(())) => return text(StatusCode::OK, "ready\n"),
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!("no answer within {READY_TIMEOUT:?}"),
    };
    if may_see_details(&admin, &request) {
        text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {why}\n"))
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "store: not ready (the reason is shown with the admin token, or to a request from \
             this machine addressed by IP address or localhost)\n",
        )
    }
}

/// `GET /metrics`: the Prometheus text, the store's gauges refreshed first.
async fn metrics(State(admin): State<Admin>) -> Response {
    let Some(render) = &admin.metrics else {
        return text(StatusCode::NOT_FOUND, "no metrics recorder installed\n");
    };
    admin.monitor.refresh_gauges(&*admin.store).await;
    admin.unknowns.refresh(&*admin.store).await;
    let mut response = text(StatusCode::OK, render());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A request for `/readyz` with `host`, from `peer` when given.
    fn probe(host: &str, peer: Option<[u8; 4]>) -> Request {
        let mut request = Request::builder()
            .uri("/readyz")
            .header(header::HOST, host)
            .body(axum::body::Body::empty())
            .unwrap();
        if let Some(peer) = peer {
            let peer = SocketAddr::from((peer, 40_000));
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        request
    }

    #[test]
    fn the_reason_a_store_is_not_ready_is_for_this_machine_or_the_token() {
        let store: Arc<dyn Store> = Arc::new(idem_store_memory::MemoryStore::new());
        let open = Admin::new(store.clone(), None, None);
        assert!(may_see_details(
            &open,
            &probe("127.0.0.1:9901", Some([127, 0, 0, 1]))
        ));
        assert!(may_see_details(
            &open,
            &probe("localhost:9901", Some([127, 0, 0, 1]))
        ));
        // A page that rebound its name to this machine, a proxy that forwards other hosts,
        // a peer elsewhere, a peer unknown.
        assert!(!may_see_details(
            &open,
            &probe("evil.example:9901", Some([127, 0, 0, 1]))
        ));
        assert!(!may_see_details(
            &open,
            &probe("10.0.0.5:9901", Some([10, 0, 0, 9]))
        ));
        assert!(!may_see_details(&open, &probe("127.0.0.1:9901", None)));
        // With a token, the guard let only the token's holders through.
        let tokened = Admin::new(store, Some("a-token-of-16-bytes".to_owned()), None);
        assert!(may_see_details(
            &tokened,
            &probe("evil.example:9901", Some([10, 0, 0, 9]))
        ));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token(b"Bearer abc"), b"abc");
        assert_eq!(bearer_token(b"bearer abc"), b"abc");
        assert_eq!(bearer_token(b"BEARER  abc "), b"abc");
        assert_eq!(bearer_token(b"Basic abc"), b"");
        assert_eq!(bearer_token(b"Bearer"), b"");
        assert_eq!(bearer_token(b""), b"");
    }
}
