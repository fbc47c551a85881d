//! [`OpenOptions`]: opens the store a [`StoreSpec`] names, chosen at run time (among the stores
//! this build has); [`open`] and [`open_or_defer`] with the default options.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Store, StoreError};

use crate::spec::StoreSpec;

mod until_refused;
use until_refused::{Refusal, UntilRefused};

/// A store opened by [`OpenOptions`], with the short name to use as its metrics label.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenedStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// `memory`, `redis`, `postgres` or `redb`.
    pub label: &'static str,
    /// Why the server did not answer, when [`OpenOptions::open_or_defer`] started on an
    /// [`idem_core::Deferred`] store that connects on first use; `None` for a store that is
    /// connected.
    pub deferred: Option<String>,
}

/// Why a store did not open. Every message starts `store SPEC: ` (the spec with any password
/// hidden).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The text is no store spec ([`StoreSpec`]'s parser says why).
    #[error("store: {0}")]
    Spec(#[from] crate::spec::StoreSpecError),
    /// This build of idem lacks the store: its cargo feature (`redis`, ...) is off.
    #[error(
        "store {spec}: this build has no {feature} store (enable the `{feature}` feature of idem)"
    )]
    NotBuilt {
        /// The spec.
        spec: String,
        /// The feature to enable.
        feature: &'static str,
    },
    /// The store's client refuses the URL.
    #[error("store {spec}: {reason}")]
    Url {
        /// The spec.
        spec: String,
        /// The client's words.
        reason: String,
    },
    /// The store does not take the namespace (a PostgreSQL schema is 1 to 63 of `a-z`, `0-9`,
    /// `_`, not starting with a digit; a Redis namespace 1 to 64 of `A-Za-z0-9_.-`).
    #[error("store {spec}: {reason}")]
    Namespace {
        /// The spec.
        spec: String,
        /// The client's words.
        reason: String,
    },
    /// No store file at the path, and [`OpenOptions::create`] is off.
    #[error("store {spec}: no such file")]
    Missing {
        /// The spec.
        spec: String,
    },
    /// The store failed to connect or open: unreachable, refused the credentials, a file in
    /// use by another process.
    #[error("store {spec}: {error}")]
    Down {
        /// The spec.
        spec: String,
        /// Why; [`StoreError::is_retryable`] tells a server that does not answer yet.
        error: StoreError,
    },
}

/// How to open a store: the namespace of its records, the memory store's bounds, whether a
/// missing store is created, and how long one deferred connect may take.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::num::NonZeroUsize;
/// use idem::{OpenOptions, StoreSpec};
///
/// let spec: StoreSpec = "memory".parse()?;
/// let opened = OpenOptions::new("my_app")
///     .memory_capacity(NonZeroUsize::new(10_000).ok_or("zero")?)
///     .open(&spec)
///     .await?;
/// assert_eq!(opened.label, "memory");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct OpenOptions {
    namespace: String,
    memory_capacity: Option<NonZeroUsize>,
    memory_max_bytes: Option<NonZeroUsize>,
    create: bool,
    redb_allow_empty_file: bool,
    retry_timeout: Option<Duration>,
}

impl OpenOptions {
    /// Options for records under `namespace` (the Redis key prefix, the PostgreSQL schema):
    /// letters, digits and `_` suit every store. A missing store is created (a redb file, a
    /// PostgreSQL schema migrated on connect); the memory store has its default bounds.
    pub fn new(namespace: impl Into<String>) -> Self {
        OpenOptions {
            namespace: namespace.into(),
            memory_capacity: None,
            memory_max_bytes: None,
            create: true,
            redb_allow_empty_file: false,
            retry_timeout: None,
        }
    }

    /// The namespace of the records.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The memory store's capacity, in records.
    pub fn memory_capacity(mut self, records: NonZeroUsize) -> Self {
        self.memory_capacity = Some(records);
        self
    }

    /// The memory store's byte budget.
    pub fn memory_max_bytes(mut self, bytes: NonZeroUsize) -> Self {
        self.memory_max_bytes = Some(bytes);
        self
    }

    /// Whether a store that does not exist yet is made (on by default): off, a PostgreSQL
    /// schema is not migrated (a read-only role can read it) and a redb path with no file is
    /// [`OpenError::Missing`] rather than a new empty store. For a program that inspects a
    /// store: a mistyped path would answer "no record".
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Whether an existing redb file of zero bytes is opened as a new, empty store (off by
    /// default: it is refused, as its records were lost; see `allow_empty_file` of the redb
    /// store's builder). Only with
    /// [`OpenOptions::create`] on: a program that inspects a store never starts one.
    pub fn redb_allow_empty_file(mut self, allow: bool) -> Self {
        self.redb_allow_empty_file = allow;
        self
    }

    /// How long one try to connect a deferred store ([`OpenOptions::open_or_defer`]) may take
    /// before it counts as failed (unbounded by default: each store's own connect timeout).
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.retry_timeout = Some(timeout);
        self
    }

    /// Opens (connects to) the store `spec` names:
    ///
    /// - `memory`: a new [`idem_store_memory::MemoryStore`] (feature `memory`);
    /// - `redis://...` or `rediss://...`: the Redis store, keys under the namespace (feature
    ///   `redis`); `redis+cluster://HOST:PORT,HOST:PORT` (or `rediss+cluster://`) on a Redis
    ///   Cluster, any nodes of it as seeds;
    /// - `postgres://...` or `postgresql://...`: the PostgreSQL store in the schema named by
    ///   the namespace, migrated on connect unless [`OpenOptions::create`] is off (feature
    ///   `postgres`);
    /// - `redb:PATH`: the embedded durable store in the file `PATH` (feature `redb`).
    ///
    /// # Errors
    /// [`OpenError`]: a store this build lacks, a setting its client refuses, a missing file,
    /// a server that does not answer.
    pub async fn open(&self, spec: &StoreSpec) -> Result<OpenedStore, OpenError> {
        let store = self.connect(spec).await?;
        Ok(OpenedStore {
            store,
            label: spec.kind(),
            deferred: None,
        })
    }

    /// Checks the settings the way opening does, without connecting: a store this build
    /// lacks, a URL or a namespace its client refuses.
    ///
    /// # Errors
    /// [`OpenError::NotBuilt`], [`OpenError::Url`] or [`OpenError::Namespace`].
    pub fn check(&self, spec: &StoreSpec) -> Result<(), OpenError> {
        match spec {
            StoreSpec::Memory => built(spec, cfg!(feature = "memory")),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(_) => self.redis_config(spec).map(drop),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(_) => self.postgres_config(spec).map(drop),
            StoreSpec::Redb(_) => built(spec, cfg!(feature = "redb")),
            #[allow(unreachable_patterns)]
            _ => built(spec, false),
        }
    }

    /// Opens the store as [`OpenOptions::open`] does, except that a Redis or PostgreSQL server
    /// that does not answer (refused, timed out: an error a retry may cure) is no error: the
    /// store is then an [`idem_core::Deferred`] (named by the spec, without its password) that
    /// connects on first use, at most one try a second (each bounded by
    /// [`OpenOptions::retry_timeout`]), and answers every operation `StoreError::Unavailable`
    /// until it has, so an HTTP layer in front of it answers 503 + `Retry-After` and runs
    /// nothing. [`OpenedStore::deferred`] says why. For a program that may start before its
    /// database. A try that fails with an error no retry cures (a server that is up but
    /// refuses the credentials, as it would have been at start) ends the tries: from then on
    /// every operation answers that error, permanent (`StoreError::Backend`, not retryable),
    /// and the store never tries to connect again.
    ///
    /// # Errors
    /// [`OpenError`] as [`OpenOptions::open`], except for a server that does not answer.
    pub async fn open_or_defer(&self, spec: &StoreSpec) -> Result<OpenedStore, OpenError> {
        match self.open(spec).await {
            Err(OpenError::Down { error, .. }) if spec.is_network() && error.is_retryable() => {
                Ok(OpenedStore {
                    store: Arc::new(self.deferred(spec, &error)),
                    label: spec.kind(),
                    deferred: Some(error.to_string()),
                })
            }
            opened => opened,
        }
    }

    /// A store that did not answer (`error` says why): it connects on first use, unless a
    /// try fails with an error no retry cures (credentials the server refuses), which ends
    /// the tries ([`UntilRefused`]).
    fn deferred(&self, spec: &StoreSpec, error: &StoreError) -> UntilRefused {
        let (options, spec) = (Arc::new(self.clone()), Arc::new(spec.clone()));
        let refusal = Refusal::default();
        let slot = refusal.clone();
        let deferred = idem_core::Deferred::new(spec.to_string(), error, move || {
            let (options, spec, slot) = (options.clone(), spec.clone(), slot.clone());
            async move {
                let tried = options.reconnect(&spec).await;
                until_refused::record(&slot, &spec.to_string(), tried)
            }
        });
        UntilRefused::new(deferred, refusal)
    }

    /// One try to connect a deferred store, bounded by the retry timeout.
    async fn reconnect(&self, spec: &StoreSpec) -> Result<Arc<dyn Store>, StoreError> {
        let tried = match self.retry_timeout {
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Some(timeout) => tokio::time::timeout(timeout, self.connect(spec))
                .await
                .unwrap_or_else(|_| {
                    Err(OpenError::Down {
                        spec: spec.to_string(),
                        error: StoreError::unavailable(format!("no connection within {timeout:?}")),
                    })
                }),
            _ => self.connect(spec).await,
        };
        let error = match tried {
            Ok(store) => {
                log_try(spec, None);
                return Ok(store);
            }
            Err(OpenError::Down { error, .. }) => error,
            Err(other) => StoreError::unavailable(other.to_string()),
        };
        log_try(spec, Some(&error));
        Err(error)
    }

    async fn connect(&self, spec: &StoreSpec) -> Result<Arc<dyn Store>, OpenError> {
        match spec {
            StoreSpec::Memory => self.memory(spec),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(_) => {
                let config = self.redis_config(spec)?;
                let store = idem_store_redis::RedisStore::connect(config)
                    .await
                    .map_err(|error| down(spec, error))?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(_) => {
                let config = self.postgres_config(spec)?;
                let store = idem_store_postgres::PostgresStore::connect(config)
                    .await
                    .map_err(|error| down(spec, error))?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "redb")]
            StoreSpec::Redb(path) => {
                if !self.create && !path.exists() {
                    return Err(OpenError::Missing {
                        spec: spec.to_string(),
                    });
                }
                // A local file opens or never will: never deferred.
                let store = idem_store_redb::RedbStore::builder()
                    .allow_empty_file(self.create && self.redb_allow_empty_file)
                    .open(path)
                    .map_err(|error| down(spec, error))?;
                Ok(Arc::new(store))
            }
            #[allow(unreachable_patterns)]
            _ => Err(not_built(spec)),
        }
    }

    #[cfg(feature = "memory")]
    #[allow(clippy::unnecessary_wraps)]
    fn memory(&self, _: &StoreSpec) -> Result<Arc<dyn Store>, OpenError> {
        let mut builder = idem_store_memory::MemoryStore::builder();
        if let Some(records) = self.memory_capacity {
            builder = builder.capacity(records);
        }
        if let Some(bytes) = self.memory_max_bytes {
            builder = builder.max_bytes(bytes);
        }
        Ok(Arc::new(builder.build()))
    }

    #[cfg(not(feature = "memory"))]
    fn memory(&self, spec: &StoreSpec) -> Result<Arc<dyn Store>, OpenError> {
        Err(not_built(spec))
    }

    /// The Redis store's settings for `spec` (a `redis://` or `redis+cluster://` URL), made
    /// without connecting: one server or a Cluster's seeds, keys under the namespace.
    ///
    /// # Errors
    /// [`OpenError::Url`] for a URL the client refuses or a spec of another store,
    /// [`OpenError::Namespace`] for a namespace it refuses.
    #[cfg(feature = "redis")]
    pub fn redis_config(
        &self,
        spec: &StoreSpec,
    ) -> Result<idem_store_redis::RedisConfig, OpenError> {
        use idem_store_redis::RedisConfig;
        let StoreSpec::Redis(url) = spec else {
            return Err(not_a(spec, "redis"));
        };
        let config = match crate::spec::cluster_seeds(url) {
            Some(seeds) => RedisConfig::cluster(seeds),
            None => RedisConfig::new(url.as_str()),
        };
        config
            .map_err(|err| url_refused(spec, &err))?
            .with_namespace(self.namespace.as_str())
            .map_err(|err| namespace_refused(spec, &err))
    }

    /// The PostgreSQL store's settings for `spec`, made without connecting: the namespace is
    /// the schema, migrated on connect unless [`OpenOptions::create`] is off.
    ///
    /// # Errors
    /// [`OpenError::Url`] for a URL the client refuses or a spec of another store,
    /// [`OpenError::Namespace`] for a schema name it refuses.
    #[cfg(feature = "postgres")]
    pub fn postgres_config(
        &self,
        spec: &StoreSpec,
    ) -> Result<idem_store_postgres::PostgresConfig, OpenError> {
        let StoreSpec::Postgres(url) = spec else {
            return Err(not_a(spec, "postgres"));
        };
        Ok(idem_store_postgres::PostgresConfig::new(url)
            .map_err(|err| url_refused(spec, &err))?
            .with_schema(&self.namespace)
            .map_err(|err| namespace_refused(spec, &err))?
            .with_migrate_on_connect(self.create))
    }
}

/// `Ok` when this build has the store, [`OpenError::NotBuilt`] otherwise.
fn built(spec: &StoreSpec, has: bool) -> Result<(), OpenError> {
    if has { Ok(()) } else { Err(not_built(spec)) }
}

/// The store is not in this build.
fn not_built(spec: &StoreSpec) -> OpenError {
    OpenError::NotBuilt {
        spec: spec.to_string(),
        feature: spec.kind(),
    }
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "redb"))]
fn down(spec: &StoreSpec, error: StoreError) -> OpenError {
    OpenError::Down {
        spec: spec.to_string(),
        error,
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn url_refused(spec: &StoreSpec, err: &dyn std::fmt::Display) -> OpenError {
    OpenError::Url {
        spec: spec.to_string(),
        reason: err.to_string(),
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn namespace_refused(spec: &StoreSpec, err: &dyn std::fmt::Display) -> OpenError {
    OpenError::Namespace {
        spec: spec.to_string(),
        reason: err.to_string(),
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn not_a(spec: &StoreSpec, kind: &str) -> OpenError {
    OpenError::Url {
        spec: spec.to_string(),
        reason: format!("not a {kind} store"),
    }
}

/// Logs a try to connect a deferred store: connected (info), or why not (debug).
fn log_try(spec: &StoreSpec, error: Option<&StoreError>) {
    #[cfg(any(feature = "redis", feature = "postgres"))]
    match error {
        None => tracing::info!(store = %spec, "the store answers: connected"),
        Some(error) => {
            tracing::debug!(store = %spec, %error, "the store still does not answer");
        }
    }
    #[cfg(not(any(feature = "redis", feature = "postgres")))]
    let _ = (spec, error);
}

/// Opens the store named by `spec` in `namespace`, with the default [`OpenOptions`]:
/// [`OpenOptions::open`].
///
/// `namespace` must suit every backend: letters, digits and `_`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let opened = idem::open("memory", "my_app").await?;
/// assert_eq!(opened.label, "memory");
/// assert!(idem::open("mysql://nope", "my_app").await.is_err());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`OpenError`] for a spec that does not parse, a store this build lacks, a bad URL or an
/// unreachable server.
pub async fn open(spec: &str, namespace: &str) -> Result<OpenedStore, OpenError> {
    OpenOptions::new(namespace).open(&spec.parse()?).await
}

/// Opens the store named by `spec` as [`open`] does, except that a Redis or PostgreSQL server
/// that does not answer is no error: [`OpenOptions::open_or_defer`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let opened = idem::open_or_defer("memory", "my_app").await?;
/// assert_eq!(opened.label, "memory");
/// assert!(idem::open_or_defer("mysql://nope", "my_app").await.is_err());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`OpenError`] as [`open`], except for a server that does not answer.
pub async fn open_or_defer(spec: &str, namespace: &str) -> Result<OpenedStore, OpenError> {
    OpenOptions::new(namespace)
        .open_or_defer(&spec.parse()?)
        .await
}
