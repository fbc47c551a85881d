//! Rejections: the answers the layer gives instead of running the handler, as RFC 9457
//! `application/problem+json` by default, replaceable through [`RejectionHandler`].
//!
//! ```
//! use bytes::Bytes;
//! use idem_http::rejection::{Rejection, RejectionHandler, ProblemJson};
//!
//! let header = http::HeaderName::from_static("idempotency-key");
//! let response = ProblemJson::default().respond(&Rejection::MissingKey { header });
//! assert_eq!(response.status(), 400);
//! assert_eq!(response.headers()["content-type"], "application/problem+json");
//! let body = std::str::from_utf8(response.body()).unwrap();
//! assert!(body.contains(r#""status":400"#), "{body}");
//!
//! // A closure replaces the default.
//! let plain = |rejection: &Rejection| {
//!     let mut response = http::Response::new(Bytes::from(rejection.title()));
//!     *response.status_mut() = rejection.status();
//!     response
//! };
//! assert_eq!(plain.respond(&Rejection::Mismatch).status(), 422);
//! ```

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};

use crate::header::KeyHeaderError;
use crate::outcome::Outcome;

/// Why the layer answered instead of the handler. The response carries it in its extensions
/// (next to the [`Outcome`]) so outer layers can read it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The key header (`Idempotency-Key` unless configured otherwise) is invalid: 400.
    InvalidKey {
        /// The name of the key header.
        header: HeaderName,
        /// What is wrong with it.
        error: KeyHeaderError,
    },
    /// The route requires a key and the request has none: 400.
    MissingKey {
        /// The name of the key header.
        header: HeaderName,
    },
    /// The scope of the request cannot be read (a scope header, `Authorization`, a tenant or an
    /// API-key header, is repeated; a tenant header is not printable ASCII; or a `scope_with`
    /// function returned `None`): 400.
    InvalidScope,
    /// The request body is larger than the limit: 413.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request body could not be read: 400.
    BodyUnreadable,
    /// The request body was not received whole within the body timeout: 408. Nothing was
    /// claimed and nothing ran; the client may send the request again.
    BodyTimeout {
        /// The body timeout.
        timeout: Duration,
    },
    /// Another request with this key is in flight: 409 with `Retry-After`.
    InFlight {
        /// When to come back: an estimate of when the request in flight ends, from the recent
        /// durations of the layer's requests (with no history, or past that estimate, the
        /// original's age), bounded by the time left on its lease.
        retry_after: Duration,
    },
    /// The key was used with another request (method, path, query or body): 422.
    Mismatch,
    /// An earlier attempt under this key lost the answer of its side effect (its upstream
    /// timed out after the request was sent, or broke off): nobody knows whether the effect
    /// happened, so the request is not run again until the outcome is resolved (reconciled,
    /// by an operator, or when the hold ends): 409 with `Retry-After`. 409, not a 5xx: the
    /// request conflicts with the state of its key, as a duplicate in flight does, and a
    /// client that retries it is safe (nothing runs twice); a 5xx would tell a proxy or a
    /// client library that the server failed and may hide the answer.
    OutcomeUnknown {
        /// The record's key.
        key: idem_core::RecordKey,
        /// The fence of the attempt that lost its answer (what a resolution names).
        fence: idem_core::Fence,
        /// What that attempt knew.
        reason: String,
        /// When to come back: the time left on the hold, at most a minute (60 s when the key
        /// is held until resolved).
        retry_after: Duration,
    },
    /// The method is a covered method spelled in another case (`post`, `Post` where `POST` is
    /// covered): 400. Methods are case-sensitive (RFC 9110 section 9.1), so such a request is
    /// not the covered method, but an upstream that folds the case would run it as one,
    /// unprotected; it is refused instead, as nginx refuses a lowercase method.
    MethodCase {
        /// The method as the request spelled it.
        method: http::Method,
    },
    /// The operation under this key failed permanently (a record written by a worker): 409.
    FailedPermanently,
    /// The store cannot be reached: 503 with `Retry-After`. The handler did not run.
    StoreUnavailable {
        /// When to try again.
        retry_after: Duration,
    },
    /// The stored response cannot be decoded: 500.
    CorruptRecord,
    /// The handler panicked or its task was cancelled before it answered: 500. Its claim was
    /// released, so a retry runs it again.
    HandlerFailed,
    /// The handler answered, but its response body failed before the layer had read it whole
    /// to store it: 500 (a proxy in front of an upstream, like the `idem` gateway, answers it
    /// as 502). Nothing was stored and the claim was released, so a retry runs it again.
    ResponseBodyFailed,
}

impl Rejection {
    /// The status of the response.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::InvalidKey { .. }
            | Rejection::MissingKey { .. }
            | Rejection::InvalidScope
            | Rejection::MethodCase { .. }
            | Rejection::BodyUnreadable => StatusCode::BAD_REQUEST,
            Rejection::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Rejection::InFlight { .. }
            | Rejection::FailedPermanently
            | Rejection::OutcomeUnknown { .. } => StatusCode::CONFLICT,
            Rejection::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::CorruptRecord | Rejection::HandlerFailed | Rejection::ResponseBodyFailed => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// A stable name of the rejection (the anchor of its `type` URL).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::InvalidKey { .. } => "InvalidKey",
            Rejection::MissingKey { .. } => "MissingKey",
            Rejection::InvalidScope => "InvalidScope",
            Rejection::BodyTooLarge { .. } => "BodyTooLarge",
            Rejection::BodyUnreadable => "BodyUnreadable",
            Rejection::BodyTimeout { .. } => "BodyTimeout",
            Rejection::InFlight { .. } => "InFlight",
            Rejection::Mismatch => "Mismatch",
            Rejection::MethodCase { .. } => "MethodCase",
            Rejection::OutcomeUnknown { .. } => "OutcomeUnknown",
            Rejection::FailedPermanently => "FailedPermanently",
            Rejection::StoreUnavailable { .. } => "StoreUnavailable",
            Rejection::CorruptRecord => "CorruptRecord",
            Rejection::HandlerFailed => "HandlerFailed",
            Rejection::ResponseBodyFailed => "ResponseBodyFailed",
        }
    }

    /// A short summary that does not change between occurrences.
    #[must_use]
    pub fn title(&self) -> &'static str {
        match self {
            Rejection::InvalidKey { .. } => "Invalid idempotency key",
            Rejection::MissingKey { .. } => "Idempotency key required",
            Rejection::InvalidScope => "Invalid scope",
            Rejection::BodyTooLarge { .. } => "Request body too large",
            Rejection::BodyUnreadable => "Request body unreadable",
            Rejection::BodyTimeout { .. } => "Request body too slow",
            Rejection::InFlight { .. } => "Request with this key in progress",
            Rejection::Mismatch => "Idempotency key reused with another request",
            Rejection::MethodCase { .. } => "Method in another case",
            Rejection::OutcomeUnknown { .. } => "Outcome unknown",
            Rejection::FailedPermanently => "Operation failed permanently",
            Rejection::StoreUnavailable { .. } => "Idempotency store unavailable",
            Rejection::CorruptRecord => "Stored response unreadable",
            Rejection::HandlerFailed => "Handler failed",
            Rejection::ResponseBodyFailed => "Response body failed",
        }
    }

    /// What happened in this occurrence, for a person.
    #[must_use]
    pub fn detail(&self) -> String {
        match self {
            Rejection::InvalidKey { header, error } => {
                format!("{}: {error}", spelled(header))
            }
            Rejection::MissingKey { header } => {
                format!("this endpoint requires the {} header", spelled(header))
            }
            Rejection::InvalidScope => {
                "the scope of this request could not be read: a scope header (Authorization, \
                 or a configured tenant or API-key header) was sent more than once, a tenant \
                 header is not 0 to 255 bytes of printable ASCII, or the scope function refused \
                 the request"
                    .into()
            }
            Rejection::BodyTooLarge { limit } => {
                format!("the request body is over the limit of {limit} bytes")
            }
            Rejection::BodyUnreadable => "the request body could not be read".into(),
            Rejection::BodyTimeout { timeout } => format!(
                "the request body was not received within {} ms: nothing was processed, and the \
                 request may be sent again",
                timeout.as_millis()
            ),
            Rejection::InFlight { .. } => {
                "a request with this key is being processed: retry after the delay in Retry-After"
                    .into()
            }
            Rejection::Mismatch => {
                "this key was used with another method, path, query or body: use a new key".into()
            }
            Rejection::FailedPermanently => {
                "the operation under this key failed permanently: use a new key".into()
            }
            Rejection::OutcomeUnknown { reason, .. } => format!(
                "outcome-unknown: an earlier request with this key may have taken effect, but its \
                 answer was lost ({reason}); it is not run again. Retry after the delay in \
                 Retry-After to get its answer once it is known, or ask the service whether it \
                 took effect"
            ),
            Rejection::MethodCase { method } => format!(
                "the method {method} is {} in another case: methods are case-sensitive, send it \
                 in upper case",
                method.as_str().to_ascii_uppercase()
            ),
            Rejection::StoreUnavailable { .. } => {
                "the request was not processed: retry after the delay in Retry-After".into()
            }
            Rejection::CorruptRecord => "the stored response for this key cannot be read".into(),
            Rejection::HandlerFailed => {
                "the request failed before it was answered: it may be retried with the same key"
                    .into()
            }
            Rejection::ResponseBodyFailed => {
                "the response broke off before it was complete: nothing was stored, and the \
                 request may be retried with the same key"
                    .into()
            }
        }
    }

    /// The delay for a `Retry-After` header, if this rejection asks for one. The layer adds the
    /// header (in whole seconds, at least 1) when the response has none.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::InFlight { retry_after }
            | Rejection::StoreUnavailable { retry_after }
            | Rejection::OutcomeUnknown { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The [`Outcome`] a response with this rejection carries (`store_error` instead for the
    /// [`Rejection::HandlerFailed`] of a request run unrecorded, fail open).
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        match self {
            Rejection::InvalidKey { .. }
            | Rejection::MissingKey { .. }
            | Rejection::InvalidScope
            | Rejection::MethodCase { .. }
            | Rejection::BodyTooLarge { .. }
            | Rejection::BodyUnreadable
            | Rejection::BodyTimeout { .. } => Outcome::Rejected,
            Rejection::InFlight { .. }
            | Rejection::FailedPermanently
            | Rejection::OutcomeUnknown { .. } => Outcome::Conflict,
            Rejection::Mismatch => Outcome::Mismatch,
            Rejection::StoreUnavailable { .. } | Rejection::CorruptRecord => Outcome::StoreError,
            Rejection::HandlerFailed | Rejection::ResponseBodyFailed => Outcome::Executed,
        }
    }
}

/// A header name as people write it: each word capitalised (`idempotency-key` is
/// `Idempotency-Key`).
fn spelled(name: &HeaderName) -> String {
    let mut spelled = String::with_capacity(name.as_str().len());
    let mut word_start = true;
    for c in name.as_str().chars() {
        spelled.push(if word_start {
            c.to_ascii_uppercase()
        } else {
            c
        });
        word_start = c == '-';
    }
    spelled
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.title(), self.detail())
    }
}

/// Turns a [`Rejection`] into a response. [`ProblemJson`] is the default; any
/// `Fn(&Rejection) -> Response<Bytes>` closure is one too.
pub trait RejectionHandler: Send + Sync + 'static {
    /// The response for `rejection`.
    fn respond(&self, rejection: &Rejection) -> Response<Bytes>;
}

impl<F> RejectionHandler for F
where
    F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
{
    fn respond(&self, rejection: &Rejection) -> Response<Bytes> {
        self(rejection)
    }
}

/// The default [`RejectionHandler`]: RFC 9457 `application/problem+json` with `type` (a link to
/// the documentation of the rejection), `title`, `status` and `detail`.
#[derive(Clone, Debug)]
pub struct ProblemJson {
    type_base: String,
}

impl Default for ProblemJson {
    /// `type` links point to this crate's documentation on docs.rs.
    fn default() -> Self {
        ProblemJson {
            type_base:
                "https://docs.rs/idem-http/latest/idem_http/rejection/enum.Rejection.html#variant."
                    .to_owned(),
        }
    }
}

impl ProblemJson {
    /// `type` links are `type_base` followed by the rejection's [`Rejection::name`].
    #[must_use]
    pub fn with_type_base(type_base: impl Into<String>) -> Self {
        ProblemJson {
            type_base: type_base.into(),
        }
    }
}

impl RejectionHandler for ProblemJson {
    fn respond(&self, rejection: &Rejection) -> Response<Bytes> {
        Problem {
            type_uri: format!("{}{}", self.type_base, rejection.name()),
            title: rejection.title().to_owned(),
            status: rejection.status(),
            detail: rejection.detail(),
        }
        .into_response()
    }
}

/// An RFC 9457 problem details object: the one writer of `application/problem+json` for
/// [`ProblemJson`] and for a program that answers problems of its own (the `idem` gateway's
/// 502, 503 and 504), with `type`, `title`, `status` and `detail` in that order.
///
/// ```
/// use http::StatusCode;
/// use idem_http::rejection::Problem;
///
/// let response = Problem {
///     type_uri: "about:blank".into(),
///     title: "Bad Gateway".into(),
///     status: StatusCode::BAD_GATEWAY,
///     detail: "the upstream broke off".into(),
/// }
/// .into_response();
/// assert_eq!(response.status(), 502);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(response.body().starts_with(br#"{"type":"about:blank","title":"Bad Gateway","status":502,"#));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `type`: a URI naming the kind of problem (`about:blank` for none but the status).
    pub type_uri: String,
    /// `title`: a short summary that does not change between occurrences.
    pub title: String,
    /// `status`, also the response's status.
    pub status: StatusCode,
    /// `detail`: what happened in this occurrence, for a person.
    pub detail: String,
}

/// The JSON form of a [`Problem`], fields in the order RFC 9457 lists them.
#[derive(serde::Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    type_uri: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

impl Problem {
    /// The JSON object.
    #[must_use]
    pub fn to_json(&self) -> String {
        let body = ProblemBody {
            type_uri: &self.type_uri,
            title: &self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
        };
        // Strings and a number always serialize.
        serde_json::to_string(&body).unwrap_or_default()
    }

    /// The response: the status, `Content-Type: application/problem+json` and the JSON object.
    #[must_use]
    pub fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from(self.to_json()));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub(crate) fn retry_after_secs(delay: Duration) -> u64 {
    let secs = delay
        .as_secs()
        .saturating_add(u64::from(delay.subsec_nanos() > 0));
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn problem_json_escapes_and_names_the_type() {
        let response =
            ProblemJson::with_type_base("https://example.com/#").respond(&Rejection::InvalidKey {
                header: HeaderName::from_static("idempotency-key"),
                error: KeyHeaderError::Malformed { reason: "a \"q\"" },
            });
        let body = std::str::from_utf8(response.body()).unwrap();
        assert!(
            body.starts_with(r#"{"type":"https://example.com/#InvalidKey","#),
            "{body}"
        );
        assert!(body.contains(r#"a \"q\""#), "{body}");
        assert!(body.contains("Idempotency-Key: malformed key"), "{body}");
    }

    #[test]
    fn key_rejections_name_the_configured_header() {
        let header = HeaderName::from_static("x-request-id");
        let missing = Rejection::MissingKey {
            header: header.clone(),
        };
        assert_eq!(
            missing.detail(),
            "this endpoint requires the X-Request-Id header"
        );
        let invalid = Rejection::InvalidKey {
            header,
            error: KeyHeaderError::Empty,
        };
        assert!(invalid.detail().starts_with("X-Request-Id: "), "{invalid}");
        assert!(!missing.title().contains("Idempotency-Key"));
    }
}
