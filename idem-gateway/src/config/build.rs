//! [`Config::build`]: THE function that turns a parsed file and the overrides into a validated
//! [`Config`], one section at a time: every default is applied and every setting checked here,
//! nothing here panics, and each error is one line naming where the bad value is
//! (`file:line:column`, or the flag).

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use idem::{OpenError, OpenOptions, StoreSpec};
use toml::Spanned;

use super::GatewayConfigError;
use super::internal::{
    AdminConfig, Config, LogConfig, Origin, Overrides, ScopeSecretBytes, ServerConfig, StoreConfig,
    UpstreamConfig, defaults,
};
use super::lint;
use super::routes::route_configs;
use super::tls::UpstreamTls;
use super::toml::{
    AdminSection, FileConfig, LogSection, ServerSection, StoreSection, UpstreamSection,
};
use super::value::{ByteSize, HumanDuration, ListenAddr, UpstreamUrl};
use crate::fence::FenceHeaders;
use crate::store::Backends;

/// The shortest admin token taken, in bytes: 16 printable characters are more than 2^100
/// guesses, so the admin listener may always accept the right token (see
/// [`Throttle`](crate::admin::access::Throttle)).
pub(super) const MIN_TOKEN_LEN: usize = 16;

/// How errors name an override: the flag and its environment variable, since either may
/// have set it.
const STORE_FLAG: &str = "--store (or IDEM_STORE)";
/// See [`STORE_FLAG`].
const ADMIN_LISTEN_FLAG: &str = "--admin-listen (or IDEM_ADMIN_LISTEN)";
/// See [`STORE_FLAG`].
const LEASE_FLAG: &str = "--lease (or IDEM_LEASE)";
/// See [`STORE_FLAG`].
const RETENTION_FLAG: &str = "--retention (or IDEM_RETENTION)";

/// An override parsed with the file's parser; a bad value names the flag and its variable.
fn flag<T: std::str::FromStr<Err: std::fmt::Display>>(
    value: Option<&String>,
    flag: &str,
) -> Result<Option<T>, GatewayConfigError> {
    value
        .map(|text| {
            text.parse::<T>()
                .map_err(|err| GatewayConfigError::new(Some(flag.to_owned()), err.to_string()))
        })
        .transpose()
}

/// A listening address given as a flag, resolved ([`ListenAddr::resolve`]); an error names
/// the flag.
fn socket_addr(
    value: Option<&String>,
    name: &str,
) -> Result<Option<SocketAddr>, GatewayConfigError> {
    flag::<ListenAddr>(value, name)?
        .map(|addr| {
            addr.resolve()
                .map_err(|err| GatewayConfigError::new(Some(name.to_owned()), err))
        })
        .transpose()
}

/// A listening address of the file, resolved ([`ListenAddr::resolve`]); an error names its
/// position.
fn listen_addr(
    value: Spanned<ListenAddr>,
    origin: &Origin,
) -> Result<SocketAddr, GatewayConfigError> {
    value
        .get_ref()
        .resolve()
        .map_err(|err| origin.error_at(Some(value.span().start), err))
}

/// Whether two listening addresses would take the same port: the same port (not 0), on the same
/// IP address or where one of them is the unspecified address of the same family (`0.0.0.0`
/// binds every IPv4 address; `[::]` every IPv6 one, and IPv4 too where the system maps it).
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip()
            || a.ip().is_unspecified() && (a.is_ipv6() || b.is_ipv4())
            || b.ip().is_unspecified() && (b.is_ipv6() || a.is_ipv4()))
}

pub(super) fn positive(
    value: Duration,
    what: &str,
    origin: &Origin,
    at: Option<usize>,
) -> Result<Duration, GatewayConfigError> {
    if value.is_zero() {
        return Err(origin.error_at(at, format!("{what} must be longer than zero")));
    }
    Ok(value)
}

/// A size setting of a section (at least 1 byte), or `inherited` when the section sets none.
pub(super) fn size(
    value: Option<&Spanned<ByteSize>>,
    what: &str,
    inherited: NonZeroUsize,
    origin: &Origin,
) -> Result<NonZeroUsize, GatewayConfigError> {
    let Some(value) = value else {
        return Ok(inherited);
    };
    usize::try_from(value.get_ref().0)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| {
            origin.error_at(
                Some(value.span().start),
                format!("{what} must be at least 1 byte"),
            )
        })
}

impl Config {
    /// THE function that turns a parsed file and the overrides into a validated configuration:
    /// every default is applied and every setting checked here, and nothing in it panics. Each
    /// error is one line naming where the bad value is (`file:line:column`, or the flag).
    ///
    /// # Errors
    /// [`GatewayConfigError`] naming the first setting refused.
    pub(crate) fn build(
        file: FileConfig,
        overrides: &Overrides,
        origin: &Origin,
    ) -> Result<Config, GatewayConfigError> {
        // Overrides first: a bad flag is reported even when the file is fine.
        let flags = Flags::parse(overrides)?;
        let FileConfig {
            server,
            upstream,
            store,
            admin,
            log,
            idempotency,
            routes,
        } = file;
        let (server, server_listen_at) = server_config(server, flags.listen, origin)?;
        let mut warnings = Vec::new();
        let upstream_section = upstream;
        let upstream =
            upstream_config(&upstream_section, flags.upstream_url, origin, &mut warnings)?;
        let store = store_config(
            store,
            flags.store_spec,
            overrides,
            origin,
            Backends::COMPILED,
        )?;
        let admin = admin_config(
            admin,
            flags.admin_listen,
            overrides,
            origin,
            &server,
            server_listen_at,
        )?;
        let log = log_config(log, origin)?;
        let routes = route_configs(
            idempotency.as_ref(),
            &routes,
            flags.lease,
            flags.retention,
            origin,
            &mut warnings,
        )?;
        if let Some(upstream_config) = &upstream {
            lint::fence_headers_apart_from_keys(
                &upstream_config.fence,
                &routes,
                &upstream_section,
                origin,
            )?;
        }
        if store.scope_secret.is_none() {
            lint::unkeyed_scopes(&routes, &mut warnings);
        }
        Ok(Config {
            server,
            upstream,
            store,
            admin,
            log,
            routes,
            warnings,
        })
    }
}

/// The overrides of the command line and the environment, parsed.
struct Flags {
    listen: Option<SocketAddr>,
    upstream_url: Option<UpstreamUrl>,
    store_spec: Option<StoreSpec>,
    retention: Option<Duration>,
    lease: Option<Duration>,
    admin_listen: Option<SocketAddr>,
}

impl Flags {
    fn parse(overrides: &Overrides) -> Result<Flags, GatewayConfigError> {
        let listen = socket_addr(overrides.listen.as_ref(), "--listen (or IDEM_LISTEN)")?;
        let upstream_url =
            flag::<UpstreamUrl>(overrides.upstream.as_ref(), "--upstream (or IDEM_UPSTREAM)")?;
        let store_spec = flag::<StoreSpec>(overrides.store.as_ref(), STORE_FLAG)?;
        let retention =
            flag::<HumanDuration>(overrides.retention.as_ref(), RETENTION_FLAG)?.map(|d| d.0);
        let lease = flag::<HumanDuration>(overrides.lease.as_ref(), LEASE_FLAG)?.map(|d| d.0);
        let admin_listen = socket_addr(overrides.admin_listen.as_ref(), ADMIN_LISTEN_FLAG)?;
        for (value, name) in [(lease, LEASE_FLAG), (retention, RETENTION_FLAG)] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(GatewayConfigError::new(
                    Some(name.to_owned()),
                    "must be longer than zero",
                ));
            }
        }
        Ok(Flags {
            listen,
            upstream_url,
            store_spec,
            retention,
            lease,
            admin_listen,
        })
    }
}

/// `[server]`, and where the file set its listen address (for the admin listener's errors).
fn server_config(
    server: ServerSection,
    listen: Option<SocketAddr>,
    origin: &Origin,
) -> Result<(ServerConfig, Option<usize>), GatewayConfigError> {
    let max_header_bytes = match &server.max_header_bytes {
        Some(spanned) => {
            let ByteSize(n) = *spanned.get_ref();
            usize::try_from(n)
                .ok()
                .filter(|n| *n >= defaults::MIN_HEADER_BYTES)
                .ok_or_else(|| {
                    origin.error_at(
                        Some(spanned.span().start),
                        format!(
                            "max_header_bytes must be at least {} (8KiB)",
                            defaults::MIN_HEADER_BYTES
                        ),
                    )
                })?
        }
        None => defaults::MAX_HEADER_BYTES,
    };
    let max_headers = match &server.max_headers {
        Some(spanned) if *spanned.get_ref() == 0 => {
            return Err(
                origin.error_at(Some(spanned.span().start), "max_headers must be at least 1")
            );
        }
        Some(spanned) => *spanned.get_ref(),
        None => defaults::MAX_HEADERS,
    };
    let workers = match &server.workers {
        Some(spanned) => NonZeroUsize::new(*spanned.get_ref())
            .filter(|workers| workers.get() <= defaults::MAX_WORKERS)
            .ok_or_else(|| {
                origin.error_at(
                    Some(spanned.span().start),
                    format!(
                        "workers must be 1 to {} (one serving thread each)",
                        defaults::MAX_WORKERS
                    ),
                )
            })?,
        None => defaults::workers(),
    };
    let max_connections = match &server.max_connections {
        Some(spanned) => NonZeroUsize::new(*spanned.get_ref()).ok_or_else(|| {
            origin.error_at(
                Some(spanned.span().start),
                "max_connections must be at least 1",
            )
        })?,
        None => defaults::MAX_CONNECTIONS,
    };
    let header_timeout = match &server.header_timeout {
        Some(d) => positive(
            d.get_ref().0,
            "header_timeout",
            origin,
            Some(d.span().start),
        )?,
        None => defaults::HEADER_TIMEOUT,
    };
    let server_listen_at = match (&listen, &server.listen) {
        (None, Some(spanned)) => Some(spanned.span().start),
        _ => None,
    };
    let listen = match (listen, server.listen) {
        (Some(listen), _) => listen,
        (None, Some(written)) => listen_addr(written, origin)?,
        (None, None) => defaults::LISTEN,
    };
    let server = ServerConfig {
        listen,
        max_header_bytes,
        max_headers,
        shutdown_grace: server
            .shutdown_grace
            .map_or(defaults::SHUTDOWN_GRACE, |d| d.0),
        workers,
        max_connections,
        header_timeout,
        underscores_in_headers: server.underscores_in_headers.unwrap_or(false),
        allow_ambiguous_paths: server.allow_ambiguous_paths.unwrap_or(false),
    };
    Ok((server, server_listen_at))
}

/// `[upstream]`, if it names one (or `--upstream` does).
fn upstream_config(
    upstream: &UpstreamSection,
    upstream_url: Option<UpstreamUrl>,
    origin: &Origin,
    warnings: &mut lint::Warnings,
) -> Result<Option<UpstreamConfig>, GatewayConfigError> {
    // Checked with or without a URL, so that `check-config` refuses a bad name either way.
    let fence = fence_headers(upstream, origin)?;
    // Read and checked with or without a URL too.
    let ca = match &upstream.ca_file {
        Some(path) => Some(
            UpstreamTls::ca_file(Path::new(path.get_ref()))
                .map_err(|err| origin.error_at(Some(path.span().start), err))?,
        ),
        None => None,
    };
    let upstream = match upstream_url.or(upstream.url.clone()) {
        None => None,
        Some(url) => Some(UpstreamConfig {
            tls: match (url.is_https(), ca) {
                (true, Some(ca)) => Some(ca),
                (true, None) => {
                    Some(UpstreamTls::system().map_err(|err| GatewayConfigError::new(None, err))?)
                }
                (false, ca) => {
                    if ca.is_some() {
                        lint::unused_ca_file(&url, upstream, origin, warnings);
                    }
                    None
                }
            },
            url,
            connect_timeout: match &upstream.connect_timeout {
                Some(d) => positive(
                    d.get_ref().0,
                    "connect_timeout",
                    origin,
                    Some(d.span().start),
                )?,
                None => defaults::CONNECT_TIMEOUT,
            },
            timeout: match &upstream.timeout {
                Some(d) => positive(
                    d.get_ref().0,
                    "the upstream timeout",
                    origin,
                    Some(d.span().start),
                )?,
                None => defaults::UPSTREAM_TIMEOUT,
            },
            body_idle_timeout: match &upstream.body_idle_timeout {
                Some(d) => positive(
                    d.get_ref().0,
                    "body_idle_timeout",
                    origin,
                    Some(d.span().start),
                )?,
                None => defaults::BODY_IDLE_TIMEOUT,
            },
            pool_idle_timeout: upstream
                .pool_idle_timeout
                .map_or(defaults::POOL_IDLE_TIMEOUT, |d| d.0),
            pool_max_idle: upstream.pool_max_idle.unwrap_or(defaults::POOL_MAX_IDLE),
            fence,
        }),
    };
    Ok(upstream)
}

/// `[upstream] fence_headers`, `fence_header` and `attempt_header`: each name a header name
/// that may carry them ([`lint::fence_header`]), and not both the same.
fn fence_headers(
    upstream: &UpstreamSection,
    origin: &Origin,
) -> Result<FenceHeaders, GatewayConfigError> {
    let defaults = FenceHeaders::default();
    let name = |written: Option<&Spanned<String>>, default: HeaderName| match written {
        Some(written) => lint::fence_header(written.get_ref(), origin, Some(written.span().start)),
        None => Ok(default),
    };
    let fence = name(upstream.fence_header.as_ref(), defaults.fence)?;
    let attempt = name(upstream.attempt_header.as_ref(), defaults.attempt)?;
    if fence == attempt {
        let at = upstream
            .attempt_header
            .as_ref()
            .or(upstream.fence_header.as_ref())
            .map(|written| written.span().start);
        return Err(origin.error_at(
            at,
            format!("fence_header and attempt_header are both {fence}: give each its own header"),
        ));
    }
    Ok(FenceHeaders {
        enabled: upstream.fence_headers.unwrap_or(defaults.enabled),
        fence,
        attempt,
    })
}

/// `[store]`: a store the build lacks (see [`Backends`]) is refused, and the store's own client
/// checks its URL and namespace, without connecting.
fn store_config(
    store: StoreSection,
    store_spec: Option<StoreSpec>,
    overrides: &Overrides,
    origin: &Origin,
    backends: Backends,
) -> Result<StoreConfig, GatewayConfigError> {
    let scope_secret = scope_secret(&store, overrides, origin)?;
    let namespace = match &store.namespace {
        Some(spanned) => {
            let ns = spanned.get_ref();
            let valid = !ns.is_empty()
                && ns.len() <= 64
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !valid {
                return Err(origin.error_at(
                    Some(spanned.span().start),
                    format!("namespace {ns:?}: 1 to 64 letters, digits, '_', '.' or '-'"),
                ));
            }
            ns.clone()
        }
        None => defaults::NAMESPACE.to_owned(),
    };
    let memory_capacity = match &store.memory_capacity {
        Some(spanned) => NonZeroUsize::new(*spanned.get_ref()).ok_or_else(|| {
            origin.error_at(
                Some(spanned.span().start),
                "memory_capacity must be at least 1",
            )
        })?,
        None => NonZeroUsize::new(defaults::MEMORY_CAPACITY).unwrap_or(NonZeroUsize::MIN),
    };
    let memory_max_bytes = size(
        store.memory_max_bytes.as_ref(),
        "memory_max_bytes",
        NonZeroUsize::new(defaults::MEMORY_MAX_BYTES).unwrap_or(NonZeroUsize::MIN),
        origin,
    )?;
    if memory_max_bytes.get() < defaults::MIN_MEMORY_MAX_BYTES {
        let at = store.memory_max_bytes.as_ref().map(|v| v.span().start);
        return Err(origin.error_at(at, "memory_max_bytes must be at least 1MiB"));
    }
    // The store's own client checks its URL and namespace here, without connecting, so
    // that `check-config` refuses what `serve` would.
    let spec_at = match (&store_spec, &store.url) {
        (Some(_), _) => None,
        (None, url) => url.as_ref().map(|url| url.span().start),
    };
    let spec = store_spec
        .or(store.url.map(Spanned::into_inner))
        .unwrap_or(StoreSpec::Memory);
    let at_spec = |message: String| match spec_at {
        Some(at) => origin.error_at(Some(at), message),
        None if overrides.store.is_some() => {
            GatewayConfigError::new(Some(STORE_FLAG.to_owned()), message)
        }
        None => origin.error_at(None, message),
    };
    backends.check(&spec).map_err(at_spec)?;
    // A store this build lacks was refused above, whatever the client would say.
    match OpenOptions::new(namespace.as_str()).check(&spec) {
        Err(OpenError::Url { reason, .. }) => return Err(at_spec(reason)),
        Err(OpenError::Namespace { reason, .. }) => {
            let at = store.namespace.as_ref().map(|ns| ns.span().start);
            return Err(origin.error_at(at, reason));
        }
        _ => {}
    }
    let store = StoreConfig {
        spec,
        namespace,
        memory_capacity,
        memory_max_bytes,
        scope_secret,
        redb_allow_empty: overrides.redb_allow_empty,
    };
    Ok(store)
}

/// The scope secret: `IDEM_SCOPE_SECRET`, or the content of `[store] scope_secret_file`
/// (without a trailing newline), at least [`idem_http::scope::ScopeSecret::MIN_LEN`] bytes;
/// not both.
fn scope_secret(
    store: &StoreSection,
    overrides: &Overrides,
    origin: &Origin,
) -> Result<Option<ScopeSecretBytes>, GatewayConfigError> {
    let min = idem_http::scope::ScopeSecret::MIN_LEN;
    let (bytes, at, what) = match (&overrides.scope_secret, &store.scope_secret_file) {
        (Some(_), Some(file)) => {
            return Err(origin.error_at(
                Some(file.span().start),
                "scope_secret_file is set and so is IDEM_SCOPE_SECRET: keep one",
            ));
        }
        (Some(secret), None) => (secret.as_bytes().to_vec(), None, "IDEM_SCOPE_SECRET"),
        (None, Some(file)) => {
            let at = Some(file.span().start);
            let mut bytes = std::fs::read(file.get_ref()).map_err(|err| {
                origin.error_at(
                    at,
                    format!("cannot read scope_secret_file {:?}: {err}", file.get_ref()),
                )
            })?;
            while bytes.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
                bytes.pop();
            }
            (bytes, at, "scope_secret_file")
        }
        (None, None) => return Ok(None),
    };
    if bytes.len() < min {
        return Err(origin.error_at(
            at,
            format!("the scope secret of {what} must be at least {min} bytes"),
        ));
    }
    Ok(Some(ScopeSecretBytes(bytes)))
}

/// `[admin]`, unless disabled; it may not share the gateway's port.
fn admin_config(
    admin: AdminSection,
    admin_listen: Option<SocketAddr>,
    overrides: &Overrides,
    origin: &Origin,
    server: &ServerConfig,
    server_listen_at: Option<usize>,
) -> Result<Option<AdminConfig>, GatewayConfigError> {
    let token = match (&overrides.admin_token, &admin.token) {
        (Some(token), _) => Some((token.clone(), None, "--admin-token (or IDEM_ADMIN_TOKEN)")),
        (None, Some(spanned)) => Some((
            spanned.get_ref().clone(),
            Some(spanned.span().start),
            "token",
        )),
        (None, None) => None,
    };
    let token = match token {
        Some((token, at, name)) => {
            let refused = if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                Some("the admin token must be printable ASCII without spaces".to_owned())
            } else if token.len() < MIN_TOKEN_LEN {
                Some(format!(
                    "the admin token is {} bytes: it must be at least {MIN_TOKEN_LEN}, so that it \
                     cannot be guessed (a wrong token is throttled, the right one never is); \
                     `openssl rand -hex 16` makes one",
                    token.len()
                ))
            } else {
                None
            };
            if let Some(message) = refused {
                return Err(match at {
                    Some(at) => origin.error_at(Some(at), message),
                    None => GatewayConfigError::new(Some(name.to_owned()), message),
                });
            }
            Some(token)
        }
        None => None,
    };
    let admin_enabled = !overrides.no_admin && admin.enabled.unwrap_or(true);
    let admin_listen_at = match (&admin_listen, &admin.listen) {
        (None, Some(spanned)) => Some(spanned.span().start),
        _ => None,
    };
    let admin = if admin_enabled {
        let listen = match (admin_listen, admin.listen) {
            (Some(listen), _) => listen,
            (None, Some(written)) => listen_addr(written, origin)?,
            (None, None) => defaults::ADMIN_LISTEN,
        };
        Some(AdminConfig { listen, token })
    } else {
        None
    };
    if let Some(admin) = &admin {
        // The admin address is named where it was set: a flag, or the file.
        let at_admin_listen = |message: String| {
            if overrides.admin_listen.is_some() {
                GatewayConfigError::new(Some(ADMIN_LISTEN_FLAG.to_owned()), message)
            } else {
                origin.error_at(admin_listen_at, message)
            }
        };
        lint::admin_listener(admin.listen, admin.token.as_deref()).map_err(at_admin_listen)?;
        if same_port(server.listen, admin.listen) {
            let message = format!(
                "the admin listener ({}) and the gateway ({}) cannot share a port: give the admin listener another (or disable it)",
                admin.listen, server.listen
            );
            // Where the admin address is the default, the gateway's is named.
            return Err(match admin_listen_at {
                None if overrides.admin_listen.is_none() && overrides.listen.is_some() => {
                    GatewayConfigError::new(Some("--listen (or IDEM_LISTEN)".to_owned()), message)
                }
                None if overrides.admin_listen.is_none() => {
                    origin.error_at(server_listen_at, message)
                }
                _ => at_admin_listen(message),
            });
        }
    }
    Ok(admin)
}

/// `[log]`.
fn log_config(log: LogSection, origin: &Origin) -> Result<LogConfig, GatewayConfigError> {
    let level = match &log.level {
        Some(spanned) => {
            let level = spanned.get_ref();
            if let Err(err) = tracing_subscriber::EnvFilter::try_new(level) {
                return Err(origin.error_at(
                    Some(spanned.span().start),
                    format!("invalid log level {level:?}: {err}"),
                ));
            }
            level.clone()
        }
        None => defaults::LOG_LEVEL.to_owned(),
    };
    let log = LogConfig {
        format: log.format.unwrap_or_default(),
        level,
    };
    Ok(log)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The `[store]` of `text`, checked for a build with `backends`.
    fn store_of(text: &str, backends: Backends) -> Result<StoreConfig, GatewayConfigError> {
        let file: FileConfig = ::toml::from_str(text).unwrap();
        let origin = Origin::file("idem.toml", text);
        store_config(file.store, None, &Overrides::default(), &origin, backends)
    }

    /// A build without a store refuses it in the configuration, so `check-config` and `serve`
    /// (both build the configuration) refuse it alike: before, only opening it did, and
    /// `check-config` said `ok`.
    #[test]
    fn a_store_the_build_lacks_is_refused_at_its_line() {
        let without_redis = Backends {
            redis: false,
            postgres: true,
            redb: true,
        };
        let text = "[store]\nurl = \"redis://127.0.0.1:6379\"\n";
        let err = store_of(text, without_redis).unwrap_err();
        assert_eq!(err.location(), Some("idem.toml:2:7"), "{err}");
        assert!(
            err.message()
                .starts_with("the redis store is not in this build of idem"),
            "{err}"
        );
        let flag = Overrides {
            store: Some("redis://127.0.0.1:6379".to_owned()),
            ..Overrides::default()
        };
        let file = FileConfig::default();
        let err = store_config(
            file.store,
            Some("redis://127.0.0.1:6379".parse().unwrap()),
            &flag,
            &Origin::none(),
            without_redis,
        )
        .unwrap_err();
        assert_eq!(err.location(), Some(STORE_FLAG), "{err}");
        assert!(store_of("[store]\nurl = \"memory\"\n", without_redis).is_ok());
        let all = Backends {
            redis: true,
            ..without_redis
        };
        assert!(store_of(text, all).is_ok());
    }

    /// `localhost:0` in the file and in the flags, for the gateway and the admin listener:
    /// each is resolved to a loopback address (its first), port 0 kept. The admin listener on
    /// it needs no token (it is loopback).
    #[test]
    fn listen_addresses_may_be_host_names() {
        let text = "[server]\nlisten = \"localhost:0\"\n[admin]\nlisten = \"localhost:0\"\n";
        let config = crate::config::from_str("idem.toml", text, &Overrides::default()).unwrap();
        let admin = config.admin.unwrap().listen;
        for addr in [config.server.listen, admin] {
            assert!(addr.ip().is_loopback() && addr.port() == 0, "{addr}");
        }
        let flags = Overrides {
            listen: Some("localhost:0".to_owned()),
            admin_listen: Some("localhost:0".to_owned()),
            ..Overrides::default()
        };
        let config = crate::config::from_str("idem.toml", "", &flags).unwrap();
        let admin = config.admin.unwrap().listen;
        for addr in [config.server.listen, admin] {
            assert!(addr.ip().is_loopback() && addr.port() == 0, "{addr}");
        }
    }

    /// A listening name that does not resolve is refused where it is written.
    #[test]
    fn a_listening_name_that_does_not_resolve_is_refused_at_its_line() {
        // `.invalid` never resolves (RFC 6761).
        let text = "[server]\nlisten = \"idem-test.invalid:8080\"\n";
        let err = crate::config::from_str("idem.toml", text, &Overrides::default()).unwrap_err();
        assert_eq!(err.location(), Some("idem.toml:2:10"), "{err}");
        assert!(
            err.message().starts_with(
                "cannot listen on idem-test.invalid:8080: \"idem-test.invalid\" does not resolve"
            ),
            "{err}"
        );
        let flags = Overrides {
            admin_listen: Some("idem-test.invalid:9901".to_owned()),
            ..Overrides::default()
        };
        let err = crate::config::from_str("idem.toml", "", &flags).unwrap_err();
        assert_eq!(err.location(), Some(ADMIN_LISTEN_FLAG), "{err}");
    }

    /// The fence headers: on with the default names unless `[upstream]` says otherwise.
    #[test]
    fn fence_headers_are_on_by_default_and_named_in_upstream() {
        let overrides = Overrides::default();
        let upstream = "[upstream]\nurl = \"http://127.0.0.1:3000\"\n";
        let config = crate::config::from_str("idem.toml", upstream, &overrides).unwrap();
        assert_eq!(config.upstream.unwrap().fence, FenceHeaders::default());
        let text = format!(
            "{upstream}fence_headers = false\nfence_header = \"X-Fence\"\nattempt_header = \"X-Attempt\"\n"
        );
        let config = crate::config::from_str("idem.toml", &text, &overrides).unwrap();
        let fence = config.upstream.unwrap().fence;
        assert!(!fence.enabled);
        assert_eq!(fence.fence, "x-fence");
        assert_eq!(fence.attempt, "x-attempt");
    }
}
