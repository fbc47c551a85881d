//! [`RedisConfig`]: where the server is and how the store uses it.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use idem_core::machine::LeasePolicy;
use idem_core::{Clock, SystemClock};

use crate::layout;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL cannot be parsed, or its scheme is not `redis`, `rediss`, `unix` or
    /// `redis+unix`.
    #[error("invalid Redis URL {url}: {reason}")]
    Url {
        /// The URL, with any password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `rediss://` URL, but the crate was built without its `tls` feature.
    #[error("{url} needs TLS: build idem-store-redis with the `tls` feature")]
    TlsNotBuilt {
        /// The URL, with any password masked.
        url: String,
    },
    /// A cluster configuration without any seed node.
    #[error("a Redis Cluster configuration needs at least one seed node")]
    NoSeeds,
    /// The namespace is not 1 to 64 bytes of `A-Za-z0-9_.-`.
    #[error("invalid namespace {0:?}: 1 to 64 bytes of letters, digits, '_', '-' and '.'")]
    Namespace(String),
    /// Redis Cluster only has database 0.
    #[error("Redis Cluster only has database 0, not {0}")]
    ClusterDatabase(u32),
    /// A timeout of zero.
    #[error("the {0} timeout must be longer than zero")]
    ZeroTimeout(&'static str),
}

/// Which servers to use.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Nodes {
    /// One server (or a primary behind a proxy).
    Single(String),
    /// The seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

/// An offset added to the store's clock, shared by every clone: a test hook that moves store
/// time forward without sleeping (a conformance harness "advances the clock" with it).
///
/// Production code never needs it: the default offset is zero, and store time is the server's
/// (`TIME`), estimated with a bounded error, never the client's own clock.
///
/// ```
/// use std::time::Duration;
/// use idem_store_redis::ClockOffset;
///
/// let offset = ClockOffset::new();
/// let shared = offset.clone();
/// offset.advance(Duration::from_secs(31));
/// assert_eq!(shared.micros(), 31_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClockOffset(Arc<AtomicI64>);

impl ClockOffset {
    /// The largest offset, in either direction: about 31 years.
    pub const MAX_MICROS: i64 = 1_000_000_000_000_000;

    /// An offset of zero.
    #[must_use]
    pub fn new() -> Self {
        ClockOffset::default()
    }

    /// Moves store time forward by `by` (saturating at [`ClockOffset::MAX_MICROS`]).
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        // fetch_update with a closure that always returns Some never fails.
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| {
                Some(m.saturating_add(by).min(Self::MAX_MICROS))
            });
    }

    /// Sets the offset to `micros` (clamped to [`ClockOffset::MAX_MICROS`] either way); a
    /// negative offset moves store time back, for tests of a server clock that steps back.
    pub fn set_micros(&self, micros: i64) {
        self.0.store(
            micros.clamp(-Self::MAX_MICROS, Self::MAX_MICROS),
            Ordering::SeqCst,
        );
    }

    /// The offset, in microseconds.
    #[must_use]
    pub fn micros(&self) -> i64 {
        self.0
            .load(Ordering::SeqCst)
            .clamp(-Self::MAX_MICROS, Self::MAX_MICROS)
    }
}

/// The configuration of a [`crate::RedisStore`]: the server (one node or a Cluster's seeds),
/// credentials, database, key namespace, timeouts and storage settings.
///
/// Consuming `with_*` methods; the fallible ones return [`RedisConfigError`]. The defaults:
///
/// | setting | default |
/// |---|---|
/// | namespace | `default` |
/// | connect timeout | 2 s (each connection attempt) |
/// | command timeout | 1 s (every store operation, reconnects included) |
/// | compression threshold | off (idem-http compresses response bodies itself) |
/// | max result size | 16 MiB (before compression) |
/// | lease policy | lenient ([`LeasePolicy::Lenient`]) |
/// | fence memory | 60 s |
///
/// ```
/// use std::time::Duration;
/// use idem_store_redis::RedisConfig;
///
/// let config = RedisConfig::new("redis://127.0.0.1:6379/0")?
///     .with_namespace("payments")?
///     .with_command_timeout(Duration::from_millis(250))?;
/// assert_eq!(config.namespace(), "payments");
///
/// let cluster = RedisConfig::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])?;
/// assert!(cluster.is_cluster());
/// # Ok::<(), idem_store_redis::RedisConfigError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisConfig {
    pub(crate) nodes: Nodes,
    pub(crate) namespace: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<u32>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) compression_threshold: usize,
    pub(crate) max_result_size: NonZeroUsize,
    pub(crate) lease_policy: LeasePolicy,
    pub(crate) fence_memory: Duration,
    pub(crate) clock_offset: ClockOffset,
    pub(crate) local_clock: Arc<dyn Clock>,
    pub(crate) tls_root: Option<Vec<u8>>,
}

const DEFAULT_MAX_RESULT: NonZeroUsize = match NonZeroUsize::new(16 << 20) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

impl RedisConfig {
    /// A single server at `url`: `redis://[user[:password]@]host[:port][/db]`, `rediss://...`
    /// (TLS, with the `tls` feature), or `unix:///path/to/redis.sock`.
    ///
    /// # Errors
    /// [`RedisConfigError::Url`] if the URL does not parse; [`RedisConfigError::TlsNotBuilt`] for
    /// `rediss://` without the `tls` feature.
    pub fn new(url: impl Into<String>) -> Result<Self, RedisConfigError> {
        let url = url.into();
        check_url(&url)?;
        Ok(RedisConfig::with_nodes(Nodes::Single(url)))
    }

    /// A Redis Cluster reached through `seeds` (any of its nodes; the client discovers the
    /// rest). Each seed is a URL as for [`RedisConfig::new`].
    ///
    /// # Errors
    /// [`RedisConfigError::NoSeeds`] for an empty list; [`RedisConfigError::Url`] or
    /// [`RedisConfigError::TlsNotBuilt`] for a bad seed.
    pub fn cluster<I, S>(seeds: I) -> Result<Self, RedisConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let seeds: Vec<String> = seeds.into_iter().map(Into::into).collect();
        if seeds.is_empty() {
            return Err(RedisConfigError::NoSeeds);
        }
        for seed in &seeds {
            check_url(seed)?;
        }
        Ok(RedisConfig::with_nodes(Nodes::Cluster(seeds)))
    }

    fn with_nodes(nodes: Nodes) -> Self {
        RedisConfig {
            nodes,
            namespace: "default".to_owned(),
            username: None,
            password: None,
            database: None,
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(1),
            compression_threshold: usize::MAX,
            max_result_size: DEFAULT_MAX_RESULT,
            lease_policy: LeasePolicy::Lenient,
            fence_memory: Duration::from_secs(60),
            clock_offset: ClockOffset::new(),
            local_clock: Arc::new(SystemClock),
            tls_root: None,
        }
    }

    /// The key namespace: every record lives at `idem:{<namespace>:...}` (default `default`).
    /// Two stores with different namespaces never see each other's records.
    ///
    /// # Errors
    /// [`RedisConfigError::Namespace`] unless it is 1 to 64 bytes of `A-Za-z0-9_.-`.
    pub fn with_namespace(
        mut self,
        namespace: impl Into<String>,
    ) -> Result<Self, RedisConfigError> {
        let namespace = namespace.into();
        if !layout::valid_namespace(&namespace) {
            return Err(RedisConfigError::Namespace(namespace));
        }
        self.namespace = namespace;
        Ok(self)
    }

    /// The user name (Redis 6 ACL); overrides one in the URL.
    pub fn with_username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password; overrides one in the URL.
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The database number; overrides one in the URL.
    ///
    /// # Errors
    /// [`RedisConfigError::ClusterDatabase`] for a database other than 0 on a Cluster.
    pub fn with_database(mut self, database: u32) -> Result<Self, RedisConfigError> {
        if database != 0 && self.is_cluster() {
            return Err(RedisConfigError::ClusterDatabase(database));
        }
        self.database = Some(database);
        Ok(self)
    }

    /// How long one connection attempt may take (default 2 s).
    ///
    /// # Errors
    /// [`RedisConfigError::ZeroTimeout`] for zero.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Result<Self, RedisConfigError> {
        if timeout.is_zero() {
            return Err(RedisConfigError::ZeroTimeout("connect"));
        }
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// How long one store operation may take, reconnecting included (default 1 s); past it the
    /// operation answers [`idem_core::StoreError::Timeout`].
    ///
    /// # Errors
    /// [`RedisConfigError::ZeroTimeout`] for zero.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Result<Self, RedisConfigError> {
        if timeout.is_zero() {
            return Err(RedisConfigError::ZeroTimeout("command"));
        }
        self.command_timeout = timeout;
        Ok(self)
    }

    /// Results longer than this many bytes are lz4-compressed before they are stored, when
    /// that makes them smaller. Off by default (`usize::MAX`): idem-http compresses a
    /// response's body itself, once, and a second pass over it costs time for nothing. Set it
    /// for large results of your own that are not compressed (a worker's, say).
    pub fn with_compression_threshold(mut self, bytes: usize) -> Self {
        self.compression_threshold = bytes;
        self
    }

    /// The longest result the store takes, before compression (default 16 MiB); a longer one
    /// is refused with [`idem_core::StoreError::TooLarge`]. Also the most a stored compressed
    /// result may claim to expand to when it is read.
    pub fn with_max_result_size(mut self, bytes: NonZeroUsize) -> Self {
        self.max_result_size = bytes;
        self
    }

    /// Whether a holder whose lease lapsed (but was not taken over) may still heartbeat,
    /// complete or fail (default: lenient, it may).
    pub fn with_lease_policy(mut self, policy: LeasePolicy) -> Self {
        self.lease_policy = policy;
        self
    }

    /// How long a key remembers its last fence after its record is released, failed with a
    /// retryable failure, deleted or expired (default 60 s). The next grant's fence is above it
    /// even if the server's clock has not moved on (two scripts in the same microsecond) or
    /// stepped back by less than this. The cost: a tombstone of about 100 bytes per such key
    /// for that long. Zero forgets at once: fences then rest on the server clock alone.
    pub fn with_fence_memory(mut self, memory: Duration) -> Self {
        self.fence_memory = memory;
        self
    }

    /// Trusts this PEM root certificate for `rediss://` connections (a private CA or a
    /// self-signed server certificate), in place of the system's roots.
    #[cfg(feature = "tls")]
    pub fn with_tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root = Some(pem.into());
        self
    }

    /// A [`ClockOffset`] added to the server's time: a test hook (see its docs).
    pub fn with_clock_offset(mut self, offset: ClockOffset) -> Self {
        self.clock_offset = offset;
        self
    }

    /// The local clock the store's estimate of the server's clock runs on (the system's by
    /// default): a test hook, for handles whose local clocks disagree. The store measures its
    /// offset to the server's `TIME` at connect and every 30 s, so any local clock gives the
    /// same store time within the estimate's bound.
    pub fn with_local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.local_clock = clock;
        self
    }

    /// The key namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether this is a Redis Cluster configuration.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self.nodes, Nodes::Cluster(_))
    }

    /// The command timeout.
    #[must_use]
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The connect timeout.
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The compression threshold, in bytes.
    #[must_use]
    pub fn compression_threshold(&self) -> usize {
        self.compression_threshold
    }

    /// The lease policy.
    #[must_use]
    pub fn lease_policy(&self) -> LeasePolicy {
        self.lease_policy
    }

    /// The clock offset (zero unless a test set one).
    #[must_use]
    pub fn clock_offset(&self) -> &ClockOffset {
        &self.clock_offset
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = match &self.nodes {
            Nodes::Single(url) => vec![mask(url)],
            Nodes::Cluster(seeds) => seeds.iter().map(|s| mask(s)).collect(),
        };
        f.debug_struct("RedisConfig")
            .field("cluster", &self.is_cluster())
            .field("nodes", &nodes)
            .field("namespace", &self.namespace)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("compression_threshold", &self.compression_threshold)
            .field("max_result_size", &self.max_result_size)
            .field("lease_policy", &self.lease_policy)
            .field("fence_memory", &self.fence_memory)
            .field("clock_offset_micros", &self.clock_offset.micros())
            .field("tls_root", &self.tls_root.as_ref().map(|_| "set"))
            .finish()
    }
}

/// `url` with the password of its user-info part replaced by `***`.
pub(crate) fn mask(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user_info = &rest[..at];
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            format!("{scheme}://{user}:***{}", &rest[at..])
        }
        None => url.to_owned(),
    }
}

fn check_url(url: &str) -> Result<(), RedisConfigError> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis" | "unix" | "redis+unix") => {}
        Some("rediss") => {
            if !cfg!(feature = "tls") {
                return Err(RedisConfigError::TlsNotBuilt { url: mask(url) });
            }
        }
        _ => {
            return Err(RedisConfigError::Url {
                url: mask(url),
                reason: "the scheme is not redis://, rediss://, unix:// or redis+unix://"
                    .to_owned(),
            });
        }
    }
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(|_| ())
        .map_err(|err| RedisConfigError::Url {
            url: mask(url),
            reason: err.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_masked() {
        assert!(RedisConfig::new("redis://127.0.0.1:6379/2").is_ok());
        assert!(RedisConfig::new("unix:///run/redis.sock").is_ok());
        assert!(matches!(
            RedisConfig::new("http://127.0.0.1"),
            Err(RedisConfigError::Url { .. })
        ));
        assert!(matches!(
            RedisConfig::new("redis://127.0.0.1:notaport"),
            Err(RedisConfigError::Url { .. })
        ));
        let tls = RedisConfig::new("rediss://127.0.0.1:6380");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls"));
        assert!(matches!(
            RedisConfig::cluster(Vec::<String>::new()),
            Err(RedisConfigError::NoSeeds)
        ));

        let config = RedisConfig::new("redis://app:s3cret@127.0.0.1:6379")
            .unwrap()
            .with_password("other-s3cret");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("app:***@127.0.0.1"), "{debug}");
        assert_eq!(mask("redis://127.0.0.1"), "redis://127.0.0.1");
        assert_eq!(mask("redis://:pw@h/0"), "redis://:***@h/0");
    }

    #[test]
    fn settings_are_validated() {
        let config = RedisConfig::new("redis://127.0.0.1").unwrap();
        assert!(config.clone().with_namespace("a b").is_err());
        assert!(config.clone().with_command_timeout(Duration::ZERO).is_err());
        assert!(config.clone().with_connect_timeout(Duration::ZERO).is_err());
        assert!(config.clone().with_database(3).is_ok());
        let cluster = RedisConfig::cluster(["redis://127.0.0.1:7000"]).unwrap();
        assert!(matches!(
            cluster.clone().with_database(1),
            Err(RedisConfigError::ClusterDatabase(1))
        ));
        assert!(cluster.with_database(0).is_ok());
    }

    #[test]
    fn offsets_saturate() {
        let offset = ClockOffset::new();
        offset.advance(Duration::MAX);
        offset.advance(Duration::MAX);
        assert_eq!(offset.micros(), ClockOffset::MAX_MICROS);
    }
}
