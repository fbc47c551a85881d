//! Logs: tracing to stderr, as text or JSON lines, filtered by `RUST_LOG` or `[log] level`.
//! Metrics: [`register_metrics`] describes every series the gateway exports and sets each at
//! zero, so a scrape shows them all from the start; [`install_prometheus`] installs the
//! recorder, behind a [`Tap`] that keeps the totals `/ui` shows rates of
//! ([`counter_totals`]), so the page reads numbers instead of parsing the Prometheus text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use idem_http::metrics as layer;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::admin::monitor;
use crate::config::LogConfig;
use crate::config::toml::LogFormat;
use crate::gateway::metric as gateway;

/// The buckets of every duration histogram, in seconds: 0.5 ms (a replay from memory) to 60 s
/// (the default upstream timeout).
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Installs the log subscriber (once per process; later calls do nothing).
pub(crate) fn init_logs(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr closed: `idem serve 2>&1 | head`) is
        // dropped; reporting it would write to the same closed stderr, and `eprintln!` panics.
        .log_internal_errors(false);
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Describes the metrics that the gateway exports (the layer's and its
/// own) and registers every series it knows the labels of at zero, on the store labelled
/// `store`: Prometheus' advice for a series that may stay at zero, so that dashboards, alerts
/// (`rate()`, `increase()`) and a reader of `/metrics` find `idem_lease_takeovers_total` before
/// the first takeover. Without an installed recorder this does nothing; registering twice is
/// harmless.
pub(crate) fn register_metrics(store: &'static str) {
    layer::describe();
    layer::register_at_zero(store);
    describe_gateway();
    if store == crate::config::StoreSpec::Memory.kind() {
        register_memory_store();
    }
    describe_monitor();
}

/// The help texts of the gateway's own metrics.
fn describe_gateway() {
    use metrics::{Unit, describe_counter, describe_histogram};
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
    describe_counter!(
        gateway::CLIENT_BODY_ERRORS,
        "Requests answered 400 because the client's body broke off while it was sent on"
    );
    describe_counter!(
        gateway::UNKNOWN_OUTCOMES,
        "Exchanges whose answer was lost after the upstream had the request (the key held as unknown), by route"
    );
    describe_counter!(
        crate::reconcile::RESOLUTIONS,
        "Unknown outcomes resolved, by way (reconcile, operator, a hold that lapsed)"
    );
}

/// The memory store's evictions, described and registered at zero for each bound.
fn register_memory_store() {
    metrics::describe_counter!(
        idem_store_memory::EVICTIONS,
        "Records the memory store evicted before their retention, by the bound it kept"
    );
    for bound in idem_store_memory::EVICTION_BOUNDS {
        let _ = metrics::counter!(idem_store_memory::EVICTIONS, "bound" => bound);
    }
}

/// The help texts of the gauges of the admin monitor.
fn describe_monitor() {
    for (name, help) in [
        (
            monitor::IN_FLIGHT,
            "Claims this gateway holds in flight (each gateway counts its own)",
        ),
        (
            monitor::IN_FLIGHT_LAPSED,
            "Claims this gateway holds whose lease lapsed (the store did not take its heartbeats or completion)",
        ),
        (
            monitor::OLDEST_IN_FLIGHT,
            "Age of this gateway's oldest claim in flight, in seconds",
        ),
        (
            monitor::STORE_RECORDS,
            "Records the store holds (where it knows at once)",
        ),
        (
            monitor::STORE_BYTES,
            "Bytes the store's records hold, as counted against its byte budget",
        ),
        (
            crate::unknowns::UNKNOWN_RECORDS,
            "Unknown outcomes this gateway has seen and not seen resolved, by route",
        ),
        (
            crate::unknowns::OLDEST_UNKNOWN,
            "Age of the oldest of them, in seconds, by route",
        ),
    ] {
        metrics::describe_gauge!(name, help);
    }
}

/// The totals of the counters of [`monitor::COUNTERS`], each summed over its labels, as the
/// [`Tap`] of this process counted them.
static TOTALS: [AtomicU64; monitor::COUNTERS.len()] =
    [const { AtomicU64::new(0) }; monitor::COUNTERS.len()];

/// Whether a [`Tap`] is this process's recorder (the totals are kept).
static TAPPED: AtomicBool = AtomicBool::new(false);

/// The totals of [`monitor::COUNTERS`] (in its order) since the [`Tap`] was installed, each
/// summed over its labels: what `/ui` computes its rates from.
#[must_use]
pub(crate) fn counter_totals() -> [f64; monitor::COUNTERS.len()] {
    #[allow(clippy::cast_precision_loss)]
    TOTALS
        .each_ref()
        .map(|total| total.load(Ordering::Relaxed) as f64)
}

/// Whether the counters' totals are kept: a [`Tap`] was installed as this process's recorder.
/// Without it (an embedder's own recorder) `/ui` says so instead of showing zeros.
#[must_use]
pub(crate) fn counters_tapped() -> bool {
    TAPPED.load(Ordering::Relaxed)
}

/// A recorder that forwards everything to `R` and, for the counters of
/// [`monitor::COUNTERS`], also adds each increment to a process-wide total
/// ([`counter_totals`]). Every other metric is `R`'s own handle, untouched.
#[derive(Debug)]
pub(crate) struct Tap<R> {
    inner: R,
}

impl<R: Recorder> Tap<R> {
    /// Wraps `inner`: the totals count what goes through it ([`install_prometheus`] installs
    /// one as the process's recorder).
    pub(crate) fn new(inner: R) -> Self {
        Tap { inner }
    }
}

/// A counter of `R` whose increments are also added to one of [`TOTALS`].
struct Teed {
    inner: Counter,
    total: &'static AtomicU64,
}

impl CounterFn for Teed {
    fn increment(&self, value: u64) {
        self.inner.increment(value);
        self.total.fetch_add(value, Ordering::Relaxed);
    }

    /// Sets the series; the total, a sum of increments over every series of the name, does
    /// not follow (no counter of [`monitor::COUNTERS`] is set this way).
    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
    }
}

impl<R: Recorder> Recorder for Tap<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let counter = self.inner.register_counter(key, metadata);
        match monitor::COUNTERS
            .iter()
            .position(|(_, name)| *name == key.name())
        {
            Some(i) => Counter::from_arc(Arc::new(Teed {
                inner: counter,
                total: &TOTALS[i],
            })),
            None => counter,
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

/// Installs the Prometheus recorder behind a tap (which keeps the totals `/ui` shows) as this
/// process's recorder, and returns the handle that renders it (`None` when a recorder is
/// installed already). The caller runs the handle's upkeep.
#[must_use]
pub fn install_prometheus() -> Option<PrometheusHandle> {
    // Buckets make every histogram a Prometheus histogram, which sums across gateways; the
    // exporter's default, a summary, has quantiles no query can combine.
    let recorder = PrometheusBuilder::new()
        .set_buckets(DURATION_BUCKETS)
        .ok()?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(Tap::new(recorder)).ok()?;
    TAPPED.store(true, Ordering::Relaxed);
    Some(handle)
}

#[cfg(test)]
mod tests {
    use idem_testkit::recorder::CountingRecorder;

    use super::*;

    #[test]
    fn the_tap_sums_the_counters_of_the_page_and_forwards_every_metric() {
        let tap = Tap::new(CountingRecorder::default());
        let before = counter_totals();
        metrics::with_local_recorder(&tap, || {
            metrics::counter!(layer::REQUESTS, "outcome" => "executed").increment(1);
            metrics::counter!(layer::REQUESTS, "outcome" => "replayed").increment(3);
            metrics::counter!(layer::REPLAYS).increment(2);
            metrics::counter!(layer::CLAIMS_ACQUIRED).increment(7);
            metrics::histogram!(layer::STORE_SECONDS).record(0.5);
        });
        let after = counter_totals();
        let added = |name: &str| {
            let i = monitor::COUNTERS
                .iter()
                .position(|(_, metric)| *metric == name)
                .unwrap_or_else(|| panic!("{name} is not on the page"));
            after[i] - before[i]
        };
        assert!((added(layer::REQUESTS) - 4.0).abs() < f64::EPSILON);
        assert!((added(layer::REPLAYS) - 2.0).abs() < f64::EPSILON);
        assert!(added(layer::MISMATCHES).abs() < f64::EPSILON);
        // The recorder behind it got every increment and value, as without the tap.
        assert_eq!(
            tap.inner.get("idem_http_requests_total{outcome=executed}"),
            1
        );
        assert_eq!(
            tap.inner.get("idem_http_requests_total{outcome=replayed}"),
            3
        );
        assert_eq!(tap.inner.get("idem_duplicates_replayed_total{}"), 2);
        assert_eq!(tap.inner.get("idem_claims_acquired_total{}"), 7);
        assert_eq!(tap.inner.get("idem_store_operation_seconds{}"), 1);
    }
}
