//! Fields that belong to one connection or to a message's framing, not to the resource, and
//! the fields only idem sets. A proxy (idem-gateway) removes the first kind on the way through,
//! in headers and trailers both ways; the layer neither passes on nor stores them in trailers,
//! and removes a handler's own copies of the second kind.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, header};
//! use idem_http::fields::{clean_trailer_header, strip_trailer_fields};
//!
//! let mut head = HeaderMap::new();
//! head.insert(header::TRAILER, HeaderValue::from_static("Connection, X-Checksum"));
//! assert_eq!(clean_trailer_header(&mut head), ["x-checksum"]);
//! assert_eq!(head[header::TRAILER], "x-checksum");
//!
//! let mut trailers = HeaderMap::new();
//! trailers.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
//! trailers.insert("x-hop", HeaderValue::from_static("1"));
//! trailers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
//! trailers.insert("x-checksum", HeaderValue::from_static("7"));
//! strip_trailer_fields(&mut trailers);
//! assert_eq!(trailers.len(), 1);
//! assert_eq!(trailers["x-checksum"], "7");
//! ```

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::service::{REPLAY_HEADER, REPLAYED_HEADER, STATUS_HEADER};

/// Fields that describe one connection (RFC 9110 section 7.6.1): never forwarded, stored or
/// replayed, in a header section or a trailer section. An HTTP/2 peer resets a stream whose
/// headers or trailers carry one (RFC 9113 section 8.2.2).
pub const CONNECTION_FIELDS: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Fields that frame a message and have no place among its trailers (RFC 9110 section 6.5.1):
/// a recipient could take them for the framing of the next message.
static FRAMING_FIELDS: [HeaderName; 2] = [header::CONTENT_LENGTH, header::TRAILER];

/// The fields only idem sets: a handler's or an upstream's own copies would pass a fresh
/// response off as a replay (or as unrecorded).
pub const IDEM_FIELDS: [HeaderName; 3] = [
    HeaderName::from_static(REPLAYED_HEADER),
    HeaderName::from_static(REPLAY_HEADER),
    HeaderName::from_static(STATUS_HEADER),
];

// The public arrays are `const`s, and a `const` of names is built and dropped again at each
// use (a `HeaderName` has drop glue): the checks per header field read these statics instead.
/// [`CONNECTION_FIELDS`], made once.
static CONNECTION: [HeaderName; 6] = CONNECTION_FIELDS;
/// [`IDEM_FIELDS`], made once.
static IDEM: [HeaderName; 3] = IDEM_FIELDS;

/// The names that the `Connection` fields of `fields` list, but `Host`: the target of a
/// request is end to end (RFC 9112 section 3.2), whatever a `Connection` says.
#[must_use]
pub fn connection_listed(fields: &HeaderMap) -> Vec<HeaderName> {
    listed(fields, &header::CONNECTION)
        .into_iter()
        .filter(|name| *name != header::HOST)
        .collect()
}

/// The field names listed (comma-separated, case-insensitive) in the values of `list`; a token
/// that is not a field name is skipped.
fn listed(fields: &HeaderMap, list: &HeaderName) -> Vec<HeaderName> {
    fields
        .get_all(list)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect()
}

/// Removes from `fields` the [`CONNECTION_FIELDS`], the fields their `Connection` lists (never
/// `Host`) and `extra`.
pub fn remove_connection_fields(fields: &mut HeaderMap, extra: &[HeaderName]) {
    let named = connection_listed(fields);
    remove_where(fields, |name| {
        CONNECTION.contains(name) || extra.contains(name) || named.contains(name)
    });
}

/// Removes every field of `fields` whose name `unwanted` picks. One walk over the names (a
/// comparison each), then a removal for each picked: most messages carry none of the names a
/// proxy removes, and a removal by name costs a hash of the name and a probe even then.
fn remove_where(fields: &mut HeaderMap, unwanted: impl Fn(&HeaderName) -> bool) {
    let picked: Vec<HeaderName> = fields
        .keys()
        .filter(|name| unwanted(name))
        .cloned()
        .collect();
    for name in &picked {
        fields.remove(name);
    }
}

/// Removes from a trailer section every connection field, every field its `Connection` lists
/// and every framing field (`Content-Length`, `Trailer`): what is left is what idem passes on
/// and stores.
pub fn strip_trailer_fields(trailers: &mut HeaderMap) {
    remove_connection_fields(trailers, &FRAMING_FIELDS);
}

/// Whether `name` is one of the [`CONNECTION_FIELDS`] or a field that frames a message
/// (`Content-Length`, `Trailer`): never stored or replayed, and never carried by a trailer
/// section.
#[must_use]
pub fn is_connection_or_framing(name: &HeaderName) -> bool {
    CONNECTION.contains(name) || FRAMING_FIELDS.contains(name)
}

/// Rewrites the `Trailer` header of `headers` (a header section) to announce only fields a
/// trailer section may carry and that its `Connection` does not list, each once, in order;
/// removes it when none is left. Returns the names it announces. Call it before the header
/// section's own connection fields are removed: it reads its `Connection`.
pub fn clean_trailer_header(headers: &mut HeaderMap) -> Vec<HeaderName> {
    if !headers.contains_key(header::TRAILER) {
        return Vec::new();
    }
    let hop = connection_listed(headers);
    let mut announced: Vec<HeaderName> = Vec::new();
    for name in listed(headers, &header::TRAILER) {
        if !is_connection_or_framing(&name) && !hop.contains(&name) && !announced.contains(&name) {
            announced.push(name);
        }
    }
    headers.remove(header::TRAILER);
    if let Some(value) = trailer_value(announced.iter()) {
        headers.insert(header::TRAILER, value);
    }
    announced
}

/// The value of a `Trailer` header that announces `names` (each once, in order), or `None`
/// when there are none.
pub fn trailer_value<'a>(names: impl IntoIterator<Item = &'a HeaderName>) -> Option<HeaderValue> {
    let mut unique: Vec<&str> = Vec::new();
    for name in names {
        if !unique.contains(&name.as_str()) {
            unique.push(name.as_str());
        }
    }
    if unique.is_empty() {
        return None;
    }
    HeaderValue::from_str(&unique.join(", ")).ok()
}

/// Removes the [`IDEM_FIELDS`] a handler or an upstream set: only idem sets them, on a replay
/// or a response it did not record.
pub fn remove_idem_fields(headers: &mut HeaderMap) {
    remove_where(headers, |name| IDEM.contains(name));
}

/// The head of a handler's response as the layer passes it on: without the [`IDEM_FIELDS`]
/// and with its `Trailer` header cleaned ([`clean_trailer_header`]).
pub(crate) fn settle_head(headers: &mut HeaderMap) {
    remove_idem_fields(headers);
    clean_trailer_header(headers);
}

/// A frame of a handler's body as the layer passes it on: trailers settled
/// ([`strip_trailer_fields`]), data as it is.
pub(crate) fn settle_frame<D>(mut frame: http_body::Frame<D>) -> http_body::Frame<D> {
    if let Some(trailers) = frame.trailers_mut() {
        strip_trailer_fields(trailers);
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_and_framing_field_leaves_the_trailers() {
        for name in CONNECTION_FIELDS.iter().chain(&FRAMING_FIELDS) {
            let mut trailers = HeaderMap::new();
            trailers.insert(name.clone(), HeaderValue::from_static("v"));
            trailers.insert("x-sum", HeaderValue::from_static("1"));
            strip_trailer_fields(&mut trailers);
            assert_eq!(trailers.len(), 1, "{name}");
            assert!(trailers.contains_key("x-sum"), "{name}");
        }
    }

    #[test]
    fn the_trailer_header_announces_only_what_may_trail() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
        headers.append(
            header::TRAILER,
            HeaderValue::from_static("TE, x-sum, Keep-Alive"),
        );
        headers.append(
            header::TRAILER,
            HeaderValue::from_static("x-hop, Content-Length, X-Sum, x-b"),
        );
        assert_eq!(clean_trailer_header(&mut headers), ["x-sum", "x-b"]);
        assert_eq!(headers[header::TRAILER], "x-sum, x-b");
        let mut none = HeaderMap::new();
        none.insert(header::TRAILER, HeaderValue::from_static("connection"));
        assert!(clean_trailer_header(&mut none).is_empty());
        assert!(!none.contains_key(header::TRAILER));
    }

    #[test]
    fn idem_fields_are_removed() {
        let mut headers = HeaderMap::new();
        for name in &IDEM_FIELDS {
            headers.insert(name.clone(), HeaderValue::from_static("true"));
        }
        headers.insert("x-a", HeaderValue::from_static("1"));
        remove_idem_fields(&mut headers);
        assert_eq!(headers.len(), 1);
    }
}
