//! The response codec: how a response is stored in a record.
//!
//! A compact binary format of this crate, all integers big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `IDH1` (the version is the last byte) |
//! | 1 | flags: bit 0 = body omitted (over the storage cap), bit 1 = body LZ4-compressed |
//! | 2 | status code |
//! | 2 | number of headers, then for each, in order with repeats: |
//! | 2 + n | name length and name (lower case) |
//! | 4 + n | value length and value bytes |
//! | 4 + n | body length and body: raw, or an LZ4 block prefixed with its raw size (u32, little-endian, as `lz4_flex` writes it) |
//!
//! Bodies of at least 1 KiB are compressed when that makes them smaller. [`decode`] never panics:
//! a record it cannot read is a [`CodecError`], which the layer answers with 500 and logs.
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
/// Bodies smaller than this are stored raw.
const COMPRESS_FROM: usize = 1024;
/// LZ4 cannot expand data by more than this factor; a larger claimed size is corrupt.
const LZ4_MAX_RATIO: usize = 256;

/// A response as stored: status, headers in order with repeats, and the body (`None` when it
/// was over the storage cap).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status.
    pub status: StatusCode,
    /// The headers kept, in order, with repeats.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body, or `None` if it was omitted.
    pub body: Option<Bytes>,
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

/// Encodes `response`. Header names over 64 KiB and values or bodies over 4 GiB are not
/// representable and are cut off (no HTTP stack sends those).
#[must_use]
pub fn encode(response: &StoredResponse) -> Bytes {
    let (flags, body) = match &response.body {
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
    let headers = &response.headers[..response.headers.len().min(usize::from(u16::MAX))];
    let size = 4
        + 1
        + 2
        + 2
        + headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum::<usize>()
        + 4
        + body.len();
    let mut out = BytesMut::with_capacity(size);
    out.put_slice(MAGIC);
    out.put_u8(flags);
    out.put_u16(response.status.as_u16());
    out.put_u16(len16(headers.len()));
    for (name, value) in headers {
        let name = name.as_str().as_bytes();
        let name = &name[..usize::from(len16(name.len()))];
        out.put_u16(len16(name.len()));
        out.put_slice(name);
        let value = value.as_bytes();
        let value = &value[..len32(value.len()) as usize];
        out.put_u32(len32(value.len()));
        out.put_slice(value);
    }
    let body = &body[..len32(body.len()) as usize];
    out.put_u32(len32(body.len()));
    out.put_slice(body);
    out.freeze()
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
    if flags & !(OMITTED | COMPRESSED) != 0 {
        return Err(corrupt("unknown flags"));
    }
    let status = StatusCode::from_u16(reader.u16()?).map_err(|_| corrupt("invalid status"))?;
    let count = reader.u16()?;
    let mut headers = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let len = usize::from(reader.u16()?);
        let name = HeaderName::from_bytes(reader.take(len)?)
            .map_err(|_| corrupt("invalid header name"))?;
        let len = reader.u32()?;
        let value = HeaderValue::from_bytes(reader.take(len)?)
            .map_err(|_| corrupt("invalid header value"))?;
        headers.push((name, value));
    }
    let len = reader.u32()?;
    let start = bytes.len() - reader.bytes.len();
    let raw = reader.take(len)?;
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
        };
        let encoded = encode(&big);
        assert!(encoded.len() < 2_000, "{}", encoded.len());
        assert_eq!(decode(&encoded).unwrap(), big);
        let omitted = StoredResponse { body: None, ..big };
        assert_eq!(decode(&encode(&omitted)).unwrap(), omitted);
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = decode(&Bytes::from(framed));
            let _ = decode(&Bytes::from(bytes));
        }

        #[test]
        fn responses_round_trip(
            status in 200u16..600,
            headers in proptest::collection::vec(("[a-z][a-z0-9-]{0,20}", "[ -~]{0,40}"), 0..8),
            body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..3000)),
        ) {
            let stored = StoredResponse {
                status: StatusCode::from_u16(status).unwrap(),
                headers: headers
                    .into_iter()
                    .map(|(n, v)| (HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(&v).unwrap()))
                    .collect(),
                body: body.map(Bytes::from),
            };
            prop_assert_eq!(decode(&encode(&stored)).unwrap(), stored);
        }
    }
}
