//! The response codec: how a response is stored in a record.
//!
//! A compact binary format of this crate, all integers big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `IDH1` (the version is the last byte) |
//! | 1 | flags: bit 0 = body omitted (over the storage cap), bit 1 = body LZ4-compressed, bit 2 = trailers follow the body |
//! | 2 | status code |
//! | 2 | number of headers, then for each, in order with repeats: |
//! | 2 + n | name length and name (lower case) |
//! | 4 + n | value length and value bytes |
//! | 4 + n | body length and body: raw, or an LZ4 block prefixed with its raw size (u32, little-endian, as `lz4_flex` writes it) |
//! | 2 | only if bit 2 is set: number of trailers, then each encoded as a header is |
//!
//! Bodies of at least 1 KiB are compressed when that makes them smaller. A response without
//! trailers is written without bit 2 and without the trailer section, byte for byte as before
//! trailers were stored, so records written then decode unchanged. [`decode`] never panics: a
//! record it cannot read is a [`CodecError`], which the layer answers with 500 and logs.
//!
//! ```
//! use bytes::Bytes;
//! use http::{HeaderName, HeaderValue, StatusCode};
//! use idem_http::codec::{decode, encode, StoredResponse};
//!
//! let stored = StoredResponse {
//!     status: StatusCode::CREATED,
//!     headers: vec![
//!         (HeaderName::from_static("x-multi"), HeaderValue::from_static("one")),
//!         (HeaderName::from_static("x-multi"), HeaderValue::from_static("two")),
//!     ],
//!     body: Some(Bytes::from_static(b"{\"ok\":true}")),
//!     trailers: vec![(HeaderName::from_static("grpc-status"), HeaderValue::from_static("0"))],
//! };
//! assert_eq!(decode(&encode(&stored))?, stored);
//! # Ok::<(), idem_http::codec::CodecError>(())
//! ```

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"IDH1";
const OMITTED: u8 = 0b01;
const COMPRESSED: u8 = 0b10;
const TRAILERS: u8 = 0b100;
/// Bodies smaller than this are stored raw.
const COMPRESS_FROM: usize = 1024;
/// LZ4 cannot expand data by more than this factor; a larger claimed size is corrupt.
const LZ4_MAX_RATIO: usize = 256;

/// A response as stored: status, headers in order with repeats, the body (`None` when it was
/// over the storage cap) and the trailers in order with repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status.
    pub status: StatusCode,
    /// The headers kept, in order, with repeats.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body, or `None` if it was omitted.
    pub body: Option<Bytes>,
    /// The trailers kept (a gRPC `grpc-status`, a checksum), in order, with repeats; empty when
    /// the response had none.
    pub trailers: Vec<(HeaderName, HeaderValue)>,
}

/// A stored response that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError {
    reason: &'static str,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stored response unreadable: {}", self.reason)
    }
}

impl std::error::Error for CodecError {}

fn corrupt(reason: &'static str) -> CodecError {
    CodecError { reason }
}

/// Lengths of fields: saturated, since the encoder never meets anything near these bounds (a
/// header name longer than 64 KiB or a value over 4 GiB is refused by every HTTP stack).
fn len16(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Encodes `response`. Header and trailer names over 64 KiB, values or bodies over 4 GiB and
/// more than 65,535 headers or trailers are not representable and are cut off (no HTTP stack
/// sends those).
#[must_use]
pub fn encode(response: &StoredResponse) -> Bytes {
    let (mut flags, body) = match &response.body {
        None => (OMITTED, Bytes::new()),
        Some(body) if body.len() >= COMPRESS_FROM => {
            let packed = lz4_flex::compress_prepend_size(body);
            if packed.len() < body.len() {
                (COMPRESSED, Bytes::from(packed))
            } else {
                (0, body.clone())
            }
        }
        Some(body) => (0, body.clone()),
    };
    let headers = capped(&response.headers);
    let trailers = capped(&response.trailers);
    if !trailers.is_empty() {
        flags |= TRAILERS;
    }
    let fields_size = |fields: &[(HeaderName, HeaderValue)]| {
        fields
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum::<usize>()
    };
    let size = 4 + 1 + 2 + 2 + fields_size(headers) + 4 + body.len() + 2 + fields_size(trailers);
    let mut out = BytesMut::with_capacity(size);
    out.put_slice(MAGIC);
    out.put_u8(flags);
    out.put_u16(response.status.as_u16());
    put_fields(&mut out, headers);
    let body = &body[..len32(body.len()) as usize];
    out.put_u32(len32(body.len()));
    out.put_slice(body);
    if flags & TRAILERS != 0 {
        put_fields(&mut out, trailers);
    }
    out.freeze()
}

/// At most as many fields as a u16 counts.
fn capped(fields: &[(HeaderName, HeaderValue)]) -> &[(HeaderName, HeaderValue)] {
    &fields[..fields.len().min(usize::from(u16::MAX))]
}

/// Writes a count and the fields (headers or trailers), in order.
fn put_fields(out: &mut BytesMut, fields: &[(HeaderName, HeaderValue)]) {
    out.put_u16(len16(fields.len()));
    for (name, value) in fields {
        let name = name.as_str().as_bytes();
        let name = &name[..usize::from(len16(name.len()))];
        out.put_u16(len16(name.len()));
        out.put_slice(name);
        let value = value.as_bytes();
        let value = &value[..len32(value.len()) as usize];
        out.put_u32(len32(value.len()));
        out.put_slice(value);
    }
}

/// Reads fields off a byte slice, never past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if n > self.bytes.len() {
            return Err(corrupt("truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<usize, CodecError> {
        let b = self.take(4)?;
        usize::try_from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .map_err(|_| corrupt("length out of range"))
    }

    /// A count and as many fields (headers or trailers).
    fn fields(&mut self) -> Result<Vec<(HeaderName, HeaderValue)>, CodecError> {
        let count = self.u16()?;
        // Each field takes at least 6 bytes: a count beyond what is left is corrupt, and must
        // not reserve memory for it.
        let mut fields = Vec::with_capacity(usize::from(count).min(self.bytes.len() / 6));
        for _ in 0..count {
            let len = usize::from(self.u16()?);
            let name = HeaderName::from_bytes(self.take(len)?)
                .map_err(|_| corrupt("invalid header name"))?;
            let len = self.u32()?;
            let value = HeaderValue::from_bytes(self.take(len)?)
                .map_err(|_| corrupt("invalid header value"))?;
            fields.push((name, value));
        }
        Ok(fields)
    }
}

/// Decodes a stored response. `body` is a zero-copy slice of `bytes` unless it was compressed.
///
/// # Errors
/// [`CodecError`] if the bytes are not a response this codec wrote.
pub fn decode(bytes: &Bytes) -> Result<StoredResponse, CodecError> {
    let mut reader = Reader { bytes };
    if reader.take(4)? != MAGIC {
        return Err(corrupt("unknown format"));
    }
    let flags = reader.u8()?;
    if flags & !(OMITTED | COMPRESSED | TRAILERS) != 0 {
        return Err(corrupt("unknown flags"));
    }
    let status = StatusCode::from_u16(reader.u16()?).map_err(|_| corrupt("invalid status"))?;
    let headers = reader.fields()?;
    let len = reader.u32()?;
    let start = bytes.len() - reader.bytes.len();
    let raw = reader.take(len)?;
    let trailers = if flags & TRAILERS != 0 {
        reader.fields()?
    } else {
        Vec::new()
    };
    if !reader.bytes.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    let body = if flags & OMITTED != 0 {
        if !raw.is_empty() {
            return Err(corrupt("an omitted body has bytes"));
        }
        None
    } else if flags & COMPRESSED != 0 {
        let claimed = raw
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or(corrupt("truncated compressed body"))?;
        if claimed > raw.len().saturating_mul(LZ4_MAX_RATIO) {
            return Err(corrupt("impossible compressed size"));
        }
        let body = lz4_flex::decompress_size_prepended(raw)
            .map_err(|_| corrupt("invalid compressed body"))?;
        Some(Bytes::from(body))
    } else {
        Some(bytes.slice(start..start + len))
    };
    Ok(StoredResponse {
        status,
        headers,
        body,
        trailers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn large_bodies_are_compressed_and_omitted_bodies_are_flagged() {
        let big = StoredResponse {
            status: StatusCode::OK,
            headers: vec![],
            body: Some(Bytes::from(vec![b'x'; 100_000])),
            trailers: vec![],
        };
        let encoded = encode(&big);
        assert!(encoded.len() < 2_000, "{}", encoded.len());
        assert_eq!(decode(&encoded).unwrap(), big);
        let omitted = StoredResponse { body: None, ..big };
        assert_eq!(decode(&encode(&omitted)).unwrap(), omitted);
    }

    /// A response without trailers is written byte for byte as before trailers were stored,
    /// and bytes written then read back with no trailers.
    #[test]
    fn a_response_without_trailers_encodes_as_records_written_before_trailers() {
        let before: &[u8] = b"IDH1\x00\x00\xc9\x00\x01\x00\x01x\x00\x00\x00\x01y\x00\x00\x00\x02ok";
        let stored = StoredResponse {
            status: StatusCode::CREATED,
            headers: vec![(HeaderName::from_static("x"), HeaderValue::from_static("y"))],
            body: Some(Bytes::from_static(b"ok")),
            trailers: vec![],
        };
        assert_eq!(encode(&stored), before);
        assert_eq!(decode(&Bytes::from_static(before)).unwrap(), stored);
    }

    /// Trailers follow the body, flagged; an omitted body keeps its trailers.
    #[test]
    fn trailers_follow_the_body_and_survive_an_omitted_body() {
        let stored = StoredResponse {
            status: StatusCode::OK,
            headers: vec![],
            body: None,
            trailers: vec![
                (
                    HeaderName::from_static("grpc-status"),
                    HeaderValue::from_static("3"),
                ),
                (
                    HeaderName::from_static("grpc-message"),
                    HeaderValue::from_static("bad"),
                ),
            ],
        };
        let encoded = encode(&stored);
        assert_eq!(encoded[4], OMITTED | TRAILERS);
        assert!(encoded.ends_with(
            b"\x00\x02\x00\x0bgrpc-status\x00\x00\x00\x013\x00\x0cgrpc-message\x00\x00\x00\x03bad"
        ));
        assert_eq!(decode(&encoded).unwrap(), stored);
        // A trailer section cut short, or trailing bytes after it, is corrupt.
        assert!(decode(&encoded.slice(..encoded.len() - 1)).is_err());
        let mut longer = encoded.to_vec();
        longer.push(0);
        assert!(decode(&Bytes::from(longer)).is_err());
        // The flag without a section is corrupt too.
        let mut flagged = encode(&StoredResponse {
            trailers: vec![],
            ..stored
        })
        .to_vec();
        flagged[4] |= TRAILERS;
        assert!(decode(&Bytes::from(flagged)).is_err());
    }

    fn fields(raw: Vec<(String, String)>) -> Vec<(HeaderName, HeaderValue)> {
        raw.into_iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(&v).unwrap(),
                )
            })
            .collect()
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = decode(&Bytes::from(framed));
            let _ = decode(&Bytes::from(bytes));
        }

        /// A valid record with trailers, cut anywhere or with any byte changed: an error or
        /// a response, never a panic.
        #[test]
        fn damaged_records_with_trailers_decode_without_panic(
            trailers in proptest::collection::vec(("[a-z][a-z0-9-]{0,10}", "[ -~]{0,10}"), 1..4),
            body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let stored = StoredResponse {
                status: StatusCode::OK,
                headers: vec![],
                body: body.map(Bytes::from),
                trailers: fields(trailers),
            };
            let encoded = encode(&stored).to_vec();
            let _ = decode(&Bytes::copy_from_slice(&encoded[..cut.index(encoded.len())]));
            let mut changed = encoded;
            let at = at.index(changed.len());
            changed[at] = byte;
            let _ = decode(&Bytes::from(changed));
        }

        #[test]
        fn responses_round_trip(
            status in 200u16..600,
            headers in proptest::collection::vec(("[a-z][a-z0-9-]{0,20}", "[ -~]{0,40}"), 0..8),
            body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..3000)),
            trailers in proptest::collection::vec(("[a-z][a-z0-9-]{0,20}", "[ -~]{0,40}"), 0..4),
        ) {
            let stored = StoredResponse {
                status: StatusCode::from_u16(status).unwrap(),
                headers: fields(headers),
                body: body.map(Bytes::from),
                trailers: fields(trailers),
            };
            let encoded = encode(&stored);
            prop_assert_eq!(encoded[4] & TRAILERS != 0, !stored.trailers.is_empty());
            prop_assert_eq!(decode(&encoded).unwrap(), stored);
        }
    }
}
