//! A store that takes no heartbeat for a whole lease: the layer's lease keeper (idem-lease,
//! the job guard's too) declares the lease lost when it ends, counts it once in
//! `idem_lease_losses_total` and stops beating, exactly as the job guard does
//! (`idem-worker/tests/lease_loss.rs` runs the same case). Before, the layer logged and retried
//! the heartbeat for as long as the handler ran, and counted no loss. The handler is not
//! cancelled: its response goes to the caller. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_http::{Config, IdempotencyLayer, Outcome};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use idem_testkit::recorder::CountingRecorder;
use tower::ServiceExt;

const LEASE: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long the handler runs: two leases.
const HANDLER: Duration = Duration::from_secs(6);

#[tokio::test(start_paused = true)]
async fn a_heartbeat_failing_for_a_whole_lease_counts_one_lease_loss() {
    let recorder = CountingRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    store.faults.heartbeat_down.store(true, Ordering::SeqCst);
    let config = Config::builder()
        .lease(LEASE)
        .heartbeat(HEARTBEAT)
        .build()
        .unwrap();
    let handler = tower::service_fn(|_: Request<Full<Bytes>>| async {
        tokio::time::sleep(HANDLER).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
    });
    let service = tower::ServiceBuilder::new()
        .layer(IdempotencyLayer::from_arc(store.clone(), config))
        .service(handler);
    let request = Request::post("/")
        .header("idempotency-key", "\"k\"")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    // The handler ran to its end and the caller has its response.
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.extensions().get::<Outcome>(),
        Some(&Outcome::Executed)
    );
    assert_eq!(recorder.get("idem_lease_losses_total{}"), 1);
    // Tried at every beat until the lease ended (1 s, 2 s, 3 s), then no more.
    assert_eq!(store.faults.heartbeats.load(Ordering::SeqCst), 3);
    assert_eq!(
        recorder.get("idem_store_errors_total{kind=unavailable,op=heartbeat,store=store}"),
        3
    );
}
