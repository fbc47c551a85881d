//! The bodies the gateway moves: [`RequestBody`] (a client's body, streamed, or the bytes the
//! idempotency layer read to fingerprint it) and [`GatewayBody`] (every response).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idem_core::BoxError;

/// The body of every response the gateway sends.
pub type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// A response body from bytes.
#[must_use]
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body into a [`GatewayBody`].
pub fn boxed<B>(body: B) -> GatewayBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// A client's request body: streamed, or the bytes the idempotency layer read to fingerprint
/// it (idem-http's [`idem_http::RequestBody`] over hyper's `Incoming`).
pub type RequestBody = idem_http::RequestBody<Incoming>;

/// A body that holds a guard until it ends or is dropped (the in-flight count of graceful
/// shutdown covers the upstream's whole response).
#[derive(Debug)]
pub struct Guarded<B, G> {
    body: B,
    guard: Option<G>,
}

impl<B, G> Guarded<B, G> {
    /// `body`, holding `guard`.
    pub fn new(body: B, guard: G) -> Self {
        Guarded {
            body,
            guard: Some(guard),
        }
    }
}

impl<B: Body + Unpin, G: Unpin> Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
