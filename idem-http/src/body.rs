//! Bodies: the request body read with a limit, and [`ResponseBody`], the body of every response
//! that leaves the layer.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::BoxError;
use pin_project_lite::pin_project;
use tokio::sync::mpsc;

/// Why a request body could not be captured.
#[derive(Debug)]
pub(crate) enum CaptureError {
    /// Over the limit: 413.
    TooLarge,
    /// The body failed while it was read: 400.
    Read,
}

/// Reads a request body up to `limit` bytes, de-chunked, as received. A body whose declared
/// length is over the limit is refused before a byte is read.
pub(crate) async fn capture<B>(body: B, limit: usize) -> Result<Bytes, CaptureError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > u64::try_from(limit).unwrap_or(u64::MAX) {
        return Err(CaptureError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Err(CaptureError::TooLarge)
        }
        Err(_) => Err(CaptureError::Read),
    }
}

/// What the handler's task sends to the caller's response body: its frames (or the error
/// that broke the body off), then, once the response is settled, its last frame with the end
/// ([`StreamFrame::Last`]) or the end alone ([`StreamFrame::End`]).
pub(crate) enum StreamFrame {
    /// A frame of the handler's body, or its error.
    Frame(Result<Frame<Bytes>, BoxError>),
    /// The body's last frame: the body is complete after it. One message, so that the server
    /// writes the last data and the end together (no pending poll between them).
    Last(Frame<Bytes>),
    /// The body is complete.
    End,
}

/// The error that ends a streamed body whose task stopped before sending
/// [`StreamFrame::End`] (the handler's body panicked, or the task was cancelled): the client
/// sees a response broken off, as it would without the layer, never a shorter one that looks
/// complete.
const BROKEN_OFF: &str = "the response body ended before the handler finished it";

pin_project! {
    /// The body of every response that leaves the layer: the handler's own body (passed
    /// through), a stored or rejection body, or the handler's body streamed from the task that
    /// runs it (so the handler finishes and its response is stored even if the client leaves).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes>, tail: Option<Box<Tail>> },
        Stream { frames: mpsc::Receiver<StreamFrame>, hint: SizeHint, done: bool },
    }
}

/// What may follow the data of a body held in memory; most have none of it (boxed, so that
/// every response body stays small).
struct Tail {
    trailers: Option<HeaderMap>,
    /// Its length is announced (else the handler announced none: the body stays unsized).
    sized: bool,
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Full { .. } => "Full",
            Kind::Stream { .. } => "Stream",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B> ResponseBody<B> {
    /// The handler's body, passed through.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// A body held in memory.
    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody::collected(data, None)
    }

    /// A body held in memory, followed by the handler's trailers if it sent any.
    pub(crate) fn collected(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ResponseBody::whole(data, trailers, true)
    }

    /// A handler's body read whole: `sized` if the handler announced its length (a body it
    /// did not is passed on without one, as the handler framed it). Its data, its trailers if
    /// any and its end are all ready at once: the server writes them together.
    pub(crate) fn whole(data: Bytes, trailers: Option<HeaderMap>, sized: bool) -> Self {
        let tail = (trailers.is_some() || !sized).then(|| Box::new(Tail { trailers, sized }));
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                tail,
            },
        }
    }

    /// An empty body.
    pub(crate) fn empty() -> Self {
        ResponseBody::full(Bytes::new())
    }

    /// Frames sent by the handler's task; `hint` is the handler body's size hint.
    pub(crate) fn stream(frames: mpsc::Receiver<StreamFrame>, hint: SizeHint) -> Self {
        ResponseBody {
            kind: Kind::Stream {
                frames,
                hint,
                done: false,
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|result| result.map_err(Into::into))),
            KindProj::Full { data, tail } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                let trailers = tail.take().and_then(|rest| rest.trailers);
                Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))))
            }
            KindProj::Stream { frames, done, .. } => {
                if *done {
                    return Poll::Ready(None);
                }
                Poll::Ready(match ready!(frames.poll_recv(cx)) {
                    Some(StreamFrame::Frame(frame)) => Some(frame),
                    Some(StreamFrame::Last(frame)) => {
                        *done = true;
                        Some(Ok(frame))
                    }
                    Some(StreamFrame::End) => {
                        *done = true;
                        None
                    }
                    None => {
                        *done = true;
                        Some(Err(BROKEN_OFF.into()))
                    }
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data, tail } => {
                data.is_none() && tail.as_ref().is_none_or(|t| t.trailers.is_none())
            }
            Kind::Stream { done, .. } => *done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data, tail } => {
                let len = data.as_ref().map_or(0, Bytes::len) as u64;
                if tail
                    .as_ref()
                    .is_some_and(|t| t.trailers.is_some() || !t.sized)
                {
                    // No length announced: the handler announced none, or there are
                    // trailers (an HTTP/1.1 server sends them only after a chunked body,
                    // never after one of a `Content-Length`).
                    let mut hint = SizeHint::new();
                    hint.set_lower(len);
                    hint
                } else {
                    SizeHint::with_exact(len)
                }
            }
            Kind::Stream { hint, .. } => *hint,
        }
    }
}
