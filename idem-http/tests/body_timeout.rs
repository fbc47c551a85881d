//! A request body that trickles in past the body timeout is answered 408 (problem+json), the
//! handler does not run and the key stays free: the client may send it again. On tokio's
//! paused clock, with a body that yields one byte a second; and over a real socket, with a
//! client that writes one byte at a time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_http::{Config, IdempotencyLayer, RequestBody};
use idem_store_memory::MemoryStore;
use idem_testkit::trickle::trickle;
use tokio::time::Sleep;
use tower::{ServiceBuilder, ServiceExt};

/// A body of `left` bytes, one a second.
struct Trickle {
    left: usize,
    pause: Pin<Box<Sleep>>,
}

impl Trickle {
    fn new(left: usize) -> Self {
        Trickle {
            left,
            pause: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
        }
    }
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        std::task::ready!(self.pause.as_mut().poll(cx));
        self.left -= 1;
        let next = tokio::time::Instant::now() + Duration::from_secs(1);
        self.pause.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
    }
}

type TrickleRequest = Request<RequestBody<Trickle>>;

#[tokio::test(start_paused = true)]
async fn a_body_that_trickles_past_the_timeout_is_408_and_the_key_stays_free() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicU64::new(0));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |_request: TrickleRequest| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("ran {n}"))))) }
        })
    };
    // The default body timeout: 10 s.
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service(handler);
    let post = |bytes| {
        Request::post("/pay")
            .header("idempotency-key", "k")
            .body(RequestBody::new(Trickle::new(bytes)))
            .unwrap()
    };

    let slow = service.clone().oneshot(post(100)).await.unwrap();
    assert_eq!(slow.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(slow.headers()["content-type"], "application/problem+json");
    assert_eq!(slow.headers()["connection"], "close");
    let body = slow.into_body().collect().await.unwrap().to_bytes();
    assert!(
        std::str::from_utf8(&body)
            .unwrap()
            .contains("\"status\":408")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    let key = RecordKey::unscoped(IdempotencyKey::new("k").unwrap());
    assert!(store.get(&key).await.unwrap().is_none(), "the key is free");

    // A body that comes whole within the timeout, slowly all the same, runs.
    let in_time = service.clone().oneshot(post(5)).await.unwrap();
    assert_eq!(in_time.status(), StatusCode::OK);
    assert_eq!(
        in_time.into_body().collect().await.unwrap().to_bytes(),
        "ran 1"
    );
}

#[tokio::test]
async fn a_client_that_writes_one_byte_at_a_time_gets_408_and_its_connection_back() {
    let runs = Arc::new(AtomicU64::new(0));
    let app = {
        let runs = runs.clone();
        axum::Router::new().route(
            "/pay",
            axum::routing::post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "paid"
            }),
        )
    };
    let config = Config::builder()
        .body_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let app = app.layer(IdempotencyLayer::with_config(MemoryStore::new(), config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // One byte every 50 ms, until the server answers (it reads no more after its 408).
    let head =
        "POST /pay HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\ncontent-length: 1000\r\n\r\n";
    let answer = trickle(addr, head, Duration::from_millis(50), 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.abort();
}
