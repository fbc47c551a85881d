//! A panic inside redb as an error: redb asserts on a file it cannot make sense of (a
//! truncated file, random bytes over its pages) instead of answering an error, so every call
//! into it runs under [`Damage::guard`], which catches the panic and answers
//! [`StoreError::Corrupt`] naming the file.
//!
//! After a panic nothing of redb's state is trusted again (a write transaction may have been
//! left half-applied in memory, an allocator half-updated): the [`Damage`] is kept, and every
//! later operation of the store answers the same error without calling redb. Reopening the
//! file is the way back, once it is repaired or replaced.
//!
//! The default panic hook would print the panic (`thread '...' panicked at ...`, and a
//! backtrace) on stderr even though it is caught: the first guard installs a hook that stays
//! silent for the panics a guard catches, and hands every other panic to the hook that was
//! installed before. For a guarded panic, the hook records the damage itself, with the
//! panic's message and location, before the unwinding starts: an operation whose answer is
//! dropped by the unwinding finds the damage already recorded.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once, OnceLock, PoisonError, RwLock, TryLockError};

use idem_core::StoreError;
use redb::Database;

/// Where a guard records the first failure of its file.
type FirstFailure = Arc<OnceLock<String>>;

thread_local! {
    /// The damage record of the innermost guard running on this thread, if any.
    static GUARDED: RefCell<Option<FirstFailure>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs the hook that keeps quiet about the panics a guard catches (once per process).
fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let guarded = GUARDED.with(|guarded| guarded.borrow().clone());
            match guarded {
                Some(first) => {
                    let _ = first.set(describe(info));
                }
                None => previous(info),
            }
        }));
    });
}

/// A panic's message and where it was raised, the path cut to the crate's own (from
/// `redb-VERSION/` on, when the panic is redb's).
fn describe(info: &PanicHookInfo<'_>) -> String {
    let message = payload_text(info.payload());
    match info.location() {
        Some(location) => {
            let file = location.file();
            let file = file.find("redb-").map_or(file, |at| &file[at..]);
            format!("{message}, at {file}:{}", location.line())
        }
        None => message,
    }
}

/// The text of a panic's payload (a `&str` or a `String`, as `panic!` makes them).
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Whether a store file is damaged, and how it showed: the first panic redb raised on it.
#[derive(Debug)]
pub(crate) struct Damage {
    path: PathBuf,
    first: FirstFailure,
}

impl Damage {
    /// The file at `path`, not known to be damaged.
    pub(crate) fn new(path: &Path) -> Self {
        Damage {
            path: path.to_owned(),
            first: Arc::new(OnceLock::new()),
        }
    }

    /// The error of every operation on the damaged file, or `None` while no panic was seen.
    pub(crate) fn error(&self) -> Option<StoreError> {
        self.first.get().map(|what| self.corrupt(what))
    }

    /// The error of a damaged file that showed as `what`.
    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::Corrupt {
            key: self.path.display().to_string(),
            reason: format!(
                "the store file is damaged: redb failed on it ({what}); restore it from a \
                 backup, or move it away to start with an empty store"
            ),
        }
    }

    /// `Ok` while the file is not known to be damaged.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        self.error().map_or(Ok(()), Err)
    }

    /// Runs `call` (which calls into redb), unless the file is already known to be damaged; a
    /// panic inside it marks the file damaged and is answered as [`Damage::error`].
    ///
    /// The panic's state is not looked at again: everything `call` touched is redb's, which
    /// no operation uses once the damage is recorded (hence the `AssertUnwindSafe`).
    pub(crate) fn guard<T>(
        &self,
        call: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check()?;
        install_hook();
        let outer = GUARDED.with(|guarded| guarded.replace(Some(Arc::clone(&self.first))));
        let caught = panic::catch_unwind(AssertUnwindSafe(call));
        GUARDED.with(|guarded| *guarded.borrow_mut() = outer);
        match caught {
            Ok(result) => result,
            Err(payload) => {
                // Recorded by the hook, unless another hook replaced it: then from the payload.
                let what = payload_text(&*payload);
                let err = self.corrupt(&what);
                let _ = self.first.set(what);
                Err(self.error().unwrap_or(err))
            }
        }
    }
}

/// The open database, shared by the store, its reads and its writer, with what is known of
/// the file's [`Damage`]: every call into redb goes through [`Db::with`] (or
/// [`Db::exclusive`]), under the guard.
#[derive(Debug)]
pub(crate) struct Db {
    /// `None` only while the database is dropped (see the `Drop` impl).
    database: RwLock<Option<Database>>,
    pub(crate) damage: Damage,
}

impl Db {
    /// `database`, opened from the file `damage` names.
    pub(crate) fn new(database: Database, damage: Damage) -> Self {
        Db {
            database: RwLock::new(Some(database)),
            damage,
        }
    }

    /// Runs `call` on the database under the shared lock (so never during a compaction),
    /// guarded. The lock guards no invariant of its own (only compaction's exclusive access),
    /// so a poisoned lock is used as it is.
    pub(crate) fn with<T>(
        &self,
        call: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.damage.check()?;
        let database = self.database.read().unwrap_or_else(PoisonError::into_inner);
        let database = database.as_ref().ok_or_else(closed)?;
        self.damage.guard(|| call(database))
    }

    /// As [`Db::with`], but `None` at once instead of waiting while a compaction holds the
    /// file, and for any error.
    pub(crate) fn try_with<T>(&self, call: impl FnOnce(&Database) -> Option<T>) -> Option<T> {
        self.damage.check().ok()?;
        let database = match self.database.try_read() {
            Ok(database) => database,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let database = database.as_ref()?;
        self.damage.guard(|| Ok(call(database))).ok().flatten()
    }

    /// Runs `call` on the database under the exclusive lock (every other call waits), guarded.
    pub(crate) fn exclusive<T>(
        &self,
        call: impl FnOnce(&mut Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.damage.check()?;
        let mut database = self
            .database
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let database = database.as_mut().ok_or_else(closed)?;
        self.damage.guard(|| call(database))
    }
}

impl Drop for Db {
    /// Closes the database under the guard: redb writes its allocator state on close, and
    /// may panic on a damaged file there too. A file known to be damaged is not closed at all
    /// (nothing more is written to it; the process keeps it open, and locked, until it exits).
    fn drop(&mut self) {
        let database = self
            .database
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(database) = database else {
            return;
        };
        if self.damage.check().is_err() {
            std::mem::forget(database);
            return;
        }
        let _ = self.damage.guard(|| {
            drop(database);
            Ok(())
        });
    }
}

/// The error of a call after the database was closed.
fn closed() -> StoreError {
    StoreError::unavailable("the store is closed")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    #[test]
    fn a_panic_is_the_file_damaged_from_then_on() {
        let damage = Damage::new(Path::new("idem.redb"));
        assert_eq!(damage.guard(|| Ok(1)).unwrap(), 1);
        let err = damage
            .guard::<()>(|| panic!("assertion failed: the page"))
            .unwrap_err();
        let StoreError::Corrupt { key, reason } = &err else {
            panic!("not Corrupt: {err}");
        };
        assert_eq!(key, "idem.redb");
        assert!(
            reason.contains("assertion failed: the page") && reason.contains("guard.rs:"),
            "{reason}"
        );
        // Nothing runs on a damaged file any more; the first failure stays the reason.
        let again = damage.guard::<()>(|| panic!("should not run")).unwrap_err();
        assert_eq!(again.to_string(), err.to_string());
        assert!(!err.is_retryable());
    }

    #[test]
    fn a_nested_guard_records_its_own_file() {
        let outer = Damage::new(Path::new("a.redb"));
        let inner = Damage::new(Path::new("b.redb"));
        let result = outer.guard(|| {
            let nested = inner.guard::<()>(|| panic!("inner"));
            assert!(nested.unwrap_err().to_string().contains("b.redb"));
            // Still guarded by the outer guard once the nested one returned.
            assert!(GUARDED.with(|guarded| guarded.borrow().is_some()));
            Ok(())
        });
        assert!(result.is_ok());
        assert!(outer.check().is_ok());
        assert!(GUARDED.with(|guarded| guarded.borrow().is_none()));
        // A panic outside any guard is the previous hook's, and no file's damage.
        let other = std::thread::spawn(|| panic!("not guarded")).join();
        assert!(other.is_err());
        assert!(outer.check().is_ok() && inner.check().is_err());
    }
}
