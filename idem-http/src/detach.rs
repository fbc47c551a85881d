//! [`Detached`]: the work of a request, polled inline by its response future, and handed to a
//! task of its own when that future lets go of it first.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The work of one request, as a boxed future.
pub(crate) type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Owns the work of a request: polled inline by the caller, and spawned onto the runtime to
/// finish on its own if the caller lets go of it before it is done (the client disconnected,
/// or the answer is a streamed response the work still feeds).
pub(crate) struct Detached {
    work: Option<Work>,
}

impl Detached {
    pub(crate) fn new(work: Work) -> Self {
        Detached { work: Some(work) }
    }

    /// Polls the work once; a panic in it drops it (its claim guard releases the key).
    pub(crate) fn poll_inline(&mut self, cx: &mut Context<'_>) {
        let Some(work) = self.work.as_mut() else {
            return;
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(())) | Err(_) => self.work = None,
        }
    }

    /// Whether the work is still here and not done.
    pub(crate) fn is_running(&self) -> bool {
        self.work.is_some()
    }

    /// Hands the work, if it is not done, to a task of its own now.
    #[inline]
    pub(crate) fn detach(&mut self) {
        if let Some(work) = self.work.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(work);
            }
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        self.detach();
    }
}
