//! The validated configuration, made from the file and the overrides by ONE function,
//! [`Config::build`], which applies every default, checks the settings together and never
//! panics.

use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::Duration;

use http::{HeaderName, Method};
use idem::StoreSpec;

use super::GatewayConfigError;
use super::lint::ConfigWarning;
use super::tls::UpstreamTls;
use super::toml::{KeyMode, LogFormat, OnStoreError, OnUnknown};
use super::value::{RoutePath, ScopeSpec, UpstreamUrl};
use crate::fence::FenceHeaders;

/// The defaults, in one place (the example config repeats them).
pub(crate) mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// `[server] listen`.
    pub(crate) const LISTEN: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
    /// `[server] max_header_bytes`: 64 KiB.
    pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
    /// The smallest `max_header_bytes` the HTTP/1 parser takes.
    pub(crate) const MIN_HEADER_BYTES: usize = 8 * 1024;
    /// `[server] max_headers`.
    pub(crate) const MAX_HEADERS: usize = 100;
    /// `[server] shutdown_grace`.
    pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// `[server] workers`: one serving thread per core the process may use.
    pub(crate) fn workers() -> std::num::NonZeroUsize {
        std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN)
    }
    /// The most `[server] workers`: each is a thread with its own runtime, listener and store
    /// connection, and no machine gains from more than this.
    pub(crate) const MAX_WORKERS: usize = 1024;
    /// `[server] max_connections`.
    pub(crate) const MAX_CONNECTIONS: std::num::NonZeroUsize =
        std::num::NonZeroUsize::new(10_000).expect("not zero");
    /// `[server] header_timeout`.
    pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
    /// `[upstream] connect_timeout`.
    pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// `[upstream] timeout`.
    pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
    /// `[upstream] body_idle_timeout`.
    pub(crate) const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// `[upstream] pool_idle_timeout`.
    pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
    /// `[upstream] pool_max_idle`.
    pub(crate) const POOL_MAX_IDLE: usize = 256;
    /// `[store] namespace`.
    pub(crate) const NAMESPACE: &str = "idem";
    /// `[store] memory_capacity`.
    pub(crate) const MEMORY_CAPACITY: usize = 1_000_000;
    /// `[store] memory_max_bytes`: 1 GiB.
    pub(crate) const MEMORY_MAX_BYTES: usize = 1 << 30;
    /// The smallest `[store] memory_max_bytes`: 1 MiB. Less would leave a shard's share too
    /// small for more than a few records (each is charged about 340 bytes before its key and
    /// response), and a share smaller than one record refuses every claim.
    pub(crate) const MIN_MEMORY_MAX_BYTES: usize = 1 << 20;
    /// `[admin] listen`.
    pub(crate) const ADMIN_LISTEN: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9901);
    /// `[log] level`.
    pub(crate) const LOG_LEVEL: &str = "info";
    /// `lease`.
    pub(crate) const LEASE: Duration = Duration::from_secs(30);
    /// `heartbeat` (and never more than a third of the lease).
    pub(crate) const HEARTBEAT: Duration = Duration::from_secs(10);
    /// `retention`.
    pub(crate) const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// `request_body_limit`: 1 MiB.
    pub(crate) const REQUEST_BODY_LIMIT: usize = 1024 * 1024;
    /// `request_body_timeout`.
    pub(crate) const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(10);
    /// `storage_cap`: 1 MiB.
    pub(crate) const STORAGE_CAP: usize = 1024 * 1024;
    /// `header`.
    pub(crate) const HEADER: &str = "idempotency-key";
}

/// Settings given on the command line or in the environment; each wins over the file.
///
/// Values are the text as given: [`from_str`](super::from_str) and [`load`](super::load) parse
/// them with the same parsers as the file, so a bad value gives the same one-line error, naming
/// the flag.
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
    /// `IDEM_SCOPE_SECRET` (no flag: a secret on the command line is in every process list).
    pub scope_secret: Option<String>,
    /// `--no-admin`: no admin listener.
    pub no_admin: bool,
    /// `--redb-allow-empty`: an existing empty redb file opens as a new store.
    pub redb_allow_empty: bool,
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
    /// The settings taken that are most likely mistakes (see [`ConfigWarning`]): `check-config`
    /// prints them, `serve` logs them.
    pub warnings: Vec<ConfigWarning>,
}

/// The public listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// The address to listen on (a host name resolved to its first address).
    pub listen: SocketAddr,
    /// The largest request head, in bytes (431 above it).
    pub max_header_bytes: usize,
    /// The most header lines (431 above it).
    pub max_headers: usize,
    /// How long in-flight requests may run on after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Serving threads, each with its own listener on the port, runtime and upstream pool.
    pub workers: NonZeroUsize,
    /// The most client connections open at once (over all serving threads); a connection
    /// past it waits in the listen backlog until one closes.
    pub max_connections: NonZeroUsize,
    /// The limit from accept to a complete first request head (a connection that sends
    /// nothing, or only the HTTP/2 preface, is closed after it), and for each later head.
    pub header_timeout: Duration,
    /// Whether header names with an underscore are forwarded (else they are dropped).
    pub underscores_in_headers: bool,
    /// Whether paths that servers resolve differently are forwarded (else they are 400).
    pub allow_ambiguous_paths: bool,
}

/// The upstream service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Its base URL.
    pub url: UpstreamUrl,
    /// The limit to connect (504 after it, the key released).
    pub connect_timeout: Duration,
    /// The limit for the response head (504 after it), and for the body's first frame before
    /// the head is passed on (streamed after the head past it).
    pub timeout: Duration,
    /// The longest pause within the response body: past it the body is broken off, as one the
    /// upstream broke off.
    pub body_idle_timeout: Duration,
    /// How long idle pooled connections are kept.
    pub pool_idle_timeout: Duration,
    /// The most idle pooled connections.
    pub pool_max_idle: usize,
    /// The headers that carry an attempt's fence and number to the upstream.
    pub fence: FenceHeaders,
    /// The TLS settings of an `https` upstream (`None` for `http`).
    pub tls: Option<UpstreamTls>,
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
    /// The secret credential scopes are hashed with (`IDEM_SCOPE_SECRET` or `[store]
    /// scope_secret_file`), if any.
    pub scope_secret: Option<ScopeSecretBytes>,
    /// Whether an existing empty redb file opens as a new store (`--redb-allow-empty`);
    /// refused otherwise.
    pub redb_allow_empty: bool,
}

/// The bytes of a scope secret. Never shown: its `Debug` says only how long it is.
#[derive(Clone, PartialEq, Eq)]
pub struct ScopeSecretBytes(pub(crate) Vec<u8>);

impl std::fmt::Debug for ScopeSecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopeSecretBytes({} bytes)", self.0.len())
    }
}

/// The admin listener.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Its address (a host name resolved to its first address).
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
    /// The paths it covers, and whether it folds their case.
    pub path: RoutePath,
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
    /// How long a covered request's whole body may take to arrive (408 after it).
    pub request_body_timeout: Duration,
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
    /// Whether the request's host is part of its fingerprint.
    pub fingerprint_host: bool,
    /// What a key whose outcome is unknown gets.
    pub on_unknown: OnUnknown,
    /// How long `hold` holds an unknown key; `None`: until resolved (or retention).
    pub unknown_hold: Option<Duration>,
    /// How long after a lost exchange `release` frees its key; `None`: the lease.
    pub release_grace: Option<Duration>,
    /// The reconcile request's path template (`{key}` once), if any.
    pub reconcile: Option<String>,
}

impl RouteSettings {
    /// How long a key whose outcome is unknown is held before it is freed (`None`: until it
    /// is resolved), as the policy says.
    #[must_use]
    pub fn unknown_hold(&self) -> Option<Duration> {
        match self.on_unknown {
            OnUnknown::Hold => self.unknown_hold,
            OnUnknown::Release => Some(self.release_grace.unwrap_or(self.lease)),
        }
    }
}

/// Where the configuration came from, to turn byte offsets into `file:line:column`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Origin {
    name: Option<String>,
    text: String,
}

impl Origin {
    /// No file: only defaults and overrides.
    #[must_use]
    pub(crate) fn none() -> Self {
        Origin::default()
    }

    /// A file named `name` (as the user wrote it) holding `text`.
    #[must_use]
    pub(crate) fn file(name: impl Into<String>, text: impl Into<String>) -> Self {
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
    ) -> GatewayConfigError {
        let location = match (offset, &self.name) {
            (Some(offset), _) => self.position(offset),
            (None, name) => name.clone(),
        };
        GatewayConfigError::new(location, message)
    }
}

impl Default for RouteSettings {
    /// The documented defaults.
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
            request_body_timeout: defaults::REQUEST_BODY_TIMEOUT,
            storage_cap: NonZeroUsize::new(defaults::STORAGE_CAP).unwrap_or(NonZeroUsize::MIN),
            store_server_errors: false,
            on_store_error: OnStoreError::FailClosed,
            strict_keys: false,
            allow_headers: Vec::new(),
            deny_headers: Vec::new(),
            log_keys: true,
            fingerprint_host: true,
            on_unknown: OnUnknown::Hold,
            unknown_hold: None,
            release_grace: None,
            reconcile: None,
        }
    }
}

impl Config {
    /// The upstream, or the error `serve` gives without one.
    ///
    /// # Errors
    /// [`GatewayConfigError`] when no upstream is configured.
    pub(crate) fn require_upstream(&self) -> Result<&UpstreamConfig, GatewayConfigError> {
        self.upstream.as_ref().ok_or_else(|| {
            GatewayConfigError::new(
                None,
                "no upstream: set [upstream] url in the config, --upstream or IDEM_UPSTREAM",
            )
        })
    }
}

/// The name of the catch-all route, of the paths no `[[route]]` covers (`[idempotency]`).
pub(crate) const DEFAULT_ROUTE: &str = "default";

/// The address the demo and tests bind to: 127.0.0.1 on a free port.
#[must_use]
pub(crate) fn loopback_any_port() -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}
