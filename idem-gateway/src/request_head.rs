//! The checks and clean-ups of a request head before it is routed, the ones hyper leaves to
//! the gateway: the same field limit for HTTP/2 as for HTTP/1.1, no transfer coding the
//! upstream would not get, no header name with an underscore (by default), and the `Cookie`
//! crumbs of an HTTP/2 request joined into one field line for the HTTP/1.1 upstream.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

/// Why a request head is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    /// More header fields than `max_headers` (an HTTP/2 request: hyper's HTTP/1 parser
    /// refuses them itself): 431.
    #[error("more than {0} header fields")]
    TooManyFields(usize),
    /// A transfer coding other than `chunked` (`Transfer-Encoding: gzip, chunked`): the
    /// gateway would forward the body decoded from its chunks but still gzip-coded, as a
    /// plain chunked body, changing its meaning: 400.
    #[error("a transfer coding other than chunked, which the gateway does not carry")]
    TransferCoding,
}

impl HeadError {
    /// The status the client gets.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            HeadError::TooManyFields(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::TransferCoding => StatusCode::BAD_REQUEST,
        }
    }
}

/// What the gateway does with a request head before it routes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadPolicy {
    /// The most header fields (`[server] max_headers`).
    pub max_headers: usize,
    /// Whether header names with an underscore are kept (`[server] underscores_in_headers`).
    pub underscores: bool,
}

impl HeadPolicy {
    /// Checks and cleans `headers` of a request in `version`.
    ///
    /// # Errors
    /// [`HeadError`] when the head is refused.
    pub(crate) fn settle(self, version: Version, headers: &mut HeaderMap) -> Result<(), HeadError> {
        if headers.len() > self.max_headers {
            return Err(HeadError::TooManyFields(self.max_headers));
        }
        if headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .any(|value| !only_chunked(value))
        {
            return Err(HeadError::TransferCoding);
        }
        if !self.underscores {
            drop_underscored(headers);
        }
        if version >= Version::HTTP_2 {
            join_cookies(headers);
        }
        Ok(())
    }
}

/// Whether a `Transfer-Encoding` value names no coding but `chunked`.
fn only_chunked(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|codings| {
        codings
            .split(',')
            .map(str::trim)
            .all(|coding| coding.eq_ignore_ascii_case("chunked"))
    })
}

/// Removes every field whose name has an underscore (`Idempotency_Fence`): CGI, WSGI and Rack
/// servers map `_` and `-` to the same variable, so such a field would reach the application
/// as the header the gateway set or removed (nginx drops them by default too).
fn drop_underscored(headers: &mut HeaderMap) {
    if !headers.keys().any(|name| name.as_str().contains('_')) {
        return;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .cloned()
        .collect();
    for name in names {
        headers.remove(&name);
        tracing::debug!(header = %name, "a header name with an underscore was dropped");
    }
}

/// Joins the `Cookie` field lines of an HTTP/2 request (which may split the cookies into one
/// field each) into one, with "; " between them (RFC 9113 section 8.2.3), as an HTTP/1.1
/// upstream expects.
fn join_cookies(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    if crumbs.next().is_none() || crumbs.next().is_none() {
        return;
    }
    let mut joined = Vec::new();
    for crumb in headers.get_all(header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: HeadPolicy = HeadPolicy {
        max_headers: 3,
        underscores: false,
    };

    #[test]
    fn an_http2_request_over_the_field_limit_is_refused() {
        let mut headers = HeaderMap::new();
        for n in 0..4 {
            headers.append("x-a", HeaderValue::from(n));
        }
        assert_eq!(
            POLICY.settle(Version::HTTP_2, &mut headers),
            Err(HeadError::TooManyFields(3))
        );
        headers.remove("x-a");
        assert_eq!(POLICY.settle(Version::HTTP_2, &mut headers), Ok(()));
    }

    #[test]
    fn a_transfer_coding_other_than_chunked_is_refused() {
        for (value, refused) in [
            ("chunked", false),
            ("Chunked", false),
            ("gzip, chunked", true),
            ("gzip", true),
            ("chunked, chunked", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static(value));
            let settled = POLICY.settle(Version::HTTP_11, &mut headers);
            assert_eq!(settled.is_err(), refused, "{value}");
        }
    }

    #[test]
    fn underscored_names_are_dropped_unless_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency_fence", HeaderValue::from_static("8"));
        headers.insert("x_forwarded_for", HeaderValue::from_static("10.0.0.1"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        let mut kept = headers.clone();
        POLICY.settle(Version::HTTP_11, &mut headers).unwrap();
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("x-kept"));
        let keep = HeadPolicy {
            underscores: true,
            ..POLICY
        };
        keep.settle(Version::HTTP_11, &mut kept).unwrap();
        assert_eq!(kept.len(), 3);
    }

    #[test]
    fn http2_cookie_crumbs_are_joined() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        headers.append(header::COOKIE, HeaderValue::from_static("c=3"));
        let mut http1 = headers.clone();
        let policy = HeadPolicy {
            max_headers: 10,
            ..POLICY
        };
        policy.settle(Version::HTTP_2, &mut headers).unwrap();
        assert_eq!(headers.get_all(header::COOKIE).iter().count(), 1);
        assert_eq!(headers[header::COOKIE], "a=1; b=2; c=3");
        // An HTTP/1.1 request's repeated Cookie lines are its own doing: left as they are.
        policy.settle(Version::HTTP_11, &mut http1).unwrap();
        assert_eq!(http1.get_all(header::COOKIE).iter().count(), 3);
    }
}
