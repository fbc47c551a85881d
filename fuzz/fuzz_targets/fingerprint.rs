//! Fuzzes the request fingerprint over arbitrary requests, as the HTTP layer computes it: the
//! body read frame by frame (with or without a declared length, with or without trailers) up
//! to the body limit, then SHA-256 over the method, the path and query, and the bytes.
//!
//! Differential: a body cut into arbitrary chunks (empty ones too) has the fingerprint of the
//! same body in one chunk, and both are over the limit or neither is; trailers and a declared
//! length do not count; an absolute-form request line has the fingerprint of its origin form
//! (headers are no input: the scope separates principals). In idem-core, the parts
//! are length-prefixed: two different lists of parts never share a fingerprint, however their
//! bytes are cut. Nothing panics.
#![no_main]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri};
use http_body::{Body, Frame, SizeHint};
use idem_core::Fingerprint;
use idem_http::fingerprint::{captured_fingerprint, request_fingerprint};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    method: Vec<u8>,
    uri: Vec<u8>,
    body: Vec<u8>,
    cuts: Vec<u8>,
    declared: bool,
    trailers: bool,
    limit: u16,
    parts: Vec<Vec<u8>>,
    part_cuts: Vec<u8>,
}

/// A request body that yields its chunks as they were cut, every frame ready.
struct Chunks {
    chunks: VecDeque<Bytes>,
    declared: bool,
    trailers: bool,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-checksum", HeaderValue::from_static("abc"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn size_hint(&self) -> SizeHint {
        if self.declared {
            SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
        } else {
            SizeHint::default()
        }
    }
}

/// Cuts `bytes` at the offsets `cuts` gives (each a step forward, maybe zero).
fn cut(bytes: &[u8], cuts: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    for &step in cuts {
        let (head, tail) = rest.split_at(usize::from(step).min(rest.len()));
        out.push(head.to_vec());
        rest = tail;
    }
    out.push(rest.to_vec());
    out
}

/// The fingerprint the layer computes for a body sent as `chunks`; every frame is ready, so
/// one poll must finish it.
fn captured(method: &Method, uri: &Uri, body: Chunks, limit: usize) -> Option<Fingerprint> {
    let future = pin!(captured_fingerprint(method, uri, body, limit));
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(fingerprint) => fingerprint,
        Poll::Pending => panic!("a ready body left the capture pending"),
    }
}

fuzz_target!(|input: Input| {
    let method = Method::from_bytes(&input.method).unwrap_or(Method::POST);
    let uri = Uri::try_from(&input.uri[..]).unwrap_or_else(|_| Uri::from_static("/"));
    let limit = usize::from(input.limit);
    let body = |chunks: Vec<Vec<u8>>| Chunks {
        chunks: chunks.into_iter().map(Bytes::from).collect(),
        declared: input.declared,
        trailers: input.trailers,
    };

    let whole = captured(&method, &uri, body(vec![input.body.clone()]), limit);
    let chunked = captured(&method, &uri, body(cut(&input.body, &input.cuts)), limit);
    assert_eq!(whole, chunked);
    let direct = request_fingerprint(&method, &uri, &input.body);
    assert_eq!(whole, (input.body.len() <= limit).then_some(direct));

    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let parts: [&[u8]; 3] = [
        method.as_str().as_bytes(),
        path_and_query.as_bytes(),
        &input.body,
    ];
    assert_eq!(direct, Fingerprint::of(&parts));
    if let Ok(origin) = Uri::builder().path_and_query(path_and_query).build() {
        assert_eq!(direct, request_fingerprint(&method, &origin, &input.body));
    }

    // The same bytes as other parts: a different list never gives the same fingerprint.
    let parts: Vec<&[u8]> = input.parts.iter().map(Vec::as_slice).collect();
    let recut = cut(&input.parts.concat(), &input.part_cuts);
    let recut: Vec<&[u8]> = recut.iter().map(Vec::as_slice).collect();
    let fingerprint = Fingerprint::of(&parts);
    let built = parts
        .iter()
        .fold(Fingerprint::builder(), |b, part| b.part(part))
        .finish();
    assert_eq!(fingerprint, built);
    assert_eq!(parts == recut, fingerprint == Fingerprint::of(&recut));
});
