//! [`open`]: a store named by a URL, chosen at run time (the stores this build has).

use std::sync::Arc;

use idem_core::Store;

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
    let failed = |reason: String| OpenError {
        spec: spec.to_owned(),
        reason,
    };
    let opened = if spec == "memory" {
        memory()
    } else if spec.starts_with("redis://") || spec.starts_with("rediss://") {
        redis(spec, namespace).await
    } else if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        postgres(spec, namespace).await
    } else if let Some(path) = spec.strip_prefix("redb:") {
        redb(path)
    } else {
        Err("unknown store: memory, redis://HOST:PORT, postgres://USER@HOST/DB or redb:PATH".into())
    };
    opened.map_err(failed)
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
fn memory() -> Result<Opened, String> {
    Ok(opened(idem_store_memory::MemoryStore::new(), "memory"))
}

#[cfg(not(feature = "memory"))]
fn memory() -> Result<Opened, String> {
    Err(not_built("memory"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str, namespace: &str) -> Result<Opened, String> {
    use idem_store_redis::{RedisConfig, RedisStore};
    let config = RedisConfig::new(url)
        .and_then(|config| config.with_namespace(namespace))
        .map_err(|e| e.to_string())?;
    let store = RedisStore::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(opened(store, "redis"))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &str, _: &str) -> Result<Opened, String> {
    Err(not_built("redis"))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, schema: &str) -> Result<Opened, String> {
    use idem_store_postgres::{PostgresConfig, PostgresStore};
    let config = PostgresConfig::new(url)
        .and_then(|config| config.with_schema(schema))
        .map_err(|e| e.to_string())?;
    let store = PostgresStore::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(opened(store, "postgres"))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str, _: &str) -> Result<Opened, String> {
    Err(not_built("postgres"))
}

#[cfg(feature = "redb")]
fn redb(path: &str) -> Result<Opened, String> {
    let store = idem_store_redb::RedbStore::open(path).map_err(|e| e.to_string())?;
    Ok(opened(store, "redb"))
}

#[cfg(not(feature = "redb"))]
fn redb(_: &str) -> Result<Opened, String> {
    Err(not_built("redb"))
}
