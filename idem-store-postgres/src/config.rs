//! [`PostgresConfig`]: where the store connects and how it behaves.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::tokio_postgres;
use idem_core::machine::LeasePolicy;
use idem_core::{Clock, SystemClock};

/// The longest schema name PostgreSQL keeps (`NAMEDATALEN - 1`).
const MAX_SCHEMA_LEN: usize = 63;

/// A configuration the store cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresConfigError {
    /// The connection URL does not parse.
    #[error("invalid PostgreSQL URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The schema name is not a plain lower-case identifier.
    #[error(
        "invalid schema name {schema:?}: {reason} (use 1 to 63 of a-z, 0-9 and _, not starting with a digit)"
    )]
    InvalidSchema {
        /// The name given.
        schema: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Where [`crate::PostgresStore`] connects and how it behaves. Built with consuming `with_*`
/// methods from [`PostgresConfig::new`].
///
/// Defaults: schema `idem`, a pool of 16 connections, a connect timeout of 5 s, an operation
/// timeout of 5 s (the wait for a pooled connection plus the statement; also sent to the server
/// as `statement_timeout`), lenient leases, migrations applied on connect.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use idem_store_postgres::PostgresConfig;
///
/// let config = PostgresConfig::new("postgres://postgres@127.0.0.1:5432/test")?
///     .with_schema("payments_idem")?
///     .with_pool_size(NonZeroUsize::new(32).unwrap())
///     .with_op_timeout(Duration::from_secs(2));
/// assert_eq!(config.schema(), "payments_idem");
/// # Ok::<(), idem_store_postgres::PostgresConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PostgresConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) schema: String,
    pub(crate) pool_size: NonZeroUsize,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) lease_policy: LeasePolicy,
    pub(crate) migrate: bool,
    pub(crate) local_clock: Arc<dyn Clock>,
}

impl PostgresConfig {
    /// The default schema.
    pub const DEFAULT_SCHEMA: &'static str = "idem";

    /// A configuration for the server at `url` (`postgres://user@host:port/db`, or the
    /// `key=value` form of libpq) with every default.
    ///
    /// # Errors
    /// [`PostgresConfigError::InvalidUrl`] if `url` does not parse.
    pub fn new(url: &str) -> Result<Self, PostgresConfigError> {
        let pg = url
            .parse::<tokio_postgres::Config>()
            .map_err(PostgresConfigError::InvalidUrl)?;
        Ok(PostgresConfig {
            pg,
            schema: Self::DEFAULT_SCHEMA.to_owned(),
            pool_size: NonZeroUsize::new(16).unwrap_or(NonZeroUsize::MIN),
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(5),
            lease_policy: LeasePolicy::Lenient,
            migrate: true,
            local_clock: Arc::new(SystemClock),
        })
    }

    /// The schema that holds the store's tables (default `idem`): a plain identifier of 1 to 63
    /// characters `a-z`, `0-9`, `_`, not starting with a digit. The store always quotes it in
    /// SQL, so a name PostgreSQL reserves as a keyword (`user`, `order`) works as well.
    ///
    /// # Errors
    /// [`PostgresConfigError::InvalidSchema`] naming the rule the name breaks.
    pub fn with_schema(mut self, schema: &str) -> Result<Self, PostgresConfigError> {
        check_schema(schema)?;
        self.schema = schema.to_owned();
        Ok(self)
    }

    /// The most connections the pool opens (default 16).
    pub fn with_pool_size(mut self, size: NonZeroUsize) -> Self {
        self.pool_size = size;
        self
    }

    /// How long opening one connection may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one operation may take, waiting for a pooled connection included (default
    /// 5 s). Past it the operation answers `StoreError::Timeout`; the server cancels the
    /// statement through `statement_timeout`.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Refuse transitions of a holder whose lease lapsed, even if nobody took the key over
    /// (default: lenient; see [`LeasePolicy`]).
    pub fn with_lease_policy(mut self, policy: LeasePolicy) -> Self {
        self.lease_policy = policy;
        self
    }

    /// The local clock the store's estimate of the server's clock runs on (the system's by
    /// default): a test hook, for handles whose local clocks disagree. The store measures its
    /// offset to the server's `clock_timestamp()` before its first operation and every 30 s,
    /// so any local clock gives the same store time within the estimate's bound.
    pub fn with_local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.local_clock = clock;
        self
    }

    /// Whether [`crate::PostgresStore::connect`] applies the embedded migrations (default
    /// `true`). Turn it off where the schema is migrated by a deploy step
    /// ([`crate::migrate`], `idem store migrate`).
    pub fn with_migrate_on_connect(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The schema name.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The driver's connection settings, with the timeouts of this configuration applied.
    pub(crate) fn driver_config(&self) -> tokio_postgres::Config {
        let mut pg = self.pg.clone();
        pg.connect_timeout(self.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("idem");
        }
        let millis = self.op_timeout.as_millis().max(1);
        let existing = pg.get_options().unwrap_or_default().to_owned();
        pg.options(format!("{existing} -c statement_timeout={millis}").trim_start());
        pg
    }
}

/// Checks that `schema` is a plain identifier that needs no quoting.
fn check_schema(schema: &str) -> Result<(), PostgresConfigError> {
    let fail = |reason| {
        Err(PostgresConfigError::InvalidSchema {
            schema: schema.to_owned(),
            reason,
        })
    };
    if schema.is_empty() {
        return fail("it is empty");
    }
    if schema.len() > MAX_SCHEMA_LEN {
        return fail("it is longer than 63 bytes");
    }
    if schema.as_bytes()[0].is_ascii_digit() {
        return fail("it starts with a digit");
    }
    if !schema
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return fail("it holds a character other than a-z, 0-9 and _");
    }
    if schema.starts_with("pg_") {
        return fail("names starting with pg_ are reserved by PostgreSQL");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked() {
        let config = PostgresConfig::new("postgres://u@localhost/db").unwrap();
        assert!(config.clone().with_schema("idem_1").is_ok());
        for bad in ["", "1abc", "a-b", "Abc", "a\"b", "pg_idem", &"a".repeat(64)] {
            assert!(
                matches!(
                    config.clone().with_schema(bad),
                    Err(PostgresConfigError::InvalidSchema { .. })
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn bad_urls_are_refused_and_timeouts_reach_the_server() {
        assert!(matches!(
            PostgresConfig::new("postgres://u@host:notaport/db"),
            Err(PostgresConfigError::InvalidUrl(_))
        ));
        let config = PostgresConfig::new("postgres://u@localhost/db")
            .unwrap()
            .with_op_timeout(Duration::from_millis(1500));
        let pg = config.driver_config();
        assert_eq!(pg.get_options(), Some("-c statement_timeout=1500"));
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(5)));
    }
}
