//! Opens the store the configuration names, as an `Arc<dyn Store>`, and runs the store
//! maintenance commands (`idem store migrate|sweep`).
//!
//! The memory store is always built in; the others are cargo features of this crate
//! (`redis`, `postgres`, `redb`), all three on by default: an installed gateway opens every
//! store, and `--no-default-features` gives a slim build with the memory store alone (add
//! back the ones wanted with `--features`). [`Backends`] says which stores a build has: the
//! configuration refuses the others, for `check-config` and `serve` alike.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Deferred, Store, StoreError};
use idem_store_memory::MemoryStore;

use crate::commands::Failure;
use crate::config::{ConfigError, StoreConfig, StoreSpec};

/// The stores a build of idem can open besides the memory store, which every build has. ONE
/// place decides what a build can run: [`Config::build`](crate::config::Config::build) checks
/// the store against [`Backends::COMPILED`] (so `check-config` refuses what `serve` would, with
/// the same message and exit code 2), opening a store checks it again, and `--help` lists the
/// forms of [`Backends::forms`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backends {
    /// `redis://...`, `redis+cluster://...` (feature `redis`).
    pub redis: bool,
    /// `postgres://...` (feature `postgres`).
    pub postgres: bool,
    /// `redb:PATH` (feature `redb`).
    pub redb: bool,
}

impl Backends {
    /// The stores this build was compiled with.
    pub(crate) const COMPILED: Backends = Backends {
        redis: cfg!(feature = "redis"),
        postgres: cfg!(feature = "postgres"),
        redb: cfg!(feature = "redb"),
    };

    /// Whether this build has the store `spec` names.
    #[must_use]
    pub(crate) fn has(self, spec: &StoreSpec) -> bool {
        match spec {
            StoreSpec::Memory => true,
            StoreSpec::Redis(_) => self.redis,
            StoreSpec::Postgres(_) => self.postgres,
            StoreSpec::Redb(_) => self.redb,
        }
    }

    /// Refuses a store this build lacks, saying how to get a build that has it.
    ///
    /// # Errors
    /// The one-line reason, when this build cannot open `spec`.
    pub(crate) fn check(self, spec: &StoreSpec) -> Result<(), String> {
        if self.has(spec) {
            return Ok(());
        }
        let kind = spec.kind();
        Err(format!(
            "the {kind} store is not in this build of idem (built without the `{kind}` feature): \
             build idem with its default features, which include every store \
             (`cargo build --release -p idem-gateway`), or add `--features {kind}` to the slim \
             build"
        ))
    }

    /// The store forms this build takes, for `--help`: `memory, redis://HOST[:PORT][/DB], ...`.
    #[must_use]
    pub(crate) fn forms(self) -> String {
        let mut forms = vec!["memory"];
        if self.redis {
            forms.push("redis://HOST[:PORT][/DB]");
            forms.push("redis+cluster://HOST:PORT,HOST:PORT");
        }
        if self.postgres {
            forms.push("postgres://USER@HOST[:PORT]/DB");
        }
        if self.redb {
            forms.push("redb:PATH");
        }
        match forms.split_last() {
            Some((last, init)) if !init.is_empty() => format!("{} or {last}", init.join(", ")),
            _ => "memory (this build has no other store)".to_owned(),
        }
    }
}

/// Opens (connects to) the store for `idem serve` (a PostgreSQL store applies its migrations on
/// connect); a Redis or PostgreSQL server that does not answer yet (refused, timed out: an
/// error a retry may cure) is not a failure. The gateway then starts on a [`Deferred`] store that connects on first use, at most once per
/// [`Deferred::RETRY_EVERY`], and until then answers every operation as unavailable: covered
/// requests get 503 with `Retry-After` (or run unrecorded, `fail_open`), `/readyz` says the
/// store does not answer, and `/healthz` that the process does. A store that goes down later
/// behaves the same, so a gateway started before its store needs no restart.
///
/// # Errors
/// [`Failure`] for any failure but a server that does not answer yet: a bad setting or a store
/// this build lacks (exit 2), a redb file in use by another process, a server that refuses the
/// credentials.
pub(crate) async fn open_to_serve(config: &StoreConfig) -> Result<Arc<dyn Store>, Failure> {
    match connect(config, Opening::Serve).await {
        Ok(store) => Ok(store),
        Err(Opened::Down(err)) if network(&config.spec) && err.is_retryable() => {
            tracing::warn!(
                store = %config.spec,
                error = %err,
                "the store does not answer: the gateway starts, answers 503 on the routes it covers and /readyz reports the store, until it connects"
            );
            Ok(Arc::new(deferred(config.clone(), &err)))
        }
        Err(err) => Err(err.into_failure(&config.spec)),
    }
}

/// How long one try to connect a [`Deferred`] store may take: a PostgreSQL store migrates on
/// connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A store that did not answer when the gateway started (`err` says why): it connects on first
/// use, one try at a time, at most one per [`Deferred::RETRY_EVERY`], each bounded by
/// [`CONNECT_TIMEOUT`], and answers [`StoreError::Unavailable`] until then.
fn deferred(config: StoreConfig, err: &StoreError) -> Deferred {
    let name = config.spec.to_string();
    let config = Arc::new(config);
    Deferred::new(name, err, move || {
        let config = config.clone();
        async move {
            let tried =
                tokio::time::timeout(CONNECT_TIMEOUT, connect(&config, Opening::Serve)).await;
            let err = match tried {
                Ok(Ok(store)) => {
                    tracing::info!(store = %config.spec, "the store answers: connected");
                    return Ok(store);
                }
                Ok(Err(Opened::Down(err))) => err,
                Ok(Err(Opened::Refused(failure))) => StoreError::unavailable(failure.to_string()),
                Err(_) => {
                    StoreError::unavailable(format!("no connection within {CONNECT_TIMEOUT:?}"))
                }
            };
            tracing::debug!(store = %config.spec, error = %err, "the store still does not answer");
            Err(err)
        }
    })
}

/// Whether the store is a server reached over the network (Redis, PostgreSQL), which may come
/// up after the gateway: a local store (memory, redb) either opens or never will.
fn network(spec: &StoreSpec) -> bool {
    matches!(spec, StoreSpec::Redis(_) | StoreSpec::Postgres(_))
}

/// Opens a store that must exist already, for an admin command (`idem keys`): a PostgreSQL
/// store is not migrated (a read-only role can run `idem keys get`), and a redb path with no
/// file is an error, not a new empty store (a mistyped path would answer "no record").
///
/// # Errors
/// [`Failure::Config`] (exit 2) when this build has no such store or the store refuses its
/// settings; [`Failure::Runtime`] when the store cannot be reached, or for a redb path where
/// no file is.
pub(crate) async fn open_existing(config: &StoreConfig) -> Result<Arc<dyn Store>, Failure> {
    open_as(config, Opening::Existing).await
}

/// Why a store is opened.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// To serve: a PostgreSQL schema is migrated, a redb file created.
    Serve,
    /// To inspect or administer: nothing is created or migrated.
    Existing,
}

async fn open_as(config: &StoreConfig, opening: Opening) -> Result<Arc<dyn Store>, Failure> {
    connect(config, opening).await.map_err(|err| match err {
        // A redb file has one owner at a time: the gateway serving it, most likely, whose admin
        // listener `idem keys` can ask instead.
        Opened::Down(err)
            if opening == Opening::Existing
                && matches!(config.spec, StoreSpec::Redb(_))
                && err.is_retryable() =>
        {
            Failure::runtime(format!(
                "store {}: {err} (if a running gateway holds it, ask that gateway: --admin http://ADMIN_ADDR)",
                config.spec
            ))
        }
        err => err.into_failure(&config.spec),
    })
}

/// Why a store did not open.
enum Opened {
    /// The store refused its settings, or this build lacks it (exit 2), or a check before
    /// connecting failed (exit 1).
    Refused(Failure),
    /// The store failed to open or connect: unreachable, or failing (exit 1). Only a store
    /// behind a feature (Redis, PostgreSQL, redb) gives it: the memory store always opens.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "redb")),
        allow(dead_code)
    )]
    Down(StoreError),
}

impl Opened {
    fn into_failure(self, spec: &StoreSpec) -> Failure {
        match self {
            Opened::Refused(failure) => failure,
            Opened::Down(err) => unreachable(spec, &err),
        }
    }
}

impl From<Failure> for Opened {
    fn from(failure: Failure) -> Self {
        Opened::Refused(failure)
    }
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "redb")),
    allow(unused_variables)
)]
async fn connect(config: &StoreConfig, opening: Opening) -> Result<Arc<dyn Store>, Opened> {
    match &config.spec {
        StoreSpec::Memory => Ok(Arc::new(
            MemoryStore::builder()
                .capacity(config.memory_capacity)
                .max_bytes(config.memory_max_bytes)
                .build(),
        )),
        #[cfg(feature = "redis")]
        StoreSpec::Redis(url) => {
            let settings = redis::settings(url, &config.namespace)?;
            let store = idem_store_redis::RedisStore::connect(settings)
                .await
                .map_err(Opened::Down)?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "redb")]
        StoreSpec::Redb(path) => {
            if opening == Opening::Existing && !path.exists() {
                return Err(Opened::Refused(Failure::runtime(format!(
                    "store {}: no such file (`idem serve` or `idem store migrate` creates it)",
                    config.spec
                ))));
            }
            let store = idem_store_redb::RedbStore::open(path).map_err(Opened::Down)?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(url) => {
            let settings = postgres::settings(url, &config.namespace)?
                .with_migrate_on_connect(opening == Opening::Serve);
            let store = idem_store_postgres::PostgresStore::connect(settings)
                .await
                .map_err(Opened::Down)?;
            Ok(Arc::new(store))
        }
        // Reached only in builds without some store features.
        #[allow(unreachable_patterns)]
        other => Err(Opened::Refused(Failure::Config(unavailable(other)))),
    }
}

/// Which store setting the store's own client refuses (only the network stores' clients
/// refuse one: the slim build makes none).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
pub(crate) enum SettingError {
    /// The URL (`[store] url`, `--store`, `IDEM_STORE`): the client cannot use it.
    Url(String),
    /// The namespace (`[store] namespace`): the store does not take it (a PostgreSQL schema is
    /// 1 to 63 of `a-z`, `0-9`, `_`, not starting with a digit).
    Namespace(String),
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
impl SettingError {
    /// The refusal as the error of opening the store: a configuration error (exit 2) at
    /// `store`, the client's own words.
    fn into_failure(self) -> Failure {
        let (SettingError::Url(reason) | SettingError::Namespace(reason)) = self;
        Failure::Config(ConfigError::new(Some("store".to_owned()), reason))
    }
}

/// Checks the store's settings the way opening it does, without connecting: what
/// `idem serve` would refuse, `idem check-config` refuses too. A store this build does not
/// include is not checked here (opening it says so).
///
/// # Errors
/// [`SettingError`] naming the setting the store's client refuses, with its reason.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_variables, clippy::unnecessary_wraps)
)]
pub(crate) fn check_settings(spec: &StoreSpec, namespace: &str) -> Result<(), SettingError> {
    match spec {
        #[cfg(feature = "redis")]
        StoreSpec::Redis(url) => redis::config(url, namespace).map(drop),
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(url) => postgres::config(url, namespace).map(drop),
        _ => Ok(()),
    }
}

/// What `idem store migrate` or `idem store sweep` did, in one line.
///
/// # Errors
/// [`Failure`]: the store cannot be opened or reached, or the step fails.
pub(crate) async fn maintain(config: &StoreConfig, migrate: bool) -> Result<String, Failure> {
    match (&config.spec, migrate) {
        (StoreSpec::Memory, true) => {
            Ok("the memory store has no schema: nothing to migrate".into())
        }
        (StoreSpec::Memory, false) => {
            Ok("the memory store sweeps itself inside each gateway: nothing to sweep".into())
        }
        (StoreSpec::Redis(_), true) => {
            Ok("the redis store needs no migration: its scripts load at connect".into())
        }
        (StoreSpec::Redis(_), false) => {
            Ok("the redis store expires records by TTL: nothing to sweep".into())
        }
        // redb has no migrations: opening the file creates it with its tables, or checks an
        // existing one's format and tables. Done here, so that a bad path fails now.
        #[cfg(feature = "redb")]
        (StoreSpec::Redb(path), true) => {
            let existed = path.exists();
            idem_store_redb::RedbStore::open(path)
                .map_err(|err| unreachable(&config.spec, &err))?;
            Ok(if existed {
                format!(
                    "{}: checked: a redb store file with its tables",
                    path.display()
                )
            } else {
                format!("{}: created, with its tables", path.display())
            })
        }
        #[cfg(feature = "redb")]
        (StoreSpec::Redb(path), false) => {
            let store = idem_store_redb::RedbStore::open(path)
                .map_err(|err| unreachable(&config.spec, &err))?;
            let removed = store
                .sweep()
                .await
                .map_err(|err| unreachable(&config.spec, &err))?;
            Ok(format!("removed {removed} expired record(s)"))
        }
        #[cfg(feature = "postgres")]
        (StoreSpec::Postgres(url), true) => {
            let settings = postgres::settings(url, &config.namespace)?;
            let report = idem_store_postgres::migrate(&settings)
                .await
                .map_err(|err| unreachable(&config.spec, &err))?;
            Ok(if report.applied.is_empty() {
                format!(
                    "schema {}: up to date at version {}",
                    report.schema, report.version
                )
            } else {
                format!(
                    "schema {}: applied migration(s) {:?}, now at version {}",
                    report.schema, report.applied, report.version
                )
            })
        }
        #[cfg(feature = "postgres")]
        (StoreSpec::Postgres(url), false) => {
            let settings = postgres::settings(url, &config.namespace)?;
            let store = idem_store_postgres::PostgresStore::connect(settings)
                .await
                .map_err(|err| unreachable(&config.spec, &err))?;
            let removed = store
                .sweep()
                .await
                .map_err(|err| unreachable(&config.spec, &err))?;
            Ok(format!("removed {removed} expired record(s)"))
        }
        #[allow(unreachable_patterns)]
        (other, _) => Err(Failure::Config(unavailable(other))),
    }
}

#[cfg(feature = "redis")]
mod redis {
    use idem_store_redis::RedisConfig;

    use super::SettingError;
    use crate::commands::Failure;

    /// The store's settings: one server, or a Cluster for `redis+cluster://h1:p1,h2:p2`.
    pub(super) fn settings(url: &str, namespace: &str) -> Result<RedisConfig, Failure> {
        config(url, namespace).map_err(SettingError::into_failure)
    }

    /// The store's settings, or which of them the client refuses (made without connecting).
    pub(super) fn config(url: &str, namespace: &str) -> Result<RedisConfig, SettingError> {
        RedisConfig::from_url(url)
            .map_err(|err| SettingError::Url(err.to_string()))?
            .with_namespace(namespace)
            .map_err(|err| SettingError::Namespace(err.to_string()))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use idem_store_postgres::PostgresConfig;

    use super::SettingError;
    use crate::commands::Failure;

    /// The store's settings: the URL, and the namespace as the schema.
    pub(super) fn settings(url: &str, namespace: &str) -> Result<PostgresConfig, Failure> {
        config(url, namespace).map_err(SettingError::into_failure)
    }

    /// The store's settings, or which of them the client refuses (made without connecting).
    pub(super) fn config(url: &str, namespace: &str) -> Result<PostgresConfig, SettingError> {
        PostgresConfig::new(url)
            .map_err(|err| SettingError::Url(err.to_string()))?
            .with_schema(namespace)
            .map_err(|err| SettingError::Namespace(err.to_string()))
    }
}

/// The store cannot be reached or failed: exit 1.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "redb")),
    allow(dead_code)
)]
fn unreachable(spec: &StoreSpec, err: &dyn std::fmt::Display) -> Failure {
    Failure::runtime(format!("store {spec}: {err}"))
}

/// The error for a store this build cannot open (the configuration refuses it first: see
/// [`Backends`]).
fn unavailable(spec: &StoreSpec) -> ConfigError {
    let reason = Backends::COMPILED
        .check(spec)
        .err()
        .unwrap_or_else(|| format!("the {} store cannot be opened", spec.kind()));
    ConfigError::new(Some("store".to_owned()), reason)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(text: &str) -> StoreSpec {
        text.parse().unwrap()
    }

    #[test]
    fn a_build_opens_only_the_stores_it_has() {
        let slim = Backends {
            redis: false,
            postgres: false,
            redb: false,
        };
        let all = Backends {
            redis: true,
            postgres: true,
            redb: true,
        };
        for text in [
            "redis://127.0.0.1:6379",
            "postgres://u@h/test",
            "redb:idem.redb",
        ] {
            let refused = slim.check(&spec(text)).unwrap_err();
            let kind = spec(text).kind();
            assert!(
                refused.contains(&format!("the {kind} store is not in this build"))
                    && refused.contains(&format!("--features {kind}")),
                "{refused}"
            );
            assert_eq!(all.check(&spec(text)), Ok(()), "{text}");
        }
        assert_eq!(slim.check(&StoreSpec::Memory), Ok(()));
        let no_redis = Backends {
            redis: false,
            ..all
        };
        assert!(no_redis.check(&spec("redis+cluster://h:1,h:2")).is_err());
        assert_eq!(no_redis.check(&spec("postgres://u@h/test")), Ok(()));
    }

    #[test]
    fn help_lists_only_the_stores_of_the_build() {
        let all = Backends {
            redis: true,
            postgres: true,
            redb: true,
        };
        assert_eq!(
            all.forms(),
            "memory, redis://HOST[:PORT][/DB], redis+cluster://HOST:PORT,HOST:PORT, \
             postgres://USER@HOST[:PORT]/DB or redb:PATH"
        );
        let redb_only = Backends {
            redis: false,
            postgres: false,
            redb: true,
        };
        assert_eq!(redb_only.forms(), "memory or redb:PATH");
        let slim = Backends {
            redb: false,
            ..redb_only
        };
        assert_eq!(slim.forms(), "memory (this build has no other store)");
    }
}
