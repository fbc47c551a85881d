//! A store that takes no heartbeat for a whole lease: the guard's lease keeper (idem-lease, the
//! HTTP layer's too) declares the lease lost when it ends, counts it once in
//! `idem_lease_losses_total` and stops beating, exactly as the layer does
//! (`idem-http/tests/lease_loss.rs` runs the same case). The job learns it through its
//! cancellation token. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{Fingerprint, IdempotencyKey};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use idem_testkit::recorder::CountingRecorder;
use idem_worker::{JobError, JobGuard};

const LEASE: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long the job runs unless cancelled: two leases.
const JOB: Duration = Duration::from_secs(6);

#[tokio::test(start_paused = true)]
async fn a_heartbeat_failing_for_a_whole_lease_counts_one_lease_loss() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    store.faults.heartbeat_down.store(true, Ordering::SeqCst);
    let guard = JobGuard::builder(store.clone())
        .lease(LEASE)
        .heartbeat_interval(HEARTBEAT)
        .build()
        .unwrap();
    let key = IdempotencyKey::new("k").unwrap();
    let run = guard
        .run(&key, Fingerprint::of(&[b"x"]), |ctx| async move {
            tokio::select! {
                () = ctx.cancelled() => Err(JobError::transient("the lease was lost")),
                () = tokio::time::sleep(JOB) => Ok(()),
            }
        })
        .await;
    assert!(run.result().is_none(), "the job was not cancelled: {run:?}");
    assert_eq!(recorder.get("idem_lease_losses_total{job_type=job}"), 1);
    // Tried at every beat until the lease ended (1 s, 2 s, 3 s), then no more.
    assert_eq!(store.faults.heartbeats.load(Ordering::SeqCst), 3);
    assert_eq!(
        recorder.get("idem_store_errors_total{kind=unavailable,op=heartbeat,store=store}"),
        3
    );
}
