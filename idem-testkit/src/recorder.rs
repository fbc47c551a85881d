//! [`CountingRecorder`]: a `metrics` recorder for tests that counts what each metric received.
//!
//! ```
//! use idem_testkit::recorder::CountingRecorder;
//!
//! let recorder = CountingRecorder::default();
//! metrics::with_local_recorder(&recorder, || {
//!     metrics::counter!("idem_claims_acquired_total", "job_type" => "email").increment(2);
//!     metrics::histogram!("idem_job_duration_seconds").record(0.5);
//! });
//! assert_eq!(recorder.get("idem_claims_acquired_total{job_type=email}"), 2);
//! assert_eq!(recorder.get("idem_job_duration_seconds{}"), 1);
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Counts, per metric and label set, the increments of a counter and the values recorded into
/// a histogram (each one counts 1). Gauges are ignored. Install it for a test with
/// `metrics::set_default_local_recorder` or `metrics::with_local_recorder`.
#[derive(Debug, Default)]
pub struct CountingRecorder {
    cells: Mutex<BTreeMap<String, Arc<Cell>>>,
}

#[derive(Debug)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }

    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// `name{label=value,...}`, the labels sorted by name.
fn cell_name(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|label| format!("{}={}", label.key(), label.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl CountingRecorder {
    /// What the metric `name{label=value,...}` (labels sorted by name; `name{}` without
    /// labels) received so far: the sum of a counter's increments, or how many values a
    /// histogram recorded; 0 if nothing was recorded under that name.
    #[must_use]
    pub fn get(&self, name: &str) -> u64 {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .map_or(0, |cell| cell.0.load(Ordering::SeqCst))
    }

    fn cell(&self, key: &Key) -> Arc<Cell> {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(cell_name(key))
            .or_insert_with(|| Arc::new(Cell(AtomicU64::new(0))))
            .clone()
    }
}

impl Recorder for CountingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}
