//! How driver and pool errors map onto [`StoreError`].

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use deadpool_postgres::tokio_postgres::error::SqlState;
use deadpool_postgres::{PoolError, tokio_postgres};
use idem_core::StoreError;

/// A driver error as a [`StoreError`]: a lost or refused connection is `Unavailable`, a
/// cancelled statement (`statement_timeout`) is a `Timeout`, a serialization failure or a
/// deadlock is a retryable `Backend` error, anything else a permanent one.
pub(crate) fn from_pg(op: &'static str, after: Duration, err: tokio_postgres::Error) -> StoreError {
    if err.is_closed() {
        return StoreError::unavailable(PgError { op, err });
    }
    let Some(code) = err.code() else {
        // No SQLSTATE: the error came from the connection (I/O, protocol), not the server.
        return StoreError::unavailable(PgError { op, err });
    };
    if *code == SqlState::QUERY_CANCELED {
        return StoreError::Timeout { op, after };
    }
    let class = code.code().get(..2).unwrap_or_default();
    let unavailable = matches!(class, "08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS;
    if unavailable {
        return StoreError::unavailable(PgError { op, err });
    }
    let retryable = matches!(class, "40" | "53" | "55");
    StoreError::Backend {
        source: Box::new(PgError { op, err }),
        retryable,
    }
}

/// A driver error with what the server or the connection said in its message: the driver's
/// own message is only its kind ("db error", "error connecting to server"), with the server's
/// message in its source, which a log line or the CLI's `error:` line does not show. The
/// driver's error stays this error's source.
#[derive(Debug)]
struct PgError {
    op: &'static str,
    err: tokio_postgres::Error,
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.op)?;
        if let Some(db) = self.err.as_db_error() {
            write!(
                f,
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            )?;
            if let Some(hint) = db.hint() {
                write!(f, "; hint: {hint}")?;
            }
            return Ok(());
        }
        write!(f, "{}", self.err)?;
        if let Some(cause) = self.err.source() {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.err)
    }
}

/// A pool error as a [`StoreError`]: no connection in time is a `Timeout`; a connection that
/// cannot be made is `Unavailable`.
pub(crate) fn from_pool(op: &'static str, after: Duration, err: PoolError) -> StoreError {
    match err {
        PoolError::Timeout(_) => StoreError::Timeout { op, after },
        PoolError::Backend(err) => from_pg(op, after, err),
        other => StoreError::unavailable(other),
    }
}

/// An answer of the server that the store cannot make sense of.
pub(crate) fn protocol(reason: impl Into<String>) -> StoreError {
    StoreError::Backend {
        source: reason.into().into(),
        retryable: false,
    }
}
