//! How driver and pool errors map onto [`StoreError`].

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use deadpool_postgres::tokio_postgres::error::SqlState;
use deadpool_postgres::{PoolError, tokio_postgres};
use idem_core::StoreError;

/// A driver error as a [`StoreError`]: credentials the server refuses (or a password it asks
/// for that the URL lacks) are a permanent `Backend` error whose source is a
/// [`CredentialsRefused`], as is a setting the driver refuses; a lost or refused connection is
/// `Unavailable`, a cancelled statement (`statement_timeout`) is a `Timeout`, a serialization
/// failure or a deadlock is a retryable `Backend` error, anything else a permanent one.
pub(crate) fn from_pg(op: &'static str, after: Duration, err: tokio_postgres::Error) -> StoreError {
    if let Some(refusal) = refusal(&err) {
        return StoreError::Backend {
            source: Box::new(CredentialsRefused { op, refusal, err }),
            retryable: false,
        };
    }
    if err.is_closed() {
        return StoreError::unavailable(PgError { op, err });
    }
    let Some(code) = err.code() else {
        if is_config(&err) {
            // A setting the driver refuses (no host, ports that do not match the hosts): no
            // retry changes it.
            return StoreError::Backend {
                source: Box::new(PgError { op, err }),
                retryable: false,
            };
        }
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

/// The driver's message of an error of its `Config` kind (the kind itself is not public: its
/// message is how the driver names it).
const CONFIG_ERROR: &str = "invalid configuration";
/// The driver's message of an error of its `Authentication` kind: the SASL exchange failed
/// (the server's proof does not match, a mechanism or channel binding the driver lacks).
const AUTHENTICATION_ERROR: &str = "authentication error";
/// The cause the driver gives a `Config` error when the server asks for a password (cleartext,
/// MD5 or SCRAM) and the configuration has none.
const PASSWORD_MISSING: &str = "password missing";

/// Whether `err` is of the driver's `Config` kind.
fn is_config(err: &tokio_postgres::Error) -> bool {
    err.as_db_error().is_none() && err.to_string() == CONFIG_ERROR
}

/// How the server refused the credentials of the connection, if that is what `err` says.
fn refusal(err: &tokio_postgres::Error) -> Option<Refusal> {
    if let Some(code) = err.code() {
        let refused = *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION;
        return refused.then_some(Refusal::Server);
    }
    let cause = err.source().map(ToString::to_string);
    if is_config(err) && cause.as_deref() == Some(PASSWORD_MISSING) {
        return Some(Refusal::PasswordMissing);
    }
    (err.to_string() == AUTHENTICATION_ERROR).then_some(Refusal::Exchange)
}

/// How the credentials were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// The server answered SQLSTATE 28P01 (a wrong password) or 28000 (a user or database the
    /// server's authentication rules refuse).
    Server,
    /// The server asked for a password and the configuration has none.
    PasswordMissing,
    /// The password exchange failed in the driver (SCRAM).
    Exchange,
}

/// The source of the permanent [`StoreError::Backend`] of a connection whose credentials the
/// server refused: a wrong password or a user it does not take (SQLSTATE 28P01 or 28000), a
/// password it asked for that the URL does not have (the driver's `password missing`), or a
/// password exchange that failed. No retry helps until the URL or the server's roles change,
/// so it is never `Unavailable` (which a caller would retry, or wait out). The driver's error
/// is its source.
///
/// ```
/// # fn check(err: &idem_core::StoreError) {
/// if let Some(refused) = idem_store_postgres::CredentialsRefused::of(err) {
///     eprintln!("fix the URL's user or password: {refused}");
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct CredentialsRefused {
    op: &'static str,
    refusal: Refusal,
    err: tokio_postgres::Error,
}

impl CredentialsRefused {
    /// The refusal `err` carries, when it is one (a [`StoreError::Backend`] whose source is a
    /// [`CredentialsRefused`]).
    #[must_use]
    pub fn of(err: &StoreError) -> Option<&CredentialsRefused> {
        match err {
            StoreError::Backend { source, .. } => source.downcast_ref(),
            _ => None,
        }
    }

    /// Whether the server asked for a password that the URL does not have.
    #[must_use]
    pub fn password_missing(&self) -> bool {
        self.refusal == Refusal::PasswordMissing
    }
}

impl fmt::Display for CredentialsRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: the server refused the credentials: ", self.op)?;
        match self.refusal {
            Refusal::PasswordMissing => f.write_str(
                "it asks for a password and the URL has none (postgres://USER:PASSWORD@HOST/DB)",
            ),
            Refusal::Server | Refusal::Exchange => write_cause(f, &self.err),
        }
    }
}

impl std::error::Error for CredentialsRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.err)
    }
}

/// What the server said in `err` (its severity, message, SQLSTATE and hint), or the driver's
/// message and its cause.
fn write_cause(f: &mut fmt::Formatter<'_>, err: &tokio_postgres::Error) -> fmt::Result {
    if let Some(db) = err.as_db_error() {
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
    write!(f, "{err}")?;
    if let Some(cause) = err.source() {
        write!(f, ": {cause}")?;
    }
    Ok(())
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
        write_cause(f, &self.err)
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
