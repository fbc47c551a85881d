//! [`StoreSpec`]: the store a URL names (`memory`, `redis://...`, `postgres://...`,
//! `redb:PATH`), the one parser of that grammar for every program built on idem.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Which store, and where: what a command line (`--store`) or a configuration file names.
///
/// | form | store |
/// |---|---|
/// | `memory` | the in-memory store of this process |
/// | `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]`, `rediss://...` (TLS) | one Redis server |
/// | `redis+cluster://HOST:PORT,HOST:PORT`, `rediss+cluster://...` | a Redis Cluster, any nodes of it as seeds |
/// | `postgres://USER@HOST[:PORT]/DB`, `postgresql://...` | a PostgreSQL database |
/// | `redb:PATH` | an embedded durable file |
///
/// Parsing checks the form only (a host, a port from 1 to 65535), whatever stores the build
/// has; opening the store ([`OpenOptions`](crate::OpenOptions)) checks the rest. It never
/// panics on any input. [`Display`](fmt::Display) writes the spec back with any password
/// hidden.
///
/// ```
/// use idem::StoreSpec;
///
/// let spec: StoreSpec = "redis://app:secret@10.0.0.1:6379/2".parse()?;
/// assert_eq!(spec.kind(), "redis");
/// assert_eq!(spec.to_string(), "redis://app:***@10.0.0.1:6379/2");
/// assert!("mysql://h/db".parse::<StoreSpec>().is_err());
/// # Ok::<(), idem::StoreSpecError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// In this process (`memory`): gone when it exits, not shared between processes.
    Memory,
    /// A Redis server (`redis://HOST[:PORT][/DB]`, `rediss://` for TLS), or a Redis Cluster
    /// (`redis+cluster://HOST:PORT,HOST:PORT`, any nodes of it as seeds): the URL as written.
    Redis(String),
    /// A PostgreSQL database (`postgres://USER@HOST[:PORT]/DB`): the URL as written.
    Postgres(String),
    /// An embedded durable file (`redb:PATH`).
    Redb(PathBuf),
}

/// Why a text is no [`StoreSpec`]: the message quotes it and lists the forms.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreSpecError(String);

impl StoreSpec {
    /// The store's kind: `memory`, `redis`, `postgres` or `redb` (the cargo feature that
    /// brings it, and the `store` label of metrics).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Memory => "memory",
            StoreSpec::Redis(_) => "redis",
            StoreSpec::Postgres(_) => "postgres",
            StoreSpec::Redb(_) => "redb",
        }
    }

    /// Whether the store is a server reached over the network (Redis, PostgreSQL), which may
    /// come up after the program: a local store (memory, redb) opens or never will.
    #[must_use]
    pub fn is_network(&self) -> bool {
        matches!(self, StoreSpec::Redis(_) | StoreSpec::Postgres(_))
    }
}

/// The forms of a store, for an error message.
const STORE_FORMS: &str = "expected memory, redis://HOST[:PORT][/DB], redis+cluster://HOST:PORT,HOST:PORT, postgres://USER@HOST[:PORT]/DB or redb:PATH";

/// The seed URLs of a Redis Cluster URL (`redis+cluster://[USERINFO@]H1:P1,H2:P2[/...]`),
/// each `redis://[USERINFO@]HOST[/...]` (`rediss://` for `rediss+cluster://`); `None` for any
/// other URL.
pub(crate) fn cluster_seeds(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("+cluster://")?;
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    Some(
        hosts
            .split(',')
            .map(|host| format!("{scheme}://{userinfo}{host}{tail}"))
            .collect(),
    )
}

/// Checks the authority of a URL (`[user[:password]@]host[:port]`, what follows `://` in
/// `rest`): a host, and a port that is a number from 1 to 65535.
fn check_authority(text: &str, rest: &str) -> Result<(), StoreSpecError> {
    let invalid = |why: String| StoreSpecError(format!("invalid store URL {text:?}: {why}"));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        match bracketed.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return Err(invalid("unclosed [ in the host".to_owned())),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() && !authority.is_empty() || authority.is_empty() && !rest.starts_with('/') {
        return Err(invalid("no host".to_owned()));
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => {
                return Err(invalid(format!(
                    "port {port:?} is not a number from 1 to 65535"
                )));
            }
        }
    }
    Ok(())
}

impl FromStr for StoreSpec {
    type Err = StoreSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text == "memory" || text == "memory:" {
            return Ok(StoreSpec::Memory);
        }
        if let Some(path) = text.strip_prefix("redb:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreSpecError(format!(
                    "invalid store {text:?}: redb:PATH needs a file path"
                )));
            }
            return Ok(StoreSpec::Redb(PathBuf::from(path)));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(StoreSpecError(format!(
                "unknown store {text:?}: {STORE_FORMS}"
            )));
        };
        match scheme {
            "redis" | "rediss" => {
                check_authority(text, rest)?;
                Ok(StoreSpec::Redis(text.to_owned()))
            }
            "redis+cluster" | "rediss+cluster" => {
                for seed in cluster_seeds(text).unwrap_or_default() {
                    let (_, seed_rest) = seed.split_once("://").unwrap_or_default();
                    check_authority(text, seed_rest)?;
                }
                Ok(StoreSpec::Redis(text.to_owned()))
            }
            "postgres" | "postgresql" => {
                check_authority(text, rest)?;
                Ok(StoreSpec::Postgres(text.to_owned()))
            }
            _ => Err(StoreSpecError(format!(
                "unknown store scheme {scheme:?} in {text:?}: {STORE_FORMS}"
            ))),
        }
    }
}

/// Hides the password of a URL (`redis://user:secret@host` -> `redis://user:***@host`).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

impl fmt::Display for StoreSpec {
    /// The store as written, with any password hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Redis(url) | StoreSpec::Postgres(url) => f.write_str(&redact(url)),
            StoreSpec::Redb(path) => write!(f, "redb:{}", path.display()),
        }
    }
}

impl fmt::Debug for StoreSpec {
    /// As [`Display`](fmt::Display): no password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreSpec({self})")
    }
}

/// A store spec is a string in a configuration file (feature `serde`); a bad one is reported
/// with the parser's message.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for StoreSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = StoreSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a store: \"memory\", \"redis://...\", \"postgres://...\" or \"redb:PATH\"",
                )
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<StoreSpec, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_form_parses_and_bad_ones_do_not() {
        assert_eq!("memory".parse::<StoreSpec>().unwrap(), StoreSpec::Memory);
        for (text, kind) in [
            ("redis://127.0.0.1:6379/0", "redis"),
            ("rediss://h:6380", "redis"),
            ("redis+cluster://h:7000,h:7001", "redis"),
            ("rediss+cluster://u:p@h:7000,[::1]:7001/0", "redis"),
            ("postgres://u@h/test", "postgres"),
            ("postgresql://u@h:5432/test", "postgres"),
            ("redb:/var/lib/idem.redb", "redb"),
        ] {
            assert_eq!(text.parse::<StoreSpec>().unwrap().kind(), kind, "{text}");
        }
        for bad in [
            "mysql://x",
            "redis://",
            "redis://h:99999",
            "redis://h:x",
            "redis+cluster://h:1,h:x",
            "redis://[::1",
            "redb:",
            "",
            "foo",
        ] {
            assert!(bad.parse::<StoreSpec>().is_err(), "{bad}");
        }
        let unknown = "mysql://h".parse::<StoreSpec>().unwrap_err().to_string();
        assert!(
            unknown.starts_with("unknown store scheme \"mysql\""),
            "{unknown}"
        );
    }

    #[test]
    fn display_hides_the_password() {
        let spec: StoreSpec = "redis://user:secret@h:6379/1".parse().unwrap();
        assert_eq!(spec.to_string(), "redis://user:***@h:6379/1");
        assert!(!format!("{spec:?}").contains("secret"));
        let spec: StoreSpec = "postgres://u@h/db".parse().unwrap();
        assert_eq!(spec.to_string(), "postgres://u@h/db");
    }

    #[test]
    fn a_cluster_url_names_every_seed_with_its_credentials() {
        assert_eq!(
            cluster_seeds("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001/0").unwrap(),
            [
                "redis://u:pw@10.0.0.1:7000/0",
                "redis://u:pw@10.0.0.2:7001/0"
            ]
        );
        assert_eq!(
            cluster_seeds("rediss+cluster://h:1").unwrap(),
            ["rediss://h:1"]
        );
        assert_eq!(cluster_seeds("redis://h:1"), None);
    }
}
