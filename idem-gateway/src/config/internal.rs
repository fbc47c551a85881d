//! The validated configuration, made from the file and the overrides by ONE function,
//! [`Config::build`], which applies every default, checks the settings together and never
//! panics.

use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::Duration;

use http::{HeaderName, Method};
use toml::Spanned;

use super::ConfigError;
use super::toml::{FileConfig, KeyMode, LogFormat, OnStoreError, RouteSection};
use super::value::{
    ByteSize, HumanDuration, ListenAddr, PathPattern, ScopeSpec, StoreSpec, UpstreamUrl,
};
use crate::normal_path::NormalPath;
use crate::store::SettingError;

/// The defaults, in one place (the example config repeats them).
pub mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// `[server] listen`.
    pub const LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
    /// `[server] max_header_bytes`: 64 KiB.
    pub const MAX_HEADER_BYTES: usize = 64 * 1024;
    /// The smallest `max_header_bytes` the HTTP/1 parser takes.
    pub const MIN_HEADER_BYTES: usize = 8 * 1024;
    /// `[server] max_headers`.
    pub const MAX_HEADERS: usize = 100;
    /// `[server] shutdown_grace`.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// `[server] workers`: one serving thread per core the process may use.
    pub fn workers() -> std::num::NonZeroUsize {
        std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN)
    }
    /// The most `[server] workers`: each is a thread with its own runtime, listener and store
    /// connection, and no machine gains from more than this.
    pub const MAX_WORKERS: usize = 1024;
    /// `[upstream] connect_timeout`.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// `[upstream] timeout`.
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
    /// `[upstream] pool_idle_timeout`.
    pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
    /// `[upstream] pool_max_idle`.
    pub const POOL_MAX_IDLE: usize = 256;
    /// `[store] namespace`.
    pub const NAMESPACE: &str = "idem";
    /// `[store] memory_capacity`.
    pub const MEMORY_CAPACITY: usize = 1_000_000;
    /// `[store] memory_max_bytes`: 1 GiB.
    pub const MEMORY_MAX_BYTES: usize = 1 << 30;
    /// The smallest `[store] memory_max_bytes`: 1 MiB. Less would leave a shard's share too
    /// small for more than a few records (each is charged about 340 bytes before its key and
    /// response), and a share smaller than one record refuses every claim.
    pub const MIN_MEMORY_MAX_BYTES: usize = 1 << 20;
    /// `[admin] listen`.
    pub const ADMIN_LISTEN: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9901);
    /// `[log] level`.
    pub const LOG_LEVEL: &str = "info";
    /// `lease`.
    pub const LEASE: Duration = Duration::from_secs(30);
    /// `heartbeat` (and never more than a third of the lease).
    pub const HEARTBEAT: Duration = Duration::from_secs(10);
    /// `retention`.
    pub const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// `request_body_limit`: 1 MiB.
    pub const REQUEST_BODY_LIMIT: usize = 1024 * 1024;
    /// `storage_cap`: 1 MiB.
    pub const STORAGE_CAP: usize = 1024 * 1024;
    /// `header`.
    pub const HEADER: &str = "idempotency-key";
}

/// Settings given on the command line or in the environment; each wins over the file.
///
/// Values are the text as given: [`Config::build`] parses them with the same parsers as the
/// file, so a bad value gives the same one-line error, naming the flag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen` / `IDEM_LISTEN`.
    pub listen: Option<String>,
    /// `--upstream` / `IDEM_UPSTREAM`.
    pub upstream: Option<String>,
    /// `--store` / `IDEM_STORE`.
    pub store: Option<String>,
    /// `--retention` / `IDEM_RETENTION`: every route's retention.
    pub retention: Option<String>,
    /// `--lease` / `IDEM_LEASE`: every route's lease.
    pub lease: Option<String>,
    /// `--admin-listen` / `IDEM_ADMIN_LISTEN`.
    pub admin_listen: Option<String>,
    /// `--admin-token` / `IDEM_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// `--no-admin`: no admin listener.
    pub no_admin: bool,
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The public listener.
    pub server: ServerConfig,
    /// The upstream; `None` when neither the file nor the flags name one (`serve` needs it).
    pub upstream: Option<UpstreamConfig>,
    /// The store.
    pub store: StoreConfig,
    /// The admin listener; `None` when disabled.
    pub admin: Option<AdminConfig>,
    /// Logs.
    pub log: LogConfig,
    /// The routes in order, ending with the catch-all `/` route of the `[idempotency]` settings.
    pub routes: Vec<Route>,
}

/// The public listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The largest request head, in bytes (431 above it).
    pub max_header_bytes: usize,
    /// The most header lines (431 above it).
    pub max_headers: usize,
    /// How long in-flight requests may run on after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Serving threads, each with its own listener on the port, runtime and upstream pool.
    pub workers: NonZeroUsize,
}

/// The upstream service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Its base URL.
    pub url: UpstreamUrl,
    /// The limit to connect (504 after it, the key released).
    pub connect_timeout: Duration,
    /// The limit for the response head (504 after it).
    pub timeout: Duration,
    /// How long idle pooled connections are kept.
    pub pool_idle_timeout: Duration,
    /// The most idle pooled connections.
    pub pool_max_idle: usize,
}

/// The store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which store.
    pub spec: StoreSpec,
    /// The namespace of this gateway's records.
    pub namespace: String,
    /// The memory store's capacity, in records.
    pub memory_capacity: NonZeroUsize,
    /// The memory store's byte budget.
    pub memory_max_bytes: NonZeroUsize,
}

/// The admin listener.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Its address.
    pub listen: SocketAddr,
    /// The bearer token every request must carry, when set.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Text or JSON lines.
    pub format: LogFormat,
    /// The tracing filter.
    pub level: String,
}

/// One route: the paths it covers and its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Its name in logs and metrics.
    pub name: String,
    /// The paths it covers.
    pub path: PathPattern,
    /// What the idempotency layer does on it.
    pub settings: RouteSettings,
}

/// The idempotency settings of a route: what the idem-http layer is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSettings {
    /// `false`: the route is proxied untouched.
    pub enabled: bool,
    /// The key header.
    pub header: HeaderName,
    /// The covered methods.
    pub methods: Vec<Method>,
    /// Key required or optional.
    pub key: KeyMode,
    /// Where the scope comes from.
    pub scope: ScopeSpec,
    /// The lease of a claim.
    pub lease: Duration,
    /// The heartbeat interval (shorter than the lease).
    pub heartbeat: Duration,
    /// How long a stored response is kept.
    pub retention: Duration,
    /// Bounded wait for an in-flight original; `None`: answer 409 at once.
    pub wait: Option<Duration>,
    /// The request body limit of covered requests.
    pub request_body_limit: NonZeroUsize,
    /// The largest stored response.
    pub storage_cap: NonZeroUsize,
    /// Whether 5xx responses are stored.
    pub store_server_errors: bool,
    /// Fail closed or open when the store is down.
    pub on_store_error: OnStoreError,
    /// Strict key syntax.
    pub strict_keys: bool,
    /// Response headers stored after all.
    pub allow_headers: Vec<HeaderName>,
    /// Response headers never stored.
    pub deny_headers: Vec<HeaderName>,
    /// Whether logs carry keys as sent.
    pub log_keys: bool,
}

/// Headers that describe one connection: never stored, so never allowed.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
];

/// Where the configuration came from, to turn byte offsets into `file:line:column`.
#[derive(Clone, Debug, Default)]
pub struct Origin {
    name: Option<String>,
    text: String,
}

impl Origin {
    /// No file: only defaults and overrides.
    #[must_use]
    pub fn none() -> Self {
        Origin::default()
    }

    /// A file named `name` (as the user wrote it) holding `text`.
    #[must_use]
    pub fn file(name: impl Into<String>, text: impl Into<String>) -> Self {
        Origin {
            name: Some(name.into()),
            text: text.into(),
        }
    }

    /// `file:line:column` of a byte offset (1-based), or `None` without a file.
    pub(crate) fn position(&self, offset: usize) -> Option<String> {
        let name = self.name.as_ref()?;
        let before = self
            .text
            .get(..offset.min(self.text.len()))
            .unwrap_or(&self.text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Some(format!("{name}:{line}:{column}"))
    }

    /// An error at a byte offset of the file.
    pub(crate) fn error_at(
        &self,
        offset: Option<usize>,
        message: impl Into<String>,
    ) -> ConfigError {
        let location = match (offset, &self.name) {
            (Some(offset), _) => self.position(offset),
            (None, name) => name.clone(),
        };
        ConfigError::new(location, message)
    }
}

/// How errors name an override: the flag and its environment variable, since either may
/// have set it.
const STORE_FLAG: &str = "--store (or IDEM_STORE)";
/// See [`STORE_FLAG`].
const LEASE_FLAG: &str = "--lease (or IDEM_LEASE)";
/// See [`STORE_FLAG`].
const RETENTION_FLAG: &str = "--retention (or IDEM_RETENTION)";

/// An override parsed with the file's parser; a bad value names the flag and its variable.
fn flag<T: std::str::FromStr<Err = String>>(
    value: Option<&String>,
    flag: &str,
) -> Result<Option<T>, ConfigError> {
    value
        .map(|text| {
            text.parse::<T>()
                .map_err(|err| ConfigError::new(Some(flag.to_owned()), err))
        })
        .transpose()
}

fn socket_addr(value: Option<&String>, name: &str) -> Result<Option<SocketAddr>, ConfigError> {
    Ok(flag::<ListenAddr>(value, name)?.map(|ListenAddr(addr)| addr))
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

fn positive(
    value: Duration,
    what: &str,
    origin: &Origin,
    at: Option<usize>,
) -> Result<Duration, ConfigError> {
    if value.is_zero() {
        return Err(origin.error_at(at, format!("{what} must be longer than zero")));
    }
    Ok(value)
}

/// A size setting of a section (at least 1 byte), or `inherited` when the section sets none.
fn size(
    value: Option<&Spanned<ByteSize>>,
    what: &str,
    inherited: NonZeroUsize,
    origin: &Origin,
) -> Result<NonZeroUsize, ConfigError> {
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

fn header_names(
    names: &[String],
    allow: bool,
    origin: &Origin,
    at: Option<usize>,
) -> Result<Vec<HeaderName>, ConfigError> {
    names
        .iter()
        .map(|name| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| origin.error_at(at, format!("{name:?} is not a header name")))?;
            if allow && HOP_BY_HOP.contains(&header.as_str()) {
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
fn settings(
    section: &RouteSection,
    parent: &RouteSettings,
    lease_override: Option<Duration>,
    retention_override: Option<Duration>,
    origin: &Origin,
    at: Option<usize>,
) -> Result<RouteSettings, ConfigError> {
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
    let retention = positive(
        retention_override
            .or(section.retention.as_ref().map(|d| d.get_ref().0))
            .unwrap_or(parent.retention),
        "the retention",
        origin,
        position(section.retention.as_ref(), at),
    )?;
    let header = match &section.header {
        Some(name) => HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
            origin.error_at(
                Some(name.span().start),
                format!("header {:?} is not a header name", name.get_ref()),
            )
        })?,
        None => parent.header.clone(),
    };
    let methods = match &section.methods {
        Some(methods) if methods.get_ref().is_empty() => {
            return Err(origin.error_at(
                Some(methods.span().start),
                "methods is empty: cover at least one method (or set enabled = false)",
            ));
        }
        Some(methods) => methods.get_ref().iter().map(|m| m.0.clone()).collect(),
        None => parent.methods.clone(),
    };
    let wait = match section.wait {
        Some(HumanDuration(d)) if d.is_zero() => None,
        Some(HumanDuration(d)) => Some(d),
        None => parent.wait,
    };
    let request_body_limit = size(
        section.request_body_limit.as_ref(),
        "request_body_limit",
        parent.request_body_limit,
        origin,
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
    Ok(RouteSettings {
        enabled: section.enabled.unwrap_or(parent.enabled),
        header,
        methods,
        key: section.key.unwrap_or(parent.key),
        scope: section
            .scope
            .clone()
            .unwrap_or_else(|| parent.scope.clone()),
        lease,
        heartbeat,
        retention,
        wait,
        request_body_limit,
        storage_cap,
        store_server_errors: section
            .store_server_errors
            .unwrap_or(parent.store_server_errors),
        on_store_error: section.on_store_error.unwrap_or(parent.on_store_error),
        strict_keys: section.strict_keys.unwrap_or(parent.strict_keys),
        allow_headers,
        deny_headers,
        log_keys: section.log_keys.unwrap_or(parent.log_keys),
    })
}

impl Default for RouteSettings {
    /// The documented defaults (DESIGN.md section 5).
    fn default() -> Self {
        RouteSettings {
            enabled: true,
            header: HeaderName::from_static(defaults::HEADER),
            methods: vec![Method::POST, Method::PATCH],
            key: KeyMode::Optional,
            scope: ScopeSpec::Authorization,
            lease: defaults::LEASE,
            heartbeat: defaults::HEARTBEAT,
            retention: defaults::RETENTION,
            wait: None,
            request_body_limit: NonZeroUsize::new(defaults::REQUEST_BODY_LIMIT)
                .unwrap_or(NonZeroUsize::MIN),
            storage_cap: NonZeroUsize::new(defaults::STORAGE_CAP).unwrap_or(NonZeroUsize::MIN),
            store_server_errors: false,
            on_store_error: OnStoreError::FailClosed,
            strict_keys: false,
            allow_headers: Vec::new(),
            deny_headers: Vec::new(),
            log_keys: true,
        }
    }
}

impl Config {
    /// THE function that turns a parsed file and the overrides into a validated configuration:
    /// every default is applied and every setting checked here, and nothing in it panics. Each
    /// error is one line naming where the bad value is (`file:line:column`, or the flag).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first setting refused.
    pub fn build(
        file: FileConfig,
        overrides: &Overrides,
        origin: &Origin,
    ) -> Result<Config, ConfigError> {
        // Overrides first: a bad flag is reported even when the file is fine.
        let listen = socket_addr(overrides.listen.as_ref(), "--listen (or IDEM_LISTEN)")?;
        let upstream_url =
            flag::<UpstreamUrl>(overrides.upstream.as_ref(), "--upstream (or IDEM_UPSTREAM)")?;
        let store_spec = flag::<StoreSpec>(overrides.store.as_ref(), STORE_FLAG)?;
        let retention =
            flag::<HumanDuration>(overrides.retention.as_ref(), RETENTION_FLAG)?.map(|d| d.0);
        let lease = flag::<HumanDuration>(overrides.lease.as_ref(), LEASE_FLAG)?.map(|d| d.0);
        let admin_listen = socket_addr(
            overrides.admin_listen.as_ref(),
            "--admin-listen (or IDEM_ADMIN_LISTEN)",
        )?;
        for (value, name) in [(lease, LEASE_FLAG), (retention, RETENTION_FLAG)] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(ConfigError::new(
                    Some(name.to_owned()),
                    "must be longer than zero",
                ));
            }
        }

        let FileConfig {
            server,
            upstream,
            store,
            admin,
            log,
            idempotency,
            routes,
        } = file;

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
        let server_listen_at = match (&listen, &server.listen) {
            (None, Some(spanned)) => Some(spanned.span().start),
            _ => None,
        };
        let server = ServerConfig {
            listen: listen
                .or(server.listen.map(|spanned| spanned.into_inner().0))
                .unwrap_or(defaults::LISTEN),
            max_header_bytes,
            max_headers,
            shutdown_grace: server
                .shutdown_grace
                .map_or(defaults::SHUTDOWN_GRACE, |d| d.0),
            workers,
        };

        let upstream = match upstream_url.or(upstream.url.clone()) {
            None => None,
            Some(url) => Some(UpstreamConfig {
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
                pool_idle_timeout: upstream
                    .pool_idle_timeout
                    .map_or(defaults::POOL_IDLE_TIMEOUT, |d| d.0),
                pool_max_idle: upstream.pool_max_idle.unwrap_or(defaults::POOL_MAX_IDLE),
            }),
        };

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
        if let Err(err) = crate::store::check_settings(&spec, &namespace) {
            return Err(match err {
                SettingError::Url(message) => match spec_at {
                    Some(at) => origin.error_at(Some(at), message),
                    None if overrides.store.is_some() => {
                        ConfigError::new(Some(STORE_FLAG.to_owned()), message)
                    }
                    None => origin.error_at(None, message),
                },
                SettingError::Namespace(message) => {
                    origin.error_at(store.namespace.as_ref().map(|ns| ns.span().start), message)
                }
            });
        }
        let store = StoreConfig {
            spec,
            namespace,
            memory_capacity,
            memory_max_bytes,
        };

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
                if token.is_empty() || !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                    let message = "the admin token must be printable ASCII without spaces";
                    return Err(match at {
                        Some(at) => origin.error_at(Some(at), message),
                        None => ConfigError::new(Some(name.to_owned()), message),
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
        let admin = admin_enabled.then(|| AdminConfig {
            listen: admin_listen
                .or(admin.listen.map(|spanned| spanned.into_inner().0))
                .unwrap_or(defaults::ADMIN_LISTEN),
            token,
        });
        if let Some(admin) = &admin {
            if same_port(server.listen, admin.listen) {
                let message = format!(
                    "the admin listener ({}) and the gateway ({}) cannot share a port: give the admin listener another (or disable it)",
                    admin.listen, server.listen
                );
                // The admin address is named where it was set: a flag, or the file.
                return Err(match (overrides.admin_listen.is_some(), admin_listen_at) {
                    (true, _) => ConfigError::new(
                        Some("--admin-listen (or IDEM_ADMIN_LISTEN)".to_owned()),
                        message,
                    ),
                    (false, Some(at)) => origin.error_at(Some(at), message),
                    (false, None) if overrides.listen.is_some() => {
                        ConfigError::new(Some("--listen (or IDEM_LISTEN)".to_owned()), message)
                    }
                    (false, None) => origin.error_at(server_listen_at, message),
                });
            }
        }

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

        let base = RouteSettings::default();
        let (top, top_at) = match &idempotency {
            Some(spanned) => (spanned.get_ref().clone(), Some(spanned.span().start)),
            None => (RouteSection::default(), None),
        };
        if top.path.is_some() || top.name.is_some() {
            return Err(origin.error_at(
                top_at,
                "[idempotency] takes no name or path: those are for [[route]] entries",
            ));
        }
        let defaults = settings(&top, &base, lease, retention, origin, top_at)?;
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
                path,
                settings: settings(section, &defaults, lease, retention, origin, at)?,
            });
        }
        resolved.push(Route {
            name: DEFAULT_ROUTE.to_owned(),
            path: PathPattern::Prefix("/".to_owned()),
            settings: defaults,
        });

        Ok(Config {
            server,
            upstream,
            store,
            admin,
            log,
            routes: resolved,
        })
    }

    /// The first route that covers the request path `path`, in its normal form as the gateway
    /// matches it (the catch-all `/` route covers every path).
    #[must_use]
    pub fn route_for(&self, path: &NormalPath<'_>) -> Option<&Route> {
        self.routes.iter().find(|route| route.path.matches(path))
    }

    /// The upstream, or the error `serve` gives without one.
    ///
    /// # Errors
    /// [`ConfigError`] when no upstream is configured.
    pub fn require_upstream(&self) -> Result<&UpstreamConfig, ConfigError> {
        self.upstream.as_ref().ok_or_else(|| {
            ConfigError::new(
                None,
                "no upstream: set [upstream] url in the config, --upstream or IDEM_UPSTREAM",
            )
        })
    }
}

/// The name of the catch-all route, of the paths no `[[route]]` covers (`[idempotency]`).
pub const DEFAULT_ROUTE: &str = "default";

/// The address the demo and tests bind to: 127.0.0.1 on a free port.
#[must_use]
pub fn loopback_any_port() -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}
