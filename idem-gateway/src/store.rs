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

use idem::{OpenError, OpenOptions, Store};

use crate::commands::Failure;
use crate::config::{GatewayConfigError, StoreConfig, StoreSpec};

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

/// The options of opening the configured store: its namespace, the memory store's bounds,
/// whether an empty redb file may start a new store, and how long one try to connect a
/// deferred store may take.
fn options(config: &StoreConfig) -> OpenOptions {
    OpenOptions::new(config.namespace.as_str())
        .memory_capacity(config.memory_capacity)
        .memory_max_bytes(config.memory_max_bytes)
        .redb_allow_empty_file(config.redb_allow_empty)
        .retry_timeout(CONNECT_TIMEOUT)
}

/// The flag that opens an existing empty redb file as a new store.
const ALLOW_EMPTY_FLAG: &str = "--redb-allow-empty";

/// `message` (the store's refusal of an empty redb file, which ends "allow an empty file
/// explicitly to start a new store in it"), with the flag that allows it, when the store
/// `config` names is such a file and the flag was not given.
fn with_empty_file_hint(config: &StoreConfig, message: String) -> String {
    let StoreSpec::Redb(path) = &config.spec else {
        return message;
    };
    let empty = std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.len() == 0);
    if empty && !config.redb_allow_empty {
        format!("{message}: {ALLOW_EMPTY_FLAG}")
    } else {
        message
    }
}

/// How long one try to connect a deferred store may take: a PostgreSQL store migrates on
/// connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (connects to) the store for `idem serve` (a PostgreSQL store applies its migrations on
/// connect); a Redis or PostgreSQL server that does not answer yet (refused, timed out: an
/// error a retry may cure) is not a failure. The gateway then starts on a deferred store
/// ([`OpenOptions::open_or_defer`]) that connects on first use, at most once per
/// [`idem_core::Deferred::RETRY_EVERY`], each try bounded by [`CONNECT_TIMEOUT`], and until
/// then answers every operation as unavailable: covered requests get 503 with `Retry-After`
/// (or run unrecorded, `fail_open`), `/readyz` says the store does not answer, and `/healthz`
/// that the process does. A store that goes down later behaves the same, so a gateway started
/// before its store needs no restart. A store that does not answer yet is logged as a warning
/// when `warn` (the first open; a serving thread's own connection to the same store says
/// nothing more).
///
/// # Errors
/// [`Failure`] for any failure but a server that does not answer yet: a bad setting or a store
/// this build lacks (exit 2), a redb file in use by another process, damaged, or empty
/// (unless `--redb-allow-empty`), a server that refuses the credentials or that asks for a
/// password the URL does not have.
pub(crate) async fn open_to_serve(
    config: &StoreConfig,
    warn: bool,
) -> Result<Arc<dyn Store>, Failure> {
    let opened = options(config)
        .open_or_defer(&config.spec)
        .await
        .map_err(|err| creating_failure(config, err))?;
    if let (Some(error), true) = (&opened.deferred, warn) {
        tracing::warn!(
            store = %config.spec,
            %error,
            "the store does not answer: the gateway starts, answers 503 on the routes it covers and /readyz reports the store, until it connects"
        );
    }
    Ok(opened.store)
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
    match options(config).create(false).open(&config.spec).await {
        Ok(opened) => Ok(opened.store),
        // A redb file has one owner at a time: the gateway serving it, most likely, whose admin
        // listener `idem keys` can ask instead.
        Err(OpenError::Down { error, .. })
            if matches!(config.spec, StoreSpec::Redb(_)) && error.is_retryable() =>
        {
            Err(Failure::runtime(format!(
                "store {}: {error} (if a running gateway holds it, ask that gateway: --admin http://ADMIN_ADDR)",
                config.spec
            )))
        }
        Err(err @ OpenError::Missing { .. }) => Err(Failure::runtime(format!(
            "{err} (`idem serve` or `idem store migrate` creates it)"
        ))),
        // An admin command never starts a new store: an empty file is an error, with no hint.
        Err(err) => Err(failure(&config.spec, err)),
    }
}

/// The failure of opening a store: a setting the store's client refuses, or a store this build
/// lacks, is a configuration error at `store` (exit 2); a store that cannot be reached or
/// fails, a runtime one (exit 1).
fn failure(spec: &StoreSpec, err: OpenError) -> Failure {
    match err {
        OpenError::Url { reason, .. } | OpenError::Namespace { reason, .. } => {
            Failure::Config(GatewayConfigError::new(Some("store".to_owned()), reason))
        }
        OpenError::NotBuilt { .. } => Failure::Config(unavailable(spec)),
        OpenError::Spec(reason) => Failure::Config(GatewayConfigError::new(
            Some("store".to_owned()),
            reason.to_string(),
        )),
        other => Failure::runtime(other.to_string()),
    }
}

/// [`failure`], with the hint of [`with_empty_file_hint`]: for the commands that may start a
/// new store (`idem serve`, `idem store migrate|sweep`).
fn creating_failure(config: &StoreConfig, err: OpenError) -> Failure {
    match failure(&config.spec, err) {
        Failure::Runtime(message) => Failure::Runtime(with_empty_file_hint(config, message)),
        other => other,
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
        #[cfg(feature = "redb")]
        (StoreSpec::Redb(path), migrate) => redb::maintain(config, path, migrate).await,
        #[cfg(feature = "postgres")]
        (StoreSpec::Postgres(_), migrate) => postgres::maintain(config, migrate).await,
        #[allow(unreachable_patterns)]
        (other, _) => Err(Failure::Config(unavailable(other))),
    }
}

#[cfg(feature = "redb")]
mod redb {
    use std::path::Path;

    use idem::redb::RedbStore;

    use super::{StoreConfig, unreachable, with_empty_file_hint};
    use crate::commands::Failure;

    /// `idem store migrate|sweep` on a redb file. redb has no migrations: opening the file
    /// creates it with its tables, or checks an existing one's format and tables. Done here,
    /// so that a bad path fails now. An existing empty file is refused unless
    /// `--redb-allow-empty`.
    pub(super) async fn maintain(
        config: &StoreConfig,
        path: &Path,
        migrate: bool,
    ) -> Result<String, Failure> {
        let existed = std::fs::metadata(path).is_ok_and(|meta| meta.len() > 0);
        let store = RedbStore::builder()
            .allow_empty_file(config.redb_allow_empty)
            .open(path)
            .map_err(|err| {
                let message = format!("store {}: {err}", config.spec);
                Failure::runtime(with_empty_file_hint(config, message))
            })?;
        if migrate {
            return Ok(if existed {
                format!(
                    "{}: checked: a redb store file with its tables",
                    path.display()
                )
            } else {
                format!("{}: created, with its tables", path.display())
            });
        }
        let removed = store
            .sweep()
            .await
            .map_err(|err| unreachable(&config.spec, &err))?;
        Ok(format!("removed {removed} expired record(s)"))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use idem::postgres::{PostgresStore, migrate};

    use super::{StoreConfig, failure, options, unreachable};
    use crate::commands::Failure;

    /// `idem store migrate|sweep` on a PostgreSQL store.
    pub(super) async fn maintain(
        config: &StoreConfig,
        migrate_it: bool,
    ) -> Result<String, Failure> {
        let settings = options(config)
            .postgres_config(&config.spec)
            .map_err(|err| failure(&config.spec, err))?;
        if migrate_it {
            let report = migrate(&settings)
                .await
                .map_err(|err| unreachable(&config.spec, &err))?;
            return Ok(if report.applied.is_empty() {
                format!(
                    "schema {}: up to date at version {}",
                    report.schema, report.version
                )
            } else {
                format!(
                    "schema {}: applied migration(s) {:?}, now at version {}",
                    report.schema, report.applied, report.version
                )
            });
        }
        let store = PostgresStore::connect(settings)
            .await
            .map_err(|err| unreachable(&config.spec, &err))?;
        let removed = store
            .sweep()
            .await
            .map_err(|err| unreachable(&config.spec, &err))?;
        Ok(format!("removed {removed} expired record(s)"))
    }
}

/// The store cannot be reached or failed: exit 1.
#[cfg_attr(not(any(feature = "postgres", feature = "redb")), allow(dead_code))]
fn unreachable(spec: &StoreSpec, err: &dyn std::fmt::Display) -> Failure {
    Failure::runtime(format!("store {spec}: {err}"))
}

/// The error for a store this build cannot open (the configuration refuses it first: see
/// [`Backends`]).
fn unavailable(spec: &StoreSpec) -> GatewayConfigError {
    let reason = Backends::COMPILED
        .check(spec)
        .err()
        .unwrap_or_else(|| format!("the {} store cannot be opened", spec.kind()));
    GatewayConfigError::new(Some("store".to_owned()), reason)
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
