//! Metrics carry the job type; the counters of DESIGN.md section 8 move as jobs run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use idem_core::{Fingerprint, IdempotencyKey};
use idem_store_memory::MemoryStore;
use idem_worker::{JobError, JobGuard};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

#[derive(Default)]
struct Counting {
    counters: Mutex<BTreeMap<String, Arc<Cell>>>,
}

struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

fn name(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder for Counting {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let cell = self
            .counters
            .lock()
            .unwrap()
            .entry(name(key))
            .or_insert_with(|| Arc::new(Cell(AtomicU64::new(0))))
            .clone();
        Counter::from_arc(cell)
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl Counting {
    fn get(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.0.load(Ordering::SeqCst))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn counters_carry_the_job_type() {
    let recorder = Counting::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("email")
        .store_label("memory")
        .redact_keys(true)
        .build()
        .unwrap();
    let key = IdempotencyKey::new("user@example.com:welcome").unwrap();
    let fp = Fingerprint::of(&[b"x"]);
    let _ = guard
        .run(&key, fp, |_| async { Ok::<_, JobError>(1u8) })
        .await;
    let _ = guard
        .run(&key, fp, |_| async { Ok::<_, JobError>(1u8) })
        .await;
    let _ = guard
        .run(&key, Fingerprint::of(&[b"y"]), |_| async {
            Ok::<_, JobError>(1u8)
        })
        .await;
    let other = IdempotencyKey::new("k2").unwrap();
    let _ = guard
        .run(&other, fp, |_| async {
            Err::<u8, _>(JobError::transient("later"))
        })
        .await;

    assert_eq!(
        recorder.get("idem_claims_acquired_total{job_type=email}"),
        2
    );
    assert_eq!(
        recorder.get("idem_duplicates_replayed_total{job_type=email}"),
        1
    );
    assert_eq!(recorder.get("idem_mismatches_total{job_type=email}"), 1);
    assert_eq!(
        recorder.get("idem_failures_total{job_type=email,kind=transient}"),
        1
    );
    assert_eq!(
        recorder.get("idem_jobs_total{disposition=ack,job_type=email,outcome=executed}"),
        1
    );
    assert_eq!(
        recorder.get("idem_jobs_total{disposition=ack,job_type=email,outcome=replayed}"),
        1
    );
    assert_eq!(
        recorder.get("idem_jobs_total{disposition=dead_letter,job_type=email,outcome=mismatch}"),
        1
    );
    assert_eq!(
        recorder.get("idem_jobs_total{disposition=retry,job_type=email,outcome=transient}"),
        1
    );
}
