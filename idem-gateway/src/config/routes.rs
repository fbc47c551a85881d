//! The routes of [`Config::build`](super::Config::build): each `[[route]]` resolved over the
//! settings of `[idempotency]`, which are themselves the catch-all route, then the duration
//! overrides of the command line applied to all of them.

use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::GatewayConfigError;
use super::build::{positive, size};
use super::internal::{DEFAULT_ROUTE, Origin, Route, RouteSettings};
use super::lint::{self, Warnings};
use super::toml::RouteSection;
use super::value::{HumanDuration, PathPattern, RoutePath, ScopeSpec};

fn header_names(
    names: &[String],
    allow: bool,
    origin: &Origin,
    at: Option<usize>,
) -> Result<Vec<HeaderName>, GatewayConfigError> {
    names
        .iter()
        .map(|name| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| origin.error_at(at, format!("{name:?} is not a header name")))?;
            if allow && lint::is_framing(&header) {
                return Err(origin.error_at(
                    at,
                    format!(
                        "{name} describes one connection and is never stored: it cannot be allowed"
                    ),
                ));
            }
            Ok(header)
        })
        .collect()
}

/// Where a value of a section is: its own position when it was set, else the section's.
fn position<T>(value: Option<&Spanned<T>>, section: Option<usize>) -> Option<usize> {
    value.map_or(section, |spanned| Some(spanned.span().start))
}

/// Resolves a route section over its parent's settings, then applies the duration overrides.
/// The settings the section writes are checked for foot-guns ([`lint`]): refused, or taken
/// with a warning added to `warnings`.
fn settings(
    section: &RouteSection,
    parent: &RouteSettings,
    lease_override: Option<Duration>,
    retention_override: Option<Duration>,
    origin: &Origin,
    at: Option<usize>,
    warnings: &mut Warnings,
) -> Result<RouteSettings, GatewayConfigError> {
    let (lease, heartbeat) = lease_and_heartbeat(section, parent, lease_override, origin, at)?;
    let retention = positive(
        retention_override
            .or(section.retention.as_ref().map(|d| d.get_ref().0))
            .unwrap_or(parent.retention),
        "the retention",
        origin,
        position(section.retention.as_ref(), at),
    )?;
    let header = key_header(section, parent, origin)?;
    let methods = methods(section, parent, origin, warnings)?;
    let wait = match section.wait {
        Some(HumanDuration(d)) if d.is_zero() => None,
        Some(HumanDuration(d)) => Some(d),
        None => parent.wait,
    };
    let (unknown_hold, release_grace, reconcile) = unknown_settings(section, parent, origin)?;
    let scope = section
        .scope
        .clone()
        .unwrap_or_else(|| parent.scope.clone());
    if let (Some(template), false) = (&section.reconcile, scope == ScopeSpec::None) {
        lint::reconcile_by_key_alone(origin, Some(template.span().start), warnings);
    }
    let request_body_limit = size(
        section.request_body_limit.as_ref(),
        "request_body_limit",
        parent.request_body_limit,
        origin,
    )?;
    let request_body_timeout = positive(
        section
            .request_body_timeout
            .as_ref()
            .map_or(parent.request_body_timeout, |d| d.get_ref().0),
        "request_body_timeout",
        origin,
        position(section.request_body_timeout.as_ref(), at),
    )?;
    let storage_cap = size(
        section.storage_cap.as_ref(),
        "storage_cap",
        parent.storage_cap,
        origin,
    )?;
    let allow_headers = match &section.allow_headers {
        Some(names) => header_names(names.get_ref(), true, origin, Some(names.span().start))?,
        None => parent.allow_headers.clone(),
    };
    let deny_headers = match &section.deny_headers {
        Some(names) => header_names(names.get_ref(), false, origin, Some(names.span().start))?,
        None => parent.deny_headers.clone(),
    };
    if let Some(names) = &section.allow_headers {
        let at = Some(names.span().start);
        lint::allowed_headers(&allow_headers, &deny_headers, origin, at, warnings);
    }
    Ok(RouteSettings {
        enabled: section.enabled.unwrap_or(parent.enabled),
        header,
        methods,
        key: section.key.unwrap_or(parent.key),
        scope,
        lease,
        heartbeat,
        retention,
        wait,
        request_body_limit,
        request_body_timeout,
        storage_cap,
        store_server_errors: section
            .store_server_errors
            .unwrap_or(parent.store_server_errors),
        on_store_error: section.on_store_error.unwrap_or(parent.on_store_error),
        strict_keys: section.strict_keys.unwrap_or(parent.strict_keys),
        allow_headers,
        deny_headers,
        log_keys: section.log_keys.unwrap_or(parent.log_keys),
        fingerprint_host: section.fingerprint_host.unwrap_or(parent.fingerprint_host),
        on_unknown: section.on_unknown.unwrap_or(parent.on_unknown),
        unknown_hold,
        release_grace,
        reconcile,
    })
}

/// The lease and the heartbeat of a route section over its parent's (`lease_override` from
/// --lease or IDEM_LEASE): positive, the heartbeat shorter than the lease.
fn lease_and_heartbeat(
    section: &RouteSection,
    parent: &RouteSettings,
    lease_override: Option<Duration>,
    origin: &Origin,
    at: Option<usize>,
) -> Result<(Duration, Duration), GatewayConfigError> {
    let lease_at = position(section.lease.as_ref(), at);
    let lease = positive(
        lease_override
            .or(section.lease.as_ref().map(|d| d.get_ref().0))
            .unwrap_or(parent.lease),
        "the lease",
        origin,
        lease_at,
    )?;
    // A heartbeat not set here is inherited; when this level changes the lease, it is also
    // kept to at most a third of the new lease.
    let heartbeat_at = position(section.heartbeat.as_ref(), lease_at);
    let heartbeat = match section.heartbeat.as_ref().map(Spanned::get_ref) {
        Some(HumanDuration(beat)) => *beat,
        None if lease == parent.lease => parent.heartbeat,
        None => parent.heartbeat.min(lease / 3),
    };
    let heartbeat = positive(heartbeat, "the heartbeat", origin, heartbeat_at)?;
    if heartbeat >= lease {
        // A lease from --lease or IDEM_LEASE is named as such: the file's heartbeat may be
        // fine for the file's own lease.
        let from = if lease_override.is_some() {
            ", set by --lease or IDEM_LEASE"
        } else {
            ""
        };
        return Err(origin.error_at(
            heartbeat_at,
            format!(
                "the heartbeat ({}) must be shorter than the lease ({}{from})",
                HumanDuration(heartbeat),
                HumanDuration(lease)
            ),
        ));
    }
    Ok((lease, heartbeat))
}

/// The key header of a route section over its parent's: a header name that may carry a key.
fn key_header(
    section: &RouteSection,
    parent: &RouteSettings,
    origin: &Origin,
) -> Result<HeaderName, GatewayConfigError> {
    match &section.header {
        Some(name) => {
            let at = Some(name.span().start);
            let header = HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
                origin.error_at(
                    at,
                    format!("header {:?} is not a header name", name.get_ref()),
                )
            })?;
            lint::key_header(&header, origin, at)?;
            Ok(header)
        }
        None => Ok(parent.header.clone()),
    }
}

/// The methods a route section covers over its parent's: at least one (a foot-gun among them
/// refused or warned about).
fn methods(
    section: &RouteSection,
    parent: &RouteSettings,
    origin: &Origin,
    warnings: &mut Warnings,
) -> Result<Vec<http::Method>, GatewayConfigError> {
    match &section.methods {
        Some(methods) if methods.get_ref().is_empty() => Err(origin.error_at(
            Some(methods.span().start),
            "methods is empty: cover at least one method (or set enabled = false)",
        )),
        Some(written) => {
            let methods: Vec<_> = written.get_ref().iter().map(|m| m.0.clone()).collect();
            lint::methods(&methods, origin, Some(written.span().start), warnings)?;
            Ok(methods)
        }
        None => Ok(parent.methods.clone()),
    }
}

/// The `[[route]]` entries over `[idempotency]`, then the catch-all route of `[idempotency]`.
pub(super) fn route_configs(
    idempotency: Option<&Spanned<RouteSection>>,
    routes: &[Spanned<RouteSection>],
    lease: Option<Duration>,
    retention: Option<Duration>,
    origin: &Origin,
    warnings: &mut Warnings,
) -> Result<Vec<Route>, GatewayConfigError> {
    let base = RouteSettings::default();
    let (top, top_at) = match idempotency {
        Some(spanned) => (spanned.get_ref().clone(), Some(spanned.span().start)),
        None => (RouteSection::default(), None),
    };
    if top.path.is_some() || top.name.is_some() || top.case_insensitive.is_some() {
        return Err(origin.error_at(
            top_at,
            "[idempotency] takes no name, path or case_insensitive: those are for [[route]] entries",
        ));
    }
    let defaults = settings(&top, &base, lease, retention, origin, top_at, warnings)?;
    let mut resolved = Vec::with_capacity(routes.len() + 1);
    for (index, spanned) in routes.iter().enumerate() {
        let at = Some(spanned.span().start);
        let section = spanned.get_ref();
        let Some(path) = section.path.clone() else {
            return Err(origin.error_at(at, format!("route {} has no path", index + 1)));
        };
        let name = section.name.clone().unwrap_or_else(|| path.to_string());
        // A route's name labels its metrics and logs: two routes of one name would count
        // as one, as would a route named like the catch-all.
        if name == DEFAULT_ROUTE || resolved.iter().any(|route: &Route| route.name == name) {
            return Err(origin.error_at(
                at,
                format!(
                    "route {}: the name {name:?} is taken (by an earlier route, or by \
                     {DEFAULT_ROUTE:?}, the paths no route covers): give each route its own",
                    index + 1
                ),
            ));
        }
        resolved.push(Route {
            name,
            path: RoutePath::new(path, section.case_insensitive.unwrap_or(false)),
            settings: settings(section, &defaults, lease, retention, origin, at, warnings)?,
        });
    }
    resolved.push(Route {
        name: DEFAULT_ROUTE.to_owned(),
        path: RoutePath::new(PathPattern::Prefix("/".to_owned()), false),
        settings: defaults,
    });
    Ok(resolved)
}

/// The unknown-outcome settings of a route section over its parent's: the hold (`None`: until
/// resolved), the grace of `release` (`None`: the lease) and the reconcile template.
#[allow(clippy::type_complexity)]
fn unknown_settings(
    section: &RouteSection,
    parent: &RouteSettings,
    origin: &Origin,
) -> Result<(Option<Duration>, Option<Duration>, Option<String>), GatewayConfigError> {
    let unknown_hold = match section.unknown_hold {
        Some(HumanDuration(d)) if d.is_zero() => None,
        Some(HumanDuration(d)) => Some(d),
        None => parent.unknown_hold,
    };
    // Unset, the grace is the route's lease (whatever lease it gets).
    let release_grace = match &section.release_grace {
        Some(grace) => Some(positive(
            grace.get_ref().0,
            "release_grace",
            origin,
            Some(grace.span().start),
        )?),
        None => parent.release_grace,
    };
    let reconcile = match &section.reconcile {
        Some(template) => Some(reconcile_template(template, origin)?),
        None => parent.reconcile.clone(),
    };
    Ok((unknown_hold, release_grace, reconcile))
}

/// A `reconcile` path template: an absolute path with `{key}` exactly once, where the key goes
/// percent-encoded.
fn reconcile_template(
    template: &Spanned<String>,
    origin: &Origin,
) -> Result<String, GatewayConfigError> {
    let text = template.get_ref();
    let fail = |why: &str| {
        origin.error_at(
            Some(template.span().start),
            format!("reconcile = {text:?}: {why}"),
        )
    };
    if !text.starts_with('/') {
        return Err(fail("a path on the upstream starts with /"));
    }
    if text.starts_with("//") {
        return Err(fail(
            "a path that starts with // reads as another host to some servers",
        ));
    }
    if text.contains('#') {
        return Err(fail("a fragment is never sent"));
    }
    let path = text.split('?').next().unwrap_or_default();
    if path
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(fail(
            "a . or .. segment is resolved by the upstream, not sent as written",
        ));
    }
    if text.matches("{key}").count() != 1 {
        return Err(fail("the template names {key} exactly once"));
    }
    let probe = text.replace("{key}", "k");
    if http::uri::PathAndQuery::try_from(probe.as_str()).is_err() || probe.contains(['{', '}']) {
        return Err(fail("not a valid path and query"));
    }
    Ok(text.clone())
}
