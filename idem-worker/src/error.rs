//! [`JobError`]: how a job tells the guard what its failure means.

use std::fmt;

use idem_core::{BoxError, StoreError};

/// What a job's failure means for the key and the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Nothing happened that a retry would repeat (a connection refused before the side
    /// effect): the key is released and the message retried with backoff.
    Transient,
    /// Retrying cannot help (invalid input, a business rule): the failure is recorded, so every
    /// later delivery of the key gets it, and the message is dead-lettered.
    Permanent,
    /// The side effect may or may not have happened (a timeout after the request was sent): the
    /// key is recorded as unknown and the message dead-lettered; no later delivery runs the job
    /// until an operator resolves the record (as completed, or released so it runs again), or
    /// the guard's unknown hold passes.
    Unknown,
}

impl ErrorClass {
    /// `transient`, `permanent` or `unknown`: a stable name for metrics labels and logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error a job returns: a cause and its [`ErrorClass`].
///
/// ```
/// use idem_worker::{ErrorClass, JobError, ResultExt};
///
/// fn parse(body: &str) -> Result<u32, JobError> {
///     body.parse::<u32>().permanent()
/// }
/// assert_eq!(parse("x").unwrap_err().class(), ErrorClass::Permanent);
/// assert_eq!(JobError::transient("connection refused").class(), ErrorClass::Transient);
/// ```
#[derive(Debug)]
pub struct JobError {
    class: ErrorClass,
    source: BoxError,
}

impl JobError {
    /// An error of `class` caused by `source`.
    pub fn new(class: ErrorClass, source: impl Into<BoxError>) -> Self {
        JobError {
            class,
            source: source.into(),
        }
    }

    /// A transient error: release the key, retry with backoff.
    pub fn transient(source: impl Into<BoxError>) -> Self {
        JobError::new(ErrorClass::Transient, source)
    }

    /// A permanent error: record the failure, dead-letter the message.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        JobError::new(ErrorClass::Permanent, source)
    }

    /// An error of unknown outcome: record the key as unknown (not run again until resolved),
    /// dead-letter the message.
    pub fn unknown(source: impl Into<BoxError>) -> Self {
        JobError::new(ErrorClass::Unknown, source)
    }

    /// The class of the error.
    #[must_use]
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// The cause.
    #[must_use]
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The cause, owned.
    #[must_use]
    pub fn into_cause(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} job error: {}", self.class, self.source)
    }
}

impl std::error::Error for JobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl From<StoreError> for JobError {
    /// A store error inside a job: transient if the store says a retry can help and the write
    /// cannot have landed; unknown otherwise: a timeout (the write may have been applied, only
    /// its answer is missing) or an error a retry cannot help (the job may have written
    /// before it failed).
    fn from(error: StoreError) -> Self {
        if error.is_retryable() && !matches!(error, StoreError::Timeout { .. }) {
            JobError::transient(error)
        } else {
            JobError::unknown(error)
        }
    }
}

/// Classifies the error of a `Result` in place: `op().await.transient()?`.
pub trait ResultExt<T> {
    /// Classifies the error as [`ErrorClass::Transient`].
    ///
    /// # Errors
    /// The error, classified.
    fn transient(self) -> Result<T, JobError>;
    /// Classifies the error as [`ErrorClass::Permanent`].
    ///
    /// # Errors
    /// The error, classified.
    fn permanent(self) -> Result<T, JobError>;
    /// Classifies the error as [`ErrorClass::Unknown`].
    ///
    /// # Errors
    /// The error, classified.
    fn unknown_outcome(self) -> Result<T, JobError>;
}

impl<T, E: Into<BoxError>> ResultExt<T> for Result<T, E> {
    fn transient(self) -> Result<T, JobError> {
        self.map_err(JobError::transient)
    }

    fn permanent(self) -> Result<T, JobError> {
        self.map_err(JobError::permanent)
    }

    fn unknown_outcome(self) -> Result<T, JobError> {
        self.map_err(JobError::unknown)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_store_timeout_is_an_unknown_outcome() {
        let timeout = StoreError::Timeout {
            op: "complete",
            after: Duration::from_secs(1),
        };
        assert_eq!(JobError::from(timeout).class(), ErrorClass::Unknown);
        let refused =
            StoreError::unavailable(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(JobError::from(refused).class(), ErrorClass::Transient);
    }
}
