//! What the admin listener measures beyond the request path: the in-flight records of the
//! store (how many, how many whose lease lapsed with no retry to take them over, the age of the
//! oldest) and, where the store knows them at once, its records and bytes, exported as gauges
//! when `/metrics` is scraped, and the rates of the main counters over the last minute, read
//! back from the Prometheus text the recorder renders.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::{
    Clock, Record, ScanPage, ScanQuery, State, Store, StoreError, StoreStats, SystemClock,
};

use super::RenderMetrics;

/// In-flight records, gauge, updated from a scan of the store when `/metrics` is scraped.
pub const IN_FLIGHT: &str = "idem_gateway_in_flight_records";
/// In-flight records whose lease has lapsed (the holder crashed and no retry has come to take
/// the key over), gauge. Such a record stays visible for one more lease, then expires.
pub const IN_FLIGHT_LAPSED: &str = "idem_gateway_in_flight_lapsed_records";
/// The age of the oldest in-flight record, in seconds (0 when there is none), gauge.
pub const OLDEST_IN_FLIGHT: &str = "idem_gateway_oldest_in_flight_seconds";

/// The records the store holds, gauge, where it knows at once (the memory store).
pub const STORE_RECORDS: &str = "idem_gateway_store_records";
/// The bytes the store's records hold, as it counts them against its byte budget, gauge (the
/// memory store with `[store] memory_max_bytes`).
pub const STORE_BYTES: &str = "idem_gateway_store_bytes";

/// At most this many pages of in-flight records are read per scan (a page is 100 records).
pub const MAX_SCAN_PAGES: usize = 10;
/// A scan answered within this long is reused instead of scanning again (scrapes that come
/// together cost one scan).
const SCAN_CACHE: Duration = Duration::from_secs(5);
/// How long a scan may take before it is given up.
const SCAN_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the counters are sampled for the rates.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The window of the rates.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Reads about `limit` entries at most matching `query` (records, and records the store could
/// not read, which a page counts too), following the store's cursor; whether there were more.
///
/// # Errors
/// The store's error.
pub async fn scan_all(
    store: &dyn Store,
    mut query: ScanQuery,
    limit: usize,
) -> Result<(ScanPage, bool), StoreError> {
    let mut all = ScanPage::default();
    loop {
        let page = store.scan(&query).await?;
        all.records.extend(page.records);
        all.unreadable.extend(page.unreadable);
        match page.next_cursor {
            Some(cursor) if all.len() < limit => query.cursor = Some(cursor),
            Some(_) => return Ok((all, true)),
            None => return Ok((all, false)),
        }
    }
}

/// The in-flight records at one moment.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    /// The records, oldest first.
    pub records: Vec<Record>,
    /// The records the scan met that the store could not read (their state unknown, so
    /// perhaps in flight): `idem keys list` names them.
    pub unreadable: usize,
    /// Whether there were more than the scan reads.
    pub truncated: bool,
    /// How many have a lapsed lease.
    pub lapsed: usize,
    /// The age of the oldest.
    pub oldest: Duration,
}

impl InFlight {
    /// Scans the in-flight records of `store` (at most [`MAX_SCAN_PAGES`] pages).
    ///
    /// # Errors
    /// The store's error.
    pub async fn scan(store: &dyn Store) -> Result<InFlight, StoreError> {
        let query = ScanQuery::all().with_state(State::InFlight);
        let (page, truncated) =
            scan_all(store, query, MAX_SCAN_PAGES * ScanQuery::DEFAULT_LIMIT).await?;
        let (mut records, unreadable) = (page.records, page.unreadable.len());
        let now = SystemClock.now();
        records.sort_by_key(|record| record.created_at);
        let lapsed = records.iter().filter(|r| r.lease_until < now).count();
        let oldest = records.first().map(|r| r.age(now)).unwrap_or_default();
        Ok(InFlight {
            records,
            unreadable,
            truncated,
            lapsed,
            oldest,
        })
    }

    fn export(&self) {
        #[allow(clippy::cast_precision_loss)]
        {
            metrics::gauge!(IN_FLIGHT).set(self.records.len() as f64);
            metrics::gauge!(IN_FLIGHT_LAPSED).set(self.lapsed as f64);
        }
        metrics::gauge!(OLDEST_IN_FLIGHT).set(self.oldest.as_secs_f64());
    }
}

/// Sets the gauges of what the store holds.
#[allow(clippy::cast_precision_loss)]
fn export_stats(stats: StoreStats) {
    metrics::gauge!(STORE_RECORDS).set(stats.records as f64);
    if let Some(bytes) = stats.bytes {
        metrics::gauge!(STORE_BYTES).set(bytes as f64);
    }
}

/// The counters shown with their rates, by label and metric name (summed over their labels).
pub const COUNTERS: [(&str, &str); 7] = [
    ("requests answered", idem_http::metrics::REQUESTS),
    ("duplicates replayed", idem_http::metrics::REPLAYS),
    ("in-flight conflicts (409)", idem_http::metrics::COLLISIONS),
    ("mismatches (422)", idem_http::metrics::MISMATCHES),
    ("lease takeovers", idem_http::metrics::TAKEOVERS),
    ("lease losses", idem_http::metrics::LEASE_LOSSES),
    ("store errors", idem_http::metrics::STORE_ERRORS),
];

/// The sum over every label set of `name` in Prometheus text.
#[must_use]
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, |sum, value| sum + value)
}

/// One counter: its value now and its rate per second over the window.
#[derive(Clone, Debug)]
pub struct Rate {
    /// The label shown.
    pub label: &'static str,
    /// The metric name.
    pub metric: &'static str,
    /// The value since the process started.
    pub total: f64,
    /// Per second over `window` (`None` before a second sample).
    pub per_second: Option<f64>,
}

/// The counters' rates and the span they were measured over.
#[derive(Clone, Debug)]
pub struct Rates {
    /// One per entry of [`COUNTERS`].
    pub counters: Vec<Rate>,
    /// The span between the samples compared.
    pub window: Duration,
}

type Sample = (Instant, [f64; COUNTERS.len()]);

/// What the admin listener measures; shared by its connections.
#[derive(Debug)]
pub struct Monitor {
    samples: Mutex<VecDeque<Sample>>,
    scanned: tokio::sync::Mutex<Option<(Instant, Arc<InFlight>)>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new()
    }
}

impl Monitor {
    /// Nothing measured yet.
    #[must_use]
    pub fn new() -> Self {
        Monitor {
            samples: Mutex::new(VecDeque::new()),
            scanned: tokio::sync::Mutex::new(None),
        }
    }

    /// Sets the store's own gauges, then scans the in-flight records (or reuses a scan of the
    /// last 5 s) and sets theirs. A scan that fails or takes over 2 s leaves them as they were.
    pub async fn refresh_gauges(&self, store: &dyn Store) {
        if let Some(stats) = store.stats() {
            export_stats(stats);
        }
        let mut scanned = self.scanned.lock().await;
        if scanned
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < SCAN_CACHE)
        {
            return;
        }
        match tokio::time::timeout(SCAN_TIMEOUT, InFlight::scan(store)).await {
            Ok(Ok(in_flight)) => {
                in_flight.export();
                *scanned = Some((Instant::now(), Arc::new(in_flight)));
            }
            Ok(Err(err)) => tracing::warn!(error = %err, "admin: the in-flight scan failed"),
            Err(_) => tracing::warn!("admin: the in-flight scan took over {SCAN_TIMEOUT:?}"),
        }
    }

    /// Records the counters' values now.
    pub fn sample(&self, render: &RenderMetrics) {
        let text = render();
        let values = COUNTERS.map(|(_, name)| sum(&text, name));
        let now = Instant::now();
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back((now, values));
        while samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW + SAMPLE_EVERY * 2)
        {
            samples.pop_front();
        }
    }

    /// The counters now, with their rates over the last minute (or what has been sampled).
    #[must_use]
    pub fn rates(&self, render: &RenderMetrics) -> Rates {
        self.sample(render);
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(&(now, latest)) = samples.back() else {
            return Rates {
                counters: Vec::new(),
                window: Duration::ZERO,
            };
        };
        let base = samples
            .iter()
            .find(|(at, _)| now.duration_since(*at) <= RATE_WINDOW)
            .filter(|(at, _)| now.duration_since(*at) >= Duration::from_secs(1));
        let window = base.map_or(Duration::ZERO, |(at, _)| now.duration_since(*at));
        let counters = COUNTERS
            .iter()
            .enumerate()
            .map(|(i, (label, metric))| Rate {
                label,
                metric,
                total: latest[i],
                per_second: base.map(|(_, then)| (latest[i] - then[i]) / window.as_secs_f64()),
            })
            .collect();
        Rates { counters, window }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_counter_over_its_labels() {
        let text = "# TYPE idem_http_requests_total counter\n\
            idem_http_requests_total{outcome=\"executed\"} 3\n\
            idem_http_requests_total{outcome=\"a b\"} 2\n\
            idem_http_requests_total_other 100\n\
            idem_mismatches_total 1\n";
        assert!((sum(text, "idem_http_requests_total") - 5.0).abs() < f64::EPSILON);
        assert!((sum(text, "idem_mismatches_total") - 1.0).abs() < f64::EPSILON);
        assert!(sum(text, "idem_lease_takeovers_total").abs() < f64::EPSILON);
    }
}
