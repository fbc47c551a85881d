//! [`open`]: a store named by a URL, chosen at run time (the stores this build has).

use std::sync::Arc;

use idem_core::{Deferred, Store, StoreError};

/// A store opened by [`open`], with the short name to use as its metrics label.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The store.
    pub store: Arc<dyn Store>,
    /// `memory`, `redis`, `postgres` or `redb`.
    pub label: &'static str,
}

/// Why [`open`] could not open a store. The message names the store spec.
#[derive(Debug, thiserror::Error)]
#[error("store {spec}: {reason}")]
pub struct OpenError {
    /// The spec as given.
    pub spec: String,
    /// What went wrong.
    pub reason: String,
}

/// Opens the store named by `spec`:
///
/// - `memory`: a new [`idem_store_memory::MemoryStore`] (feature `memory`);
/// - `redis://...` or `rediss://...`: the Redis store, keys under `namespace` (feature `redis`);
///   `redis+cluster://HOST:PORT,HOST:PORT` (or `rediss+cluster://`) on a Redis Cluster, any
///   nodes of it as seeds;
/// - `postgres://...` or `postgresql://...`: the PostgreSQL store in the schema `namespace`,
///   migrated on connect (feature `postgres`);
/// - `redb:PATH`: the embedded durable store in the file `PATH` (feature `redb`).
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
/// [`OpenError`] for an unknown scheme, a store this build lacks, a bad URL or an unreachable
/// server.
pub async fn open(spec: &str, namespace: &str) -> Result<Opened, OpenError> {
    try_open(spec, namespace)
        .await
        .map_err(|failed| failed.into_error(spec))
}

/// Opens the store named by `spec` as [`open`] does, except that a Redis or PostgreSQL server
/// that does not answer (refused, timed out: an error a retry may cure) is no error: the store
/// is then an [`idem_core::Deferred`] that connects on first use (at most one try a second) and
/// answers every operation `StoreError::Unavailable` until it has, so an HTTP layer in front of
/// it answers 503 + `Retry-After` and runs nothing. For a program that may start before its
/// database.
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
pub async fn open_or_defer(spec: &str, namespace: &str) -> Result<Opened, OpenError> {
    match try_open(spec, namespace).await {
        Ok(opened) => Ok(opened),
        Err(Failed::Down { label, error }) if error.is_retryable() => {
            let (spec, namespace): (Arc<str>, Arc<str>) = (spec.into(), namespace.into());
            // Named by its kind only: the URL may hold a password, and the name is in every
            // error the store answers.
            let store = Deferred::new(label, &error, move || {
                let (spec, namespace) = (spec.clone(), namespace.clone());
                async move {
                    match try_open(&spec, &namespace).await {
                        Ok(opened) => Ok(opened.store),
                        Err(Failed::Down { error, .. }) => Err(error),
                        Err(Failed::Refused(reason)) => Err(StoreError::unavailable(reason)),
                    }
                }
            });
            Ok(Opened {
                store: Arc::new(store),
                label,
            })
        }
        Err(failed) => Err(failed.into_error(spec)),
    }
}

/// Why a store did not open.
enum Failed {
    /// An unknown spec, a store this build lacks, a setting its client refuses.
    Refused(String),
    /// The store failed to connect or open. Only a store behind a feature (Redis,
    /// PostgreSQL, redb) gives it: the memory store always opens.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "redb")),
        allow(dead_code)
    )]
    Down {
        /// The store's metrics label.
        label: &'static str,
        /// Why.
        error: StoreError,
    },
}

impl Failed {
    fn into_error(self, spec: &str) -> OpenError {
        OpenError {
            spec: spec.to_owned(),
            reason: match self {
                Failed::Refused(reason) => reason,
                Failed::Down { error, .. } => error.to_string(),
            },
        }
    }
}

impl From<String> for Failed {
    fn from(reason: String) -> Self {
        Failed::Refused(reason)
    }
}

/// The URL schemes of the Redis store: a single server, or a Cluster's seeds.
const REDIS_SCHEMES: [&str; 4] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
];

async fn try_open(spec: &str, namespace: &str) -> Result<Opened, Failed> {
    if spec == "memory" {
        memory()
    } else if REDIS_SCHEMES.iter().any(|scheme| spec.starts_with(scheme)) {
        redis(spec, namespace).await
    } else if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        postgres(spec, namespace).await
    } else if let Some(path) = spec.strip_prefix("redb:") {
        redb(path)
    } else {
        Err(
            "unknown store: memory, redis://HOST:PORT, redis+cluster://HOST:PORT,HOST:PORT, postgres://USER@HOST/DB or redb:PATH"
                .to_owned()
                .into(),
        )
    }
}

/// Why a store is missing from this build.
#[allow(dead_code)]
fn not_built(feature: &str) -> String {
    format!("this build has no {feature} store (enable the `{feature}` feature of idem)")
}

fn opened(store: impl Store + 'static, label: &'static str) -> Opened {
    Opened {
        store: Arc::new(store),
        label,
    }
}

#[cfg(feature = "memory")]
fn memory() -> Result<Opened, Failed> {
    Ok(opened(idem_store_memory::MemoryStore::new(), "memory"))
}

#[cfg(not(feature = "memory"))]
fn memory() -> Result<Opened, Failed> {
    Err(not_built("memory").into())
}

#[cfg(feature = "redis")]
async fn redis(url: &str, namespace: &str) -> Result<Opened, Failed> {
    use idem_store_redis::{RedisConfig, RedisStore};
    let config = RedisConfig::from_url(url)
        .and_then(|config| config.with_namespace(namespace))
        .map_err(|e| e.to_string())?;
    let store = RedisStore::connect(config)
        .await
        .map_err(|error| Failed::Down {
            label: "redis",
            error,
        })?;
    Ok(opened(store, "redis"))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &str, _: &str) -> Result<Opened, Failed> {
    Err(not_built("redis").into())
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, schema: &str) -> Result<Opened, Failed> {
    use idem_store_postgres::{PostgresConfig, PostgresStore};
    let config = PostgresConfig::new(url)
        .and_then(|config| config.with_schema(schema))
        .map_err(|e| e.to_string())?;
    let store = PostgresStore::connect(config)
        .await
        .map_err(|error| Failed::Down {
            label: "postgres",
            error,
        })?;
    Ok(opened(store, "postgres"))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str, _: &str) -> Result<Opened, Failed> {
    Err(not_built("postgres").into())
}

#[cfg(feature = "redb")]
fn redb(path: &str) -> Result<Opened, Failed> {
    // A local file opens or never will: not deferred.
    let store = idem_store_redb::RedbStore::open(path).map_err(|e| e.to_string())?;
    Ok(opened(store, "redb"))
}

#[cfg(not(feature = "redb"))]
fn redb(_: &str) -> Result<Opened, Failed> {
    Err(not_built("redb").into())
}
