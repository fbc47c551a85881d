//! [`catch_unwind`]: a job run with its panics caught, in making its future or in polling it.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Creates the future with `make` and runs it, catching a panic in either step: `Err` holds
/// the panic's message. The guard runs jobs through this; a variant of the guard can too.
///
/// # Errors
/// The message of the panic.
pub async fn catch_unwind<F, Fut>(make: F) -> Result<Fut::Output, String>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let caught = match std::panic::catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => CatchUnwind(Box::pin(future)).await,
        Err(panic) => Err(panic),
    };
    caught.map_err(|panic| panic_message(panic.as_ref()))
}

/// Catches a panic while polling the job's future.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
