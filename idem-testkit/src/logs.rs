//! [`CapturedLogs`]: the log lines a test's code writes, for the test to read.
//!
//! ```
//! use idem_testkit::logs::CapturedLogs;
//!
//! let (logs, _capturing) = CapturedLogs::start();
//! tracing::warn!(error = "refused", "the store failed");
//! assert!(logs.text().contains("the store failed"));
//! ```

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;

/// Every line written by the `tracing` events of the capturing thread, as `tracing_subscriber`'s
/// plain text format writes them (no colours).
#[derive(Clone, Debug, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Captures the events of this thread (a current-thread runtime's tasks included) until
    /// the guard is dropped.
    #[must_use]
    pub fn start() -> (CapturedLogs, DefaultGuard) {
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// What was written so far.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
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
