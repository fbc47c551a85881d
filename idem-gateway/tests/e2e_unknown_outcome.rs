//! Unknown outcomes end to end: an upstream that applies an effect and then loses its answer
//! (it stalls past `timeout`, resets the connection before its head, or breaks its body off)
//! behind a gateway in this process. Clients retry every 100 ms; the effect count says
//! whether a retry ran again. Each effect is counted by the key the upstream received, so the
//! tests also show that the key goes downstream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::raw_http::read_message;
use common::{Gateway, Http, config};
use http::Method;
use idem_core::{IdempotencyKey, RecordKey, State, Store};
use tokio::io::{AsyncWriteExt, BufReader};

/// An upstream whose `POST` applies an effect (counted per `Idempotency-Key` it received) and
/// then, by path: `/stall` answers only after 3 s; `/reset` resets the connection before any
/// head; `/break` sends a head and half its body, then closes; `/nothing` closes at once
/// without applying anything; `/ok` answers 201. `GET /by-key/{key}` reconciles: 503 while
/// `reconcile_down`, else 200 `{"done":true}` if the key's effect was applied, 404 if not.
#[derive(Clone)]
struct EffectUpstream {
    addr: SocketAddr,
    effects: Arc<Mutex<HashMap<String, u64>>>,
    reconcile_down: Arc<AtomicBool>,
}

impl EffectUpstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = EffectUpstream {
            addr: listener.local_addr().unwrap(),
            effects: Arc::default(),
            reconcile_down: Arc::default(),
        };
        let state = upstream.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(state.clone().serve(stream));
            }
        });
        upstream
    }

    fn effects(&self, key: &str) -> u64 {
        self.effects.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    async fn serve(self, stream: tokio::net::TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        while let Some(request) = read_message(&mut reader).await {
            let start = request.start().to_owned();
            let path = start.split(' ').nth(1).unwrap_or("").to_owned();
            let key = request.header("idempotency-key").unwrap_or("").to_owned();
            if let Some(asked) = path.strip_prefix("/by-key/") {
                let answer = if self.reconcile_down.load(Ordering::SeqCst) {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_owned()
                } else if self.effects(asked) > 0 && asked == key {
                    let body = "{\"done\":true}";
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned()
                };
                if write.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                continue;
            }
            if path == "/nothing" {
                return;
            }
            *self.effects.lock().unwrap().entry(key).or_default() += 1;
            match path.as_str() {
                "/stall" => {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let _ = write
                        .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\nlate")
                        .await;
                    return;
                }
                "/reset" => {
                    // SO_LINGER 0: the close is a reset, not a FIN.
                    let stream = reader.into_inner().reunite(write).unwrap();
                    let socket = socket2::SockRef::from(&stream);
                    socket.set_linger(Some(Duration::ZERO)).unwrap();
                    return;
                }
                "/break" => {
                    let _ = write
                        .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\nhalf")
                        .await;
                    return;
                }
                _ => {
                    let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
                    if write.write_all(answer).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// A gateway in front of `upstream` with a 300 ms `timeout` and `route` as its one route's
/// extra lines.
async fn gateway(upstream: &EffectUpstream, route: &str) -> Gateway {
    let extra = format!("[[route]]\npath = \"/\"\n{route}\n");
    let mut config = config(upstream.addr, &extra);
    config.upstream.as_mut().unwrap().timeout = Duration::from_millis(300);
    Gateway::start(&config).await
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

/// Retries `path` under `key` every 100 ms for `over`, asserting each answer is a 409
/// `outcome-unknown` with a `Retry-After`.
async fn retries_are_told_unknown(gateway: &Gateway, path: &str, key: &str, over: Duration) {
    let http = Http::new();
    let until = tokio::time::Instant::now() + over;
    while tokio::time::Instant::now() < until {
        let retry = http.post_key(&gateway.url(path), key, "pay 10").await;
        assert_eq!(retry.status, 409, "{path}: {}", retry.text());
        assert!(retry.text().contains("outcome-unknown"), "{}", retry.text());
        assert!(
            retry.header("retry-after").is_some(),
            "{path}: no Retry-After"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An upstream that applied the effect and then stalled, reset the connection or broke its
/// body: in `hold` (the default), retries every 100 ms for 10 s are answered `outcome-unknown`
/// and the effect stays at 1; the record says unknown, with the request sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_holds_the_key_and_retries_never_run_again() {
    let upstream = EffectUpstream::start().await;
    let gateway = gateway(&upstream, "").await;
    let http = Http::new();
    let cases = [
        ("/stall", "k-stall"),
        ("/reset", "k-reset"),
        ("/break", "k-break"),
    ];
    for (path, key) in cases {
        let first = http
            .try_send(
                Method::POST,
                &gateway.url(path),
                &[("idempotency-key", key)],
                "pay 10",
            )
            .await;
        match path {
            "/stall" => assert_eq!(first.unwrap().status, 504),
            "/reset" => assert_eq!(first.unwrap().status, 502),
            _ => assert!(first.is_err(), "{path}: the body was not cut short"),
        }
        assert_eq!(upstream.effects(key), 1, "{path}");
    }
    let retries = cases
        .map(|(path, key)| retries_are_told_unknown(&gateway, path, key, Duration::from_secs(10)));
    futures_join(retries).await;
    for (path, key) in cases {
        assert_eq!(upstream.effects(key), 1, "{path}: the effect ran again");
        let record = gateway.store.get(&record_key(key)).await.unwrap().unwrap();
        assert_eq!(record.state, State::Unknown, "{path}");
        assert!(record.unknown.unwrap().request_sent, "{path}");
    }
}

async fn futures_join<F: std::future::Future<Output = ()>>(futures: [F; 3]) {
    let [a, b, c] = futures;
    tokio::join!(a, b, c);
}

/// A request that never reached the upstream whole (refused connection) or that the
/// upstream closed on without answering is still released: nothing ran, a retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_releases_the_key() {
    let closed = common::free_addr();
    let mut config = config(closed, "");
    config.upstream.as_mut().unwrap().timeout = Duration::from_millis(300);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    for _ in 0..2 {
        let reply = http
            .post_key(&gateway.url("/ok"), "refused", "pay 10")
            .await;
        assert_eq!(reply.status, 502, "{}", reply.text());
    }
    assert!(
        gateway
            .store
            .get(&record_key("refused"))
            .await
            .unwrap()
            .is_none()
    );
}

/// `on_unknown = "release"` frees the key after `release_grace`, never before: retries in the
/// grace are told `outcome-unknown`, a retry after it runs again (a release after a hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_key_only_after_its_grace() {
    let upstream = EffectUpstream::start().await;
    let gateway = gateway(
        &upstream,
        "on_unknown = \"release\"\nrelease_grace = \"2s\"",
    )
    .await;
    let http = Http::new();
    let first = http
        .post_key(&gateway.url("/reset"), "k-grace", "pay 10")
        .await;
    assert_eq!(first.status, 502);
    retries_are_told_unknown(&gateway, "/reset", "k-grace", Duration::from_millis(1200)).await;
    assert_eq!(upstream.effects("k-grace"), 1);
    let rerun = common::eventually(Duration::from_secs(10), || async {
        let retry = http
            .post_key(&gateway.url("/reset"), "k-grace", "pay 10")
            .await;
        retry.status == 502 && upstream.effects("k-grace") == 2
    })
    .await;
    assert!(rerun, "the key was never freed after its grace");
}

/// `reconcile` asks the upstream: while it cannot say (503), the key stays unknown; once it
/// answers 200, the key is settled with that answer and every retry gets it replayed, the
/// effect still once. A 404 (the effect did not happen) frees the key: the retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_settles_a_done_effect_and_frees_one_that_did_not_happen() {
    let upstream = EffectUpstream::start().await;
    upstream.reconcile_down.store(true, Ordering::SeqCst);
    let gateway = gateway(&upstream, "reconcile = \"/by-key/{key}\"").await;
    let http = Http::new();
    let first = http
        .post_key(&gateway.url("/stall"), "k-rec", "pay 10")
        .await;
    assert_eq!(first.status, 504);
    retries_are_told_unknown(&gateway, "/stall", "k-rec", Duration::from_millis(1500)).await;
    upstream.reconcile_down.store(false, Ordering::SeqCst);
    let replayed = common::eventually(Duration::from_secs(20), || async {
        let retry = http
            .post_key(&gateway.url("/stall"), "k-rec", "pay 10")
            .await;
        assert!(
            retry.status == 409 || retry.status == 200,
            "{}",
            retry.status
        );
        retry.replayed() && retry.text() == "{\"done\":true}"
    })
    .await;
    assert!(replayed, "the reconciled answer was never replayed");
    assert_eq!(upstream.effects("k-rec"), 1);

    // The upstream closes without doing anything: its reconcile says 404, the key is freed.
    let first = http
        .post_key(&gateway.url("/nothing"), "k-none", "pay 10")
        .await;
    assert_eq!(first.status, 502);
    let record = gateway.store.get(&record_key("k-none")).await.unwrap();
    assert_eq!(record.map(|r| r.state), Some(State::Unknown));
    let freed = common::eventually(Duration::from_secs(20), || async {
        gateway
            .store
            .get(&record_key("k-none"))
            .await
            .unwrap()
            .is_none()
    })
    .await;
    assert!(freed, "a 404 from reconcile did not free the key");
}

/// The gauges and counters of unknown outcomes: the route's lost answers, its unknown records
/// and the age of the oldest, and resolutions by way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcomes_are_counted_by_route_and_resolutions_by_way() {
    let upstream = EffectUpstream::start().await;
    let extra = "[[route]]\nname = \"metered\"\npath = \"/\"\n";
    let gateway = Gateway::start_with_metrics(
        &config(upstream.addr, extra),
        Some(common::metrics_recorder()),
    )
    .await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let series = |name: &str| format!("{name}{{route=\"metered\"}}");
    let first = http
        .post_key(&gateway.url("/reset"), "k-metered", "pay 10")
        .await;
    assert_eq!(first.status, 502);
    let (lost, text) = common::metric_value(
        &http,
        &admin,
        &series("idem_gateway_unknown_outcomes_total"),
    )
    .await;
    assert_eq!(lost, Some(1.0), "{text}");
    let (held, text) =
        common::metric_value(&http, &admin, &series("idem_gateway_unknown_records")).await;
    assert_eq!(held, Some(1.0), "{text}");
    assert!(
        text.contains("idem_gateway_oldest_unknown_seconds{route=\"metered\"}"),
        "{text}"
    );

    let url = format!("{admin}/api/keys/k-metered");
    let released = http
        .send(Method::POST, &url, &[], "{\"resolve\":\"release\"}")
        .await;
    assert_eq!(released.status, 200, "{}", released.text());
    let (held, text) =
        common::metric_value(&http, &admin, &series("idem_gateway_unknown_records")).await;
    assert_eq!(held, Some(0.0), "{text}");
    let way = "idem_gateway_unknown_resolutions_total{way=\"operator_released\"}";
    let (resolved, text) = common::metric_value(&http, &admin, way).await;
    assert!(resolved.is_some_and(|n| n >= 1.0), "{text}");
    // Freed: the next request with the key runs.
    let retry = http
        .post_key(&gateway.url("/ok"), "k-metered", "pay 10")
        .await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(upstream.effects("k-metered"), 2);
}

/// `kill -9` of the upstream mid-request, after it made the payment and before it answered:
/// the gateway's exchange breaks before any head, so the key is held as unknown; retries are
/// told so while the upstream is down. Once the upstream is back, the route's reconcile asks
/// it, and the retry gets the payment it reports, replayed: one payment in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_upstream_is_reconciled_once_it_is_back_and_pays_once() {
    let Some(mut upstream) = common::shared_store::FencedUpstream::start("unknown-kill") else {
        return;
    };
    let extra = "[[route]]\npath = \"/payments\"\nreconcile = \"/payments/by-key/{key}\"\n";
    let gateway = Gateway::start(&config(upstream.addr, extra)).await;
    let http = Http::new();
    let url = gateway.url("/payments?hang=1");
    let first = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move { http.post_key(&url, "order-9", "10 EUR").await })
    };
    let paid = common::eventually(Duration::from_secs(10), || async {
        upstream.payments("order-9").await.len() == 1
    })
    .await;
    assert!(paid, "the upstream never made the payment");
    upstream.kill();
    let first = first.await.unwrap();
    assert_eq!(first.status, 502, "{}", first.text());
    for _ in 0..5 {
        let retry = http.post_key(&url, "order-9", "10 EUR").await;
        assert_eq!(retry.status, 409, "{}", retry.text());
        assert!(retry.text().contains("outcome-unknown"), "{}", retry.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    upstream.restart();
    let replayed = common::eventually(Duration::from_secs(30), || async {
        let retry = http.post_key(&url, "order-9", "10 EUR").await;
        assert!(
            retry.status == 409 || retry.replayed(),
            "{}: {}",
            retry.status,
            retry.text()
        );
        retry.replayed()
    })
    .await;
    assert!(replayed, "the reconciled payment was never replayed");
    let retry = http.post_key(&url, "order-9", "10 EUR").await;
    assert!(
        retry.text().contains("\"reconciled\": true"),
        "{}",
        retry.text()
    );
    assert_eq!(upstream.payments("order-9").await.len(), 1);
}

/// An upstream that takes the connection and never reads the request: a body larger than the
/// socket buffers is never delivered whole, so the timeout is a request that never ran: 504,
/// the key released, the retry sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_read_the_body_releases_the_key() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    let extra = "[[route]]\npath = \"/\"\nrequest_body_limit = \"64MiB\"\n";
    let mut config = config(addr, extra);
    config.upstream.as_mut().unwrap().timeout = Duration::from_millis(500);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    let body = "x".repeat(48 << 20);
    for attempt in 1..=2 {
        let reply = http.post_key(&gateway.url("/big"), "k-unread", &body).await;
        assert_eq!(reply.status, 504, "attempt {attempt}: {}", reply.text());
        assert!(
            gateway
                .store
                .get(&record_key("k-unread"))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            attempt,
            "the retry was sent again"
        );
    }
}

/// A connection that is never made (a listener whose backlog is full drops the SYN, so the
/// connect waits past `timeout`, which is shorter than `connect_timeout` here) sent nothing,
/// an empty body included: 504, released, and the retry is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_never_made_releases_the_key_even_for_an_empty_body() {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    // Fill the backlog: connections the listener never accepts.
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(stream)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            fillers.push(stream);
        }
    }
    let mut config = config(addr, "");
    config.upstream.as_mut().unwrap().timeout = Duration::from_millis(300);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    for _ in 0..2 {
        let reply = http.post_key(&gateway.url("/ok"), "k-nowhere", "").await;
        assert_eq!(reply.status, 504, "{}", reply.text());
        assert!(
            gateway
                .store
                .get(&record_key("k-nowhere"))
                .await
                .unwrap()
                .is_none()
        );
    }
    drop(socket);
}

/// A client that gives up before the gateway's `timeout` does not keep its key from being
/// reconciled: the exchange runs on, loses its answer, and the route's reconcile settles the
/// key, with no retry to start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_client_gave_up_first_is_still_reconciled() {
    let upstream = EffectUpstream::start().await;
    let extra = "[[route]]\npath = \"/\"\nreconcile = \"/by-key/{key}\"\n";
    let mut config = config(upstream.addr, extra);
    config.upstream.as_mut().unwrap().timeout = Duration::from_secs(1);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    let headers = [("idempotency-key", "k-gone")];
    let url = gateway.url("/stall");
    let send = http.try_send(Method::POST, &url, &headers, "pay 10");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), send)
            .await
            .is_err()
    );
    let settled = common::eventually(Duration::from_secs(20), || async {
        let record = gateway.store.get(&record_key("k-gone")).await.unwrap();
        record.is_some_and(|r| r.state == State::Completed)
    })
    .await;
    assert!(settled, "the key was never reconciled");
    assert_eq!(upstream.effects("k-gone"), 1);
}
