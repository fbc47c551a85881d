//! How redb's errors become [`StoreError`]s, and the errors this crate adds: the file that
//! could not be opened, and the batch whose commit failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_core::StoreError;

/// A redb error as a [`StoreError`]: I/O and a closed database are `Unavailable`, an oversized
/// value `TooLarge`, anything else (a corrupt file, a format from the future) a permanent
/// `Backend` error.
pub(crate) fn storage(err: impl Into<redb::Error>) -> StoreError {
    let err: redb::Error = err.into();
    match err {
        // What redb answers for a file that is not a redb file.
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            StoreError::Backend {
                source: Box::new(io),
                retryable: false,
            }
        }
        redb::Error::Io(_)
        | redb::Error::PreviousIo
        | redb::Error::DatabaseClosed
        | redb::Error::DatabaseAlreadyOpen
        | redb::Error::LockPoisoned(_) => StoreError::unavailable(err),
        redb::Error::ValueTooLarge(size) => StoreError::TooLarge {
            size,
            limit: u32::MAX as usize,
        },
        other => StoreError::Backend {
            source: Box::new(other),
            retryable: false,
        },
    }
}

/// Why a store file could not be opened, with its path: redb's own messages name neither the
/// file nor, for a file locked by another process, the process.
#[derive(Debug)]
pub(crate) struct OpenError {
    path: PathBuf,
    source: redb::DatabaseError,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path.display();
        match &self.source {
            redb::DatabaseError::DatabaseAlreadyOpen => write!(
                f,
                "the store file {path} is in use: another process (or another RedbStore in \
                 this one) has it open, and a redb file has one owner at a time"
            ),
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.kind() == std::io::ErrorKind::InvalidData =>
            {
                write!(f, "cannot open {path}: it is not a redb store file ({io})")
            }
            other => write!(f, "cannot open {path}: {other}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An error of opening the file at `path` as a [`StoreError`], classified as [`storage`] does
/// (a file in use is `Unavailable`: its owner may be on its way out), and naming the file.
pub(crate) fn open_error(path: &Path, err: redb::DatabaseError) -> StoreError {
    let retryable = match &err {
        redb::DatabaseError::DatabaseAlreadyOpen => true,
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
            io.kind() != std::io::ErrorKind::InvalidData
        }
        redb::DatabaseError::Storage(
            redb::StorageError::PreviousIo
            | redb::StorageError::DatabaseClosed
            | redb::StorageError::LockPoisoned(_),
        ) => true,
        _ => false,
    };
    let source = OpenError {
        path: path.to_owned(),
        source: err,
    };
    if retryable {
        StoreError::unavailable(source)
    } else {
        StoreError::Backend {
            source: Box::new(source),
            retryable: false,
        }
    }
}

/// A [`StoreError`] of preparing the file at `path` (its tables, its format), naming the file
/// and keeping the error as its source.
pub(crate) fn in_file(path: &Path, err: StoreError) -> StoreError {
    let wrap = |source| InFile {
        path: path.to_owned(),
        source,
    };
    match err {
        StoreError::Unavailable { source } => StoreError::unavailable(wrap(source)),
        StoreError::Backend { source, retryable } => StoreError::Backend {
            source: Box::new(wrap(source)),
            retryable,
        },
        other => other,
    }
}

/// An error that happened in the store file at `path`.
#[derive(Debug)]
pub(crate) struct InFile {
    path: PathBuf,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for InFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for InFile {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// A failed batch's error, shared by every operation of the batch.
#[derive(Debug)]
pub(crate) struct BatchError(pub(crate) Arc<str>);

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BatchError {}

/// The error of opening the file at `path` when it is empty (and empty files are not allowed:
/// see [`RedbStoreBuilder::allow_empty_file`](crate::RedbStoreBuilder::allow_empty_file)).
pub(crate) fn empty_file(path: &Path) -> StoreError {
    StoreError::Backend {
        source: format!(
            "the store file {} is empty (0 bytes): a store file is never empty once opened, so \
             its records were lost (a truncation, a failed copy, a full disk); restore it from \
             a backup, or allow an empty file explicitly to start a new store in it",
            path.display()
        )
        .into(),
        retryable: false,
    }
}
