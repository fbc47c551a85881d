//! Black-box tests of the webhook receiver over real HTTP on 127.0.0.1:0: 202, the replay of a
//! duplicate, 409 while the first is processing, 422 for another body, 429 when the queue is
//! full, 400 without an id.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_store_memory::MemoryStore;
use idem_worker::JobGuard;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use webhook_receiver::{Config, Processor, app, processor};

/// A receiver whose processor waits for a permit of `gate` per event and counts executions.
struct Receiver {
    addr: SocketAddr,
    gate: Arc<Semaphore>,
    started: Arc<AtomicU32>,
    executed: Arc<AtomicU32>,
}

impl Receiver {
    /// Serves the receiver's app on a free port of 127.0.0.1.
    async fn serve(
        guard: JobGuard,
        config: Config,
        process: Processor,
        gate: Arc<Semaphore>,
        started: Arc<AtomicU32>,
        executed: Arc<AtomicU32>,
    ) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app(guard, config, process);
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Receiver {
            addr,
            gate,
            started,
            executed,
        }
    }
}

async fn start(config: Config) -> Receiver {
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(AtomicU32::new(0));
    let executed = Arc::new(AtomicU32::new(0));
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("webhook")
        .build()
        .unwrap();
    let process = processor({
        let (gate, started, executed) = (gate.clone(), started.clone(), executed.clone());
        move |event, _ctx| {
            let (gate, started, executed) = (gate.clone(), started.clone(), executed.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                executed.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"processed": event.id}))
            }
        }
    });
    Receiver::serve(guard, config, process, gate, started, executed).await
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// One HTTP/1.1 request on a fresh connection.
async fn post(addr: SocketAddr, path: &str, event_id: Option<&str>, body: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let id_header = event_id.map_or(String::new(), |id| format!("X-Event-Id: {id}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{id_header}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Posts until the answer is no longer 202/409 (the first delivery finished).
async fn until_done(addr: SocketAddr, path: &str, id: Option<&str>, body: &str) -> Reply {
    for _ in 0..500 {
        let reply = post(addr, path, id, body).await;
        if reply.status != 409 {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still in flight after 5 s");
}

async fn wait_for(counter: &AtomicU32, value: u32) {
    for _ in 0..500 {
        if counter.load(Ordering::SeqCst) >= value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("counter stuck at {}", counter.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_new_event_is_accepted_and_a_duplicate_gets_the_stored_result() {
    let receiver = start(Config::default()).await;
    receiver.gate.add_permits(100);
    let first = post(receiver.addr, "/webhooks/shop", Some("evt_1"), r#"{"a":1}"#).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.json()["status"], "accepted");

    let dup = until_done(receiver.addr, "/webhooks/shop", Some("evt_1"), r#"{"a":1}"#).await;
    assert_eq!(dup.status, 200, "{}", dup.body);
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    assert_eq!(dup.json(), json!({"processed": "evt_1"}));
    assert_eq!(receiver.executed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_duplicate_while_the_first_is_processing_gets_409() {
    let receiver = start(Config::default()).await;
    let first = post(receiver.addr, "/webhooks/shop", Some("evt_2"), "{}").await;
    assert_eq!(first.status, 202);
    wait_for(&receiver.started, 1).await;

    let dup = post(receiver.addr, "/webhooks/shop", Some("evt_2"), "{}").await;
    assert_eq!(dup.status, 409, "{}", dup.body);
    let retry_after: u64 = dup.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    assert_eq!(dup.header("content-type"), Some("application/problem+json"));

    receiver.gate.add_permits(1);
    let done = until_done(receiver.addr, "/webhooks/shop", Some("evt_2"), "{}").await;
    assert_eq!(done.status, 200);
    assert_eq!(receiver.executed.load(Ordering::SeqCst), 1);
}

/// Once events have been processed (here in well under a second), a duplicate is told to
/// come back after about as long as they took (1 s, the least `Retry-After` says), not after
/// the claim's lease (before: 30).
#[tokio::test]
async fn a_409_says_how_long_this_receivers_events_take() {
    let receiver = start(Config::default()).await;
    assert_eq!(
        post(receiver.addr, "/webhooks/shop", Some("quick"), "{}")
            .await
            .status,
        202
    );
    receiver.gate.add_permits(1);
    let done = until_done(receiver.addr, "/webhooks/shop", Some("quick"), "{}").await;
    assert_eq!(done.status, 200);
    assert_eq!(
        post(receiver.addr, "/webhooks/shop", Some("held"), "{}")
            .await
            .status,
        202
    );
    wait_for(&receiver.started, 2).await;
    let dup = post(receiver.addr, "/webhooks/shop", Some("held"), "{}").await;
    assert_eq!(dup.status, 409, "{}", dup.body);
    assert_eq!(dup.header("retry-after"), Some("1"));
    receiver.gate.add_permits(1);
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after_and_frees_the_key() {
    let receiver = start(Config {
        queue_capacity: 1,
        workers: 1,
        retry_after: Duration::from_secs(3),
        ..Config::default()
    })
    .await;
    // The worker takes the first event and blocks; the second fills the queue.
    assert_eq!(
        post(receiver.addr, "/webhooks/s", Some("a"), "{}")
            .await
            .status,
        202
    );
    wait_for(&receiver.started, 1).await;
    assert_eq!(
        post(receiver.addr, "/webhooks/s", Some("b"), "{}")
            .await
            .status,
        202
    );

    let full = post(receiver.addr, "/webhooks/s", Some("c"), "{}").await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.header("retry-after"), Some("3"));

    // The key of the refused event was released: once there is room, its retry is accepted.
    receiver.gate.add_permits(100);
    let mut accepted = None;
    for _ in 0..500 {
        let retry = post(receiver.addr, "/webhooks/s", Some("c"), "{}").await;
        if retry.status != 429 {
            accepted = Some(retry.status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(accepted, Some(202));
    wait_for(&receiver.executed, 3).await;
}

#[tokio::test]
async fn the_id_may_come_from_the_body_and_another_body_is_a_mismatch() {
    let receiver = start(Config::default()).await;
    receiver.gate.add_permits(100);
    let body = r#"{"id":"evt_9","amount":10}"#;
    assert_eq!(
        post(receiver.addr, "/webhooks/pay", None, body)
            .await
            .status,
        202
    );
    // The same event with the id in the header is the same key.
    let dup = until_done(receiver.addr, "/webhooks/pay", Some("evt_9"), body).await;
    assert_eq!(dup.status, 200);
    assert_eq!(dup.json(), json!({"processed": "evt_9"}));

    let other = post(
        receiver.addr,
        "/webhooks/pay",
        None,
        r#"{"id":"evt_9","amount":99}"#,
    )
    .await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(receiver.executed.load(Ordering::SeqCst), 1);

    let numeric = post(receiver.addr, "/webhooks/pay", None, r#"{"id":42}"#).await;
    assert_eq!(numeric.status, 202);
}

#[tokio::test]
async fn an_event_without_a_usable_id_is_refused() {
    let receiver = start(Config::default()).await;
    let missing = post(receiver.addr, "/webhooks/pay", None, r#"{"amount":10}"#).await;
    assert_eq!(missing.status, 400);
    let not_json = post(receiver.addr, "/webhooks/pay", None, "hello").await;
    assert_eq!(not_json.status, 400);
    assert_eq!(receiver.started.load(Ordering::SeqCst), 0);
}

/// A receiver whose processor fails transiently on the first try of each event whose id starts
/// with `flaky`, and whose guard backs off `backoff` (no jitter) before the retry.
async fn start_flaky(config: Config, backoff: Duration) -> Receiver {
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(AtomicU32::new(0));
    let executed = Arc::new(AtomicU32::new(0));
    let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
        .job_type("webhook")
        .retry_policy(
            idem_worker::RetryPolicy::default()
                .with_initial_delay(backoff)
                .with_jitter(0.0)
                .unwrap(),
        )
        .build()
        .unwrap();
    let process = processor({
        let (started, executed) = (started.clone(), executed.clone());
        move |event, ctx| {
            let (started, executed) = (started.clone(), executed.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                if event.id.starts_with("flaky") && ctx.delivery() == 1 {
                    return Err(idem_worker::JobError::transient("downstream busy"));
                }
                executed.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"processed": event.id}))
            }
        }
    });
    Receiver::serve(guard, config, process, gate, started, executed).await
}

#[tokio::test]
async fn a_duplicate_while_the_first_waits_for_its_retry_gets_409() {
    let receiver = start_flaky(Config::default(), Duration::from_secs(2)).await;
    let first = post(receiver.addr, "/webhooks/shop", Some("flaky_1"), "{}").await;
    assert_eq!(first.status, 202);
    // The first try failed transiently; the retry waits for its backoff.
    wait_for(&receiver.started, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let dup = post(receiver.addr, "/webhooks/shop", Some("flaky_1"), "{}").await;
    assert_eq!(
        dup.status, 409,
        "the event is still being processed (waiting for its retry): {}",
        dup.body
    );
    assert!(dup.header("retry-after").is_some());

    let done = until_done(receiver.addr, "/webhooks/shop", Some("flaky_1"), "{}").await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(receiver.executed.load(Ordering::SeqCst), 1);
    assert_eq!(
        receiver.started.load(Ordering::SeqCst),
        2,
        "one retry, no second run"
    );
}

#[tokio::test]
async fn a_retry_waiting_for_its_backoff_does_not_hold_up_other_events() {
    let receiver = start_flaky(
        Config {
            workers: 1,
            ..Config::default()
        },
        Duration::from_secs(4),
    )
    .await;
    assert_eq!(
        post(receiver.addr, "/webhooks/s", Some("flaky_a"), "{}")
            .await
            .status,
        202
    );
    wait_for(&receiver.started, 1).await;
    // The only worker must not sleep through flaky_a's 4 s backoff with b in the queue.
    assert_eq!(
        post(receiver.addr, "/webhooks/s", Some("b"), "{}")
            .await
            .status,
        202
    );
    let started = std::time::Instant::now();
    wait_for(&receiver.executed, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "b waited {:?} behind a retry",
        started.elapsed()
    );
    let done = until_done(receiver.addr, "/webhooks/s", Some("b"), "{}").await;
    assert_eq!(done.json(), json!({"processed": "b"}));
}

/// Each source has keys of its own: source `a:b` with event `c` and source `a` with event
/// `b:c` are two events (both run), although `webhook:{source}:{id}` spells both
/// `webhook:a:b:c`.
#[tokio::test]
async fn two_sources_never_share_a_key() {
    let receiver = start(Config::default()).await;
    receiver.gate.add_permits(100);
    let body = r#"{"amount":10}"#;
    let first = post(receiver.addr, "/webhooks/a:b", Some("c"), body).await;
    assert_eq!(first.status, 202, "{}", first.body);
    let second = post(receiver.addr, "/webhooks/a", Some("b:c"), body).await;
    assert_eq!(second.status, 202, "{}", second.body);
    // A percent sign in the source is escaped too: `a%3Ab` (decoded from `a%253Ab`) is not `a:b`.
    let third = post(receiver.addr, "/webhooks/a%253Ab", Some("c"), body).await;
    assert_eq!(third.status, 202, "{}", third.body);
    wait_for(&receiver.executed, 3).await;
    for (path, id) in [
        ("/webhooks/a:b", "c"),
        ("/webhooks/a", "b:c"),
        ("/webhooks/a%253Ab", "c"),
    ] {
        let replay = until_done(receiver.addr, path, Some(id), body).await;
        assert_eq!(replay.status, 200, "{path} {id}: {}", replay.body);
        assert_eq!(replay.json(), json!({"processed": id}));
    }
    assert_eq!(receiver.executed.load(Ordering::SeqCst), 3);
}
