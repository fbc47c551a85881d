//! [`Gateway`]: matches a request to its route, runs it through that route's idempotency layer
//! (idem-http) over the [`Proxy`], and turns an upstream failure into 502, 503 or 504 (also
//! one the layer saw as a response body that failed: `Rejection::ResponseBodyFailed`). Every
//! answer is in the client's HTTP version, whatever the upstream spoke.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use idem_core::Store;
use idem_http::{
    Idempotency, IdempotencyLayer, KeyPolicy, Outcome, ProblemJson, Rejection, RejectionHandler,
    StoreFailure,
};
use metrics::{Counter, Histogram};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{GatewayBody, RequestBody, boxed, full};
use crate::config::toml::{KeyMode, OnStoreError};
use crate::config::{Config, GatewayConfigError, RoutePath, RouteSettings, ScopeSpec, StoreConfig};
use crate::normal_path::{NormalPath, PathError, unambiguous};
use crate::proxy::{ClientAddr, LostAnswer, OnLost, Proxy, ProxyError, Tracker};
use crate::reconcile::Reconciler;
use crate::request_head::{HeadError, HeadPolicy};
use crate::unknowns::UnknownBook;

/// The metric names of the gateway, next to the layer's (see `idem_http::metrics`).
pub(crate) mod metric {
    /// Requests by route and status class (`2xx` ... `5xx`), counter.
    pub(crate) const REQUESTS: &str = "idem_gateway_requests_total";
    /// Request duration until the response head, by route, histogram (seconds).
    pub(crate) const DURATION: &str = "idem_gateway_request_duration_seconds";
    /// Upstream failures by kind (`unreachable`, `connect_timeout`, `timeout`, `failed`: a
    /// malformed response, a response body broken off or a 101, `shutting_down`), counter.
    pub(crate) const UPSTREAM_ERRORS: &str = "idem_gateway_upstream_errors_total";
    /// Requests the gateway refused before any route, by reason (`host`: a missing, repeated
    /// or malformed `Host`; `above_root`: a path that climbs above `/`; `no_path`: a request
    /// target without a path; `ambiguous_path`: a path servers resolve differently;
    /// `too_many_headers`: an HTTP/2 request over `max_headers`; `transfer_coding`: a coding
    /// other than chunked), counter.
    pub(crate) const REFUSED: &str = "idem_gateway_refused_total";
    /// Requests whose body broke while it was sent on (a malformed chunk, a client that
    /// closed before the announced length), answered 400, counter.
    pub(crate) const CLIENT_BODY_ERRORS: &str = "idem_gateway_client_body_errors_total";
    /// Exchanges whose answer was lost after the upstream had the request, by route: their
    /// keys are held as unknown, counter.
    pub(crate) const UNKNOWN_OUTCOMES: &str = "idem_gateway_unknown_outcomes_total";
    /// The reasons of [`REFUSED`], each registered at zero.
    pub(crate) const REFUSED_REASONS: [&str; 6] = [
        "host",
        "above_root",
        "no_path",
        "ambiguous_path",
        "too_many_headers",
        "transfer_coding",
    ];
}

/// The idem-http settings of a route.
///
/// # Errors
/// [`idem_http::LayerConfigError`] when the layer refuses a setting.
pub(crate) fn layer_config(
    settings: &RouteSettings,
    store: &StoreConfig,
) -> Result<idem_http::Config, idem_http::LayerConfigError> {
    layer_builder(settings, store)?.build()
}

/// The idem-http settings of a route, to build (with the gateway's rejection handler, say).
fn layer_builder(
    settings: &RouteSettings,
    store: &StoreConfig,
) -> Result<idem_http::ConfigBuilder, idem_http::LayerConfigError> {
    let store_label = store.spec.kind();
    let mut builder = idem_http::Config::builder()
        .header_name(settings.header.as_str())?
        .methods(settings.methods.iter().cloned())
        .key_policy(match settings.key {
            KeyMode::Optional => KeyPolicy::Optional,
            KeyMode::Required => KeyPolicy::Required,
        })
        .lease(settings.lease)
        .heartbeat(settings.heartbeat)
        .retention(settings.retention)
        .body_limit(settings.request_body_limit)
        .body_timeout(settings.request_body_timeout)
        .storage_cap(settings.storage_cap)
        .store_server_errors(settings.store_server_errors)
        .store_failure(match settings.on_store_error {
            OnStoreError::FailClosed => StoreFailure::FailClosed,
            OnStoreError::FailOpen => StoreFailure::FailOpen,
        })
        .strict(settings.strict_keys)
        .store_label(store_label)
        .log_keys(settings.log_keys)
        .fingerprint_host(settings.fingerprint_host)
        .unknown_hold(settings.unknown_hold());
    if let Some(secret) = &store.scope_secret {
        builder = builder.scope_secret(&secret.0)?;
    }
    builder = match &settings.scope {
        ScopeSpec::Authorization => builder.scope_by_authorization(),
        ScopeSpec::Header(name) => builder.scope_by_header(name)?,
        ScopeSpec::Cookie(name) => builder.scope_by_cookie(name)?,
        ScopeSpec::All(parts) => builder.scope_by_all(parts.iter().filter_map(ScopeSpec::part))?,
        ScopeSpec::None => builder.no_scope(),
    };
    if let Some(wait) = settings.wait {
        builder = builder.wait_for_in_flight(wait);
    }
    for name in &settings.allow_headers {
        builder = builder.allow_header(name.as_str())?;
    }
    for name in &settings.deny_headers {
        builder = builder.deny_header(name.as_str())?;
    }
    Ok(builder)
}

/// Checks that the layer takes every route's settings (`check-config` and `serve` call this).
///
/// # Errors
/// [`GatewayConfigError`] naming the route whose settings the layer refuses.
pub(crate) fn check_routes(config: &Config) -> Result<(), GatewayConfigError> {
    for route in &config.routes {
        layer_config(&route.settings, &config.store).map_err(|err| {
            GatewayConfigError::new(None, format!("route {:?}: {err}", route.name))
        })?;
    }
    Ok(())
}

/// What a route runs.
#[derive(Clone, Debug)]
enum RouteService {
    /// The idempotency layer over the proxy.
    Layered(Idempotency<Proxy>),
    /// The proxy alone (`enabled = false`).
    Plain(Proxy),
}

/// A route, ready to serve.
#[derive(Debug)]
struct RouteEntry {
    name: String,
    path: RoutePath,
    service: RouteService,
    /// Requests by status class: 1xx to 5xx.
    by_class: [Counter; 5],
    duration: Histogram,
    /// Asks the upstream for unknown outcomes (`reconcile`), if the route names a path.
    reconciler: Option<Reconciler>,
}

/// What a route does with an answer its proxy lost: counted
/// (`idem_gateway_unknown_outcomes_total{route}` and the upstream error's kind), logged, put in
/// the book of unknown outcomes, reconciled if the route names a path, and its hold's end
/// noted. Called by the proxy where the answer is lost, so a client that went away first does
/// not keep the key from being reconciled.
#[derive(Debug)]
struct RouteLosses {
    route: String,
    count: Counter,
    upstream_errors: Arc<[(&'static str, Counter)]>,
    book: Arc<UnknownBook>,
    reconciler: Option<Reconciler>,
    /// How long an unknown key is held before it is freed, and the store to see it in, for the
    /// log line and count of a release after a hold (`None`: held until resolved).
    lapse: Option<(Duration, Arc<dyn Store>)>,
}

impl OnLost for RouteLosses {
    fn lost(&self, lost: &LostAnswer) {
        let kind = lost.error.kind();
        if let Some((_, counter)) = self.upstream_errors.iter().find(|(k, _)| *k == kind) {
            counter.increment(1);
        }
        self.count.increment(1);
        let now = idem_core::Clock::now(&idem_core::SystemClock);
        self.book.held(&self.route, &lost.key, lost.fence, now);
        tracing::warn!(route = %self.route, key = %lost.key, fence = lost.fence.get(), error = %crate::proxy::error_chain(lost.error.as_ref()), "the upstream had the request and its answer was lost: the outcome is unknown, and the key is not freed for a retry to run blind");
        if let Some(reconciler) = &self.reconciler {
            reconciler.start(lost.key.clone(), lost.fence);
        }
        if let Some((hold, store)) = &self.lapse {
            crate::reconcile::note_lapse(store.clone(), lost.key.clone(), lost.fence, *hold);
        }
    }
}

/// The gateway: routes, each with its layer and the shared proxy. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Gateway {
    routes: Arc<[RouteEntry]>,
    upstream_errors: Arc<[(&'static str, Counter)]>,
    /// Requests refused before any route, by reason ([`metric::REFUSED_REASONS`], in order).
    refused: Arc<[Counter; 6]>,
    /// `idem_gateway_client_body_errors_total`.
    client_body_errors: Counter,
    /// What is checked and cleaned in a request head before it is routed.
    head: HeadPolicy,
    /// Whether paths servers resolve differently are forwarded.
    allow_ambiguous_paths: bool,
    /// The unknown outcomes seen, for the gauges.
    unknowns: Arc<UnknownBook>,
}

/// Why a request was refused before any route: its index in [`metric::REFUSED_REASONS`].
#[derive(Clone, Copy)]
enum Refused {
    Host = 0,
    AboveRoot = 1,
    NoPath = 2,
    AmbiguousPath = 3,
    TooManyHeaders = 4,
    TransferCoding = 5,
}

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const ERROR_KINDS: [&str; 5] = [
    "unreachable",
    "connect_timeout",
    "timeout",
    "failed",
    "shutting_down",
];

impl Gateway {
    /// A gateway for `config` over `store`, counting upstream exchanges in `tracker`. Metric
    /// handles are registered now: install the recorder before.
    ///
    /// # Errors
    /// [`GatewayConfigError`] when there is no upstream or the layer refuses a route's settings.
    pub(crate) fn new(
        config: &Config,
        store: Arc<dyn Store>,
        tracker: Tracker,
        unknowns: Arc<UnknownBook>,
    ) -> Result<Self, GatewayConfigError> {
        let proxy = Proxy::new(config.require_upstream()?, tracker);
        let upstream_errors: Arc<[(&'static str, Counter)]> = ERROR_KINDS
            .iter()
            .map(|kind| {
                (
                    *kind,
                    metrics::counter!(metric::UPSTREAM_ERRORS, "kind" => *kind),
                )
            })
            .collect();
        let mut routes = Vec::with_capacity(config.routes.len());
        for route in &config.routes {
            let mut reconciler = None;
            let service = if route.settings.enabled {
                let layer_config = layer_builder(&route.settings, &config.store)
                    .and_then(|builder| {
                        builder
                            .rejection_handler(UpstreamRejections {
                                upstream: proxy.upstream().to_owned(),
                            })
                            .build()
                    })
                    .map_err(|err| {
                        GatewayConfigError::new(None, format!("route {:?}: {err}", route.name))
                    })?;
                reconciler = route.settings.reconcile.as_deref().map(|template| {
                    Reconciler::new(
                        &route.name,
                        proxy.clone(),
                        store.clone(),
                        template,
                        &route.settings,
                        layer_config.clone(),
                        unknowns.clone(),
                    )
                });
                let losses = RouteLosses {
                    route: route.name.clone(),
                    count: metrics::counter!(metric::UNKNOWN_OUTCOMES, "route" => route.name.clone()),
                    upstream_errors: upstream_errors.clone(),
                    book: unknowns.clone(),
                    reconciler: reconciler.clone(),
                    lapse: route
                        .settings
                        .unknown_hold()
                        .map(|hold| (hold, store.clone())),
                };
                let layer = IdempotencyLayer::from_arc(store.clone(), layer_config);
                RouteService::Layered(layer.layer(proxy.reporting(Arc::new(losses))))
            } else {
                RouteService::Plain(proxy.clone())
            };
            let name = route.name.clone();
            let by_class = CLASSES.map(|class| {
                metrics::counter!(metric::REQUESTS, "route" => name.clone(), "status" => class)
            });
            let duration = metrics::histogram!(metric::DURATION, "route" => name.clone());
            routes.push(RouteEntry {
                name,
                path: route.path.clone(),
                service,
                by_class,
                duration,
                reconciler,
            });
        }
        let refused = metric::REFUSED_REASONS
            .map(|reason| metrics::counter!(metric::REFUSED, "reason" => reason));
        for way in crate::reconcile::WAYS {
            let _registered = crate::reconcile::resolved(way);
        }
        Ok(Gateway {
            routes: routes.into(),
            upstream_errors,
            refused: Arc::new(refused),
            client_body_errors: metrics::counter!(metric::CLIENT_BODY_ERRORS),
            head: HeadPolicy {
                max_headers: config.server.max_headers,
                underscores: config.server.underscores_in_headers,
            },
            allow_ambiguous_paths: config.server.allow_ambiguous_paths,
            unknowns,
        })
    }

    /// Answers one request from a client at `client`.
    pub(crate) async fn handle(
        &self,
        request: Request<Incoming>,
        client: SocketAddr,
    ) -> Response<GatewayBody> {
        let start = Instant::now();
        let version = request.version();
        let mut response = self.route(request, client, start).await;
        // The gateway answers in the client's version, whatever the upstream speaks: an
        // HTTP/1.0 upstream's status line would make an HTTP/1.1 client close the connection.
        *response.version_mut() = version;
        response
    }

    /// Answers one request, in the version the upstream or the layer gave the response.
    async fn route(
        &self,
        request: Request<Incoming>,
        client: SocketAddr,
        start: Instant,
    ) -> Response<GatewayBody> {
        let (request, route) = match self.admit(request, client) {
            Ok(admitted) => admitted,
            Err(refused) => return refused,
        };
        let method = request.method().clone();
        // A clone of the URI shares its bytes: no copy on the hot path.
        let uri = request.uri().clone();
        let result = match &route.service {
            RouteService::Layered(service) => {
                let mut service = service.clone();
                match poll_fn(|cx| service.poll_ready(cx)).await {
                    Ok(()) => service.call(request).await.map(|r| r.map(boxed)),
                    Err(err) => Err(err),
                }
            }
            RouteService::Plain(proxy) => proxy.forward(request).await.map(|r| r.map(boxed)),
        };
        let response = match result {
            Ok(response) => {
                self.unknown_outcomes(route, &response);
                response
            }
            Err(err @ ProxyError::ClientBody { .. }) => {
                self.client_body_errors.increment(1);
                tracing::debug!(route = %route.name, %method, path = uri.path(), error = %crate::proxy::error_chain(&err), "the client's body broke off; the key, if any, is released");
                proxy_error_response(&err)
            }
            Err(err) => {
                if let Some((_, counter)) =
                    self.upstream_errors.iter().find(|(k, _)| *k == err.kind())
                {
                    counter.increment(1);
                }
                tracing::warn!(route = %route.name, %method, path = uri.path(), error = %crate::proxy::error_chain(&err), "upstream failed; the key, if any, is released");
                proxy_error_response(&err)
            }
        };
        let class = usize::from(response.status().as_u16() / 100).clamp(1, 5) - 1;
        route.by_class[class].increment(1);
        route.duration.record(start.elapsed().as_secs_f64());
        tracing::debug!(
            route = %route.name,
            %method,
            path = uri.path(),
            status = response.status().as_u16(),
            outcome = response.extensions().get::<Outcome>().map_or("none", |o| o.as_str()),
            "request"
        );
        response
    }

    /// Notes a retry answered `outcome-unknown` (a key another attempt left unknown, perhaps
    /// on another gateway or before a restart): the key goes in the book, and its reconciler
    /// starts here if none runs. A lost answer of this gateway's own is reported where it is
    /// lost ([`RouteLosses`]).
    fn unknown_outcomes(&self, route: &RouteEntry, response: &Response<GatewayBody>) {
        // Only a 409 can be one: the common answers look nothing up.
        if response.status() != StatusCode::CONFLICT {
            return;
        }
        if let Some(Rejection::OutcomeUnknown { key, fence, .. }) =
            response.extensions().get::<Rejection>()
        {
            let now = idem_core::Clock::now(&idem_core::SystemClock);
            self.unknowns.held(&route.name, key, *fence, now);
            if let Some(reconciler) = &route.reconciler {
                reconciler.start(key.clone(), *fence);
            }
        }
    }

    /// Checks a request's head, `Host` and path before it goes anywhere, and chooses its route;
    /// a refused request gets its answer (counted) as the error.
    #[allow(clippy::result_large_err)]
    fn admit(
        &self,
        request: Request<Incoming>,
        client: SocketAddr,
    ) -> Result<(Request<RequestBody>, &RouteEntry), Response<GatewayBody>> {
        let (mut parts, body) = request.into_parts();
        if let Err(err) = self.head.settle(parts.version, &mut parts.headers) {
            let refused = match err {
                HeadError::TooManyFields(_) => Refused::TooManyHeaders,
                HeadError::TransferCoding => Refused::TransferCoding,
            };
            self.refused[refused as usize].increment(1);
            tracing::debug!(method = %parts.method, path = parts.uri.path(), "refused: {err}");
            return Err(problem_of_type(
                err.status(),
                "about:blank",
                &format!("{err}: the request is not forwarded"),
            ));
        }
        if let Err(reason) = settle_host(&mut parts) {
            self.refused[Refused::Host as usize].increment(1);
            tracing::debug!(method = %parts.method, path = parts.uri.path(), "refused: {reason}");
            return Err(problem_of_type(
                StatusCode::BAD_REQUEST,
                "about:blank",
                &format!("{reason}: the request is not forwarded"),
            ));
        }
        parts.extensions.insert(ClientAddr(client));
        let request = Request::from_parts(parts, RequestBody::new(body));
        // The route is chosen by the normal form of the path, so that no other spelling of a
        // path (`//payments`, `/x/../payments`, `/%70ayments`) escapes the route that covers
        // it; the request itself goes on as it came.
        let path = request.uri().path();
        let checked = if self.allow_ambiguous_paths {
            Ok(())
        } else {
            unambiguous(path)
        };
        let route = match checked.and_then(|()| NormalPath::new(path)) {
            Ok(path) => self.routes.iter().find(|r| r.path.matches(&path)),
            Err(err) => {
                let (status, variant, refused) = match err {
                    PathError::Ambiguous(_) => {
                        (StatusCode::BAD_REQUEST, "Ambiguous", Refused::AmbiguousPath)
                    }
                    PathError::AboveRoot => {
                        (StatusCode::BAD_REQUEST, "AboveRoot", Refused::AboveRoot)
                    }
                    // A request target without a path (`*`, or a CONNECT's authority): no
                    // route covers it.
                    PathError::NotAbsolute => {
                        (StatusCode::NOT_FOUND, "NotAbsolute", Refused::NoPath)
                    }
                };
                self.refused[refused as usize].increment(1);
                tracing::debug!(method = %request.method(), path = request.uri().path(), "refused: {err}");
                return Err(problem_of_type(
                    status,
                    &format!("{DOCS}/normal_path/enum.PathError.html#variant.{variant}"),
                    &format!("{err}: the request is not forwarded"),
                ));
            }
        };
        let Some(route) = route else {
            // Never: the catch-all route covers every path.
            return Err(problem_of_type(
                StatusCode::NOT_FOUND,
                "about:blank",
                "no route covers this request target",
            ));
        };
        Ok((request, route))
    }
}

/// Checks the `Host` of a request before it goes anywhere, as RFC 9112 section 3.2 asks of a
/// server: more than one `Host` field line, a `Host` that is not a host and an optional port,
/// or an HTTP/1.1 request without one is refused (the reason is returned), since the gateway
/// and the upstream could each take another host from it. An HTTP/1 request in absolute form
/// (`POST http://h/p`) gets the target's host as its `Host` (section 3.2.2); an HTTP/2 request
/// whose `Host` names another host than its `:authority` is refused (RFC 9113 section 8.3.1).
fn settle_host(parts: &mut http::request::Parts) -> Result<(), &'static str> {
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let host = hosts.next().cloned();
    if hosts.next().is_some() {
        return Err("more than one Host field line");
    }
    let authority = |value: &str| {
        value
            .parse::<http::uri::Authority>()
            .ok()
            .filter(|authority| !authority.as_str().contains('@'))
    };
    if let Some(host) = &host {
        if host.to_str().ok().and_then(authority).is_none() {
            return Err("a Host that is not a host and an optional port");
        }
    }
    let Some(target) = parts.uri.authority().map(|a| a.as_str().to_owned()) else {
        return match (parts.version, host) {
            (http::Version::HTTP_11, None) => Err("an HTTP/1.1 request without Host"),
            _ => Ok(()),
        };
    };
    if parts.version >= http::Version::HTTP_2 {
        let differs = host
            .as_ref()
            .is_some_and(|host| !host.as_bytes().eq_ignore_ascii_case(target.as_bytes()));
        return if differs {
            Err("a Host other than the :authority")
        } else {
            Ok(())
        };
    }
    if host.is_none() && parts.version == http::Version::HTTP_11 {
        return Err("an HTTP/1.1 request without Host");
    }
    let Some(value) = authority(&target).and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    else {
        return Err("a request target whose authority is not a host and an optional port");
    };
    parts.headers.insert(header::HOST, value);
    Ok(())
}

/// The layer's rejections on a route, as [`ProblemJson`] writes them, except one: where the
/// upstream broke off the response body the layer was reading to store
/// ([`Rejection::ResponseBodyFailed`], a 500 of the layer's), the answer is the gateway's 502,
/// as for any upstream failure (the key is released either way; the failure was counted and
/// logged by the [`crate::proxy::UpstreamBody`]).
struct UpstreamRejections {
    /// The upstream, for the 502's log line.
    upstream: String,
}

impl RejectionHandler for UpstreamRejections {
    fn respond(&self, rejection: &Rejection) -> Response<Bytes> {
        if let Rejection::ResponseBodyFailed = rejection {
            return proxy_error_problem(&ProxyError::Failed {
                upstream: self.upstream.clone(),
                source: "the response body broke off before it was complete".into(),
            });
        }
        ProblemJson::default().respond(rejection)
    }
}

/// Where the problem `type` links point.
const DOCS: &str = "https://docs.rs/idem-gateway/latest/idem_gateway";

/// An RFC 9457 problem response of the gateway itself.
#[must_use]
fn problem(status: StatusCode, name: &str, detail: &str) -> Response<Bytes> {
    problem_bytes(
        status,
        &format!("{DOCS}/proxy/enum.ProxyError.html#variant.{name}"),
        detail,
    )
}

/// An RFC 9457 problem response whose `type` is `type_uri`.
fn problem_of_type(status: StatusCode, type_uri: &str, detail: &str) -> Response<GatewayBody> {
    problem_bytes(status, type_uri, detail).map(full)
}

/// An RFC 9457 problem response whose `type` is `type_uri`, its body in one piece.
fn problem_bytes(status: StatusCode, type_uri: &str, detail: &str) -> Response<Bytes> {
    idem_http::Problem {
        type_uri: type_uri.to_owned(),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status,
        detail: detail.to_owned(),
    }
    .into_response()
}

/// The response for an upstream failure: 502, 503 (with `Retry-After`) or 504. Its detail is
/// [`ProxyError::public_detail`]: the upstream's address and the underlying error go to the log
/// only.
#[must_use]
pub(crate) fn proxy_error_response(err: &ProxyError) -> Response<GatewayBody> {
    proxy_error_problem(err).map(full)
}

/// [`proxy_error_response`], its body in one piece.
pub(crate) fn proxy_error_problem(err: &ProxyError) -> Response<Bytes> {
    let mut response = problem(err.status(), err.name(), &err.public_detail());
    if matches!(err, ProxyError::ShuttingDown) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
