//! Where the scope of a request comes from: a credential header (hashed), a tenant header (as
//! sent), one named cookie (hashed), several of those combined (hashed together), a closure, or
//! nothing. See [`ConfigBuilder::scope_by_all`](crate::ConfigBuilder::scope_by_all).
//!
//! The scope keeps one principal's records apart from another's: a request is answered only
//! from a record of its own scope. An application that authenticates by a cookie or an API-key
//! header, and is scoped by `Authorization` (the default), would replay one caller's response
//! to another who sends the same key and body: it must be scoped by that cookie or header.
//!
//! Two safeguards hold whatever the source:
//! - A request whose configured source is absent but that carries credentials (an
//!   `Authorization` or `Cookie` header) is scoped by a hash of those (all of them, as sent),
//!   not the shared "no scope": two callers with different credentials never share a record
//!   unless scoping is off ([`ConfigBuilder::no_scope`](crate::ConfigBuilder::no_scope)) or a
//!   closure decides.
//! - A hashed scope is an HMAC-SHA256 under the layer's scope secret when one is set
//!   ([`ConfigBuilder::scope_secret`](crate::ConfigBuilder::scope_secret)), so that a scope
//!   shown in logs, the admin pages or the store cannot be checked offline against guessed
//!   credentials; without one it is a plain SHA-256 of the credential.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, header, request};
use idem_core::Scope;
use sha2::Sha256;

/// The secret a hashed scope is keyed with (HMAC-SHA256): every layer and gateway of one store
/// must share it, or they would not find each other's records. Its bytes never appear in
/// `Debug` output.
#[derive(Clone)]
pub struct ScopeSecret(Hmac<Sha256>);

impl ScopeSecret {
    /// The shortest secret taken, in bytes.
    pub const MIN_LEN: usize = 16;

    /// A secret of `bytes` (at least [`ScopeSecret::MIN_LEN`]).
    ///
    /// # Errors
    /// [`LayerConfigError::ShortScopeSecret`](crate::LayerConfigError::ShortScopeSecret).
    pub fn new(bytes: &[u8]) -> Result<Self, crate::LayerConfigError> {
        if bytes.len() < Self::MIN_LEN {
            return Err(crate::LayerConfigError::ShortScopeSecret);
        }
        Hmac::new_from_slice(bytes)
            .map(ScopeSecret)
            .map_err(|_| crate::LayerConfigError::ShortScopeSecret)
    }

    /// The scope named by the keyed hash of `credential`: 32 hex digits (128 bits of the
    /// HMAC), like [`Scope::from_secret`].
    fn scope(&self, credential: &[u8]) -> Scope {
        let mut mac = self.0.clone();
        mac.update(credential);
        let digest = mac.finalize().into_bytes();
        let mut name = String::with_capacity(32);
        for byte in &digest[..16] {
            name.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            name.push(char::from(b"0123456789abcdef"[usize::from(byte & 0x0f)]));
        }
        // 32 hex digits are always a valid scope name.
        Scope::new(name).unwrap_or_else(|_| Scope::from_secret(credential))
    }
}

impl fmt::Debug for ScopeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopeSecret(..)")
    }
}

/// The scope of a credential: keyed by `secret` when there is one.
fn hashed(secret: Option<&ScopeSecret>, credential: &[u8]) -> Scope {
    match secret {
        Some(secret) => secret.scope(credential),
        None => Scope::from_secret(credential),
    }
}

/// Derives a scope from a request (see [`ConfigBuilder::scope_with`]); `None` refuses the
/// request with 400.
///
/// [`ConfigBuilder::scope_with`]: crate::ConfigBuilder::scope_with
pub type ScopeFn = dyn Fn(&request::Parts) -> Option<Scope> + Send + Sync;

/// One source of a combined scope ([`ConfigBuilder::scope_by_all`]).
///
/// [`ConfigBuilder::scope_by_all`]: crate::ConfigBuilder::scope_by_all
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopePart {
    /// A header's value (`Authorization`, a tenant header, an API-key header). Sent on two
    /// field lines, it names no single principal: the request is refused with 400.
    Header(HeaderName),
    /// The value of one named cookie of the `Cookie` header (its name is matched
    /// case-sensitively). A cookie sent more than once (a browser sends one per path that set
    /// it) counts with every value, in order.
    Cookie(String),
}

impl ScopePart {
    /// The `Authorization` header.
    #[must_use]
    pub fn authorization() -> Self {
        ScopePart::Header(header::AUTHORIZATION)
    }

    /// The header `name`.
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidHeaderName`](crate::LayerConfigError::InvalidHeaderName).
    pub fn header(name: &str) -> Result<Self, crate::LayerConfigError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(ScopePart::Header)
            .map_err(|_| crate::LayerConfigError::InvalidHeaderName(name.to_owned()))
    }

    /// The cookie `name`.
    ///
    /// # Errors
    /// [`LayerConfigError::InvalidCookieName`](crate::LayerConfigError::InvalidCookieName): not an
    /// RFC 6265 cookie name (a token: visible ASCII without separators).
    pub fn cookie(name: &str) -> Result<Self, crate::LayerConfigError> {
        if is_cookie_name(name) {
            Ok(ScopePart::Cookie(name.to_owned()))
        } else {
            Err(crate::LayerConfigError::InvalidCookieName(name.to_owned()))
        }
    }

    /// Whether the part names something a request can carry.
    pub(crate) fn is_valid(&self) -> bool {
        match self {
            ScopePart::Header(_) => true,
            ScopePart::Cookie(name) => is_cookie_name(name),
        }
    }

    /// Appends what the request carries of this part: a byte that tells absent (0) from
    /// present (1), then each value with its length, so that no two requests that differ in a
    /// part, an absence or an empty value encode alike.
    fn encode(&self, headers: &HeaderMap, out: &mut Vec<u8>) -> Result<bool, InvalidScope> {
        let values: Vec<&[u8]> = match self {
            ScopePart::Header(name) => single(headers, name)?
                .map(HeaderValue::as_bytes)
                .into_iter()
                .collect(),
            ScopePart::Cookie(name) => cookie_values(headers, name).collect(),
        };
        if values.is_empty() {
            out.push(0);
            return Ok(false);
        }
        out.push(1);
        out.extend_from_slice(&(values.len() as u64).to_be_bytes());
        for value in values {
            out.extend_from_slice(&(value.len() as u64).to_be_bytes());
            out.extend_from_slice(value);
        }
        Ok(true)
    }
}

/// Whether `name` is an RFC 6265 cookie name: an RFC 9110 token.
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The values of the cookie `name` in the request's `Cookie` field lines (HTTP/2 may split
/// them over several), in order.
fn cookie_values<'h>(headers: &'h HeaderMap, name: &'h str) -> impl Iterator<Item = &'h [u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|line| line.as_bytes().split(|&b| b == b';'))
        .filter_map(move |pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|&b| b == b'=')?;
            let (cookie, value) = pair.split_at(at);
            if cookie.trim_ascii() != name.as_bytes() {
                return None;
            }
            // After the `=`.
            value.get(1..).map(<[u8]>::trim_ascii)
        })
}

/// Where the scope of a request comes from.
#[derive(Clone)]
pub(crate) enum ScopeSource {
    /// A hash of a credential header's value (`Authorization` by default).
    Secret(HeaderName),
    /// A tenant header's value, as sent.
    Header(HeaderName),
    /// A hash of what the request carries of each part, in order.
    Combined(Vec<ScopePart>),
    Custom(Arc<ScopeFn>),
    None,
}

impl fmt::Debug for ScopeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeSource::Secret(name) => write!(f, "Secret({name})"),
            ScopeSource::Header(name) => write!(f, "Header({name})"),
            ScopeSource::Combined(parts) => write!(f, "Combined({parts:?})"),
            ScopeSource::Custom(_) => f.write_str("Custom(..)"),
            ScopeSource::None => f.write_str("None"),
        }
    }
}

/// Why a request has no usable scope.
#[derive(Debug)]
pub(crate) struct InvalidScope;

impl ScopeSource {
    /// The scope source of a header: hashed if it carries a credential, else as sent.
    pub(crate) fn header(name: HeaderName) -> Self {
        if is_credential(&name) {
            ScopeSource::Secret(name)
        } else {
            ScopeSource::Header(name)
        }
    }

    /// The scope of a request, its credentials hashed under `secret` when there is one. A
    /// request the source finds nothing in, but that carries credentials, is scoped by those
    /// ([`credentials`]).
    pub(crate) fn scope_of(
        &self,
        parts: &request::Parts,
        secret: Option<&ScopeSecret>,
    ) -> Result<Scope, InvalidScope> {
        let scope = match self {
            ScopeSource::Secret(name) => single(&parts.headers, name)?
                .map_or_else(Scope::none, |value| hashed(secret, value.as_bytes())),
            ScopeSource::Header(name) => match single(&parts.headers, name)? {
                None => Scope::none(),
                Some(value) => std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|text| Scope::new(text).ok())
                    .ok_or(InvalidScope)?,
            },
            ScopeSource::Combined(sources) => combined(sources, &parts.headers, secret)?,
            ScopeSource::Custom(derive) => return derive(parts).ok_or(InvalidScope),
            ScopeSource::None => return Ok(Scope::none()),
        };
        if scope.is_none() {
            return Ok(credentials(&parts.headers, secret));
        }
        Ok(scope)
    }
}

/// The scope of a request the configured source found nothing in: a hash of every
/// `Authorization` and `Cookie` field line it carries, in order (a session cookie of another
/// name than the configured one, a credential the layer was not told of), so that callers
/// with different credentials do not share the "no scope"; none when it carries neither.
fn credentials(headers: &HeaderMap, secret: Option<&ScopeSecret>) -> Scope {
    let mut encoded: Option<Vec<u8>> = None;
    for name in [header::AUTHORIZATION, header::COOKIE] {
        for value in headers.get_all(&name) {
            let out = encoded.get_or_insert_with(|| b"idem-scope-credentials-v1".to_vec());
            out.extend_from_slice(name.as_str().as_bytes());
            out.push(0);
            out.extend_from_slice(&(value.len() as u64).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
    }
    encoded.map_or_else(Scope::none, |encoded| hashed(secret, &encoded))
}

/// The hash of every part's encoding; no scope when the request carries none of them.
fn combined(
    sources: &[ScopePart],
    headers: &HeaderMap,
    secret: Option<&ScopeSecret>,
) -> Result<Scope, InvalidScope> {
    let mut encoded = b"idem-scope-v1".to_vec();
    let mut any = false;
    for source in sources {
        any |= source.encode(headers, &mut encoded)?;
    }
    Ok(if any {
        hashed(secret, &encoded)
    } else {
        Scope::none()
    })
}

/// Whether a header carries a credential, whose value must never be stored as a scope.
fn is_credential(name: &HeaderName) -> bool {
    [
        header::AUTHORIZATION,
        header::PROXY_AUTHORIZATION,
        header::COOKIE,
        HeaderName::from_static("x-api-key"),
    ]
    .contains(name)
}

/// The one value of the scope header `name`, if it is there. Sent on two field lines it names
/// no single principal (and an application may read either line), so it is refused.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, InvalidScope> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(InvalidScope);
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(source: &ScopeSource, headers: &[(&str, &str)]) -> Option<Scope> {
        let mut request = http::Request::post("/");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (parts, ()) = request.body(()).unwrap().into_parts();
        source.scope_of(&parts, None).ok()
    }

    #[test]
    fn a_cookie_is_found_among_others_and_hashed() {
        let source = ScopeSource::Combined(vec![ScopePart::cookie("session").unwrap()]);
        let a = scope(&source, &[("cookie", "theme=dark; session=abc")]).unwrap();
        assert!(!a.is_none() && !a.as_str().contains("abc"));
        // Another line (HTTP/2 splits cookies), other spacing: the same cookie.
        let split = [("cookie", "theme=dark"), ("cookie", "session=abc ")];
        assert_eq!(scope(&source, &split).unwrap(), a);
        assert_ne!(scope(&source, &[("cookie", "session=abd")]).unwrap(), a);
        // Only a cookie of another name (prefix and case differ): not the session's scope,
        // and not the shared no-scope either: one of those credentials' own.
        let mut others = Vec::new();
        for other in ["xsession=abc", "Session=abc", "sessionabc"] {
            let found = scope(&source, &[("cookie", other)]).unwrap();
            assert!(!found.is_none() && found != a, "{other}");
            others.push(found);
        }
        assert_ne!(others[0], others[1]);
        assert_ne!(
            scope(&source, &[("cookie", "Session=aaa")]),
            scope(&source, &[("cookie", "Session=bbb")])
        );
        assert!(scope(&source, &[]).unwrap().is_none());
        // Present but empty is not absent.
        assert!(!scope(&source, &[("cookie", "session=")]).unwrap().is_none());
    }

    #[test]
    fn combined_parts_tell_absent_from_empty_and_keep_their_places() {
        let source = ScopeSource::Combined(vec![
            ScopePart::authorization(),
            ScopePart::cookie("session").unwrap(),
            ScopePart::header("x-api-key").unwrap(),
        ]);
        let only_empty_key = scope(&source, &[("x-api-key", "")]).unwrap();
        let only_empty_cookie = scope(&source, &[("cookie", "session=")]).unwrap();
        assert_ne!(only_empty_key, only_empty_cookie);
        assert!(!only_empty_key.is_none());
        let both = [("authorization", "a"), ("x-api-key", "b")];
        let swapped = [("authorization", "b"), ("x-api-key", "a")];
        assert_ne!(scope(&source, &both), scope(&source, &swapped));
        // A repeated header is refused, as for a single scope header.
        assert!(scope(&source, &[("x-api-key", "a"), ("x-api-key", "b")]).is_none());
    }

    #[test]
    fn credentials_the_source_does_not_name_never_share_the_no_scope() {
        let tenant = ScopeSource::header(HeaderName::from_static("x-tenant"));
        let by_auth = ScopeSource::Secret(header::AUTHORIZATION);
        for source in [&tenant, &by_auth] {
            assert!(scope(source, &[]).unwrap().is_none());
            let a = scope(source, &[("cookie", "sid=a")]).unwrap();
            let b = scope(source, &[("cookie", "sid=b")]).unwrap();
            assert!(!a.is_none() && a != b);
        }
        let a = scope(&tenant, &[("authorization", "Bearer a")]).unwrap();
        assert!(!a.is_none());
        // No scope at all stays no scope.
        assert!(
            scope(&ScopeSource::None, &[("authorization", "Bearer a")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_scope_secret_keys_the_hash() {
        let request = http::Request::post("/")
            .header("authorization", "Bearer AAA")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let source = ScopeSource::Secret(header::AUTHORIZATION);
        let plain = source.scope_of(&parts, None).unwrap();
        assert_eq!(plain, Scope::from_secret(b"Bearer AAA"));
        let one = ScopeSecret::new(b"0123456789abcdef").unwrap();
        let other = ScopeSecret::new(b"0123456789abcdeg").unwrap();
        let keyed = source.scope_of(&parts, Some(&one)).unwrap();
        assert_ne!(keyed, plain);
        assert_eq!(keyed.as_str().len(), 32);
        assert_ne!(keyed, source.scope_of(&parts, Some(&other)).unwrap());
        assert_eq!(keyed, source.scope_of(&parts, Some(&one)).unwrap());
        assert!(ScopeSecret::new(b"short").is_err());
        assert_eq!(format!("{one:?}"), "ScopeSecret(..)");
    }

    #[test]
    fn cookie_names_are_tokens() {
        assert!(ScopePart::cookie("__Host-session").is_ok());
        for bad in ["", "a b", "a=b", "a;b", "sé"] {
            assert!(ScopePart::cookie(bad).is_err(), "{bad:?}");
        }
    }
}
