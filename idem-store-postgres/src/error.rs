//! How driver and pool errors map onto [`StoreError`].

use std::time::Duration;

use deadpool_postgres::tokio_postgres::error::SqlState;
use deadpool_postgres::{PoolError, tokio_postgres};
use idem_core::StoreError;

/// A driver error as a [`StoreError`]: a lost or refused connection is `Unavailable`, a
/// cancelled statement (`statement_timeout`) is a `Timeout`, a serialization failure or a
/// deadlock is a retryable `Backend` error, anything else a permanent one.
pub(crate) fn from_pg(op: &'static str, after: Duration, err: tokio_postgres::Error) -> StoreError {
    if err.is_closed() {
        return StoreError::unavailable(err);
    }
    let Some(code) = err.code() else {
        // No SQLSTATE: the error came from the connection (I/O, protocol), not the server.
        return StoreError::unavailable(err);
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
        return StoreError::unavailable(err);
    }
    let retryable = matches!(class, "40" | "53" | "55");
    StoreError::Backend {
        source: Box::new(err),
        retryable,
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
