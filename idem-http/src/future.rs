//! [`ResponseFuture`]: the future of the [`crate::Idempotency`] service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::metrics;
use crate::outcome::Outcome;

/// A boxed future of a request the layer handles.
pub(crate) type Managed<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

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
        Bypass { #[pin] future: F },
        // An answer known at once (a rejection).
        Ready { response: Option<Response<ResponseBody<B>>> },
        // A request the layer handles.
        Managed { future: Managed<B, E> },
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
    pub(crate) fn bypass(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Bypass { future },
        }
    }

    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn managed(future: Managed<B, E>) -> Self {
        ResponseFuture {
            kind: Kind::Managed { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Bypass { future } => {
                let response = ready!(future.poll(cx))?;
                metrics::request(Outcome::Bypassed);
                let mut response = response.map(ResponseBody::inner);
                response.extensions_mut().insert(Outcome::Bypassed);
                Poll::Ready(Ok(response))
            }
            KindProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled after completion: answer an empty 500 rather than panic.
                None => {
                    let mut response = Response::new(ResponseBody::empty());
                    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    Poll::Ready(Ok(response))
                }
            },
            KindProj::Managed { future } => future.as_mut().poll(cx),
        }
    }
}
