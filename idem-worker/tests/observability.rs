//! Metrics carry the job type; the counters of the metrics table of ops/README.md move as jobs run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use idem_core::{Fingerprint, IdempotencyKey};
use idem_store_memory::MemoryStore;
use idem_testkit::recorder::CountingRecorder;
use idem_worker::{JobError, JobGuard};

#[tokio::test(flavor = "current_thread")]
async fn counters_carry_the_job_type() {
    let recorder = CountingRecorder::default();
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

/// With `redact_keys(true)`, no log line shows the key as sent: the span's key field is a
/// digest, and a store error that names its record (a corrupt one) leaves the key out.
#[tokio::test(flavor = "current_thread")]
async fn a_store_error_logged_with_keys_redacted_does_not_show_the_key() {
    let (logs, _capturing) = idem_testkit::logs::CapturedLogs::start();
    let store = idem_testkit::faulty::FaultyStore::new(MemoryStore::new());
    store
        .faults
        .claim_corrupt
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let guard = JobGuard::builder(Arc::new(store))
        .job_type("email")
        .redact_keys(true)
        .build()
        .unwrap();
    let key = IdempotencyKey::new("user-8812:welcome").unwrap();
    let run = guard
        .run(&key, Fingerprint::of(&[b"x"]), |_| async {
            Ok::<_, JobError>(1u8)
        })
        .await;
    assert!(
        matches!(run.outcome, idem_worker::JobOutcome::Error(_)),
        "{run:?}"
    );
    let text = logs.text();
    assert!(text.contains("corrupt record (key redacted)"), "{text}");
    assert!(!text.contains("user-8812"), "{text}");
}
