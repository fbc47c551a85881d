//! [`CapturedLogs`]: the log lines a test's code writes, for the test to read.
//!
//! ```
//! use idem_testkit::logs::CapturedLogs;
//!
//! let (logs, _capturing) = CapturedLogs::start();
//! tracing::warn!(error = "refused", "the store failed");
//! assert!(logs.text().contains("the store failed"));
//! ```
//!
//! One subscriber serves the whole test binary: the first [`CapturedLogs::start`] installs it
//! as the global default, and it writes each event to the capture of the thread that emits
//! it (or nowhere). A subscriber per test (`tracing::subscriber::set_default`) is not
//! deterministic: tracing caches each callsite's interest for every thread, and a callsite
//! first hit by a test running in parallel without a subscriber could be cached as
//! uninteresting while the capturing test ran, so its line was missing (one run in about 20
//! with a core kept busy). With one global subscriber that wants every event at its level,
//! the cached interest is the same for everyone.

use std::cell::RefCell;
use std::io::Write;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, Once, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

/// Every line written by the `tracing` events of the capturing thread, as `tracing_subscriber`'s
/// plain text format writes them (no colours), at `INFO` and above.
#[derive(Clone, Debug, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

thread_local! {
    /// The capture of this thread, if a test started one.
    static CURRENT: RefCell<Option<CapturedLogs>> = const { RefCell::new(None) };
}

/// Captures while it lives: dropping it ends the capture of its thread (and restores the one
/// it replaced, if any). It stays on the thread that made it.
#[must_use = "the capture ends when this guard is dropped"]
#[derive(Debug)]
pub struct Capturing {
    previous: Option<CapturedLogs>,
    _thread_bound: PhantomData<*const ()>,
}

impl Drop for Capturing {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }
}

impl CapturedLogs {
    /// Captures the events of this thread (a current-thread runtime's tasks included) until
    /// the guard is dropped.
    ///
    /// # Panics
    /// If another global `tracing` subscriber was installed in this test binary first.
    pub fn start() -> (CapturedLogs, Capturing) {
        install_router();
        let logs = CapturedLogs::default();
        let previous = CURRENT.with(|current| current.borrow_mut().replace(logs.clone()));
        let guard = Capturing {
            previous,
            _thread_bound: PhantomData,
        };
        (logs, guard)
    }

    /// What was written so far.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

/// Installs, once per process, the global subscriber that routes each event to its thread's
/// capture.
fn install_router() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(ThreadCapture)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("CapturedLogs needs the global tracing subscriber of the test binary");
    });
}

/// The writer of the global subscriber: the capture of the calling thread, or a sink.
struct ThreadCapture;

impl<'a> MakeWriter<'a> for ThreadCapture {
    type Writer = Box<dyn Write + 'a>;

    fn make_writer(&'a self) -> Self::Writer {
        match CURRENT.with(|current| current.borrow().clone()) {
            Some(logs) => Box::new(logs),
            None => Box::new(std::io::sink()),
        }
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_reads_its_own_lines_and_none_after_the_guard() {
        let (mine, capturing) = CapturedLogs::start();
        let theirs = std::thread::spawn(|| {
            let (theirs, _capturing) = CapturedLogs::start();
            tracing::warn!("from the other thread");
            theirs.text()
        })
        .join()
        .unwrap();
        tracing::warn!("from this thread");
        drop(capturing);
        tracing::warn!("after the guard");
        let text = mine.text();
        assert!(text.contains("from this thread"), "{text}");
        assert!(!text.contains("other thread"), "{text}");
        assert!(!text.contains("after the guard"), "{text}");
        assert!(theirs.contains("from the other thread"), "{theirs}");
        assert!(!theirs.contains("from this thread"), "{theirs}");
    }
}
