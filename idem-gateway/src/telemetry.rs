//! Logs: tracing to stderr, as text or JSON lines, filtered by `RUST_LOG` or `[log] level`.
//! Metrics: [`register_metrics`] describes every series the gateway exports and sets each at
//! zero, so a scrape shows them all from the start.

use idem_http::Outcome;
use idem_http::metrics as layer;
use tracing_subscriber::EnvFilter;

use crate::admin::monitor;
use crate::config::LogConfig;
use crate::config::toml::LogFormat;
use crate::gateway::metric as gateway;

/// Installs the log subscriber (once per process; later calls do nothing).
pub fn init_logs(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Describes the metrics of DESIGN.md section 8 that the gateway exports (the layer's and its
/// own) and registers every series it knows the labels of at zero, on the store labelled
/// `store`: Prometheus' advice for a series that may stay at zero, so that dashboards, alerts
/// (`rate()`, `increase()`) and a reader of `/metrics` find `idem_lease_takeovers_total` before
/// the first takeover. Without an installed recorder this does nothing; registering twice is
/// harmless.
pub fn register_metrics(store: &'static str) {
    use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram};

    describe_counter!(
        layer::REQUESTS,
        "Requests through the idempotency layer, by outcome"
    );
    for outcome in Outcome::ALL {
        let _ = counter!(layer::REQUESTS, "outcome" => outcome.as_str());
    }
    for (name, help) in [
        (
            layer::CLAIMS_ACQUIRED,
            "Claims acquired: the upstream was called under a key",
        ),
        (
            layer::REPLAYS,
            "Duplicates answered from a completed record",
        ),
        (
            layer::COLLISIONS,
            "Duplicates that met a record still in flight (409, or a wait)",
        ),
        (
            layer::MISMATCHES,
            "Keys reused with another method, path, query or body (422)",
        ),
        (
            layer::TAKEOVERS,
            "Claims that took over a lapsed lease (a crashed holder)",
        ),
        (
            layer::OMITTED,
            "Responses stored without their body (over the storage cap)",
        ),
    ] {
        describe_counter!(name, help);
        let _ = counter!(name);
    }
    let _ = counter!(layer::LEASE_LOSSES);
    describe_counter!(
        layer::FAILURES,
        "Claims released without a stored response, by kind"
    );
    for kind in layer::FAILURE_KINDS {
        let _ = counter!(layer::FAILURES, "kind" => kind);
    }
    // The store metrics and the lease losses describe themselves (idem-lease, which meters
    // the layer's store and keeps its leases).
    idem_lease::register_at_zero(store, &layer::STORE_OPS);

    describe_counter!(
        gateway::REQUESTS,
        "Requests answered by the gateway, by route and status class"
    );
    describe_histogram!(
        gateway::DURATION,
        Unit::Seconds,
        "Time to the response head, by route"
    );
    describe_counter!(
        gateway::UPSTREAM_ERRORS,
        "Upstream exchanges that gave no response, by kind"
    );
    describe_counter!(
        gateway::REFUSED,
        "Requests the gateway refused before any route (no route's counters see them), by reason"
    );
    if store == crate::config::StoreSpec::Memory.kind() {
        describe_counter!(
            idem_store_memory::EVICTIONS,
            "Records the memory store evicted before their retention, by the bound it kept"
        );
        for bound in idem_store_memory::EVICTION_BOUNDS {
            let _ = counter!(idem_store_memory::EVICTIONS, "bound" => bound);
        }
    }
    for (name, help) in [
        (monitor::IN_FLIGHT, "Records in flight in the store"),
        (
            monitor::IN_FLIGHT_LAPSED,
            "Records in flight whose lease lapsed (a crashed holder, not yet taken over)",
        ),
        (
            monitor::OLDEST_IN_FLIGHT,
            "Age of the oldest record in flight, in seconds",
        ),
        (
            monitor::STORE_RECORDS,
            "Records the store holds (where it knows at once)",
        ),
        (
            monitor::STORE_BYTES,
            "Bytes the store's records hold, as counted against its byte budget",
        ),
    ] {
        describe_gauge!(name, help);
    }
}
