//! The foot-guns of a configuration that parses: settings that are always wrong are refused
//! (a [`GatewayConfigError`]), settings that may be intended but are most likely a mistake are taken
//! with a [`ConfigWarning`], which `check-config` prints and `serve` logs. Each says which and
//! why:
//!
//! | setting | refused or warned | why |
//! |---|---|---|
//! | an admin listener on an address that is not loopback, without a token | refused | anyone who reaches the address could list and delete records |
//! | a key header that is a framing or hop-by-hop field (`Content-Length`, `Host`, `Transfer-Encoding`, `Connection`, ...) | refused | it describes the message or the connection, not the operation, and proxies rewrite or drop it |
//! | a `fence_header` or `attempt_header` that is a framing or hop-by-hop field, or one the gateway sets (`X-Forwarded-*`) | refused | the value would be dropped or overwritten on the way, or overwrite the gateway's own |
//! | a `fence_header` or `attempt_header` that is a route's key header | refused | the gateway removes the client's copies of those headers from every request: the upstream would lose the key |
//! | `HEAD`, `OPTIONS`, `CONNECT` or `TRACE` among the covered methods | refused | they have no effect to run once: a stored answer would only be stale |
//! | `GET` among the covered methods | warned | a safe method needs no key, and a replayed GET is a stale read; an API whose GET has effects may mean it |
//! | a method not in upper case (`post`) | refused (by the parser) | method names are case-sensitive: `post` is not `POST` |
//! | an `allow_headers` entry for a header that is never denied | warned | it changes nothing; most likely a typo of one that is |
//! | `[upstream] ca_file` with an `http` upstream | warned | the file is not used: most likely the URL was meant to be `https` |

use std::net::SocketAddr;

use http::{HeaderName, Method};

use super::GatewayConfigError;
use super::internal::{Origin, Route};
use super::toml::UpstreamSection;
use crate::fence::FenceHeaders;

/// Whether `header` describes the message's framing or one connection (idem-http's
/// connection and framing fields, and `Host`): never a key header, never stored (so never
/// allowed).
pub(crate) fn is_framing(header: &HeaderName) -> bool {
    idem_http::fields::is_connection_or_framing(header) || header == http::header::HOST
}

/// A setting that is taken but is most likely a mistake: `check-config` prints it (exit 0) and
/// `serve` logs it at start. One line naming where the setting is, like a [`GatewayConfigError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning(GatewayConfigError);

impl ConfigWarning {
    /// Where the setting is, when known.
    #[must_use]
    pub fn location(&self) -> Option<&str> {
        self.0.location()
    }

    /// What may be wrong with it.
    #[must_use]
    pub fn message(&self) -> &str {
        self.0.message()
    }
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Where [`Config::build`](super::Config::build) collects its warnings.
pub(super) type Warnings = Vec<ConfigWarning>;

/// Adds a warning at a byte offset of the file.
fn warn(warnings: &mut Warnings, origin: &Origin, at: Option<usize>, message: String) {
    warnings.push(ConfigWarning(origin.error_at(at, message)));
}

/// Warns of a `ca_file` that the upstream `url` does not use: it is plain `http` (most likely
/// meant to be `https`, or overridden by `--upstream` for a while).
pub(super) fn unused_ca_file(
    url: &super::UpstreamUrl,
    upstream: &UpstreamSection,
    origin: &Origin,
    warnings: &mut Warnings,
) {
    let at = upstream.ca_file.as_ref().map(|path| path.span().start);
    warn(
        warnings,
        origin,
        at,
        format!(
            "ca_file is set but the upstream {url} is plain http: the file is not used (an https URL uses it)"
        ),
    );
}

/// Warns that credential scopes are plain SHA-256 hashes when no scope secret is set and a
/// route scopes by anything: a scope shown in the admin pages, the key API or the store can
/// then be checked offline against guessed credentials (a Basic password, a short token).
pub(super) fn unkeyed_scopes(routes: &[super::Route], warnings: &mut Warnings) {
    let scoped = routes.iter().any(|route| {
        route.settings.enabled && !matches!(route.settings.scope, super::ScopeSpec::None)
    });
    if scoped {
        warnings.push(ConfigWarning(GatewayConfigError::new(
            None,
            "no scope secret: scopes are unkeyed SHA-256 hashes of credentials, which anyone who \
             sees one (the admin pages, the key API, the store) can check guessed credentials \
             against offline. Set IDEM_SCOPE_SECRET or [store] scope_secret_file (at least 16 \
             bytes, the same on every gateway of the store)",
        )));
    }
}

/// Warns that a route's `reconcile` request names the key alone, on a route whose keys are
/// scoped: the request carries none of the client's credentials, so an upstream that keeps
/// keys per principal cannot tell two principals' same key apart.
pub(super) fn reconcile_by_key_alone(origin: &Origin, at: Option<usize>, warnings: &mut Warnings) {
    warn(
        warnings,
        origin,
        at,
        "reconcile asks the upstream by key alone, with none of the client's credentials, on a \
         route whose keys are scoped: its answer must be the one for that key whoever sent it \
         (keys unique across principals), or two principals' same key get one answer"
            .to_owned(),
    );
}

/// Refuses an admin listener that other machines can reach without a token.
///
/// # Errors
/// The reason, for the caller to place.
pub(super) fn admin_listener(listen: SocketAddr, token: Option<&str>) -> Result<(), String> {
    if token.is_some() || listen.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "the admin listener on {listen} is not on a loopback address and has no token: anyone \
         who reaches it could list and delete records. Set [admin] token (--admin-token, \
         IDEM_ADMIN_TOKEN), or listen on 127.0.0.1 or [::1]"
    ))
}

/// Refuses a key header that is a framing or hop-by-hop field.
///
/// # Errors
/// [`GatewayConfigError`] at `at`.
pub(super) fn key_header(
    header: &HeaderName,
    origin: &Origin,
    at: Option<usize>,
) -> Result<(), GatewayConfigError> {
    if is_framing(header) {
        return Err(origin.error_at(
            at,
            format!(
                "header {header:?} cannot carry the idempotency key: it describes the message's \
                 framing or one connection, and proxies rewrite or drop it (use a header of its \
                 own, such as Idempotency-Key)"
            ),
        ));
    }
    Ok(())
}

/// A `fence_header` or `attempt_header` as written: refused when it is not a header name, or
/// cannot carry a value to the upstream ([`crate::fence::refused_name`]).
///
/// # Errors
/// [`GatewayConfigError`] at `at`.
pub(super) fn fence_header(
    written: &str,
    origin: &Origin,
    at: Option<usize>,
) -> Result<HeaderName, GatewayConfigError> {
    let header = HeaderName::from_bytes(written.as_bytes())
        .map_err(|_| origin.error_at(at, format!("{written:?} is not a header name")))?;
    if let Some(why) = crate::fence::refused_name(&header) {
        return Err(origin.error_at(
            at,
            format!(
                "header {header:?} cannot carry the fence or the attempt number to the upstream: \
                 {why} (use a header of its own, such as Idempotency-Fence)"
            ),
        ));
    }
    Ok(header)
}

/// Refuses fence headers named like a route's key header: the gateway removes the client's
/// copies of the fence headers from every request, so the upstream would never see the key.
///
/// # Errors
/// [`GatewayConfigError`] at the fence header's name in `[upstream]` (or the section, for a default
/// name).
pub(super) fn fence_headers_apart_from_keys(
    fence: &FenceHeaders,
    routes: &[Route],
    written: &UpstreamSection,
    origin: &Origin,
) -> Result<(), GatewayConfigError> {
    let clashes = [
        (&fence.fence, "fence_header", written.fence_header.as_ref()),
        (
            &fence.attempt,
            "attempt_header",
            written.attempt_header.as_ref(),
        ),
    ];
    for (name, setting, at) in clashes {
        if let Some(route) = routes.iter().find(|route| route.settings.header == *name) {
            return Err(origin.error_at(
                at.map(|written| written.span().start),
                format!(
                    "{setting} {name:?} is the key header of route {:?}: the gateway removes a \
                     client's {name} from every request, so the upstream would never see the key \
                     (give the fence headers names of their own)",
                    route.name
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses the covered methods that have no effect to run once, and warns of `GET`.
///
/// # Errors
/// [`GatewayConfigError`] at `at` for `HEAD`, `OPTIONS`, `CONNECT` or `TRACE`.
pub(super) fn methods(
    methods: &[Method],
    origin: &Origin,
    at: Option<usize>,
    warnings: &mut Warnings,
) -> Result<(), GatewayConfigError> {
    for method in methods {
        match *method {
            Method::HEAD | Method::OPTIONS | Method::CONNECT | Method::TRACE => {
                return Err(origin.error_at(
                    at,
                    format!(
                        "{method} is not an idempotency candidate: it has no effect to run once, \
                         and a stored answer would only be stale (cover POST, PATCH, or methods \
                         with effects)"
                    ),
                ));
            }
            Method::GET => warn(
                warnings,
                origin,
                at,
                "GET is covered: a safe method needs no idempotency key, and a keyed GET is \
                 answered from its first response until the retention ends (a stale read); \
                 keep it only if this API's GET has effects"
                    .to_owned(),
            ),
            _ => {}
        }
    }
    Ok(())
}

/// Warns of `allow_headers` entries that change nothing: headers the layer stores anyway (the
/// default deny list does not name them), or that `deny_headers` denies, which wins.
pub(super) fn allowed_headers(
    allow: &[HeaderName],
    deny: &[HeaderName],
    origin: &Origin,
    at: Option<usize>,
    warnings: &mut Warnings,
) {
    let defaults = idem_http::Config::builder().build().ok();
    for name in allow {
        if deny.contains(name) {
            warn(
                warnings,
                origin,
                at,
                format!(
                    "allow_headers names {name}, which deny_headers names too: deny wins, it is \
                     not stored"
                ),
            );
        } else if defaults.as_ref().is_some_and(|c| c.stores_header(name)) {
            warn(
                warnings,
                origin,
                at,
                format!(
                    "allow_headers names {name}, which is never denied: it is stored anyway, so \
                     the entry changes nothing (it re-allows set-cookie, date, www-authenticate \
                     or proxy-authenticate)"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_admin_listener_off_loopback_needs_a_token() {
        for open in [
            "0.0.0.0:9901",
            "[::]:9901",
            "10.0.0.5:9901",
            "[2001:db8::1]:9901",
        ] {
            let addr: SocketAddr = open.parse().unwrap();
            let reason = admin_listener(addr, None).unwrap_err();
            assert!(reason.contains("has no token"), "{reason}");
            assert_eq!(admin_listener(addr, Some("a-token-of-16-bytes")), Ok(()));
        }
        for local in [
            "127.0.0.1:9901",
            "127.0.0.2:0",
            "[::1]:9901",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert_eq!(
                admin_listener(local.parse().unwrap(), None),
                Ok(()),
                "{local}"
            );
        }
    }
}
