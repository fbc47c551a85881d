//! The sessions of the operator page: a browser cannot send a bearer header from a link, so
//! `POST /ui/login` with the admin token opens a session held in this process and names it in
//! an `HttpOnly; SameSite=Strict` cookie (with `Secure` when the browser reached the listener
//! over HTTPS, through a proxy that says so), written and read by the `cookie` crate. On a
//! listener without a token, the page opens a session for a visitor that comes without one.
//! Each session carries its own CSRF token, which every form of the page repeats: a form is
//! taken only with the token of the session its cookie names (a request with the bearer
//! header needs none: a browser never sends that header on its own). Sessions end after 12
//! hours, on logout, or when the process stops.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use cookie::{Cookie, SameSite};
use http::HeaderMap;
use http::header;
use idem_core::OwnerToken;

use super::access::same;

/// The cookie that names a session.
pub(crate) const COOKIE: &str = "idem_admin_session";
/// How long a session lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// At most this many sessions are kept (the oldest goes first).
const MAX_SESSIONS: usize = 256;

/// 256 random bits as 64 hex digits (two UUID v4 draws from a CSPRNG: 244 random bits).
fn secret() -> String {
    format!("{}{}", OwnerToken::random(), OwnerToken::random())
}

struct Session {
    csrf: String,
    until: Instant,
}

/// The open sessions.
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Sessions")
            .field("open", &open.len())
            .finish_non_exhaustive()
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new()
    }
}

impl Sessions {
    /// No session yet.
    #[must_use]
    pub(crate) fn new() -> Self {
        Sessions {
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a session: returns its id (for the cookie); [`Sessions::csrf_of`] its CSRF token.
    pub(crate) fn open(&self) -> String {
        let id = secret();
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, session| session.until > now);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, session)| session.until)
                .map(|(id, _)| id.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(
            id.clone(),
            Session {
                csrf: secret(),
                until: now + LIFETIME,
            },
        );
        id
    }

    /// The CSRF token of the live session `id`, compared in constant time.
    #[must_use]
    pub(crate) fn csrf_of(&self, id: &str) -> Option<String> {
        let now = Instant::now();
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .find(|(candidate, session)| {
                session.until > now && same(candidate.as_bytes(), id.as_bytes())
            })
            .map(|(_, session)| session.csrf.clone())
    }

    /// Ends the session `id`.
    pub(crate) fn close(&self, id: &str) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|candidate, _| !same(candidate.as_bytes(), id.as_bytes()));
    }
}

/// The session id the `Cookie` headers of a request name, if any (a request may split its
/// cookies over several headers).
#[must_use]
pub(crate) fn cookie_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|cookie| cookie.name() == COOKIE)
        .map(|cookie| cookie.value().to_owned())
}

/// Whether the browser reached the listener over HTTPS: the request's URI says so, or a proxy
/// in front of the listener did (`X-Forwarded-Proto: https`). The session cookie is then
/// `Secure`. A forged header only makes the cookie stricter.
#[must_use]
pub(crate) fn over_https(uri: &http::Uri, headers: &HeaderMap) -> bool {
    uri.scheme_str() == Some("https")
        || headers
            .get("x-forwarded-proto")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value that names the session `id` for [`LIFETIME`], or with `None`
/// removes the cookie.
#[must_use]
pub(crate) fn set_cookie(id: Option<&str>, secure: bool) -> String {
    let lifetime = id.map_or(0, |_| LIFETIME.as_secs());
    Cookie::build((COOKIE, id.unwrap_or_default()))
        .path("/ui")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(lifetime).unwrap_or(i64::MAX),
        ))
        .to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_session_has_its_own_csrf_token_until_closed() {
        let sessions = Sessions::new();
        let a = sessions.open();
        let b = sessions.open();
        assert_eq!(a.len(), 64);
        let csrf_a = sessions.csrf_of(&a).unwrap();
        assert_ne!(csrf_a, sessions.csrf_of(&b).unwrap());
        assert_eq!(csrf_a.len(), 64);
        assert_eq!(sessions.csrf_of("nope"), None);
        sessions.close(&a);
        assert_eq!(sessions.csrf_of(&a), None);
        assert!(sessions.csrf_of(&b).is_some());
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_read_back() {
        let id = "a".repeat(64);
        let set = set_cookie(Some(&id), false);
        for part in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=43200"] {
            assert!(set.contains(part), "{part} not in {set}");
        }
        assert!(!set.contains("Secure"), "{set}");
        assert!(set_cookie(Some(&id), true).contains("Secure"));
        assert!(set_cookie(None, false).contains("Max-Age=0"));
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, "a=1; other=2".parse().unwrap());
        assert_eq!(cookie_of(&headers), None);
        let pair = set.split(';').next().unwrap();
        headers.append(header::COOKIE, format!("b=3; {pair}").parse().unwrap());
        assert_eq!(cookie_of(&headers), Some(id));
    }
}
