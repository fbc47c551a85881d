//! The metric names of the layer (DESIGN.md section 8), emitted through the `metrics` facade.
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

use std::future::Future;
use std::time::Instant;

use idem_core::StoreError;
pub use idem_core::metrics::{
    CLAIMS_ACQUIRED, COLLISIONS, FAILURES, LEASE_LOSSES, MISMATCHES, REPLAYS, STORE_ERRORS,
    STORE_SECONDS, TAKEOVERS,
};

use crate::outcome::Outcome;

/// Requests by outcome.
pub const REQUESTS: &str = "idem_http_requests_total";
/// Responses stored without their body (over the storage cap).
pub const OMITTED: &str = "idem_responses_omitted_total";

pub(crate) fn request(outcome: Outcome) {
    metrics::counter!(REQUESTS, "outcome" => outcome.as_str()).increment(1);
}

pub(crate) fn count(name: &'static str) {
    metrics::counter!(name).increment(1);
}

pub(crate) fn failure(kind: &'static str) {
    metrics::counter!(FAILURES, "kind" => kind).increment(1);
}

/// Runs one store operation, timing it and counting its errors.
pub(crate) async fn store_op<T>(
    store: &'static str,
    op: &'static str,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let start = Instant::now();
    let result = fut.await;
    metrics::histogram!(STORE_SECONDS, "store" => store, "op" => op)
        .record(start.elapsed().as_secs_f64());
    if let Err(error) = &result {
        metrics::counter!(STORE_ERRORS, "store" => store, "op" => op, "kind" => error.kind())
            .increment(1);
    }
    result
}
