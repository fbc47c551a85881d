//! [`Outcome`]: what the layer did with a request, put in the response extensions.

use std::fmt;

/// What the layer did with one request. Every response that leaves the layer carries one in its
/// extensions, for metrics and logs of outer layers:
///
/// ```
/// use idem_http::Outcome;
///
/// let response = http::Response::new(());
/// let outcome = response.extensions().get::<Outcome>().copied();
/// assert_eq!(outcome, None); // a response that did not pass the layer
/// assert_eq!(Outcome::Replayed.as_str(), "replayed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran for this request (its response may or may not have been stored).
    Executed,
    /// The stored response of an earlier request was replayed.
    Replayed,
    /// Another request with the key is in flight: 409.
    Conflict,
    /// The key was used with another request: 422.
    Mismatch,
    /// The request was refused before anything ran: an invalid or missing key, a body over the
    /// limit (400, 413).
    Rejected,
    /// The layer let the request through untouched: a method it does not cover, or no key where
    /// the key is optional.
    Bypassed,
    /// The store failed: 503 (fail closed), or the handler ran unrecorded (fail open).
    StoreError,
}

impl Outcome {
    /// Every outcome, in the order of the variants: the `outcome` labels of
    /// `idem_http_requests_total`.
    pub const ALL: [Outcome; 7] = [
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::Rejected,
        Outcome::Bypassed,
        Outcome::StoreError,
    ];

    /// A short, stable name for metrics labels and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Rejected => "rejected",
            Outcome::Bypassed => "bypassed",
            Outcome::StoreError => "store_error",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_names_every_outcome_once() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "executed",
                "replayed",
                "conflict",
                "mismatch",
                "rejected",
                "bypassed",
                "store_error"
            ]
        );
    }
}
