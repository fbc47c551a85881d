//! The value types of the configuration: each parses from text (the file and the flags use the
//! same parser, so both give the same error), and never panics on any input.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use http::{Method, Uri};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::normal_path::{self, NormalPath};

/// Implements `Deserialize` through `FromStr`, so a bad value is reported by toml with the
/// position of the value.
macro_rules! deserialize_from_str {
    ($ty:ty, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: de::Error>(self, text: &str) -> Result<$ty, E> {
                        text.parse().map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(V)
            }
        }
    };
}

/// A duration written the human way: `30s`, `24h`, `1h 30m`, `250ms`; at most
/// [`HumanDuration::MAX`] (100 years).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The longest duration a setting takes: 100 years (of 365.25 days, as humantime counts
    /// `100y`). Longer ones are typing mistakes, and no store keeps a record that long (each
    /// clamps its expiry, each somewhere else); one of about 292 billion years no longer fits
    /// the clock a deadline is counted on.
    pub(crate) const MAX: Duration = Duration::from_secs(100 * 31_557_600);
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let duration = humantime::parse_duration(text.trim()).map_err(|err| {
            format!("invalid duration {text:?}: {err} (write it like 30s, 24h or 1h 30m)")
        })?;
        if duration > HumanDuration::MAX {
            return Err(format!(
                "invalid duration {text:?}: longer than 100 years (write it like 30s, 24h or 1h 30m)"
            ));
        }
        Ok(HumanDuration(duration))
    }
}

deserialize_from_str!(HumanDuration, "a duration such as \"30s\" or \"24h\"");

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// A listening address as written: an IP address and a port (`127.0.0.1:8080`, `[::1]:8080`,
/// `0.0.0.0:8080`), or a host name and a port (`localhost:8080`); port 0 picks a free port.
///
/// A host name is resolved when the configuration is built ([`ListenAddr::resolve`]) and the
/// listener binds the first address the system's resolver gives for it (its preferred one),
/// as one listener, on one port. A name whose last label does not start with a letter
/// (`127.1`, `0x7f.1`) is refused rather than resolved: the resolver would read it as an IPv4
/// address in a legacy form, which is most likely a typing mistake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListenAddr {
    /// An IP address and a port.
    Ip(SocketAddr),
    /// A host name and a port.
    Name {
        /// The name, as written.
        host: String,
        /// The port.
        port: u16,
    },
}

impl ListenAddr {
    /// The address to bind: the IP address as written, or the first address the host name
    /// resolves to.
    ///
    /// # Errors
    /// The name does not resolve, or resolves to no address.
    pub(crate) fn resolve(&self) -> Result<SocketAddr, String> {
        let (host, port) = match self {
            ListenAddr::Ip(addr) => return Ok(*addr),
            ListenAddr::Name { host, port } => (host.as_str(), *port),
        };
        let mut addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host, port)).map_err(|err| {
            format!("cannot listen on {host}:{port}: {host:?} does not resolve ({err})")
        })?;
        addrs.next().ok_or_else(|| {
            format!("cannot listen on {host}:{port}: {host:?} resolves to no address")
        })
    }
}

/// Whether `host` is a host name a listening address may name: dot-separated labels of ASCII
/// letters, digits and `-` (not at either end), 1 to 63 bytes each and 253 in all, the last
/// starting with a letter.
fn is_host_name(host: &str) -> bool {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    host.len() <= 253
        && host.split('.').all(label_ok)
        && host
            .rsplit('.')
            .next()
            .is_some_and(|last| last.starts_with(|c: char| c.is_ascii_alphabetic()))
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if let Ok(addr) = trimmed.parse::<SocketAddr>() {
            return Ok(ListenAddr::Ip(addr));
        }
        let bad = || {
            format!(
                "invalid address {text:?}: write it like 127.0.0.1:8080, [::1]:8080 or \
                 localhost:8080 (an IP address or a host name, and a port from 0 to 65535)"
            )
        };
        let (host, port) = trimmed.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        if !is_host_name(host) {
            return Err(bad());
        }
        Ok(ListenAddr::Name {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Ip(addr) => addr.fmt(f),
            ListenAddr::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

deserialize_from_str!(
    ListenAddr,
    "an address such as \"127.0.0.1:8080\" or \"localhost:8080\""
);

/// A size in bytes: an integer, or text with a unit (`512`, `64KiB`, `1MiB`, `1GiB`; `kB`,
/// `MB`, `GB` are powers of 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (digits, unit) = trimmed.split_at(split);
        let bad = || format!("invalid size {text:?}: write it like 1048576, 64KiB or 1MiB");
        let number: u64 = digits.parse().map_err(|_| bad())?;
        let factor: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "kB" | "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            _ => return Err(bad()),
        };
        number
            .checked_mul(factor)
            .map(ByteSize)
            .ok_or_else(|| format!("size {text:?} is too large"))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes, such as 1048576 or \"1MiB\"")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<ByteSize, E> {
                u64::try_from(n)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {n}: a size is not negative")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(n))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The upstream's base URL: `http://HOST[:PORT]` or `https://HOST[:PORT]` (the port is 80 or
/// 443 when none is written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `http` or `https`.
    pub scheme: http::uri::Scheme,
    /// `HOST[:PORT]`.
    pub authority: http::uri::Authority,
}

impl UpstreamUrl {
    /// Whether the upstream speaks TLS (`https`).
    #[must_use]
    pub fn is_https(&self) -> bool {
        self.scheme == http::uri::Scheme::HTTPS
    }

    /// The port: as written, or the scheme's (80 for `http`, 443 for `https`).
    #[must_use]
    pub fn port(&self) -> u16 {
        let default = if self.is_https() { 443 } else { 80 };
        self.authority.port_u16().unwrap_or(default)
    }

    /// The host without the brackets of an IPv6 address: what is resolved, and the name the
    /// upstream's certificate must carry.
    #[must_use]
    pub fn host(&self) -> &str {
        let host = self.authority.host();
        host.strip_prefix('[')
            .and_then(|host| host.strip_suffix(']'))
            .unwrap_or(host)
    }
}

impl FromStr for UpstreamUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let uri: Uri = text
            .parse()
            .map_err(|err| format!("invalid upstream URL {text:?}: {err}"))?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(format!(
                "invalid upstream URL {text:?}: write it like http://127.0.0.1:3000"
            ));
        };
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!(
                "unsupported upstream scheme {:?} in {text:?}: idem speaks http or https to its upstream",
                scheme.as_str()
            ));
        }
        if authority.host().is_empty() || authority.as_str().contains('@') {
            return Err(format!(
                "invalid upstream URL {text:?}: write it like http://127.0.0.1:3000"
            ));
        }
        let url = UpstreamUrl { scheme, authority };
        // The name TLS sends (SNI) and checks the certificate against: a DNS name or an IP
        // address.
        if url.is_https() && rustls::pki_types::ServerName::try_from(url.host()).is_err() {
            return Err(format!(
                "invalid upstream URL {text:?}: {:?} is not a host name a certificate can name",
                url.host()
            ));
        }
        let UpstreamUrl { scheme, authority } = url;
        // The port as written (`http` accepts any digits there): 1 to 65535, or none.
        let port = authority
            .as_str()
            .strip_prefix(authority.host())
            .and_then(|rest| rest.strip_prefix(':'));
        if let Some(port) = port {
            if !port.parse::<u16>().is_ok_and(|port| port > 0) {
                return Err(format!(
                    "invalid upstream URL {text:?}: port {port:?} is not a number from 1 to 65535"
                ));
            }
        }
        if parts
            .path_and_query
            .is_some_and(|pq| pq.as_str() != "/" && !pq.as_str().is_empty())
        {
            return Err(format!(
                "invalid upstream URL {text:?}: no path or query (requests keep their own path)"
            ));
        }
        Ok(UpstreamUrl { scheme, authority })
    }
}

deserialize_from_str!(
    UpstreamUrl,
    "an upstream URL such as \"http://127.0.0.1:3000\""
);

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

/// Which paths a route covers: a prefix (`/payments` covers `/payments` and `/payments/...`,
/// not `/paymentsx`) or a glob (`*` stands for any text within one segment, `**` for any number
/// of whole segments: `/v1/*/orders/**`).
///
/// A route matches the normal form of the request path (as nginx does: see the README), without its
/// trailing `/`; the parser puts the pattern in the same form (`//payments/` is `/payments`,
/// `/%70ayments` is `/payments`), so a prefix written with a trailing `/` covers the bare path
/// too, and refuses a pattern with a `..` segment, which would say another path than it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathPattern {
    /// A path prefix, at segment boundaries.
    Prefix(String),
    /// A glob over segments.
    Glob(Vec<String>),
}

impl FromStr for PathPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if !text.starts_with('/') {
            return Err(format!("invalid path {text:?}: a route path starts with /"));
        }
        if text.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(format!(
                "invalid path {text:?}: only printable ASCII without spaces (percent-encode the rest)"
            ));
        }
        if text.contains(['?', '#']) {
            return Err(format!(
                "invalid path {text:?}: a route matches the path alone, without a query or fragment"
            ));
        }
        if normal_path::decode(text).split('/').any(|s| s == "..") {
            return Err(format!(
                "invalid path {text:?}: a route path has no .. segment (write the path it stands for)"
            ));
        }
        let normal =
            NormalPath::new(text).map_err(|err| format!("invalid path {text:?}: {err}"))?;
        let normal = normal.for_matching();
        if !normal.contains('*') {
            return Ok(PathPattern::Prefix(normal.to_owned()));
        }
        let segments: Vec<String> = normal
            .strip_prefix('/')
            .unwrap_or(normal)
            .split('/')
            .map(str::to_owned)
            .collect();
        if let Some(bad) = segments
            .iter()
            .find(|s| s.contains("**") && s.as_str() != "**")
        {
            return Err(format!(
                "invalid path {text:?}: ** stands alone in a segment ({bad:?})"
            ));
        }
        Ok(PathPattern::Glob(segments))
    }
}

deserialize_from_str!(
    PathPattern,
    "a path prefix or glob such as \"/payments\" or \"/v1/*/orders/**\""
);

/// Whether `text` matches `pattern`, where `*` matches any run of characters.
fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            backtrack = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star, matched)) = backtrack {
            pi = star + 1;
            ti = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// Whether the path segments match the glob segments (`**` spans zero or more segments).
fn glob(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skip| glob(rest, &path[skip..]))
        }
        Some((first, rest)) => path
            .split_first()
            .is_some_and(|(segment, tail)| wildcard(first, segment) && glob(rest, tail)),
    }
}

impl PathPattern {
    /// Whether a request path is covered: its normal form, a trailing `/` ignored.
    #[must_use]
    pub(crate) fn matches(&self, path: &NormalPath<'_>) -> bool {
        self.matches_form(path.for_matching())
    }

    /// Whether the form `path` of a request path ([`NormalPath::for_matching`], or that with
    /// its case folded) is covered.
    fn matches_form(&self, path: &str) -> bool {
        match self {
            PathPattern::Prefix(prefix) => {
                // The parser drops a trailing `/`; a pattern built by hand may have one. The
                // root `/` is then empty: every path starts with `/`.
                let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
                path.strip_prefix(prefix)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            PathPattern::Glob(segments) => {
                let segments = match segments.split_last() {
                    Some((last, init)) if last.is_empty() && !init.is_empty() => init,
                    _ => segments,
                };
                let rest = path.strip_prefix('/').unwrap_or(path);
                let parts: Vec<&str> = rest.split('/').collect();
                glob(segments, &parts)
            }
        }
    }
}

/// The paths a route covers: its [`PathPattern`], matched as written, or without regard to
/// ASCII case (`case_insensitive = true`, for an upstream that folds case: `/Payments` and
/// `/PAYMENTS/7` are then covered by `/payments`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePath {
    pattern: PathPattern,
    case_insensitive: bool,
}

impl RoutePath {
    /// `pattern`, matched without regard to case when `case_insensitive` (the pattern is then
    /// kept in lower case).
    #[must_use]
    pub(crate) fn new(pattern: PathPattern, case_insensitive: bool) -> Self {
        let pattern = match pattern {
            PathPattern::Prefix(prefix) if case_insensitive => {
                PathPattern::Prefix(prefix.to_ascii_lowercase())
            }
            PathPattern::Glob(segments) if case_insensitive => {
                PathPattern::Glob(segments.iter().map(|s| s.to_ascii_lowercase()).collect())
            }
            pattern => pattern,
        };
        RoutePath {
            pattern,
            case_insensitive,
        }
    }

    /// The pattern (in lower case when the route folds case).
    #[must_use]
    pub fn pattern(&self) -> &PathPattern {
        &self.pattern
    }

    /// Whether the route matches without regard to case.
    #[must_use]
    pub fn case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Whether the route covers a request path (its normal form, a trailing `/` ignored, its
    /// ASCII case folded when the route says so).
    #[must_use]
    pub(crate) fn matches(&self, path: &NormalPath<'_>) -> bool {
        if self.case_insensitive {
            self.pattern
                .matches_form(&path.for_matching().to_ascii_lowercase())
        } else {
            self.pattern.matches(path)
        }
    }
}

impl fmt::Display for RoutePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pattern.fmt(f)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathPattern::Prefix(prefix) => f.write_str(prefix),
            PathPattern::Glob(segments) => write!(f, "/{}", segments.join("/")),
        }
    }
}

/// An HTTP method name, as a request writes it: `POST`. Method names are case-sensitive (RFC
/// 9110 section 9.1), so `post` is refused, with the name to write, rather than guessed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MethodName(pub Method);

impl FromStr for MethodName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let name = text.trim();
        let method =
            Method::from_bytes(name.as_bytes()).map_err(|_| format!("invalid method {text:?}"))?;
        let upper = name.to_ascii_uppercase();
        if upper != name {
            return Err(format!(
                "method {text:?} is not in upper case: method names are case-sensitive \
                 (RFC 9110 section 9.1): write {upper:?}"
            ));
        }
        Ok(MethodName(method))
    }
}

deserialize_from_str!(MethodName, "a method name such as \"POST\"");

/// Where the scope of a record comes from: one source (`authorization`, `header:X-Tenant`,
/// `cookie:session`, `none`), or several hashed together (a list of sources).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeSpec {
    /// A hash of the `Authorization` header (`authorization`, the default).
    Authorization,
    /// A tenant header's value (`header:X-Tenant`); a credential header (`Authorization`,
    /// `Proxy-Authorization`, `Cookie`, `X-Api-Key`) is hashed.
    Header(String),
    /// A hash of one named cookie's value (`cookie:session`).
    Cookie(String),
    /// A hash of several sources together (`["authorization", "cookie:session"]`), each
    /// source's absence told from an empty value. Never empty, and never `none` or a list.
    All(Vec<ScopeSpec>),
    /// No scope: every caller shares one namespace (`none`).
    None,
}

impl ScopeSpec {
    /// The source of a combined scope this is; `None` for `none` or a list.
    #[must_use]
    pub fn part(&self) -> Option<idem_http::ScopePart> {
        match self {
            ScopeSpec::Authorization => Some(idem_http::ScopePart::authorization()),
            ScopeSpec::Header(name) => idem_http::ScopePart::header(name).ok(),
            ScopeSpec::Cookie(name) => idem_http::ScopePart::cookie(name).ok(),
            ScopeSpec::All(_) | ScopeSpec::None => None,
        }
    }

    /// A list of sources, each checked.
    fn all(parts: Vec<ScopeSpec>) -> Result<Self, String> {
        if parts.is_empty() {
            return Err(
                "an empty scope list: name at least one source, or write scope = \"none\"".into(),
            );
        }
        if parts.iter().any(|part| part.part().is_none()) {
            return Err("a scope list holds sources only: authorization, header:NAME or cookie:NAME (not none)".into());
        }
        Ok(ScopeSpec::All(parts))
    }
}

impl FromStr for ScopeSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || {
            format!(
                "invalid scope {text:?}: expected authorization, none, header:NAME, cookie:NAME \
                 or a list of sources"
            )
        };
        match text.trim() {
            "authorization" => Ok(ScopeSpec::Authorization),
            "none" => Ok(ScopeSpec::None),
            other => {
                let spec = if let Some(name) = other.strip_prefix("header:") {
                    ScopeSpec::Header(name.to_owned())
                } else if let Some(name) = other.strip_prefix("cookie:") {
                    ScopeSpec::Cookie(name.to_owned())
                } else {
                    return Err(invalid());
                };
                spec.part().map(|_| spec).ok_or_else(invalid)
            }
        }
    }
}

/// The scope as the configuration writes it (`authorization`, `none`, `header:NAME`,
/// `cookie:NAME`, `["authorization", "cookie:NAME"]`).
impl fmt::Display for ScopeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeSpec::Authorization => f.write_str("authorization"),
            ScopeSpec::Header(name) => write!(f, "header:{name}"),
            ScopeSpec::Cookie(name) => write!(f, "cookie:{name}"),
            ScopeSpec::All(parts) => {
                let parts: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
                write!(f, "[{}]", parts.join(", "))
            }
            ScopeSpec::None => f.write_str("none"),
        }
    }
}

/// A scope is a string, or a list of strings (several sources hashed together).
impl<'de> Deserialize<'de> for ScopeSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ScopeSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a scope: \"authorization\", \"none\", \"header:NAME\", \"cookie:NAME\", \
                     or a list of those sources",
                )
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ScopeSpec, E> {
                text.parse().map_err(E::custom)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<ScopeSpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    parts.push(text.parse().map_err(de::Error::custom)?);
                }
                ScopeSpec::all(parts).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_paths_and_scopes() {
        assert!("/payments".parse::<PathPattern>().is_ok());
        assert!("/v1/*/orders/**".parse::<PathPattern>().is_ok());
        for bad in ["payments", "/q?x=1", "/a#b", "/a b", "/a/**x"] {
            let error = bad.parse::<PathPattern>().unwrap_err();
            assert!(error.starts_with("invalid path"), "{bad}: {error}");
        }
        for text in ["authorization", "none", "header:X-Tenant"] {
            assert_eq!(text.parse::<ScopeSpec>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(
            "30s".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(30)
        );
        assert_eq!(
            "24h".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(86_400)
        );
        let err = "3x".parse::<HumanDuration>().unwrap_err();
        assert!(err.contains("invalid duration \"3x\""), "{err}");
        assert_eq!(
            "100y".parse::<HumanDuration>().unwrap().0,
            HumanDuration::MAX
        );
        for huge in ["101y", "36525days 1s", "500000000000y"] {
            let err = huge.parse::<HumanDuration>().unwrap_err();
            assert!(err.contains("longer than 100 years"), "{huge}: {err}");
        }
        assert_eq!("1MiB".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert_eq!("512".parse::<ByteSize>().unwrap().0, 512);
        assert!("1 TB".parse::<ByteSize>().is_err());
        assert!("99999999999999GiB".parse::<ByteSize>().is_err());
        assert!("".parse::<ByteSize>().is_err());
    }

    #[test]
    fn stores() {
        use idem::StoreSpec;
        assert_eq!("memory".parse::<StoreSpec>().unwrap(), StoreSpec::Memory);
        assert_eq!(
            "redis://127.0.0.1:6379/0"
                .parse::<StoreSpec>()
                .unwrap()
                .kind(),
            "redis"
        );
        assert_eq!(
            "redb:/var/lib/idem.redb"
                .parse::<StoreSpec>()
                .unwrap()
                .kind(),
            "redb"
        );
        assert_eq!(
            "postgres://u@h/test".parse::<StoreSpec>().unwrap().kind(),
            "postgres"
        );
        for bad in [
            "mysql://x",
            "redis://",
            "redis://h:99999",
            "redis://h:x",
            "redb:",
            "",
            "foo",
        ] {
            assert!(bad.parse::<StoreSpec>().is_err(), "{bad}");
        }
        let spec: StoreSpec = "redis://user:secret@h:6379/1".parse().unwrap();
        assert_eq!(spec.to_string(), "redis://user:***@h:6379/1");
    }

    /// A listening address is an IP address or a host name, and a port; a name is resolved
    /// only when the configuration is built. Before, a name was refused.
    #[test]
    fn listen_addresses_take_host_names() {
        let ip: ListenAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(ip, ListenAddr::Ip("127.0.0.1:8080".parse().unwrap()));
        assert!(matches!("[::1]:0".parse(), Ok(ListenAddr::Ip(addr)) if addr.is_ipv6()));
        for (text, name, port) in [
            ("localhost:8130", "localhost", 8130),
            (" localhost:0 ", "localhost", 0),
            ("gw-1.internal.example:443", "gw-1.internal.example", 443),
        ] {
            let parsed: ListenAddr = text.parse().unwrap();
            assert_eq!(
                parsed,
                ListenAddr::Name {
                    host: name.to_owned(),
                    port
                },
                "{text}"
            );
            assert_eq!(parsed.to_string(), format!("{name}:{port}"));
        }
        for bad in [
            "localhost",
            "8080",
            ":8080",
            "localhost:",
            "localhost:65536",
            "localhost:-1",
            "local host:80",
            "local_host:80",
            "-bad:80",
            "a..b:80",
            "127.1:80",
            "1.2.3:80",
            "0x7f.1:80",
            "::1:80",
            "[::1]:80:80",
            "",
        ] {
            let err = bad.parse::<ListenAddr>().unwrap_err();
            assert!(err.starts_with("invalid address"), "{bad}: {err}");
        }
        let long = format!("{}:80", "a".repeat(64));
        assert!(long.parse::<ListenAddr>().is_err());
    }

    #[test]
    fn a_listening_host_name_resolves_to_its_first_address() {
        let name: ListenAddr = "localhost:0".parse().unwrap();
        let addr = name.resolve().unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == 0, "{addr}");
        let ip: ListenAddr = "0.0.0.0:9".parse().unwrap();
        assert_eq!(ip.resolve().unwrap(), "0.0.0.0:9".parse().unwrap());
    }

    #[test]
    fn upstreams() {
        let url: UpstreamUrl = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!(url.to_string(), "http://127.0.0.1:3000");
        assert!("http://127.0.0.1:3000/".parse::<UpstreamUrl>().is_ok());
        assert!("http://[::1]:8080".parse::<UpstreamUrl>().is_ok());
        assert!("http://localhost".parse::<UpstreamUrl>().is_ok());
        let url: UpstreamUrl = "https://api.example.com".parse().unwrap();
        assert!(url.is_https());
        assert_eq!((url.host(), url.port()), ("api.example.com", 443));
        let url: UpstreamUrl = "https://[::1]:8443".parse().unwrap();
        assert_eq!((url.host(), url.port()), ("::1", 8443));
        let url: UpstreamUrl = "http://[::1]".parse().unwrap();
        assert!(!url.is_https());
        assert_eq!((url.host(), url.port()), ("::1", 80));
        for bad in [
            "https://a..b",
            "ws://x",
            "127.0.0.1:3000",
            "http://h/base",
            "ftp://h",
            "http://u@h",
            "http://127.0.0.1:99999",
            "http://127.0.0.1:0",
            "http://127.0.0.1:",
            "http://[::1]:70000",
            "",
        ] {
            assert!(bad.parse::<UpstreamUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn paths() {
        let prefix: PathPattern = "/payments".parse().unwrap();
        assert!(covers(&prefix, "/payments") && covers(&prefix, "/payments/7"));
        assert!(!covers(&prefix, "/paymentsx") && !covers(&prefix, "/"));
        let root: PathPattern = "/".parse().unwrap();
        assert!(covers(&root, "/anything/at/all") && covers(&root, "/"));
        let glob: PathPattern = "/v1/*/orders/**".parse().unwrap();
        assert!(covers(&glob, "/v1/acme/orders") && covers(&glob, "/v1/acme/orders/7/items"));
        assert!(!covers(&glob, "/v1/acme/refunds/7") && !covers(&glob, "/v2/acme/orders"));
        let star: PathPattern = "/files/*.json".parse().unwrap();
        assert!(covers(&star, "/files/a.json") && !covers(&star, "/files/a/b.json"));
        assert!("payments".parse::<PathPattern>().is_err());
        assert!("/a/**b".parse::<PathPattern>().is_err());
    }

    /// Whether `pattern` covers the request path `path`, as the gateway matches it.
    fn covers(pattern: &PathPattern, path: &str) -> bool {
        pattern.matches(&NormalPath::new(path).unwrap())
    }

    #[test]
    fn routes_match_the_normal_form_of_the_path() {
        let prefix: PathPattern = "/payments".parse().unwrap();
        for path in [
            "//payments",
            "/./payments",
            "/x/../payments",
            "/%70ayments",
            "/payments/",
            "/payments//7",
            "/PAY/../payments/%37",
        ] {
            assert!(covers(&prefix, path), "{path}");
        }
        assert!(!covers(&prefix, "/payments%2F7") && !covers(&prefix, "/payments/../x"));
        let glob: PathPattern = "/v1/*/orders".parse().unwrap();
        for path in [
            "/v1/a/orders/",
            "/v1//a/./orders",
            "/v1/a/x/../orders",
            "/v1/%61/orders",
        ] {
            assert!(covers(&glob, path), "{path}");
        }
        assert!(!covers(&glob, "/v1/a/orders/7") && !covers(&glob, "/v1//orders"));
        // Built by hand with a trailing slash, a pattern still ignores it.
        let by_hand = PathPattern::Prefix("/payments/".to_owned());
        assert!(covers(&by_hand, "/payments") && covers(&by_hand, "/payments/7"));
        let by_hand = PathPattern::Glob(vec!["v1".into(), "*".into(), String::new()]);
        assert!(covers(&by_hand, "/v1/a") && covers(&by_hand, "/v1/a/"));
    }

    /// Each spelling of the issue against a `/payments` route: case escapes a route that does
    /// not fold case and not one that does; `;x`, `.json` and `%2F7` name other paths (another
    /// segment), which the glob `/payments*/**` covers for an upstream that reads them as
    /// `/payments`.
    #[test]
    fn spellings_of_a_path_and_the_routes_that_cover_them() {
        let exact = RoutePath::new("/payments".parse().unwrap(), false);
        let folded = RoutePath::new("/Payments".parse().unwrap(), true);
        let wide = RoutePath::new("/payments*/**".parse().unwrap(), false);
        let covers = |route: &RoutePath, path: &str| route.matches(&NormalPath::new(path).unwrap());
        for path in ["/payments", "/payments/7", "//payments/", "/%70ayments"] {
            assert!(covers(&exact, path) && covers(&folded, path) && covers(&wide, path));
        }
        for path in ["/Payments", "/PAYMENTS/7", "/%50ayments"] {
            assert!(!covers(&exact, path), "{path}");
            assert!(covers(&folded, path), "{path}");
        }
        assert_eq!(folded.to_string(), "/payments");
        for path in [
            "/payments;x",
            "/payments.json",
            "/payments%2F7",
            "/payments%2f7",
        ] {
            assert!(!covers(&exact, path), "{path}");
            assert!(covers(&wide, path), "{path}");
        }
        assert!(covers(&wide, "/payments;x/7") && !covers(&wide, "/refunds"));
        let glob = RoutePath::new("/V1/*/Orders".parse().unwrap(), true);
        assert!(covers(&glob, "/v1/ACME/orders") && !covers(&glob, "/v1/acme/orders/7"));
    }

    #[test]
    fn patterns_are_put_in_normal_form_or_refused() {
        for (written, normal) in [
            ("/payments/", "/payments"),
            ("//payments//", "/payments"),
            ("/./payments", "/payments"),
            ("/%70ayments", "/payments"),
            ("/a%2fb", "/a%2Fb"),
            ("/", "/"),
            ("//", "/"),
            ("/v1/*/orders/", "/v1/*/orders"),
            ("/v1//*/./orders/**/", "/v1/*/orders/**"),
        ] {
            let pattern: PathPattern = written.parse().unwrap();
            assert_eq!(pattern.to_string(), normal, "{written}");
            assert_eq!(pattern, normal.parse().unwrap(), "{written}");
        }
        for bad in ["/a/../b", "/..", "/v1/*/..", "/a/%2E%2E/b", "/a/.%2e"] {
            let error = bad.parse::<PathPattern>().unwrap_err();
            assert!(error.contains("no .. segment"), "{bad}: {error}");
        }
        // A glob keeps its meaning: `**` still stands alone after normalisation.
        assert!("/a/**%62".parse::<PathPattern>().is_err());
    }

    #[test]
    fn methods_and_scopes() {
        assert_eq!("POST".parse::<MethodName>().unwrap().0, Method::POST);
        let lower = "post".parse::<MethodName>().unwrap_err();
        assert!(lower.contains("write \"POST\""), "{lower}");
        assert!("PO ST".parse::<MethodName>().is_err());
        assert_eq!(
            "header:X-Tenant".parse::<ScopeSpec>().unwrap(),
            ScopeSpec::Header("X-Tenant".into())
        );
        assert!("header:bad name".parse::<ScopeSpec>().is_err());
        assert!("tenant".parse::<ScopeSpec>().is_err());
        assert_eq!(
            "cookie:session".parse::<ScopeSpec>().unwrap(),
            ScopeSpec::Cookie("session".into())
        );
        for bad in ["cookie:", "cookie:a b", "cookie:a;b"] {
            assert!(bad.parse::<ScopeSpec>().is_err(), "{bad}");
        }
    }
}
