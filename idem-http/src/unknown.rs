//! [`OutcomeUnknown`]: how a handler tells the layer that the outcome of its request is not
//! known (it sent its side effect, a payment provider's call say, and lost the answer), so the
//! key is held as unknown instead of being released for a retry to run the effect again.
//!
//! ```
//! use idem_http::OutcomeUnknown;
//!
//! let mut response = http::Response::new(());
//! *response.status_mut() = http::StatusCode::GATEWAY_TIMEOUT;
//! response
//!     .extensions_mut()
//!     .insert(OutcomeUnknown::new("the payment provider timed out"));
//! assert!(response.extensions().get::<OutcomeUnknown>().is_some());
//! ```

use idem_core::UnknownOutcome;

/// In a handler's response extensions: the handler does not know whether its side effect
/// happened. The layer settles the key as unknown (held for
/// [`ConfigBuilder::unknown_hold`](crate::ConfigBuilder::unknown_hold); a retry meanwhile is
/// answered [`Rejection::OutcomeUnknown`](crate::Rejection::OutcomeUnknown), never run) and
/// passes the response on to this caller, unstored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutcomeUnknown(pub UnknownOutcome);

impl OutcomeUnknown {
    /// An outcome lost for `reason` (the request counted as sent, no answer seen).
    #[must_use]
    pub fn new(reason: impl Into<String>) -> Self {
        OutcomeUnknown(UnknownOutcome::new(reason))
    }
}
