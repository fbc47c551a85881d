//! [`ResponseFuture`]: the future of the [`crate::Idempotency`] service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tokio::sync::oneshot;

use crate::body::ResponseBody;
use crate::detach::Detached;
use crate::fields;
use crate::layer::Shared;
use crate::outcome::Outcome;
use crate::rejection::Rejection;
use crate::service::{Reply, reject};

pin_project! {
    /// The response future of [`crate::Idempotency`].
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // A request the layer does not handle: the inner future, untouched.
        Bypass { #[pin] future: F, shared: Arc<Shared> },
        // An answer known at once (a rejection).
        Ready { response: Option<Response<ResponseBody<B>>> },
        // A request the layer handles: its work (polled here, detached if this future is
        // dropped first) and the answer the work sends.
        Managed {
            work: Detached,
            answer: Option<oneshot::Receiver<Reply<B, E>>>,
            shared: Arc<Shared>,
        },
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Bypass { .. } => "Bypass",
            Kind::Ready { .. } => "Ready",
            Kind::Managed { .. } => "Managed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn bypass(future: F, shared: Arc<Shared>) -> Self {
        ResponseFuture {
            kind: Kind::Bypass { future, shared },
        }
    }

    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn managed(
        work: Detached,
        answer: oneshot::Receiver<Reply<B, E>>,
        shared: Arc<Shared>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Managed {
                work,
                answer: Some(answer),
                shared,
            },
        }
    }
}

/// The answer to a future polled after it completed: an empty 500 rather than a panic.
fn polled_after_completion<B>() -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    response
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Bypass { future, shared } => {
                // Counted whatever the inner service answers: a request that ends in its
                // error (a gateway's upstream down) passed through all the same.
                let result = ready!(future.poll(cx));
                shared.metrics.request(Outcome::Bypassed);
                let mut response = result?.map(ResponseBody::inner);
                // Only idem marks a replay, also where it does not handle the request.
                fields::remove_idem_fields(response.headers_mut());
                response.extensions_mut().insert(Outcome::Bypassed);
                Poll::Ready(Ok(response))
            }
            KindProj::Ready { response } => {
                Poll::Ready(Ok(response.take().unwrap_or_else(polled_after_completion)))
            }
            KindProj::Managed {
                work,
                answer,
                shared,
            } => {
                let Some(receiver) = answer.as_mut() else {
                    return Poll::Ready(Ok(polled_after_completion()));
                };
                // The answer is sent only while the work is polled here (the work is detached
                // only after it, or with this future): read it without registering a waker, so
                // sending it does not wake this task for a poll that has nothing to do.
                work.poll_inline(cx);
                let received = match receiver.try_recv() {
                    Ok(received) => Ok(received),
                    Err(oneshot::error::TryRecvError::Empty) if work.is_running() => {
                        return Poll::Pending;
                    }
                    Err(_) => Err(()),
                };
                *answer = None;
                // The work that goes on (it feeds a streamed body, or stores the record) goes on
                // on its own from now, whether or not this future is dropped soon.
                work.detach();
                Poll::Ready(match received {
                    Ok(Ok(mut response)) => {
                        if response.extensions().get::<Outcome>().is_none() {
                            response.extensions_mut().insert(Outcome::Executed);
                        }
                        Ok(shared.metrics.counted(response))
                    }
                    // The handler's error (a gateway's upstream down or too slow) is still a
                    // request that ran under the key (its claim was released): counted as
                    // executed, as a handler that panicked is.
                    Ok(Err(error)) => {
                        shared.metrics.request(Outcome::Executed);
                        Err(error)
                    }
                    // The work ended without answering: the handler panicked (its claim was
                    // released).
                    Err(_) => Ok(shared
                        .metrics
                        .counted(reject(shared, Rejection::HandlerFailed))),
                })
            }
        }
    }
}
