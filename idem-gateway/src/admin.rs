//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (the store answers, and the gateway is not shutting down), the key API under `/api/keys` (see [`api`]) and the
//! operator's page `/ui` (see [`ui`]). When a token is set, every request needs
//! `Authorization: Bearer TOKEN` (401 otherwise); `/ui` also accepts the session cookie that
//! its login form sets (see [`session`]). Without a token, the key API and `/ui` answer only
//! requests addressed to an IP address or `localhost` (see [`addressed_directly`]).

pub mod access;
pub mod api;
pub mod client;
pub mod form;
pub mod monitor;
pub mod session;
pub mod ui;

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use idem_core::Store;
use tokio::net::TcpListener;

use crate::body::{GatewayBody, full};
use crate::records::{ArgNames, record_key};
use access::{Throttle, addressed_directly, same};
use monitor::Monitor;
use session::Sessions;

/// Renders the metrics as Prometheus text (the binary passes its exporter's handle).
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin listener serves.
#[derive(Clone)]
pub struct Admin {
    store: Arc<dyn Store>,
    token: Option<Arc<str>>,
    metrics: Option<RenderMetrics>,
    monitor: Arc<Monitor>,
    sessions: Arc<Sessions>,
    throttle: Arc<Throttle>,
    draining: Arc<AtomicBool>,
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

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<GatewayBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `response`, a 405, with the `Allow` header RFC 9110 section 15.5.6 requires of it: the
/// methods `allow` the resource takes.
pub(crate) fn with_allow(
    mut response: Response<GatewayBody>,
    allow: &'static str,
) -> Response<GatewayBody> {
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
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
fn refusal(key_api: bool, status: StatusCode, message: &str) -> Response<GatewayBody> {
    if key_api {
        api::error(status, message)
    } else {
        text(status, format!("{message}\n"))
    }
}

/// `response` with `Retry-After` for `wait` (in whole seconds, at least 1).
fn throttled(mut response: Response<GatewayBody>, wait: Duration) -> Response<GatewayBody> {
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
fn challenge(mut response: Response<GatewayBody>) -> Response<GatewayBody> {
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"idem admin\""),
    );
    response
}

impl Admin {
    /// The admin endpoints over `store`; `metrics` renders `/metrics` (404 without it).
    #[must_use]
    pub fn new(
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
        }
    }

    /// The same admin, its in-flight gauges reporting the claims of `index` (the index the
    /// gateway's store keeps: [`crate::in_flight::Watched`]). Without it they are not set.
    #[must_use]
    pub fn with_in_flight(mut self, index: Arc<crate::in_flight::InFlightIndex>) -> Self {
        self.monitor = Arc::new(Monitor::watching(index));
        self
    }

    /// Says that the gateway is shutting down (it no longer accepts and finishes its in-flight
    /// requests): from now on `/readyz` answers 503 `draining`, on this admin and its clones,
    /// so a load balancer that still asks stops sending. `/healthz` stays 200 until the end.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Checks the bearer token of `request` from `peer`: a peer that sent too many wrong
    /// tokens gets 429 for a wrong one (see [`Throttle`]) until its window ends; the right one
    /// is accepted all the same.
    fn bearer<B>(&self, request: &Request<B>, peer: Option<IpAddr>) -> Access {
        let Some(token) = &self.token else {
            return Access::Granted;
        };
        let Some(given) = request.headers().get(header::AUTHORIZATION) else {
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

    /// The 401 of a request without the token.
    fn unauthorized() -> Response<GatewayBody> {
        challenge(text(
            StatusCode::UNAUTHORIZED,
            "a bearer token is required\n",
        ))
    }

    /// Answers one admin request from `peer` (its address, when known: wrong tokens are counted
    /// by peer).
    pub async fn handle<B>(
        &self,
        request: Request<B>,
        peer: Option<IpAddr>,
    ) -> Response<GatewayBody>
    where
        B: http_body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path();
        let ui = path == "/ui" || path.starts_with("/ui/");
        let key_api = path
            .strip_prefix(api::PREFIX)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if (ui || key_api) && self.token.is_none() && !addressed_directly(&request) {
            tracing::warn!(
                path,
                "admin: refused a request addressed by a host name, without a token"
            );
            return refusal(key_api, StatusCode::FORBIDDEN, NOT_DIRECT);
        }
        if ui {
            return self.ui(request, peer).await;
        }
        match self.bearer(&request, peer) {
            Access::Granted => {}
            Access::Refused => return Self::unauthorized(),
            Access::Throttled(wait) => {
                let refused = refusal(key_api, StatusCode::TOO_MANY_REQUESTS, TOO_MANY);
                return throttled(refused, wait);
            }
        }
        if key_api {
            return api::handle(&*self.store, request.method(), path, request.uri().query()).await;
        }
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return with_allow(
                text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
                "GET, HEAD",
            );
        }
        match path {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.draining.load(Ordering::Acquire) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining: the gateway is shutting down\n",
            ),
            "/readyz" => match tokio::time::timeout(READY_TIMEOUT, self.store.ping()).await {
                Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
                Ok(Err(err)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n")),
                Err(_) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("store: no answer within {READY_TIMEOUT:?}\n"),
                ),
            },
            "/metrics" => match &self.metrics {
                Some(render) => {
                    self.monitor.refresh_gauges(&*self.store).await;
                    let mut response = text(StatusCode::OK, render());
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    response
                }
                None => text(StatusCode::NOT_FOUND, "no metrics recorder installed\n"),
            },
            _ => text(
                StatusCode::NOT_FOUND,
                "GET /metrics, /healthz, /readyz, /api/keys or /ui\n",
            ),
        }
    }

    /// The pages and forms under `/ui`.
    async fn ui<B>(&self, request: Request<B>, peer: Option<IpAddr>) -> Response<GatewayBody>
    where
        B: http_body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let session_id = request
            .headers()
            .get(header::COOKIE)
            .and_then(|value| value.to_str().ok())
            .and_then(|cookies| form::cookie(cookies, session::COOKIE))
            .map(str::to_owned);
        let session_csrf = session_id
            .as_deref()
            .and_then(|id| self.sessions.csrf_of(id));
        // The CSRF token of this visitor, when it may see the page.
        let access = match session_csrf {
            Some(csrf) => Some((csrf, true)),
            None => match self.bearer(&request, peer) {
                Access::Granted => Some((self.sessions.process_csrf().to_owned(), false)),
                Access::Refused => None,
                Access::Throttled(wait) => {
                    return throttled(
                        ui::login_page(StatusCode::TOO_MANY_REQUESTS, Some(TOO_MANY)),
                        wait,
                    );
                }
            },
        };
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        match (method, path.as_str()) {
            (Method::GET | Method::HEAD, "/ui") => match access {
                Some((csrf, session)) => {
                    let page = ui::Page {
                        store: &*self.store,
                        metrics: self.metrics.as_ref(),
                        monitor: &self.monitor,
                        csrf: &csrf,
                        session,
                    };
                    page.render().await
                }
                None => challenge(ui::login_page(StatusCode::UNAUTHORIZED, None)),
            },
            (Method::GET | Method::HEAD, "/ui/login") => ui::login_page(StatusCode::OK, None),
            (Method::POST, "/ui/login") => {
                let Some(token) = &self.token else {
                    return ui::redirect("/ui", None);
                };
                let form = read_form(request.into_body()).await;
                let given = form::value(&form, "token").unwrap_or_default();
                match self.check(given.as_bytes(), token, peer) {
                    Access::Granted => {}
                    Access::Refused => {
                        return challenge(ui::login_page(
                            StatusCode::UNAUTHORIZED,
                            Some("Wrong token."),
                        ));
                    }
                    Access::Throttled(wait) => {
                        return throttled(
                            ui::login_page(StatusCode::TOO_MANY_REQUESTS, Some(TOO_MANY)),
                            wait,
                        );
                    }
                }
                let id = self.sessions.open();
                let cookie = format!(
                    "{}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
                    session::COOKIE,
                    session::LIFETIME.as_secs()
                );
                ui::redirect("/ui", Some(&cookie))
            }
            (Method::POST, "/ui/logout") => {
                if let Some(id) = &session_id {
                    self.sessions.close(id);
                }
                let cookie = format!(
                    "{}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0",
                    session::COOKIE
                );
                ui::redirect("/ui", Some(&cookie))
            }
            (Method::POST, "/ui/delete") => {
                let Some((csrf, _)) = access else {
                    return challenge(ui::login_page(StatusCode::UNAUTHORIZED, None));
                };
                let form = read_form(request.into_body()).await;
                let given = form::value(&form, "csrf").unwrap_or_default();
                if !same(given.as_bytes(), csrf.as_bytes()) {
                    return text(
                        StatusCode::FORBIDDEN,
                        "a stale or foreign form: reload /ui\n",
                    );
                }
                let key = match record_key(
                    form::value(&form, "key").unwrap_or_default(),
                    form::value(&form, "scope").unwrap_or_default(),
                    ArgNames::PARAMS,
                ) {
                    Ok(key) => key,
                    Err(err) => return text(StatusCode::BAD_REQUEST, format!("{err}\n")),
                };
                match self.store.delete(&key).await {
                    Ok(deleted) => {
                        tracing::info!(key = %key, deleted, "admin: record deleted from /ui");
                        ui::redirect("/ui", None)
                    }
                    Err(err) => text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n")),
                }
            }
            (_, "/ui") => with_allow(
                text(StatusCode::METHOD_NOT_ALLOWED, NOT_ALLOWED),
                "GET, HEAD",
            ),
            (_, "/ui/login") => with_allow(
                text(StatusCode::METHOD_NOT_ALLOWED, NOT_ALLOWED),
                "GET, HEAD, POST",
            ),
            (_, "/ui/logout" | "/ui/delete") => {
                with_allow(text(StatusCode::METHOD_NOT_ALLOWED, NOT_ALLOWED), "POST")
            }
            _ => text(StatusCode::NOT_FOUND, "no such page\n"),
        }
    }

    /// Serves the admin endpoints on `listener` until `shutdown` resolves.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
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
        let builder = auto::Builder::new(TokioExecutor::new());
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, peer)) = accepted else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let admin = self.clone();
                    let service = service_fn(move |request: Request<Incoming>| {
                        let admin = admin.clone();
                        async move { Ok::<_, Infallible>(admin.handle(request, Some(peer.ip())).await) }
                    });
                    let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                () = &mut shutdown => break,
            }
        }
        if let Some(sampler) = sampler {
            sampler.abort();
        }
    }
}

/// The pairs of a form body of at most 16 KiB (none when it is larger or unreadable).
async fn read_form<B>(body: B) -> Vec<(String, String)>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt as _;
    let Ok(collected) = http_body_util::Limited::new(body, 16 * 1024)
        .collect()
        .await
    else {
        return Vec::new();
    };
    let bytes = collected.to_bytes();
    std::str::from_utf8(&bytes).map_or_else(|_| Vec::new(), form::pairs)
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

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
