//! The bodies the gateway moves: [`RequestBody`] (a client's body, streamed, or the bytes the
//! idempotency layer read to fingerprint it) and [`GatewayBody`] (every response).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderName;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idem_core::BoxError;
use idem_http::fields::strip_trailer_fields;

/// The body of every response the gateway sends.
pub(crate) type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// A response body from bytes.
#[must_use]
pub(crate) fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body into a [`GatewayBody`].
pub(crate) fn boxed<B>(body: B) -> GatewayBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// A client's request body: streamed, or the bytes the idempotency layer read to fingerprint
/// it (idem-http's [`idem_http::RequestBody`] over hyper's `Incoming`).
pub(crate) type RequestBody = idem_http::RequestBody<Incoming>;

/// A body that holds a guard until it ends or is dropped (the in-flight count of graceful
/// shutdown covers the upstream's whole response).
#[derive(Debug)]
pub(crate) struct Guarded<B, G> {
    body: B,
    guard: Option<G>,
}

impl<B, G> Guarded<B, G> {
    /// `body`, holding `guard`.
    pub(crate) fn new(body: B, guard: G) -> Self {
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

/// A body whose trailers lose their connection and framing fields
/// ([`strip_trailer_fields`]) and, where the head's `Trailer` announced a list, the fields it
/// did not announce; a trailer section left empty is not sent. Both ways through the gateway:
/// an HTTP/2 peer resets a stream whose trailers hold a connection field, and an HTTP/1.1
/// peer could take one for its own.
#[derive(Debug)]
pub(crate) struct SettledTrailers<B> {
    body: B,
    announced: Option<Vec<HeaderName>>,
}

impl<B> SettledTrailers<B> {
    /// `body`, its trailers stripped of connection and framing fields.
    #[cfg(test)]
    pub(crate) fn new(body: B) -> Self {
        SettledTrailers {
            body,
            announced: None,
        }
    }

    /// `body`, its trailers stripped, and only the fields in `announced` kept: an HTTP/1.1
    /// server sends only the trailers its `Trailer` header announces, so an HTTP/2 client, an
    /// HTTP/1.1 client and a replay all get the same ones.
    pub(crate) fn announced(body: B, announced: Vec<HeaderName>) -> Self {
        SettledTrailers {
            body,
            announced: Some(announced),
        }
    }
}

impl<B: Body + Unpin> Body for SettledTrailers<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        loop {
            let mut frame = match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                other => return Poll::Ready(other),
            };
            if let Some(trailers) = frame.trailers_mut() {
                strip_trailer_fields(trailers);
                if let Some(announced) = &this.announced {
                    let unannounced: Vec<HeaderName> = trailers
                        .keys()
                        .filter(|name| !announced.contains(name))
                        .cloned()
                        .collect();
                    for name in unannounced {
                        trailers.remove(name);
                    }
                }
                if trailers.is_empty() {
                    continue;
                }
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that notes when its last bytes were handed over to the upstream connection:
/// the upstream then has (nearly) the whole request and may be running it, so an answer lost
/// after that is an unknown outcome, while one lost before is a request that never ran. Only a
/// claimed request carries a note (`None` otherwise: nothing to decide, no allocation). Its
/// data goes in frames of at most [`DELIVERY_FRAME`] bytes (a split of `Bytes` copies
/// nothing): hyper asks for the next frame only once its write buffer has room, so the last
/// frame is handed over only after the rest has been written to the socket, and an upstream
/// that never reads a body larger than the socket buffers never gets it noted.
#[derive(Debug)]
pub(crate) struct Delivered<B: Body> {
    body: B,
    /// The rest of a frame larger than [`DELIVERY_FRAME`], handed over next.
    rest: Option<B::Data>,
    note: Option<Arc<AtomicBool>>,
}

/// The largest data frame a noted [`Delivered`] body hands over at once.
pub(crate) const DELIVERY_FRAME: usize = 64 * 1024;

impl<B: Body<Data = Bytes>> Delivered<B> {
    /// `body`, noting its delivery in `note`.
    pub(crate) fn new(body: B, note: Option<Arc<AtomicBool>>) -> Self {
        Delivered {
            body,
            rest: None,
            note,
        }
    }

    /// Called as the request is handed to a connection: an empty body goes with the head
    /// (hyper never polls it), so it is noted delivered now.
    pub(crate) fn dispatched(&self) {
        if let Some(note) = &self.note {
            if self.rest.is_none() && self.body.is_end_stream() {
                note.store(true, Ordering::Release);
            }
        }
    }

    /// The next part of `data` to hand over: all of it without a note, else at most
    /// [`DELIVERY_FRAME`] bytes, the rest kept for the next poll.
    fn part(&mut self, mut data: Bytes) -> Bytes {
        if self.note.is_some() && data.len() > DELIVERY_FRAME {
            let rest = data.split_off(DELIVERY_FRAME);
            self.rest = Some(rest);
        }
        data
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Delivered<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = match this.rest.take() {
            Some(rest) => Some(Ok(Frame::data(this.part(rest)))),
            None => match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => Some(Ok(match frame.into_data() {
                    Ok(data) => Frame::data(this.part(data)),
                    Err(frame) => frame,
                })),
                other => other,
            },
        };
        if let Some(note) = &this.note {
            let ended = match &polled {
                None => true,
                Some(Ok(_)) => this.is_end_stream(),
                Some(Err(_)) => false,
            };
            if ended {
                note.store(true, Ordering::Release);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map_or(0, |rest| rest.len() as u64);
        let inner = self.body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// Whether a [`Delivered`] body handed over its last bytes, as its `note` says.
pub(crate) fn was_delivered(note: &AtomicBool) -> bool {
    note.load(Ordering::Acquire)
}
