//! The names of the metrics that the HTTP layer and the job guard share,
//! defined once so both report into the same series. idem-core emits no metric itself.

/// Claims acquired (the handler or the job ran).
pub const CLAIMS_ACQUIRED: &str = "idem_claims_acquired_total";
/// Duplicates answered from a completed record.
pub const REPLAYS: &str = "idem_duplicates_replayed_total";
/// Duplicates that met an in-flight record.
pub const COLLISIONS: &str = "idem_in_flight_collisions_total";
/// Keys reused with another request or payload.
pub const MISMATCHES: &str = "idem_mismatches_total";
/// Failures, by kind.
pub const FAILURES: &str = "idem_failures_total";
/// Claims that took over a lapsed lease (a crashed holder).
pub const TAKEOVERS: &str = "idem_lease_takeovers_total";
/// Leases lost while the work ran (a heartbeat or a completion refused).
pub const LEASE_LOSSES: &str = "idem_lease_losses_total";
/// Store operation latency, by store and operation.
pub const STORE_SECONDS: &str = "idem_store_operation_seconds";
/// Store operation errors, by store, operation and kind.
pub const STORE_ERRORS: &str = "idem_store_errors_total";
