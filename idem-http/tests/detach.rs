//! A response future dropped by its caller (the client went away), through tower calls on a
//! counting handler: dropped before its request was claimed, nothing runs and nothing is
//! stored; dropped while the handler runs, the handler finishes, its response is stored, and a
//! retry is a replay.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{IdempotencyKey, RecordKey, State, Store};
use idem_http::IdempotencyLayer;
use idem_store_memory::MemoryStore;
use tower::{Layer, Service, ServiceExt};

/// A handler that counts its runs and answers `ran {n}` after `delay`.
#[derive(Clone)]
struct Counting {
    counter: Arc<AtomicU64>,
    delay: Duration,
}

impl Service<Request<Full<Bytes>>> for Counting {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<Full<Bytes>>) -> Self::Future {
        let counter = self.counter.clone();
        let delay = self.delay;
        Box::pin(async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            Ok(Response::new(Full::new(Bytes::from(format!("ran {n}")))))
        })
    }
}

fn counting(counter: &Arc<AtomicU64>, delay: Duration) -> Counting {
    Counting {
        counter: counter.clone(),
        delay,
    }
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/pay")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))
        .unwrap()
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

#[tokio::test(start_paused = true)]
async fn dropped_before_its_claim_nothing_runs_and_a_retry_executes() {
    let store = Arc::new(MemoryStore::new());
    let counter = Arc::new(AtomicU64::new(0));
    let mut service =
        IdempotencyLayer::new(store.clone()).layer(counting(&counter, Duration::ZERO));

    // The caller lets go before the future is ever polled: the request was never claimed.
    let future = service.ready().await.unwrap().call(post("\"gone\""));
    drop(future);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(counter.load(Ordering::SeqCst), 0);
    assert!(store.get(&record_key("gone")).await.unwrap().is_none());

    // The retry is the first execution.
    let response = service
        .ready()
        .await
        .unwrap()
        .call(post("\"gone\""))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "ran 1"
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_while_the_handler_runs_it_finishes_once_and_the_retry_is_a_replay() {
    let store = Arc::new(MemoryStore::new());
    let counter = Arc::new(AtomicU64::new(0));
    let mut service =
        IdempotencyLayer::new(store.clone()).layer(counting(&counter, Duration::from_millis(100)));

    // The caller's task runs the request until the handler has started, then is cancelled.
    let future = service.ready().await.unwrap().call(post("\"left\""));
    let caller = tokio::spawn(future);
    let started = tokio::time::timeout(Duration::from_secs(5), async {
        while counter.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(started.is_ok(), "the handler never started");
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());

    let completed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let record = store.get(&record_key("left")).await.unwrap();
            if record.is_some_and(|r| r.state == State::Completed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        completed.is_ok(),
        "the detached work never stored its response"
    );

    let retry = service
        .ready()
        .await
        .unwrap()
        .call(post("\"left\""))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        retry.into_body().collect().await.unwrap().to_bytes(),
        "ran 1"
    );
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}
