//! What the admin listener measures beyond the request path: the claims this gateway holds in
//! flight (how many, how many whose lease lapsed, the age of the oldest), read from the
//! [`InFlightIndex`] its store keeps as the claims happen, and, where the store knows them at
//! once, its records and bytes: exported as gauges when `/metrics` is scraped, without a scan
//! of the store. Also the rates of the main counters over the last minute, read from the totals
//! the metrics recorder keeps ([`crate::telemetry::install_prometheus`]).
//!
//! `/ui` still lists the in-flight records of the whole store ([`InFlight::scan`]) when an
//! operator opens it: that is a page asked for, not a scrape every few seconds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::{
    Clock, Record, ScanPage, ScanQuery, State, Store, StoreError, StoreStats, SystemClock,
};

use crate::in_flight::{InFlightCount, InFlightIndex};

/// The claims this gateway holds in flight, gauge (see [`crate::in_flight`] for what a
/// gateway among several reports).
pub(crate) const IN_FLIGHT: &str = "idem_gateway_in_flight_records";
/// Of this gateway's claims in flight, those whose lease has lapsed (its heartbeat or
/// settling got no answer from the store), gauge. Such a claim counts until another attempt
/// takes it over, or one more lease, when the store's record expires.
pub(crate) const IN_FLIGHT_LAPSED: &str = "idem_gateway_in_flight_lapsed_records";
/// The age of this gateway's oldest claim in flight, in seconds (0 when there is none), gauge.
pub(crate) const OLDEST_IN_FLIGHT: &str = "idem_gateway_oldest_in_flight_seconds";

/// The records the store holds, gauge, where it knows at once (the memory store).
pub(crate) const STORE_RECORDS: &str = "idem_gateway_store_records";
/// The bytes the store's records hold, as it counts them against its byte budget, gauge (the
/// memory store with `[store] memory_max_bytes`).
pub(crate) const STORE_BYTES: &str = "idem_gateway_store_bytes";

/// At most this many pages of in-flight records are read per scan of `/ui` (a page is 100
/// records).
pub(crate) const MAX_SCAN_PAGES: usize = 10;
/// How often the counters are sampled for the rates.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The window of the rates.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Reads about `limit` entries at most matching `query` (records, and records the store could
/// not read, which a page counts too), following the store's cursor; whether there were more.
///
/// # Errors
/// The store's error.
pub(crate) async fn scan_all(
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
pub(crate) struct InFlight {
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
    pub(crate) async fn scan(store: &dyn Store) -> Result<InFlight, StoreError> {
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
}

/// Sets the gauges of this gateway's claims in flight.
#[allow(clippy::cast_precision_loss)]
fn export_in_flight(count: InFlightCount) {
    metrics::gauge!(IN_FLIGHT).set(count.records as f64);
    metrics::gauge!(IN_FLIGHT_LAPSED).set(count.lapsed as f64);
    metrics::gauge!(OLDEST_IN_FLIGHT).set(count.oldest.as_secs_f64());
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
pub(crate) const COUNTERS: [(&str, &str); 7] = [
    ("requests answered", idem_http::metrics::REQUESTS),
    ("duplicates replayed", idem_http::metrics::REPLAYS),
    ("in-flight conflicts (409)", idem_http::metrics::COLLISIONS),
    ("mismatches (422)", idem_http::metrics::MISMATCHES),
    ("lease takeovers", idem_http::metrics::TAKEOVERS),
    ("lease losses", idem_http::metrics::LEASE_LOSSES),
    ("store errors", idem_http::metrics::STORE_ERRORS),
];

/// One counter: its value now and its rate per second over the window.
#[derive(Clone, Debug)]
pub(crate) struct Rate {
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
pub(crate) struct Rates {
    /// One per entry of [`COUNTERS`].
    pub counters: Vec<Rate>,
    /// The span between the samples compared.
    pub window: Duration,
}

type Sample = (Instant, [f64; COUNTERS.len()]);

/// What the admin listener measures; shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct Monitor {
    samples: Mutex<VecDeque<Sample>>,
    in_flight: Option<Arc<InFlightIndex>>,
}

impl Monitor {
    /// Nothing measured yet, and no claims to report: the in-flight gauges are not set.
    #[must_use]
    pub(crate) fn new() -> Self {
        Monitor::default()
    }

    /// Nothing measured yet; the in-flight gauges report the claims of `index` (the one the
    /// gateway's store keeps: [`crate::in_flight::Watched`]).
    #[must_use]
    pub(crate) fn watching(index: Arc<InFlightIndex>) -> Self {
        Monitor {
            samples: Mutex::default(),
            in_flight: Some(index),
        }
    }

    /// Sets the gauges: the store's own where it knows them at once ([`Store::stats`]), and
    /// this gateway's claims in flight from its index. Reads no record of the store.
    pub(crate) async fn refresh_gauges(&self, store: &dyn Store) {
        if let Some(stats) = store.stats() {
            export_stats(stats);
        }
        if let Some(index) = &self.in_flight {
            export_in_flight(index.count());
        }
    }

    /// Records the counters' totals now.
    pub(crate) fn sample(&self) {
        let values = crate::telemetry::counter_totals();
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
    pub(crate) fn rates(&self) -> Rates {
        self.sample();
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
