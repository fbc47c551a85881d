//! Who may ask the admin listener: one `Host` ([`one_host`]), the Host guard of a listener
//! without a token ([`addressed_directly`]), the cross-site guard of every state-changing
//! request ([`cross_site`]), and the throttle on wrong tokens ([`Throttle`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::header;
use http::{Method, Request};
use subtle::ConstantTimeEq as _;

/// Wrong tokens a peer may send within [`WINDOW`] before its wrong tokens are answered 429.
pub(crate) const MAX_FAILURES: u32 = 10;
/// The window [`MAX_FAILURES`] counts in.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// At most this many peers are remembered (those whose window ended go first).
const MAX_PEERS: usize = 4096;

/// Compares two secrets in constant time (`subtle`): the time taken does not tell how much of
/// a guess was right. Only the length may show, and the length of a token is no secret.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

/// Whether `request` has at most one `Host` field line. Two could each name another host to
/// whoever reads them (RFC 9112 section 3.2 asks a server to refuse them with 400), as the
/// gateway's own listener does.
#[must_use]
pub(crate) fn one_host<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get_all(header::HOST)
        .iter()
        .nth(1)
        .is_none()
}

/// Whether `request` changes something (any method but `GET`, `HEAD` and `OPTIONS`) and a
/// browser sent it from another site: a form or a script of a page the operator visits
/// (another port of `localhost` is another origin: a page the gateway proxies is one).
///
/// A browser says where a request comes from: `Sec-Fetch-Site` (every current browser), which
/// must be `same-origin` (or `none`: the operator's own action, a bookmark); without it,
/// `Origin`, which must name the host and port the request is addressed to (`Host`), as the
/// browser saw them. A request with neither comes from no browser (curl, `idem keys --admin`)
/// and is not refused here: the token, when one is set, guards it.
#[must_use]
pub(crate) fn cross_site<B>(request: &Request<B>) -> bool {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return false;
    }
    let headers = request.headers();
    if let Some(site) = headers.get("sec-fetch-site") {
        return !(site == "same-origin" || site == "none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let origin_authority = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.parse::<http::Uri>().ok())
        .and_then(|uri| uri.authority().map(|a| a.as_str().to_ascii_lowercase()));
    let host = match request.uri().authority() {
        Some(authority) => Some(authority.as_str().to_ascii_lowercase()),
        None => headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .map(str::to_ascii_lowercase),
    };
    match (origin_authority, host) {
        (Some(origin), Some(host)) => origin != host,
        // `Origin: null` (a sandboxed page, a redirect across sites), or no host to compare.
        _ => true,
    }
}

/// Whether `request` names this listener by an IP address or `localhost` (or names no host).
///
/// Without a token, that is what keeps a web page out of the key API and `/ui`: the page of a
/// site the operator visits can point its own host name at 127.0.0.1 (DNS rebinding), and the
/// browser then lets it read the admin listener's answers, `/ui`'s CSRF token included. Such a
/// request always carries that host name; one addressed by IP cannot come from it.
#[must_use]
pub(crate) fn addressed_directly<B>(request: &Request<B>) -> bool {
    let authority = match request.uri().authority() {
        Some(authority) => Some(authority.clone()),
        None => match request.headers().get(header::HOST) {
            // A Host that is not an authority at all is not a name a page could have used.
            Some(value) => match http::uri::Authority::try_from(value.as_bytes()) {
                Ok(authority) => Some(authority),
                Err(_) => return false,
            },
            None => None,
        },
    };
    let Some(authority) = authority else {
        return true;
    };
    let host = authority.host().to_ascii_lowercase();
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    bare.parse::<IpAddr>().is_ok() || host == "localhost" || host.ends_with(".localhost")
}

/// The peer a failure is counted against: its address, or its /64 network for IPv6 (one host
/// commonly holds a whole /64). `None` when the address is not known.
fn peer_of(address: Option<IpAddr>) -> Option<IpAddr> {
    address.map(|ip| match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        IpAddr::V4(_) => ip,
    })
}

struct Failures {
    count: u32,
    since: Instant,
}

/// Wrong tokens by peer, in fixed windows: after [`MAX_FAILURES`] in one [`WINDOW`], the peer's
/// requests with a wrong token are answered 429 until the window ends (a log line and a 401
/// each no more). The right token is still accepted: the throttle holds back the failures, not
/// the operator who shares an address with whoever sends them.
#[derive(Default)]
pub(crate) struct Throttle {
    peers: Mutex<HashMap<Option<IpAddr>, Failures>>,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Throttle")
            .field("peers", &peers.len())
            .finish()
    }
}

impl Throttle {
    /// No failure counted yet.
    #[must_use]
    pub(crate) fn new() -> Self {
        Throttle::default()
    }

    /// How long the peer at `address` must wait before a token of its is checked again, if it
    /// must.
    #[must_use]
    pub(crate) fn wait(&self, address: Option<IpAddr>) -> Option<Duration> {
        self.wait_at(address, Instant::now())
    }

    /// Counts a wrong token from the peer at `address`.
    pub(crate) fn failed(&self, address: Option<IpAddr>) {
        self.failed_at(address, Instant::now());
    }

    fn wait_at(&self, address: Option<IpAddr>, now: Instant) -> Option<Duration> {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let failures = peers.get(&peer_of(address))?;
        let end = failures.since + WINDOW;
        (failures.count >= MAX_FAILURES && end > now).then(|| end - now)
    }

    fn failed_at(&self, address: Option<IpAddr>, now: Instant) {
        let peer = peer_of(address);
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, failures| failures.since + WINDOW > now);
            if peers.len() >= MAX_PEERS {
                if let Some(oldest) = peers
                    .iter()
                    .min_by_key(|(_, failures)| failures.since)
                    .map(|(peer, _)| *peer)
                {
                    peers.remove(&oldest);
                }
            }
        }
        let failures = peers.entry(peer).or_insert(Failures {
            count: 0,
            since: now,
        });
        if failures.since + WINDOW <= now {
            *failures = Failures {
                count: 0,
                since: now,
            };
        }
        failures.count = failures.count.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn to(host: Option<&str>, uri: &str) -> Request<()> {
        let mut request = Request::builder().uri(uri);
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn same_compares_whole_secrets() {
        assert!(same(b"admin-test-token", b"admin-test-token"));
        assert!(!same(b"admin-test-token", b"admin-test-tokeN"));
        assert!(!same(b"admin-test-token", b"admin-test-toke"));
        assert!(!same(b"", b"admin-test-token"));
        assert!(same(b"", b""));
    }

    #[test]
    fn addressed_by_ip_or_localhost_only() {
        for host in [
            "127.0.0.1:9901",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:9901",
            "[::1]",
            "localhost:9901",
            "LocalHost",
            "admin.localhost:9901",
        ] {
            assert!(addressed_directly(&to(Some(host), "/ui")), "{host}");
        }
        for host in [
            "evil.example:9901",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9901",
            "not a host",
            "",
        ] {
            assert!(!addressed_directly(&to(Some(host), "/ui")), "{host:?}");
        }
        // No Host at all (HTTP/1.0): not a browser.
        assert!(addressed_directly(&to(None, "/ui")));
        // The URI's authority (HTTP/2, absolute form) wins over the header.
        assert!(!addressed_directly(&to(
            Some("127.0.0.1"),
            "http://evil.example/ui"
        )));
        assert!(addressed_directly(&to(None, "http://127.0.0.1:9901/ui")));
    }

    #[test]
    fn two_host_lines_are_not_one_host() {
        assert!(one_host(&to(Some("127.0.0.1:9901"), "/readyz")));
        assert!(one_host(&to(None, "/readyz")));
        let mut twice = to(Some("127.0.0.1:9901"), "/readyz");
        twice
            .headers_mut()
            .append(header::HOST, "evil.example".parse().unwrap());
        assert!(!one_host(&twice));
    }

    fn sent(method: Method, host: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::builder()
            .method(method)
            .uri("/ui/delete")
            .header(header::HOST, host);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn a_change_from_another_site_is_cross_site() {
        let host = "127.0.0.1:9901";
        for refused in [
            &[("sec-fetch-site", "cross-site")][..],
            // Another port of the same host is the same site, not the same origin.
            &[("sec-fetch-site", "same-site")],
            &[
                ("sec-fetch-site", "cross-site"),
                ("origin", "http://127.0.0.1:9901"),
            ],
            &[("origin", "http://127.0.0.1:8080")],
            &[("origin", "http://evil.example")],
            &[("origin", "null")],
        ] {
            assert!(
                cross_site(&sent(Method::POST, host, refused)),
                "{refused:?}"
            );
            assert!(
                cross_site(&sent(Method::DELETE, host, refused)),
                "{refused:?}"
            );
        }
        for taken in [
            &[][..],
            &[("sec-fetch-site", "same-origin")],
            &[("sec-fetch-site", "none")],
            &[("origin", "http://127.0.0.1:9901")],
            &[("origin", "HTTP://127.0.0.1:9901")],
        ] {
            assert!(!cross_site(&sent(Method::POST, host, taken)), "{taken:?}");
        }
        // Reading is never refused here (the page's own checks apply).
        let read = sent(Method::GET, host, &[("sec-fetch-site", "cross-site")]);
        assert!(!cross_site(&read));
    }

    #[test]
    fn ten_wrong_tokens_a_minute_then_wait_for_the_window() {
        let throttle = Throttle::new();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        let start = Instant::now();
        for _ in 0..MAX_FAILURES - 1 {
            throttle.failed_at(a, start);
        }
        assert_eq!(throttle.wait_at(a, start), None);
        throttle.failed_at(a, start);
        let later = start + Duration::from_secs(20);
        assert_eq!(
            throttle.wait_at(a, later),
            Some(WINDOW - Duration::from_secs(20))
        );
        // Another peer is not held back.
        assert_eq!(throttle.wait_at(b, later), None);
        // The window ends; the count starts over.
        let next = start + WINDOW;
        assert_eq!(throttle.wait_at(a, next), None);
        throttle.failed_at(a, next);
        assert_eq!(throttle.wait_at(a, next), None);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64() {
        let throttle = Throttle::new();
        let start = Instant::now();
        for i in 0..MAX_FAILURES {
            let ip: IpAddr = format!("2001:db8:1:2::{:x}", i + 1).parse().unwrap();
            throttle.failed_at(Some(ip), start);
        }
        let same_net: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_net: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(throttle.wait_at(Some(same_net), start).is_some());
        assert!(throttle.wait_at(Some(other_net), start).is_none());
        // An IPv4-mapped address is its IPv4 address.
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        for _ in 0..MAX_FAILURES {
            throttle.failed_at(Some(mapped), start);
        }
        assert!(
            throttle
                .wait_at(Some(IpAddr::from([10, 0, 0, 7])), start)
                .is_some()
        );
    }

    #[test]
    fn the_table_stays_bounded() {
        let throttle = Throttle::new();
        let start = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 10) {
            throttle.failed_at(Some(IpAddr::from(i.to_be_bytes())), start);
        }
        assert!(throttle.peers.lock().unwrap().len() <= MAX_PEERS);
    }
}
