//! `/ui`: the operator's page, plain server-rendered HTML (no script, no build step): records
//! in flight with their age, owner and fence and a delete button each; recent completions and
//! failures; the duplicate-hit and conflict counters with their rates over the last minute.
//! Everything that comes from the store is HTML-escaped (keys are client input).
//!
//! Forms: `POST /ui/login` (field `token`), `POST /ui/logout`, `POST /ui/delete` (fields
//! `key`, `scope`, `csrf`: the CSRF token of the visitor's session, see [`session`]). The page
//! is served with a strict Content-Security-Policy and may not be framed.

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Form, State as Shared};
use axum::response::Response;
use axum::routing::{MethodRouter, any, get, post};
use axum::{Router, body::Body};
use http::header::{self, HeaderValue};
use http::{HeaderMap, StatusCode};
use idem_core::{Clock, Record, RecordKey, ScanQuery, State, Store, SystemClock, Timestamp};
use serde::Deserialize;

use super::access::same;
use super::monitor::{InFlight, Monitor, scan_all};
use super::{Access, Admin, Grant, NOT_ALLOWED, RenderMetrics, TOO_MANY, Visitor, session};
use super::{challenge, only, text, throttled};
use crate::records::{ArgNames, BODY_PREVIEW, escaped, record_key, time};

/// How many recent completions and failures the page lists.
const RECENT: usize = 20;
/// How many completed or failed records are read to find the recent ones.
const RECENT_SCAN: usize = 5 * ScanQuery::DEFAULT_LIMIT;

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}\
th,td{border-bottom:1px solid #ddd;padding:.3em .7em;text-align:left;vertical-align:top}\
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
code{font-size:12px}.lapsed{color:#b00}.err{color:#b00}\
form.inline{display:inline;margin:0}button{cursor:pointer}";

/// Escapes `text` for HTML text and for attribute values in double or single quotes (`&`,
/// `<`, `>`, `"` and `'`), with the `html-escape` crate.
#[must_use]
pub(crate) fn html(text: &str) -> String {
    html_escape::encode_quoted_attribute(text).into_owned()
}

/// An HTML response with the page's security headers.
#[must_use]
pub(crate) fn html_response(status: StatusCode, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A `303 See Other` to `location`, setting `cookie` when given.
#[must_use]
pub(crate) fn redirect(location: &'static str, cookie: Option<&str>) -> Response {
    let mut response = html_response(StatusCode::SEE_OTHER, String::new());
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(location));
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\"><title>{title}</title>\
<style>{STYLE}</style></head><body>\n{body}</body></html>\n"
    )
}

/// The login form (`status` 401 when the token was missing or wrong).
#[must_use]
pub(crate) fn login_page(status: StatusCode, message: Option<&str>) -> Response {
    let message = message
        .map(|m| format!("<p class=\"err\">{}</p>", html(m)))
        .unwrap_or_default();
    let body = format!(
        "<h1>idem admin</h1>{message}\
<form method=\"post\" action=\"/ui/login\">\
<label>Admin token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" autofocus></label> \
<button type=\"submit\" id=\"login\">Sign in</button></form>\n"
    );
    html_response(status, document("idem admin: sign in", &body))
}

/// The routes under `/ui`; each handler finds the [`Visitor`] the guard put on the request.
pub(super) fn routes() -> Router<Admin> {
    let not_allowed = || text(StatusCode::METHOD_NOT_ALLOWED, NOT_ALLOWED);
    let login_form = get(|| async { login_page(StatusCode::OK, None) }).post(login);
    let form_only = |route: MethodRouter<Admin>| only(route, "POST", not_allowed);
    Router::new()
        .route("/ui", only(get(page), "GET, HEAD", not_allowed))
        .route(
            "/ui/login",
            only(login_form, "GET, HEAD, POST", not_allowed),
        )
        .route("/ui/logout", form_only(post(logout)))
        .route("/ui/delete", form_only(post(delete)))
        .route("/ui/resolve", form_only(post(resolve)))
        .route(
            "/ui/{*rest}",
            any(|| async { text(StatusCode::NOT_FOUND, "no such page\n") }),
        )
}

/// The login form of a peer that sent too many wrong tokens: 429, after `wait`.
pub(super) fn too_many(wait: Duration) -> Response {
    throttled(
        login_page(StatusCode::TOO_MANY_REQUESTS, Some(TOO_MANY)),
        wait,
    )
}

/// The login form of a visitor without access: 401, with its challenge.
fn sign_in() -> Response {
    challenge(login_page(StatusCode::UNAUTHORIZED, None))
}

/// `GET /ui`: the page, or the login form for a visitor without access. A visitor of a
/// listener without a token that comes without a live session gets one (and its cookie), so
/// that its forms carry a CSRF token of its own.
async fn page(
    Shared(admin): Shared<Admin>,
    Extension(visitor): Extension<Visitor>,
    uri: http::Uri,
    headers: HeaderMap,
) -> Response {
    // A logout button where there was a login.
    let logout = admin.token.is_some() && matches!(visitor.grant, Some(Grant::Session { .. }));
    let (csrf, opened) = match visitor.grant {
        None => return sign_in(),
        Some(Grant::Session { csrf }) => (csrf, None),
        // The forms need no token: the header is the proof.
        Some(Grant::Bearer) => (String::new(), None),
        Some(Grant::Open) => {
            let id = admin.sessions.open();
            let csrf = admin.sessions.csrf_of(&id).unwrap_or_default();
            (csrf, Some(id))
        }
    };
    let page = Page {
        store: &*admin.store,
        metrics: admin.metrics.as_ref(),
        monitor: &admin.monitor,
        csrf: &csrf,
        session: logout,
    };
    let mut response = page.render().await;
    if let Some(id) = opened {
        let cookie = session::set_cookie(Some(&id), session::over_https(&uri, &headers));
        if let Ok(cookie) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, cookie);
        }
    }
    response
}

/// The field of the login form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Login {
    token: String,
}

/// `POST /ui/login`: the right token opens a session and sets its cookie; a wrong one is the
/// form again (401), or 429 for a peer that sent too many.
async fn login(
    Shared(admin): Shared<Admin>,
    Extension(visitor): Extension<Visitor>,
    uri: http::Uri,
    headers: HeaderMap,
    form: Result<Form<Login>, FormRejection>,
) -> Response {
    let Some(token) = &admin.token else {
        return redirect("/ui", None);
    };
    // A body that is not a form (or is too large) is a form without a token.
    let given = form.map(|Form(login)| login.token).unwrap_or_default();
    match admin.check(given.as_bytes(), token, visitor.peer) {
        Access::Granted => {}
        Access::Refused => {
            return challenge(login_page(StatusCode::UNAUTHORIZED, Some("Wrong token.")));
        }
        Access::Throttled(wait) => return too_many(wait),
    }
    let id = admin.sessions.open();
    let secure = session::over_https(&uri, &headers);
    redirect("/ui", Some(&session::set_cookie(Some(&id), secure)))
}

/// `POST /ui/logout`: ends the session and removes its cookie.
async fn logout(
    Shared(admin): Shared<Admin>,
    Extension(visitor): Extension<Visitor>,
    uri: http::Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = &visitor.session_id {
        admin.sessions.close(id);
    }
    let secure = session::over_https(&uri, &headers);
    redirect("/ui", Some(&session::set_cookie(None, secure)))
}

/// The fields of a Delete button's form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Delete {
    key: String,
    scope: String,
    csrf: String,
}

/// `POST /ui/delete`: deletes the record, when the form carries the CSRF token of the
/// visitor's session (or the request the bearer header).
async fn delete(
    Shared(admin): Shared<Admin>,
    Extension(visitor): Extension<Visitor>,
    form: Result<Form<Delete>, FormRejection>,
) -> Response {
    let form = form.map(|Form(form)| form).unwrap_or_default();
    let key = match form_key(&visitor, &form.csrf, &form.key, &form.scope) {
        Ok(key) => key,
        Err(refused) => return refused,
    };
    match admin.store.delete(&key).await {
        Ok(deleted) => {
            tracing::info!(key = %key, deleted, "admin: record deleted from /ui");
            redirect("/ui", None)
        }
        Err(err) => text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n")),
    }
}

/// Whether a form may change anything: it carries the CSRF token of the visitor's session (or
/// the request the bearer header); otherwise the answer that refuses it.
#[allow(clippy::result_large_err)]
fn form_allowed(visitor: &Visitor, form_csrf: &str) -> Result<(), Response> {
    let stale = || {
        text(
            StatusCode::FORBIDDEN,
            "a stale or foreign form: reload /ui\n",
        )
    };
    match &visitor.grant {
        None => Err(sign_in()),
        Some(Grant::Session { csrf }) if !same(form_csrf.as_bytes(), csrf.as_bytes()) => {
            Err(stale())
        }
        Some(Grant::Session { .. } | Grant::Bearer) => Ok(()),
        // No session, so no CSRF token the form could carry: a form the page of this
        // listener did not make for this visitor.
        Some(Grant::Open) => Err(stale()),
    }
}

/// The record key a button's form names, once the form may change anything
/// ([`form_allowed`]); otherwise the answer that refuses it (a bad key is 400).
#[allow(clippy::result_large_err)]
fn form_key(
    visitor: &Visitor,
    form_csrf: &str,
    key: &str,
    scope: &str,
) -> Result<RecordKey, Response> {
    form_allowed(visitor, form_csrf)?;
    record_key(key, scope, ArgNames::PARAMS)
        .map_err(|err| text(StatusCode::BAD_REQUEST, format!("{err}\n")))
}

/// The fields of a Release or Completed button's form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Resolve {
    key: String,
    scope: String,
    fence: u64,
    resolve: String,
    status: String,
    body: String,
    csrf: String,
}

/// `POST /ui/resolve`: resolves an unknown outcome at the fence the page showed, when the
/// form carries the visitor's CSRF token.
async fn resolve(
    Shared(admin): Shared<Admin>,
    Extension(visitor): Extension<Visitor>,
    form: Result<Form<Resolve>, FormRejection>,
) -> Response {
    let form = form.map(|Form(form)| form).unwrap_or_default();
    let key = match form_key(&visitor, &form.csrf, &form.key, &form.scope) {
        Ok(key) => key,
        Err(refused) => return refused,
    };
    let completed = form.resolve == "completed";
    let status = match form.status.trim() {
        "" => None,
        status => match status.parse::<u16>() {
            Ok(status) => Some(status),
            Err(_) => return text(StatusCode::BAD_REQUEST, "status: a number, 200 to 599\n"),
        },
    };
    let request = crate::resolve::ResolveRequest {
        resolve: form.resolve,
        fence: Some(form.fence),
        status: status.filter(|_| completed),
        headers: Vec::new(),
        body: if completed { form.body } else { String::new() },
    };
    let (resolution, fence) = match request.parse() {
        Ok(parsed) => parsed,
        Err(err) => return text(StatusCode::BAD_REQUEST, format!("{err}\n")),
    };
    match crate::resolve::resolve(&*admin.store, &key, fence, &resolution, admin.retention).await {
        Ok(_) => {
            admin.unknowns.resolved(&key);
            redirect("/ui", None)
        }
        Err(err) => text(err.status(), format!("{err}\n")),
    }
}

/// A duration for people: `850ms`, `12.3s`, `4m 10s`.
fn age(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

fn scope_cell(record: &Record) -> String {
    if record.key.scope.is_none() {
        "-".to_owned()
    } else {
        html(record.key.scope.as_str())
    }
}

/// How long each of the page's scans may take.
const SCAN_TIMEOUT: Duration = Duration::from_secs(5);

/// A stored response as the page shows it, folded: its headers and the first
/// [`BODY_PREVIEW`] bytes of its body, every byte visible ([`escaped`]) and HTML-escaped.
fn response_cell(response: &idem_http::codec::StoredResponse) -> String {
    let mut text = String::new();
    for (name, value) in &response.headers {
        let _ = writeln!(text, "{}: {}", name, escaped(value.as_bytes()));
    }
    let summary = match &response.body {
        Some(body) => {
            let shown = &body[..body.len().min(BODY_PREVIEW)];
            let _ = write!(text, "\n{}", escaped(shown));
            if body.len() > BODY_PREVIEW {
                text.push_str(" …");
            }
            format!("{} bytes", body.len())
        }
        None => "body not stored".to_owned(),
    };
    format!(
        "<details><summary>{summary}</summary><pre>{}</pre></details>",
        html(&text)
    )
}

/// A scan, or why there is none (its error, or no answer within [`SCAN_TIMEOUT`]).
async fn within<T>(
    scan: impl std::future::Future<Output = Result<T, idem_core::StoreError>>,
) -> Result<T, String> {
    match tokio::time::timeout(SCAN_TIMEOUT, scan).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {SCAN_TIMEOUT:?}")),
    }
}

/// What the page is built from.
pub(crate) struct Page<'a> {
    /// The store to read.
    pub store: &'a dyn Store,
    /// The metrics renderer, when a recorder is installed.
    pub metrics: Option<&'a RenderMetrics>,
    /// The counters' history.
    pub monitor: &'a Monitor,
    /// The CSRF token the forms carry.
    pub csrf: &'a str,
    /// Whether the visitor signed in with the token (a logout button is shown).
    pub session: bool,
}

impl Page<'_> {
    /// Renders the page.
    pub(crate) async fn render(&self) -> Response {
        let now = SystemClock.now();
        let mut body = String::from("<h1>idem admin</h1>\n");
        if self.session {
            body.push_str(
                "<form class=\"inline\" method=\"post\" action=\"/ui/logout\"><button type=\"submit\">Sign out</button></form> ",
            );
        }
        body.push_str("<a href=\"/ui\">Refresh</a>\n");
        self.rates(&mut body);
        match within(InFlight::scan(self.store)).await {
            Ok(in_flight) => self.in_flight(&mut body, &in_flight, now),
            Err(err) => {
                let _ = write!(
                    body,
                    "<h2>In flight</h2><p class=\"err\">store: {}</p>",
                    html(&err)
                );
            }
        }
        self.unknown(&mut body, now).await;
        self.recent(&mut body).await;
        html_response(StatusCode::OK, document("idem admin", &body))
    }

    fn rates(&self, body: &mut String) {
        body.push_str("<h2>Rates</h2>\n");
        if self.metrics.is_none() {
            body.push_str("<p>No metrics recorder in this process: counters are not kept.</p>\n");
            return;
        }
        if !crate::telemetry::counters_tapped() {
            body.push_str("<p>This process's metrics recorder keeps no totals for this page: install it with <code>telemetry::install_prometheus</code>.</p>\n");
            return;
        }
        let rates = self.monitor.rates();
        let window = if rates.window.is_zero() {
            "last minute".to_owned()
        } else {
            format!("last {}s", rates.window.as_secs())
        };
        let _ = writeln!(
            body,
            "<table id=\"rates\"><tr><th>counter</th><th>since start</th><th>per second, {window}</th></tr>"
        );
        for rate in &rates.counters {
            let per_second = rate
                .per_second
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
            let _ = writeln!(
                body,
                "<tr><td>{} <code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{per_second}</td></tr>",
                html(rate.label),
                html(rate.metric),
                rate.total,
            );
        }
        body.push_str("</table>\n");
        let total = |metric: &str| {
            rates
                .counters
                .iter()
                .find(|r| r.metric == metric)
                .map_or(0.0, |r| r.total)
        };
        // The layer counts a request when it is answered: one still running is not in it yet.
        let requests = total(idem_http::metrics::REQUESTS);
        if requests > 0.0 {
            let _ = writeln!(
                body,
                "<p id=\"shares\">Of the {requests} request(s) answered since start (a request still running counts once it is answered): {:.1}% duplicates replayed, {:.1}% in-flight conflicts (409).</p>",
                100.0 * total(idem_http::metrics::REPLAYS) / requests,
                100.0 * total(idem_http::metrics::COLLISIONS) / requests,
            );
        }
    }

    fn in_flight(&self, body: &mut String, in_flight: &InFlight, now: Timestamp) {
        if in_flight.records.is_empty() && !in_flight.truncated {
            body.push_str("<h2>In flight</h2><p id=\"in-flight-summary\">Nothing in flight.</p>\n");
        } else {
            let _ = writeln!(
                body,
                "<h2>In flight</h2><p id=\"in-flight-summary\">{}{} record(s), {} with a lapsed lease; the oldest is {} old.</p>",
                in_flight.records.len(),
                if in_flight.truncated { "+" } else { "" },
                in_flight.lapsed,
                age(in_flight.oldest),
            );
        }
        if in_flight.unreadable > 0 {
            let _ = writeln!(
                body,
                "<p class=\"err\">The scan also met {} record(s) the store cannot read: <code>idem keys list</code> names them.</p>",
                in_flight.unreadable,
            );
        }
        if in_flight.records.is_empty() {
            return;
        }
        body.push_str(
            "<table id=\"in-flight\"><tr><th>key</th><th>scope</th><th>age</th><th>owner</th><th>fence</th><th>attempt</th><th>lease</th><th></th></tr>\n",
        );
        let csrf = html(self.csrf);
        for record in &in_flight.records {
            let key = html(record.key.key.as_str());
            let lease = if record.lease_until < now {
                format!(
                    "<span class=\"lapsed\">lapsed {} ago</span>",
                    age(now.saturating_since(record.lease_until))
                )
            } else {
                format!("{} left", age(record.lease_until.saturating_since(now)))
            };
            let _ = writeln!(
                body,
                "<tr data-key=\"{key}\"><td><code>{key}</code></td><td>{scope}</td><td class=\"n\">{age}</td>\
<td><code>{owner}</code></td><td class=\"n\">{fence}</td><td class=\"n\">{attempt}</td><td>{lease}</td>\
<td><form class=\"inline\" method=\"post\" action=\"/ui/delete\">\
<input type=\"hidden\" name=\"key\" value=\"{key}\"><input type=\"hidden\" name=\"scope\" value=\"{scope_value}\">\
<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button type=\"submit\" class=\"delete\">Delete</button></form></td></tr>",
                scope = scope_cell(record),
                age = age(record.age(now)),
                owner = record.owner,
                fence = record.fence.get(),
                attempt = record.attempt,
                scope_value = html(record.key.scope.as_str()),
            );
        }
        body.push_str("</table>\n");
    }

    /// The unknown outcomes, oldest first, each with its buttons: Release (the effect did not
    /// happen) and Completed with a status and a body (it did).
    async fn unknown(&self, body: &mut String, now: Timestamp) {
        body.push_str("<h2>Unknown outcomes</h2>\n");
        let query = ScanQuery::all().with_state(State::Unknown);
        let mut records = match within(scan_all(self.store, query, RECENT_SCAN)).await {
            Ok((found, _)) => found.records,
            Err(err) => {
                let _ = writeln!(body, "<p class=\"err\">store: {}</p>", html(&err));
                return;
            }
        };
        if records.is_empty() {
            body.push_str(
                "<p id=\"unknown-summary\">None: every answer that was lost is resolved.</p>\n",
            );
            return;
        }
        records.sort_by_key(|r| r.created_at);
        let _ = writeln!(
            body,
            "<p id=\"unknown-summary\">{} key(s) whose upstream had the request and lost its answer: a retry is told so and never run until the outcome is resolved here, by <code>idem keys resolve</code> or by the route's reconcile.</p>",
            records.len()
        );
        body.push_str(
            "<table id=\"unknown\"><tr><th>key</th><th>scope</th><th>age</th><th>fence</th><th>what is known</th><th>held until</th><th></th></tr>\n",
        );
        let csrf = html(self.csrf);
        for record in &records {
            let key = html(record.key.key.as_str());
            let known = record
                .unknown
                .as_ref()
                .map_or_else(String::new, |u| html(&u.reason));
            let held = record
                .hold_until
                .map_or_else(|| "resolved".to_owned(), time);
            let hidden = format!(
                "<input type=\"hidden\" name=\"key\" value=\"{key}\"><input type=\"hidden\" name=\"scope\" value=\"{}\">\
<input type=\"hidden\" name=\"fence\" value=\"{}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">",
                html(record.key.scope.as_str()),
                record.fence.get(),
            );
            let _ = writeln!(
                body,
                "<tr data-key=\"{key}\"><td><code>{key}</code></td><td>{scope}</td><td class=\"n\">{age}</td><td class=\"n\">{fence}</td><td>{known}</td><td>{held}</td>\
<td><form class=\"inline\" method=\"post\" action=\"/ui/resolve\">{hidden}<input type=\"hidden\" name=\"resolve\" value=\"release\">\
<button type=\"submit\" class=\"release\">Release</button></form> \
<form class=\"inline\" method=\"post\" action=\"/ui/resolve\">{hidden}<input type=\"hidden\" name=\"resolve\" value=\"completed\">\
<input name=\"status\" size=\"3\" value=\"200\" aria-label=\"status\"> <input name=\"body\" size=\"16\" placeholder=\"body\" aria-label=\"body\">\
<button type=\"submit\" class=\"completed\">Completed</button></form></td></tr>",
                scope = scope_cell(record),
                age = age(record.age(now)),
                fence = record.fence.get(),
            );
        }
        body.push_str("</table>\n");
    }

    async fn recent(&self, body: &mut String) {
        body.push_str("<h2>Recent completions and failures</h2>\n");
        let mut records = Vec::new();
        for state in [State::Completed, State::Failed] {
            let query = ScanQuery::all().with_state(state);
            match within(scan_all(self.store, query, RECENT_SCAN)).await {
                Ok((found, _)) => records.extend(found.records),
                Err(err) => {
                    let _ = writeln!(body, "<p class=\"err\">store: {}</p>", html(&err));
                    return;
                }
            }
        }
        if records.is_empty() {
            body.push_str("<p>None.</p>\n");
            return;
        }
        records.sort_by_key(|r| std::cmp::Reverse(r.completed_at.unwrap_or(r.created_at)));
        records.truncate(RECENT);
        body.push_str(
            "<table id=\"recent\"><tr><th>key</th><th>scope</th><th>state</th><th>status</th><th>finished</th><th>fence</th><th>failure</th><th>response</th></tr>\n",
        );
        for record in &records {
            let response = record
                .result
                .as_ref()
                .and_then(|bytes| idem_http::codec::decode(bytes).ok());
            let status = response
                .as_ref()
                .map(|r| r.status.as_u16().to_string())
                .unwrap_or_default();
            let preview = response.as_ref().map(response_cell).unwrap_or_default();
            let failure = record
                .failure
                .as_ref()
                .map(|f| html(&f.message))
                .unwrap_or_default();
            let _ = writeln!(
                body,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{status}</td><td>{}</td><td class=\"n\">{}</td><td>{failure}</td><td>{preview}</td></tr>",
                html(record.key.key.as_str()),
                scope_cell(record),
                record.state,
                time(record.completed_at.unwrap_or(record.created_at)),
                record.fence.get(),
            );
        }
        body.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::html;

    #[test]
    fn html_escapes_text_and_both_quotes() {
        assert_eq!(
            html("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#x27;&amp;&#x27;&lt;/a&gt;"
        );
        assert_eq!(html("plain é"), "plain é");
    }
}
