//! The metric names of the layer, emitted through the `metrics` facade.
//! The application installs an exporter; without one, these cost next to nothing.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `idem_http_requests_total` | counter | `outcome` (see [`crate::Outcome`]) |
//! | `idem_claims_acquired_total` | counter | |
//! | `idem_duplicates_replayed_total` | counter | |
//! | `idem_in_flight_collisions_total` | counter | |
//! | `idem_mismatches_total` | counter | |
//! | `idem_failures_total` | counter | `kind`: `handler_error`, `panic`, `status` (a released 408/425/429/5xx), `body_error` |
//! | `idem_lease_takeovers_total` | counter | |
//! | `idem_lease_losses_total` | counter | |
//! | `idem_store_operation_seconds` | histogram | `store`, `op` |
//! | `idem_store_errors_total` | counter | `store`, `op`, `kind` |
//! | `idem_responses_omitted_total` | counter | |
//!
//! The store metrics come from the layer's store wrapped in idem-lease's
//! [`Metered`](idem_lease::Metered), and the lease losses from its
//! [`LeaseKeeper`](idem_lease::LeaseKeeper): the job guard reports both with the same labels.

use http::Response;
pub use idem_core::metrics::{
    CLAIMS_ACQUIRED, COLLISIONS, FAILURES, LEASE_LOSSES, MISMATCHES, REPLAYS, STORE_ERRORS,
    STORE_SECONDS, TAKEOVERS,
};
use idem_lease::{BoundCounter, StoreOp};
use metrics::{Key, Level, Metadata};

use crate::outcome::Outcome;

/// Requests by outcome.
pub const REQUESTS: &str = "idem_http_requests_total";
/// Responses stored without their body (over the storage cap).
pub const OMITTED: &str = "idem_responses_omitted_total";

/// The `kind` labels of `idem_failures_total` the layer counts: a handler that returned an
/// error, panicked, answered a status that releases the key, or broke off its response body.
pub const FAILURE_KINDS: [&str; 4] = ["handler_error", "panic", "status", "body_error"];

/// The `op` labels of the store metrics the layer records (`idem_store_operation_seconds`,
/// `idem_store_errors_total`).
pub const STORE_OPS: [StoreOp; 4] = [
    StoreOp::Claim,
    StoreOp::Heartbeat,
    StoreOp::Complete,
    StoreOp::Release,
];

/// The help texts of the layer's counters without labels.
const COUNTER_HELP: [(&str, &str); 6] = [
    (
        CLAIMS_ACQUIRED,
        "Claims acquired: the handler ran under a key",
    ),
    (REPLAYS, "Duplicates answered from a completed record"),
    (
        COLLISIONS,
        "Duplicates that met a record still in flight (409, or a wait)",
    ),
    (
        MISMATCHES,
        "Keys reused with another method, path, query or body (422)",
    ),
    (
        TAKEOVERS,
        "Claims that took over a lapsed lease (a crashed holder)",
    ),
    (
        OMITTED,
        "Responses stored without their body (over the storage cap)",
    ),
];

/// Registers the help texts of the layer's metrics with the installed `metrics` recorder
/// (a Prometheus exporter prints them as `# HELP`). The store metrics and the lease losses are
/// described by idem-lease ([`register_at_zero`] does that too).
pub fn describe() {
    metrics::describe_counter!(
        REQUESTS,
        "Requests through the idempotency layer, by outcome"
    );
    for (name, help) in COUNTER_HELP {
        metrics::describe_counter!(name, help);
    }
    metrics::describe_counter!(
        FAILURES,
        "Claims released without a stored response, by kind"
    );
}

/// Registers every series of the layer at zero (the store metrics labelled `store`), so that a
/// dashboard and an alert see them before the first request: each outcome, each counter, each
/// failure kind, the lease losses and the store metrics of [`STORE_OPS`].
pub fn register_at_zero(store: &'static str) {
    for outcome in Outcome::ALL {
        let _ = metrics::counter!(REQUESTS, "outcome" => outcome.as_str());
    }
    for (name, _) in COUNTER_HELP {
        let _ = metrics::counter!(name);
    }
    let _ = metrics::counter!(LEASE_LOSSES);
    for kind in FAILURE_KINDS {
        let _ = metrics::counter!(FAILURES, "kind" => kind);
    }
    idem_lease::register_at_zero(store, &STORE_OPS);
}

/// What the layer's metrics say of themselves to the recorder (as `metrics::counter!` would).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A metric key built at compile time: using it allocates nothing and hashes nothing (the
/// `metrics` macros build and hash a key on every call when its name is a constant or a label
/// is not a literal).
macro_rules! key {
    ($name:expr) => {{
        static KEY: ::metrics::Key = ::metrics::Key::from_static_name($name);
        &KEY
    }};
    ($name:expr, $label:literal => $value:literal) => {{
        static LABELS: [::metrics::Label; 1] =
            [::metrics::Label::from_static_parts($label, $value)];
        static KEY: ::metrics::Key = ::metrics::Key::from_static_parts($name, &LABELS);
        &KEY
    }};
}
pub(crate) use key;

/// Adds one to the counter `key`.
pub(crate) fn increment(key: &Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
}

/// The key of the request counter for `outcome`.
fn request_key(outcome: Outcome) -> &'static Key {
    match outcome {
        Outcome::Executed => key!(REQUESTS, "outcome" => "executed"),
        Outcome::Replayed => key!(REQUESTS, "outcome" => "replayed"),
        Outcome::Conflict => key!(REQUESTS, "outcome" => "conflict"),
        Outcome::Mismatch => key!(REQUESTS, "outcome" => "mismatch"),
        Outcome::Rejected => key!(REQUESTS, "outcome" => "rejected"),
        Outcome::Bypassed => key!(REQUESTS, "outcome" => "bypassed"),
        Outcome::StoreError => key!(REQUESTS, "outcome" => "store_error"),
    }
}

/// The counters a layer bumps on every request, each with its handle in the recorder in use
/// (idem-lease's [`BoundCounter`]): one layer's, so a test's local recorder sees its own.
#[derive(Debug)]
pub(crate) struct LayerMetrics {
    /// `idem_http_requests_total` by outcome, in the order of [`Outcome::ALL`].
    requests: [BoundCounter; Outcome::ALL.len()],
    pub(crate) claims_acquired: BoundCounter,
    pub(crate) replays: BoundCounter,
    pub(crate) collisions: BoundCounter,
    pub(crate) mismatches: BoundCounter,
}

impl LayerMetrics {
    pub(crate) fn new() -> Self {
        let bound = |key: &Key| BoundCounter::new(key.clone());
        LayerMetrics {
            requests: Outcome::ALL.map(|outcome| bound(request_key(outcome))),
            claims_acquired: bound(key!(CLAIMS_ACQUIRED)),
            replays: bound(key!(REPLAYS)),
            collisions: bound(key!(COLLISIONS)),
            mismatches: bound(key!(MISMATCHES)),
        }
    }

    /// Counts a response by its outcome on its way out.
    pub(crate) fn counted<B>(&self, response: Response<B>) -> Response<B> {
        if let Some(outcome) = response.extensions().get::<Outcome>() {
            self.request(*outcome);
        }
        response
    }

    pub(crate) fn request(&self, outcome: Outcome) {
        self.requests[outcome as usize].increment(1);
    }
}

pub(crate) fn failure(kind: &'static str) {
    metrics::counter!(FAILURES, "kind" => kind).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_counts_under_its_own_label() {
        let metrics = LayerMetrics::new();
        for (at, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(
                outcome as usize, at,
                "Outcome::ALL is in the order of the variants"
            );
            let key = metrics.requests[outcome as usize].key();
            assert_eq!(key.name(), REQUESTS);
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert_eq!(labels, [("outcome", outcome.as_str())]);
        }
    }
}
