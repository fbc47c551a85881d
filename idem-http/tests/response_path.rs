//! The path of a first execution's response through the layer: a body complete before it goes
//! out is stored from the request's own future (no task, no channel) and leaves whole once its
//! record is settled; a streamed body's last frame comes with its end once the record is
//! settled; a body over the storage cap streams at once and is stored omitted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use idem_core::{IdempotencyKey, RecordKey, State, Store};
use idem_http::{Config, IdempotencyLayer, ResponseBody};
use idem_store_memory::MemoryStore;
use idem_store_redis::{RedisConfig, RedisStore};
use idem_testkit::faulty::{Faults, FaultyStore};
use idem_testkit::probe::{require_tcp, service_url};
use tokio::sync::mpsc;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

/// The default storage cap.
const MIB: usize = 1 << 20;

/// Bounds every wait of these tests: a hang is a failure, not a slow pass.
const HANG: Duration = Duration::from_secs(20);

/// A handler's body: frames that are all ready, or data sent by the test; with the size hint
/// the test chooses.
enum TestBody {
    Ready(VecDeque<Frame<Bytes>>),
    Sent(mpsc::UnboundedReceiver<Bytes>),
}

struct HintedBody {
    body: TestBody,
    hint: SizeHint,
}

impl Body for HintedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.body {
            TestBody::Ready(frames) => Poll::Ready(frames.pop_front().map(Ok)),
            TestBody::Sent(data) => data.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/pay")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))
        .unwrap()
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

async fn state(store: &MemoryStore, key: &str) -> State {
    store.get(&record_key(key)).await.unwrap().unwrap().state
}

/// The service of the layer's requests.
type Served = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<HintedBody>>, Infallible>;

/// The layer (storage cap `cap`) over `store`, around a handler that counts its runs in `runs`
/// and answers 201 with the body `make` gives.
fn served(
    store: impl Store + 'static,
    cap: usize,
    runs: Arc<AtomicU64>,
    make: impl Fn() -> HintedBody + Clone + Send + Sync + 'static,
) -> Served {
    let handler = tower::service_fn(move |_request: Request<Full<Bytes>>| {
        runs.fetch_add(1, Ordering::SeqCst);
        let body = make();
        async move {
            let mut response = Response::new(body);
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    });
    let config = Config::builder()
        .storage_cap(NonZeroUsize::new(cap).unwrap())
        .build()
        .unwrap();
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(IdempotencyLayer::with_config(store, config))
            .service(handler),
    )
}

/// The layer (cap `cap`) over a memory store whose completes are held, around a handler whose
/// body (hinted `hint`) is the data the test sends; the store, its faults, the handler's runs,
/// the sender and the service. The first request takes the sent body; later ones get an empty
/// one.
fn sent_body_with_completes_held(
    cap: usize,
    hint: SizeHint,
) -> (
    Arc<MemoryStore>,
    Arc<Faults>,
    Arc<AtomicU64>,
    mpsc::UnboundedSender<Bytes>,
    Served,
) {
    let memory = Arc::new(MemoryStore::new());
    let store = FaultyStore::new(memory.clone());
    let faults = store.faults.clone();
    faults.complete_held.store(true, Ordering::SeqCst);
    let runs = Arc::new(AtomicU64::new(0));
    let (send, receive) = mpsc::unbounded_channel::<Bytes>();
    let receive = Arc::new(std::sync::Mutex::new(Some(receive)));
    let service = served(store, cap, runs.clone(), move || {
        let data = receive.lock().unwrap().take();
        HintedBody {
            body: data.map_or_else(|| TestBody::Ready(VecDeque::new()), TestBody::Sent),
            hint,
        }
    });
    (memory, faults, runs, send, service)
}

/// A retry of `key` gets the status and headers with `Idempotency-Replay: omitted` and no body.
async fn assert_replayed_omitted(service: Served, key: &str) {
    let replay = service.oneshot(post(key)).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotency-replay"], "omitted");
    let body = replay.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
}

/// Frames all ready at once (20 of them, and trailers), of no announced length, end the body
/// before the response goes out: the record is completed (with the trailers) by the time the
/// response future resolves, before its body is read, and a retry replays it. Before, such a
/// body went through a channel of 16 frames, whose task waited for the caller to read the
/// rest: the record was still in flight when the response came.
#[tokio::test(flavor = "current_thread")]
async fn a_body_complete_at_once_is_stored_before_the_response_is_read() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicU64::new(0));
    let service = served(store.clone(), MIB, runs.clone(), || {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("7"));
        let mut frames: VecDeque<_> = (0..20)
            .map(|_| Frame::data(Bytes::from_static(b"ab")))
            .collect();
        frames.push_back(Frame::trailers(trailers));
        HintedBody {
            body: TestBody::Ready(frames),
            hint: SizeHint::new(),
        }
    });
    let first = service.clone().oneshot(post("ready")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(state(&store, "ready").await, State::Completed);
    let first = first.into_body().collect().await.unwrap();
    assert_eq!(first.trailers().unwrap()["x-sum"], "7");
    assert_eq!(first.to_bytes(), "ab".repeat(20));

    let replay = service.oneshot(post("ready")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay = replay.into_body().collect().await.unwrap();
    assert_eq!(replay.trailers().unwrap()["x-sum"], "7");
    assert_eq!(replay.to_bytes(), "ab".repeat(20));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body of a known length over the storage cap goes out at once: the caller reads its first
/// bytes while the handler still holds back the rest; it is stored omitted, and its last byte
/// waits for the record. Before, a known
/// length up to 16 times the cap was read whole before the first byte went out (this test hung
/// until its bound).
#[tokio::test]
async fn a_known_length_over_the_cap_streams_at_once_and_is_stored_omitted() {
    let (memory, faults, runs, send, service) =
        sent_body_with_completes_held(64, SizeHint::with_exact(400));
    send.send(Bytes::from(vec![b'a'; 100])).unwrap();
    let first = tokio::time::timeout(HANG, service.clone().oneshot(post("big")))
        .await
        .expect("the response came while the handler held back the rest of its body")
        .unwrap();
    assert_eq!(first.size_hint().exact(), Some(400));
    let mut body = first.into_body();
    let frame = tokio::time::timeout(HANG, body.frame())
        .await
        .expect("the first bytes came while the handler held back the rest")
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), vec![b'a'; 100]);
    for _ in 0..3 {
        send.send(Bytes::from(vec![b'b'; 100])).unwrap();
    }
    drop(send);
    let mut rest = Vec::new();
    while rest.len() < 200 {
        let frame = tokio::time::timeout(HANG, body.frame()).await.unwrap();
        rest.extend_from_slice(&frame.unwrap().unwrap().into_data().unwrap());
    }
    assert_eq!(rest, vec![b'b'; 200]);
    assert_the_last_frame_waits_for_the_record(&mut body, &faults, &memory, "big", &[b'b'; 100])
        .await;

    assert_replayed_omitted(service, "big").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Capture stops at the storage cap: a body over it is stored omitted even where compression
/// would have brought it under (3,000 bytes of one letter, cap 1,024). Before, it was captured
/// up to 16 times the cap and stored compressed.
#[tokio::test]
async fn a_body_over_the_cap_is_stored_omitted_even_if_it_would_compress_under_it() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicU64::new(0));
    let service = served(store.clone(), 1024, runs.clone(), || HintedBody {
        body: TestBody::Ready(
            (0..3)
                .map(|_| Frame::data(Bytes::from(vec![b'x'; 1000])))
                .collect(),
        ),
        hint: SizeHint::new(),
    });
    let first = service.clone().oneshot(post("x")).await.unwrap();
    let first = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(first, vec![b'x'; 3000]);
    assert_replayed_omitted(service, "x").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The body of `key`, whose record the store holds back (`faults`), has sent all but its last
/// frame: that frame waits for the record, and comes once the store takes it, with the body's
/// end ready at once after it (no pending poll between them: a server writes them together).
async fn assert_the_last_frame_waits_for_the_record(
    body: &mut ResponseBody<HintedBody>,
    faults: &Faults,
    memory: &MemoryStore,
    key: &str,
    last: &[u8],
) {
    assert!(
        poll_frame_now(body).await.is_pending(),
        "the body went on before the record was stored"
    );
    assert_eq!(state(memory, key).await, State::InFlight);
    faults.release_completes();
    let next = tokio::time::timeout(HANG, body.frame()).await.unwrap();
    assert_eq!(next.unwrap().unwrap().into_data().unwrap(), last);
    assert_eq!(state(memory, key).await, State::Completed);
    assert_ends_now(body).await;
}

/// Polls `body` for a frame once.
async fn poll_frame_now<B: Body + Unpin>(
    body: &mut B,
) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await
}

/// `body` has nothing more: it says so, or its next poll ends it without pending.
async fn assert_ends_now<B: Body + Unpin>(body: &mut B)
where
    B::Error: std::fmt::Debug,
{
    if body.is_end_stream() {
        return;
    }
    match poll_frame_now(body).await {
        Poll::Ready(None) => {}
        Poll::Ready(Some(_)) => panic!("a frame after the last"),
        Poll::Pending => panic!("the end did not come with the last frame"),
    }
}

/// A small complete response leaves whole once its record is settled: while the store has not
/// answered, the response future waits (before, the response and all but its last byte went
/// out, and that byte followed in a second write once the store answered: on a socket without
/// `TCP_NODELAY` Nagle held it until the client's delayed ACK, about 40 ms); once it answers,
/// the head comes with the whole body in one frame and its end, with no pending poll between
/// them, and the record is completed.
#[tokio::test]
async fn a_small_response_leaves_whole_once_its_record_is_settled() {
    let memory = Arc::new(MemoryStore::new());
    let store = FaultyStore::new(memory.clone());
    let faults = store.faults.clone();
    faults.complete_held.store(true, Ordering::SeqCst);
    let runs = Arc::new(AtomicU64::new(0));
    let service = served(store, MIB, runs.clone(), || HintedBody {
        body: TestBody::Ready(VecDeque::from([
            Frame::data(Bytes::from_static(b"pa")),
            Frame::data(Bytes::from_static(b"id")),
        ])),
        hint: SizeHint::with_exact(4),
    });
    let mut first = std::pin::pin!(service.clone().oneshot(post("gated")));
    // Polled until its complete reached the (held) store: the work runs in this future.
    while faults.completes.load(Ordering::SeqCst) == 0 {
        let polled = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(
            polled.is_pending(),
            "the response came before its record was stored"
        );
        tokio::task::yield_now().await;
    }
    let polled = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "the response came before its record was stored"
    );
    assert_eq!(state(&memory, "gated").await, State::InFlight);
    faults.release_completes();
    let first = tokio::time::timeout(HANG, first).await.unwrap().unwrap();
    assert_eq!(state(&memory, "gated").await, State::Completed);
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(first.size_hint().exact(), Some(4));
    let mut body = first.into_body();
    let Poll::Ready(Some(Ok(frame))) = poll_frame_now(&mut body).await else {
        panic!("the body was not ready with its response");
    };
    assert_eq!(frame.into_data().unwrap(), "paid", "the body in one frame");
    assert_ends_now(&mut body).await;

    let replay = service.oneshot(post("gated")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.into_body().collect().await.unwrap().to_bytes(),
        "paid"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A streamed body of no announced length (its frames come while the response is read): the
/// frames go out as they come, except the last one, whose end is ready with it: it waits for
/// the record and then comes with the end, no pending poll between them (before, the last
/// frame went out at once and the end alone followed the record, a write of its own).
#[tokio::test]
async fn a_streamed_body_ends_with_its_last_frame_once_its_record_is_settled() {
    let (memory, faults, runs, send, service) = sent_body_with_completes_held(MIB, SizeHint::new());
    let first = tokio::time::timeout(HANG, service.clone().oneshot(post("chunks")))
        .await
        .expect("the response came while the handler held back its body")
        .unwrap();
    let mut body = first.into_body();
    send.send(Bytes::from_static(b"one,")).unwrap();
    let frame = tokio::time::timeout(HANG, body.frame()).await.unwrap();
    assert_eq!(frame.unwrap().unwrap().into_data().unwrap(), "one,");
    // The last frame and the end, ready together.
    send.send(Bytes::from_static(b"two")).unwrap();
    drop(send);
    while faults.completes.load(Ordering::SeqCst) == 0 {
        assert!(
            poll_frame_now(&mut body).await.is_pending(),
            "the last frame went out before the record was stored"
        );
        tokio::task::yield_now().await;
    }
    assert_the_last_frame_waits_for_the_record(&mut body, &faults, &memory, "chunks", b"two").await;

    let replay = service.oneshot(post("chunks")).await.unwrap();
    assert_eq!(
        replay.into_body().collect().await.unwrap().to_bytes(),
        "one,two"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Hammer, on Redis (a store that answers over the network, so the response goes out before
/// its record is stored): 32 callers, 8 keys each, each reads its response to the end and at
/// once sends its key again. Every retry is a replay, byte for byte, never a 409 or a second
/// run: a caller that has seen a body's end finds its record stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_a_caller_that_read_the_end_finds_the_record_stored() {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let target = url.trim_start_matches("redis://").trim_end_matches('/');
    if !require_tcp("Redis", target) {
        return;
    }
    let config = RedisConfig::new(url.clone())
        .unwrap()
        .with_namespace(format!("idem-http-response-path-{}", std::process::id()))
        .unwrap();
    let store = RedisStore::connect(config).await.unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let service = served(store, MIB, runs.clone(), || HintedBody {
        body: TestBody::Ready(VecDeque::from([Frame::data(Bytes::from_static(b"paid"))])),
        hint: SizeHint::with_exact(4),
    });
    let callers = (0..32).map(|caller| {
        let service = service.clone();
        tokio::spawn(async move {
            for n in 0..8 {
                let key = format!("hammer-{}-{caller}-{n}", std::process::id());
                let first = service.clone().oneshot(post(&key)).await.unwrap();
                assert_eq!(first.status(), StatusCode::CREATED);
                let body = first.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, "paid");
                let retry = service.clone().oneshot(post(&key)).await.unwrap();
                assert_eq!(retry.status(), StatusCode::CREATED, "{key}");
                assert_eq!(retry.headers()["idempotent-replayed"], "true", "{key}");
                let body = retry.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, "paid");
            }
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        tokio::time::timeout(HANG, caller).await.unwrap().unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 32 * 8);
}
