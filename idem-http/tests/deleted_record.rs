//! An operator deletes the record of a request while its handler runs (the gateway's `/ui` or
//! `idem keys delete`): the handler finishes, its response reaches the caller, nothing is
//! stored, and the log says so (no lease is left that a retry would have to wait out). A
//! retry runs the handler again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_http::IdempotencyLayer;
use idem_store_memory::MemoryStore;
use idem_testkit::logs::CapturedLogs;
use tokio::sync::{Mutex, mpsc};
use tower::{Service, ServiceBuilder, ServiceExt};

fn post() -> Request<Full<Bytes>> {
    Request::post("/pay")
        .header("idempotency-key", "\"order-1\"")
        .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))
        .unwrap()
}

// Current thread: the captured logs are those of this thread, the handler's task included.
#[tokio::test(flavor = "current_thread")]
async fn a_record_deleted_while_its_request_runs_is_logged_as_deleted() {
    let (logs, _capturing) = CapturedLogs::start();
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicU64::new(0));
    // The handler tells the test it runs, then waits for the test's go.
    let (started, mut running) = mpsc::unbounded_channel::<()>();
    let (go, gate) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |_request: Request<Full<Bytes>>| {
            let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = started.send(());
                gate.lock().await.recv().await;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "ran {n}"
                )))))
            }
        })
    };
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service(handler);

    let first = tokio::spawn(service.clone().oneshot(post()));
    running.recv().await.unwrap();
    let key = RecordKey::unscoped(IdempotencyKey::new("order-1").unwrap());
    assert!(
        store.delete(&key).await.unwrap(),
        "the record was in flight"
    );
    go.send(()).unwrap();
    let response = first.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "ran 1"
    );
    assert!(store.get(&key).await.unwrap().is_none(), "nothing stored");

    let text = logs.text();
    assert!(
        text.contains("the record was deleted while the request ran"),
        "{text}"
    );
    assert!(
        text.contains("a retry will run the handler again"),
        "{text}"
    );
    assert!(!text.contains("after the lease"), "{text}");

    // As the log says: a retry runs the handler again.
    go.send(()).unwrap();
    let mut service = service;
    let retry = service.ready().await.unwrap().call(post()).await.unwrap();
    assert_eq!(
        retry.into_body().collect().await.unwrap().to_bytes(),
        "ran 2"
    );
}
