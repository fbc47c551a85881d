//! [`RequestBody`]: a request body the layer can hand back after reading it, for servers whose
//! own body type cannot be built from bytes (hyper's `Incoming`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use idem_core::BoxError;

/// A request body as the server gave it (streamed), or the bytes the layer read to fingerprint
/// it (buffered).
///
/// The layer reads a covered request's body whole before the handler runs, then hands the
/// handler a body made from those bytes, so the inner service's body type must implement
/// `From<Bytes>`. axum's `Body` and `http_body_util::Full<Bytes>` do; hyper's `Incoming` does
/// not. Wrap it on the way in, and the handler takes a `RequestBody<Incoming>`:
///
/// ```
/// use http::{Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use hyper::body::Incoming;
/// use idem_http::{IdempotencyLayer, RequestBody};
/// use idem_store_memory::MemoryStore;
/// use tower::ServiceBuilder;
///
/// async fn handle(request: Request<RequestBody<Incoming>>) -> Result<Response<Full<bytes::Bytes>>, idem_core::BoxError> {
///     let body = request.into_body().collect().await?.to_bytes();
///     Ok(Response::new(Full::new(body)))
/// }
///
/// // A tower service over hyper's request type, ready for hyper-util's TowerToHyperService.
/// let service = ServiceBuilder::new()
///     .map_request(|request: Request<Incoming>| request.map(RequestBody::new))
///     .layer(IdempotencyLayer::new(MemoryStore::new()))
///     .service_fn(handle);
/// # let _ = service;
/// ```
#[derive(Debug)]
pub struct RequestBody<B>(Kind<B>);

#[derive(Debug)]
enum Kind<B> {
    Streamed(B),
    Buffered(Full<Bytes>),
}

impl<B> RequestBody<B> {
    /// `body`, streamed as it comes.
    pub fn new(body: B) -> Self {
        RequestBody(Kind::Streamed(body))
    }
}

impl<B> From<Bytes> for RequestBody<B> {
    fn from(bytes: Bytes) -> Self {
        RequestBody(Kind::Buffered(Full::new(bytes)))
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Kind::Streamed(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Kind::Buffered(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Streamed(body) => body.is_end_stream(),
            Kind::Buffered(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Streamed(body) => body.size_hint(),
            Kind::Buffered(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn either_form_yields_its_bytes_and_its_size() {
        let streamed = RequestBody::new(Full::new(Bytes::from_static(b"streamed")));
        assert_eq!(streamed.size_hint().exact(), Some(8));
        assert_eq!(streamed.collect().await.unwrap().to_bytes(), "streamed");
        let buffered = RequestBody::<Full<Bytes>>::from(Bytes::from_static(b"read"));
        assert_eq!(buffered.size_hint().exact(), Some(4));
        assert!(!buffered.is_end_stream());
        assert_eq!(buffered.collect().await.unwrap().to_bytes(), "read");
    }
}
