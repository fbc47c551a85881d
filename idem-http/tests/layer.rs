//! The settings of the layer that the fixture does not exercise, on an axum app served on
//! 127.0.0.1:0 and called with a real HTTP client: optional keys, a store that is down (fail
//! closed and fail open), a panicking handler (and a streamed body that panics), bounded wait mode, strict keys, other scopes,
//! a replaced rejection, a small storage cap, stored 5xx, a status above 599, other methods,
//! the outcome in the response extensions, and the axum extractor.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::{post, put};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{ClaimOutcome, ClaimRequest, Record, RecordKey, Scope, Store};
use idem_http::{Config, ConfigBuilder, IdempotencyLayer, Outcome, Rejection, StoreFailure};
use idem_store_memory::MemoryStore;
use idem_testkit::faulty::FaultyStore;
use tower::ServiceExt;
use tower::util::MapResponseLayer;

/// A served app whose handlers count their executions.
struct App {
    counter: Arc<AtomicU64>,
    addr: std::net::SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    server: tokio::task::JoinHandle<()>,
    /// The app, to call in process ([`App::in_process`]) instead of over TCP.
    router: Router,
    in_process: bool,
}

impl Drop for App {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn outcome(&self) -> &str {
        self.header("x-outcome").unwrap_or("none")
    }
}

/// Copies the outcome from the response extensions into a header the client can see.
fn outcome_header(mut response: Response) -> Response {
    let outcome = response.extensions().get::<Outcome>().copied();
    let value = outcome.map_or("none", Outcome::as_str);
    response
        .headers_mut()
        .insert("x-outcome", HeaderValue::from_static(value));
    response
}

impl App {
    /// Serves `routes` (given the counter) behind the layer built from `config` over `store`.
    async fn serve(
        store: impl Store + 'static,
        config: ConfigBuilder,
        routes: impl FnOnce(Arc<AtomicU64>) -> Router,
    ) -> App {
        let counter = Arc::new(AtomicU64::new(0));
        let layer = IdempotencyLayer::with_config(store, config.build().unwrap());
        let app = routes(counter.clone())
            .layer(layer)
            .layer(MapResponseLayer::new(outcome_header));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        App {
            counter,
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
            server,
            router,
            in_process: false,
        }
    }

    /// Requests go to the app in process, not over TCP: a test on tokio's paused clock then
    /// never waits on a socket while the clock jumps ahead.
    fn in_process(mut self) -> App {
        self.in_process = true;
        self
    }

    /// A counting app: `POST /run` answers 200 `ran {n}` after `delay`.
    async fn counting(store: impl Store + 'static, config: ConfigBuilder) -> App {
        App::serve(store, config, |counter| {
            Router::new().route(
                "/run",
                post(move |body: Bytes| async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    let delay = std::str::from_utf8(&body).ok().and_then(|b| b.parse().ok());
                    if let Some(ms) = delay {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    format!("ran {n}")
                }),
            )
        })
        .await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let (parts, body) = if self.in_process {
            let request = request.map(axum::body::Body::new);
            let response = self.router.clone().oneshot(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        } else {
            let response = self.client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        };
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    async fn post(&self, key: Option<&str>, body: &str) -> Answer {
        let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
        self.send(Method::POST, "/run", &headers, body).await
    }

    fn count(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }
}

/// A store that is down.
/// A store that cannot be reached at the claim.
fn down_store() -> FaultyStore<MemoryStore> {
    let store = FaultyStore::new(MemoryStore::new());
    store.faults.claim_down.store(true, Ordering::SeqCst);
    store
}

#[tokio::test]
async fn an_optional_key_lets_keyless_requests_through() {
    let app = App::counting(MemoryStore::new(), Config::builder()).await;
    for _ in 0..2 {
        let answer = app.post(None, "").await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.outcome(), "bypassed");
    }
    assert_eq!(app.count(), 2, "nothing stored: both ran");
    let executed = app.post(Some("k"), "").await;
    assert_eq!(executed.outcome(), "executed");
    let replayed = app.post(Some("k"), "").await;
    assert_eq!(replayed.outcome(), "replayed");
    assert_eq!(replayed.body, executed.body);
    let mismatch = app.post(Some("k"), "1").await;
    assert_eq!(mismatch.outcome(), "mismatch");
    let rejected = app.post(Some(""), "").await;
    assert_eq!(rejected.outcome(), "rejected");
    assert_eq!(app.count(), 3);
}

#[tokio::test]
async fn a_store_that_is_down_is_503_and_the_handler_does_not_run() {
    let app = App::counting(down_store(), Config::builder()).await;
    let answer = app.post(Some("k"), "").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(answer.outcome(), "store_error");
    assert_eq!(app.count(), 0);
}

/// A claim granted by the store whose answer was lost (a timeout) is 503, and is then released
/// by the layer: a retry runs the handler within moments instead of meeting 409 for a whole
/// lease with nothing running.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_timed_out_is_released() {
    let store = FaultyStore::new(MemoryStore::new());
    store.faults.claim_lost_replies.store(1, Ordering::SeqCst);
    let faults = store.faults.clone();
    let app = App::counting(store, Config::builder()).await.in_process();
    let lost = app.post(Some("k"), "").await;
    assert_eq!(lost.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.count(), 0);
    let mut answer = app.post(Some("k"), "").await;
    for _ in 0..100 {
        if answer.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = app.post(Some("k"), "").await;
    }
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    assert_eq!(answer.outcome(), "executed");
    assert_eq!(app.count(), 1);
    assert_eq!(faults.releases.load(Ordering::SeqCst), 1);
}

/// A store that fails while the response is stored (a short outage after the handler ran)
/// does not leave the record in flight: the layer answers the client, keeps trying within the
/// lease, and a retry is then a replay, not a second execution.
#[tokio::test(start_paused = true)]
async fn a_completion_the_store_failed_is_retried_so_a_retry_is_a_replay() {
    let store = FaultyStore::new(MemoryStore::new());
    store.faults.complete_failures.store(3, Ordering::SeqCst);
    let app = App::counting(store, Config::builder()).await.in_process();
    let first = app.post(Some("k"), "").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.outcome(), "executed");
    let mut answer = app.post(Some("k"), "").await;
    for _ in 0..100 {
        if answer.outcome() == "replayed" {
            break;
        }
        // In flight while the layer retries the completion.
        assert_eq!(answer.status, StatusCode::CONFLICT, "{:?}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = app.post(Some("k"), "").await;
    }
    assert_eq!(answer.outcome(), "replayed");
    assert_eq!(answer.body, first.body);
    assert_eq!(app.count(), 1);
}

#[tokio::test]
async fn fail_open_runs_the_handler_and_marks_the_response() {
    let config = Config::builder().store_failure(StoreFailure::FailOpen);
    let app = App::counting(down_store(), config).await;
    let answer = app.post(Some("k"), "").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("idempotency-status"), Some("unrecorded"));
    assert_eq!(answer.outcome(), "store_error");
    assert_eq!(app.count(), 1);
}

/// A response body of 10 bytes announced, which fails instead of giving them.
struct BrokenBody;

impl http_body::Body for BrokenBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Err(std::io::Error::other("broken off"))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(10)
    }
}

/// A response whose body fails while the layer reads it to store it is 500
/// `ResponseBodyFailed` (not a handler panic's `HandlerFailed`). The handler answered, so its
/// effect may have happened: the key is held as unknown and a retry is 409 `OutcomeUnknown`,
/// never run again (before, the claim was released and the retry ran the effect twice); once
/// an operator releases it, the next request runs.
#[tokio::test]
async fn a_response_body_that_fails_is_500_and_holds_its_key_as_unknown() {
    let store = MemoryStore::new();
    let app = App::serve(store.clone(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Response::new(Body::new(BrokenBody))
            }),
        )
    })
    .await;
    let broken = app.post(Some("k"), "").await;
    assert_eq!(broken.status, StatusCode::INTERNAL_SERVER_ERROR);
    let body = String::from_utf8_lossy(&broken.body);
    assert!(body.contains("ResponseBodyFailed"), "{body}");
    for _ in 0..3 {
        let retry = app.post(Some("k"), "").await;
        assert_eq!(retry.status, StatusCode::CONFLICT);
        let text = String::from_utf8_lossy(&retry.body);
        assert!(
            text.contains("OutcomeUnknown") && text.contains("outcome-unknown"),
            "{text}"
        );
        assert_eq!(retry.header("retry-after"), Some("60"));
    }
    assert_eq!(app.count(), 1);
    let key = RecordKey::unscoped(idem_core::IdempotencyKey::new("k").unwrap());
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, idem_core::State::Unknown);
    store.resolve_released(&key, record.fence).await.unwrap();
    let _ = app.post(Some("k"), "").await;
    assert_eq!(app.count(), 2);
}

/// A handler that says its outcome is unknown (its own provider call timed out) has its
/// answer passed on, unstored, and its key held: retries are 409 until the hold ends, then
/// the next one runs.
#[tokio::test(start_paused = true)]
async fn a_handler_that_marks_its_outcome_unknown_holds_its_key() {
    use idem_core::{Clock, ManualClock, SystemClock};
    let clock = ManualClock::new(SystemClock.now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let config = Config::builder().unknown_hold(Some(Duration::from_secs(20)));
    let app = App::serve(store, config, |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let mut response = Response::new(Body::from(format!("provider timed out {n}")));
                *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
                response
                    .extensions_mut()
                    .insert(idem_http::OutcomeUnknown::new("the provider timed out"));
                response
            }),
        )
    })
    .await
    .in_process();
    let first = app.post(Some("k"), "").await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(first.body, "provider timed out 1");
    let retry = app.post(Some("k"), "").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(app.count(), 1);
    clock.advance(Duration::from_secs(21));
    let after = app.post(Some("k"), "").await;
    assert_eq!(after.body, "provider timed out 2");
    assert_eq!(app.count(), 2);
}

/// A streamed response body (no length announced) that sends a frame, then panics.
struct PanicsMidway {
    sent: bool,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for PanicsMidway {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if !self.sent {
            self.sent = true;
            // The rest is late: the layer answers with the head and streams the body.
            self.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))));
            let part = Bytes::from_static(b"part one;");
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(part))));
        }
        if let Some(pause) = self.pause.as_mut() {
            std::task::ready!(pause.as_mut().poll(cx));
        }
        panic!("the response body breaks (expected in this test)");
    }
}

/// A streamed response body that panicked after its first frame reached the client as a
/// complete 200 of that one frame (the end of a chunked body), while the claim was released:
/// the client had no way to know it should retry. It now breaks off, as it does without the
/// layer, and the retry runs the handler again.
#[tokio::test]
async fn a_streamed_body_that_panics_is_broken_off_not_cut_short() {
    let app = App::serve(MemoryStore::new(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Body::new(PanicsMidway {
                    sent: false,
                    pause: None,
                })
            }),
        )
    })
    .await;
    let request = || {
        Request::post(format!("http://{}/run", app.addr))
            .header("idempotency-key", "\"midway\"")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let response = app.client.request(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await;
    assert!(body.is_err(), "a complete-looking body: {body:?}");
    // The release is spawned by the claim's drop guard: give it a moment.
    let mut retry = app.client.request(request()).await.unwrap();
    for _ in 0..50 {
        if retry.status() != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = app.client.request(request()).await.unwrap();
    }
    assert_eq!(retry.status(), StatusCode::OK);
    assert!(retry.into_body().collect().await.is_err());
    assert_eq!(app.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_releases_its_claim() {
    let app = App::serve(MemoryStore::new(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("the first attempt fails (expected in this test)");
                }
                "second attempt"
            }),
        )
    })
    .await
    .in_process();
    let failed = app.post(Some("k"), "").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        failed.header("content-type"),
        Some("application/problem+json")
    );
    // The release is spawned by the claim's drop guard: give it a moment.
    let mut retry = app.post(Some("k"), "").await;
    for _ in 0..50 {
        if retry.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = app.post(Some("k"), "").await;
    }
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body, "second attempt");
    assert_eq!(app.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn wait_mode_answers_a_duplicate_with_the_replay() {
    let config = Config::builder().wait_for_in_flight(Duration::from_secs(5));
    let app = App::counting(MemoryStore::new(), config).await.in_process();
    let (first, duplicate) = tokio::join!(app.post(Some("k"), "400"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.post(Some("k"), "400").await
    });
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(duplicate.status, StatusCode::OK);
    assert_eq!(duplicate.header("idempotent-replayed"), Some("true"));
    assert_eq!(duplicate.body, first.body);
    assert_eq!(app.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_mode_is_bounded() {
    let config = Config::builder().wait_for_in_flight(Duration::from_millis(200));
    let app = App::counting(MemoryStore::new(), config).await.in_process();
    let (_, duplicate) = tokio::join!(app.post(Some("k"), "1000"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.post(Some("k"), "1000").await
    });
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(duplicate.header("retry-after").is_some());
    assert_eq!(duplicate.outcome(), "conflict");
}

#[tokio::test]
async fn strict_mode_refuses_bare_keys() {
    let app = App::counting(MemoryStore::new(), Config::builder().strict(true)).await;
    let bare = app.post(Some("k"), "").await;
    assert_eq!(bare.status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&bare.body).contains("sf-string"));
    assert_eq!(app.post(Some("\"k\""), "").await.status, StatusCode::OK);
    assert_eq!(app.count(), 1);
}

#[tokio::test]
async fn a_tenant_header_scopes_records() {
    let config = Config::builder().scope_by_header("x-tenant").unwrap();
    let app = App::counting(MemoryStore::new(), config).await;
    let as_tenant = |tenant: &'static str| {
        let app = &app;
        async move {
            let headers = [
                ("idempotency-key", "k"),
                ("x-tenant", tenant),
                ("authorization", "same"),
            ];
            app.send(Method::POST, "/run", &headers, "").await
        }
    };
    assert_eq!(as_tenant("a").await.body, "ran 1");
    assert_eq!(as_tenant("b").await.body, "ran 2");
    assert_eq!(as_tenant("a").await.body, "ran 1");
    assert_eq!(app.count(), 2);
}

/// A credential header named as the scope header is hashed, as the default scope is: no
/// credential is written to the store, and two credentials still see their own records.
#[tokio::test]
async fn a_credential_scope_header_is_hashed() {
    for name in ["Authorization", "proxy-authorization", "cookie"] {
        let store = MemoryStore::new();
        let config = Config::builder().scope_by_header(name).unwrap();
        let app = App::counting(store.clone(), config).await;
        let as_holder = |secret: &'static str| {
            let app = &app;
            async move {
                let headers = [("idempotency-key", "k"), (name, secret)];
                app.send(Method::POST, "/run", &headers, "").await
            }
        };
        assert_eq!(as_holder("Bearer s3cret-a").await.body, "ran 1");
        assert_eq!(as_holder("Bearer s3cret-b").await.body, "ran 2");
        assert_eq!(as_holder("Bearer s3cret-a").await.body, "ran 1");
        let page = store.scan(&idem_core::ScanQuery::all()).await.unwrap();
        assert_eq!(page.records.len(), 2, "{name}");
        for record in &page.records {
            let scope = record.key.scope.as_str();
            assert!(!scope.contains("s3cret"), "{name}: scope {scope:?}");
        }
    }
}

/// A scope header sent twice names no single principal (an application may read either
/// line): 400, and nothing runs.
#[tokio::test]
async fn a_scope_header_sent_twice_is_refused() {
    for (config, name) in [
        (Config::builder(), "authorization"),
        (
            Config::builder().scope_by_header("x-tenant").unwrap(),
            "x-tenant",
        ),
    ] {
        let app = App::counting(MemoryStore::new(), config).await;
        let headers = [("idempotency-key", "k"), (name, "alice"), (name, "bob")];
        let twice = app.send(Method::POST, "/run", &headers, "").await;
        assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{name}");
        assert!(String::from_utf8_lossy(&twice.body).contains("InvalidScope"));
        assert_eq!(app.count(), 0);
        let once = [("idempotency-key", "k"), (name, "alice")];
        assert_eq!(
            app.send(Method::POST, "/run", &once, "").await.body,
            "ran 1"
        );
    }
}

/// With another key header, the 400s name it.
#[tokio::test]
async fn key_rejections_name_the_configured_header() {
    let config = Config::builder()
        .header_name("X-Request-Id")
        .unwrap()
        .require_key();
    let app = App::counting(MemoryStore::new(), config).await;
    let missing = app.post(None, "").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    let body = String::from_utf8_lossy(&missing.body);
    assert!(body.contains("requires the X-Request-Id header"), "{body}");
    let headers = [("x-request-id", "")];
    let invalid = app.send(Method::POST, "/run", &headers, "").await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    let body = String::from_utf8_lossy(&invalid.body);
    assert!(body.contains("X-Request-Id: "), "{body}");
    assert!(!body.contains("Idempotency-Key"), "{body}");
}

#[tokio::test]
async fn a_closure_or_no_scope() {
    // No scope: two credentials share one namespace of keys.
    let app = App::counting(MemoryStore::new(), Config::builder().no_scope()).await;
    let with_auth = |auth: &'static str| {
        let app = &app;
        async move {
            let headers = [("idempotency-key", "k"), ("authorization", auth)];
            app.send(Method::POST, "/run", &headers, "").await
        }
    };
    assert_eq!(with_auth("a").await.body, "ran 1");
    assert_eq!(with_auth("b").await.body, "ran 1");
    // A closure: here the scope is the first path segment of a header, and a request without
    // it is refused.
    let config = Config::builder().scope_with(|parts| {
        let account = parts.headers.get("x-account")?.to_str().ok()?;
        Scope::new(account).ok()
    });
    let app = App::counting(MemoryStore::new(), config).await;
    let refused = app.post(Some("k"), "").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let headers = [("idempotency-key", "k"), ("x-account", "acct_1")];
    assert_eq!(
        app.send(Method::POST, "/run", &headers, "").await.status,
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn the_rejection_response_is_replaceable() {
    let config = Config::builder()
        .require_key()
        .rejection_handler(|rejection: &Rejection| {
            let mut response =
                http::Response::new(Bytes::from(format!("nope: {}", rejection.name())));
            *response.status_mut() = rejection.status();
            response
        });
    let app = App::counting(MemoryStore::new(), config).await.in_process();
    let missing = app.post(None, "").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.body, "nope: MissingKey");
    let (_, conflict) = tokio::join!(app.post(Some("k"), "300"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.post(Some("k"), "300").await
    });
    assert_eq!(conflict.body, "nope: InFlight");
    assert!(
        conflict.header("retry-after").is_some(),
        "the layer adds Retry-After"
    );
}

#[tokio::test]
async fn a_response_over_a_small_cap_is_stored_without_its_body() {
    let config = Config::builder().storage_cap(NonZeroUsize::new(64).unwrap());
    let app = App::serve(MemoryStore::new(), config, |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                // 300 bytes that do not compress to under 64.
                let body: Vec<u8> = (0..300u32).map(|i| (i * 7919 % 251) as u8).collect();
                (StatusCode::CREATED, [("x-kept", "yes")], body)
            }),
        )
    })
    .await;
    let first = app.post(Some("k"), "").await;
    assert_eq!(first.body.len(), 300);
    let retry = app.post(Some("k"), "").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotency-replay"), Some("omitted"));
    assert_eq!(retry.header("x-kept"), Some("yes"));
    assert!(retry.body.is_empty());
    assert_eq!(app.count(), 1);
}

#[tokio::test]
async fn server_errors_can_be_stored_the_stripe_way() {
    let config = Config::builder().store_server_errors(true);
    let app = App::serve(MemoryStore::new(), config, |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                (StatusCode::BAD_GATEWAY, "upstream failed")
            }),
        )
    })
    .await;
    assert_eq!(
        app.post(Some("k"), "").await.status,
        StatusCode::BAD_GATEWAY
    );
    let retry = app.post(Some("k"), "").await;
    assert_eq!(retry.status, StatusCode::BAD_GATEWAY);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.count(), 1);
}

/// A status HTTP does not define (600 to 999: `http` represents it, hyper sends it) is a server
/// error to the client (RFC 9110 section 15): it releases the key like a 5xx, so a retry runs,
/// and the Stripe switch stores it like a 5xx.
#[tokio::test]
async fn a_status_above_599_is_released_like_a_5xx() {
    let routes = |counter: Arc<AtomicU64>| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                (StatusCode::from_u16(600).unwrap(), "undefined")
            }),
        )
    };
    let app = App::serve(MemoryStore::new(), Config::builder(), routes).await;
    for _ in 0..2 {
        let answer = app.post(Some("k"), "").await;
        assert_eq!(answer.status.as_u16(), 600);
        assert_eq!(answer.header("idempotent-replayed"), None);
        assert_eq!(answer.outcome(), "executed");
    }
    assert_eq!(app.count(), 2, "a retry of a 600 runs again");
    let stripe = Config::builder().store_server_errors(true);
    let app = App::serve(MemoryStore::new(), stripe, routes).await;
    app.post(Some("k"), "").await;
    let retry = app.post(Some("k"), "").await;
    assert_eq!(retry.status.as_u16(), 600);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.count(), 1);
}

#[tokio::test]
async fn covered_methods_are_configurable() {
    let config = Config::builder().methods([Method::PUT]).require_key();
    let app = App::serve(MemoryStore::new(), config, |counter| {
        let again = counter.clone();
        Router::new()
                .route(
                    "/run",
                    put(move || async move {
                        format!("put {}", counter.fetch_add(1, Ordering::SeqCst))
                    }),
                )
                .route(
                    "/post",
                    post(move || async move {
                        format!("post {}", again.fetch_add(1, Ordering::SeqCst))
                    }),
                )
    })
    .await;
    assert_eq!(
        app.send(Method::PUT, "/run", &[], "").await.status,
        StatusCode::BAD_REQUEST
    );
    let key = [("idempotency-key", "k")];
    assert_eq!(app.send(Method::PUT, "/run", &key, "").await.body, "put 0");
    assert_eq!(app.send(Method::PUT, "/run", &key, "").await.body, "put 0");
    let post = app.send(Method::POST, "/post", &[], "").await;
    assert_eq!(post.status, StatusCode::OK);
    assert_eq!(post.outcome(), "bypassed");
}

#[tokio::test]
async fn a_covered_method_in_another_case_is_refused_never_run() {
    let app = App::serve(MemoryStore::new(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            axum::routing::any(move || async move {
                format!("ran {}", counter.fetch_add(1, Ordering::SeqCst) + 1)
            }),
        )
    })
    .await;
    let key = [("idempotency-key", "k")];
    for spelling in ["post", "Post", "pOST", "patch"] {
        let method = Method::from_bytes(spelling.as_bytes()).unwrap();
        let answer = app.send(method, "/run", &key, "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{spelling}");
        assert_eq!(answer.outcome(), "rejected");
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(
            body.contains("MethodCase") && body.contains(spelling),
            "{body}"
        );
    }
    assert_eq!(app.count(), 0);
    // The covered spelling runs once; a method no covered one spells passes through.
    assert_eq!(app.send(Method::POST, "/run", &key, "").await.body, "ran 1");
    assert_eq!(app.send(Method::POST, "/run", &key, "").await.body, "ran 1");
    let other = app
        .send(Method::from_bytes(b"purge").unwrap(), "/run", &[], "")
        .await;
    assert_eq!(other.outcome(), "bypassed");
    assert_eq!(app.count(), 2);
}

/// A key used through one host and then another is a 422, never the first host's response
/// (an upstream that serves tenants by host); with `fingerprint_host(false)`, a replay.
#[tokio::test]
async fn a_key_sent_to_another_host_is_a_mismatch_unless_hosts_are_not_fingerprinted() {
    for (fingerprinted, second) in [
        (true, StatusCode::UNPROCESSABLE_ENTITY),
        (false, StatusCode::OK),
    ] {
        let config = Config::builder().fingerprint_host(fingerprinted);
        let app = App::counting(MemoryStore::new(), config).await;
        let key = ("idempotency-key", "k");
        let first = app
            .send(Method::POST, "/run", &[key, ("host", "a.example")], "")
            .await;
        assert_eq!(first.status, StatusCode::OK);
        // Case does not make another host.
        let again = app
            .send(Method::POST, "/run", &[key, ("host", "A.example")], "")
            .await;
        assert_eq!(again.body, first.body);
        let other = app
            .send(Method::POST, "/run", &[key, ("host", "b.example")], "")
            .await;
        assert_eq!(other.status, second, "fingerprinted: {fingerprinted}");
        assert_eq!(app.count(), 1);
    }
}

#[tokio::test]
async fn a_handler_error_releases_the_claim() {
    use tower::{Service, ServiceExt, service_fn};

    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let inner = service_fn(move |_: Request<Full<Bytes>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err("the first call fails")
            } else {
                Ok(http::Response::new(Full::new(Bytes::from("ok"))))
            }
        }
    });
    let mut service = idem_http::Idempotency::new(inner, MemoryStore::new(), Config::default());
    let request = || {
        Request::post("/x")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = service.ready().await.unwrap().call(request()).await;
    assert_eq!(first.err(), Some("the first call fails"));
    let second = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(
        second.extensions().get::<Outcome>(),
        Some(&Outcome::Executed)
    );
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn the_axum_extractor_hands_over_key_and_fence() {
    use idem_http::IdempotencyContext;

    let app = App::serve(MemoryStore::new(), Config::builder(), |_| {
        Router::new()
            .route(
                "/run",
                post(|ctx: IdempotencyContext| async move {
                    format!("{} {} {}", ctx.key(), ctx.fence().get() > 0, ctx.attempt())
                }),
            )
            .route(
                "/optional",
                post(|ctx: Option<IdempotencyContext>| async move {
                    ctx.map_or("no key".to_owned(), |ctx| ctx.key().to_string())
                }),
            )
            .route(
                "/needs-key",
                post(|ctx: IdempotencyContext| async move { ctx.key().to_string() }),
            )
    })
    .await;
    assert_eq!(
        app.post(Some("\"order-7\""), "").await.body,
        "order-7 true 1"
    );
    let keyless = app.send(Method::POST, "/optional", &[], "").await;
    assert_eq!(keyless.body, "no key");
    // Without a key the context is missing: a problem+json 500, like every rejection.
    let missing = app.send(Method::POST, "/needs-key", &[], "").await;
    assert_eq!(missing.status, 500);
    assert_eq!(missing.headers["content-type"], "application/problem+json");
    let problem = String::from_utf8_lossy(&missing.body);
    assert!(
        problem.contains(r#""title":"Idempotency context missing""#),
        "{problem}"
    );
    let _ = Body::empty();
}

/// The fingerprint and record key of `POST /run` with an empty body and the key `k` sent to
/// `app`, as the layer computes them (no `Authorization`: no scope; the app's address as the
/// host).
fn run_key(app: &App) -> (RecordKey, idem_core::Fingerprint) {
    let uri: http::Uri = "/run".parse().unwrap();
    let host = app.addr.to_string();
    let fingerprint = idem_http::fingerprint::request_fingerprint_with_host(
        &Method::POST,
        &uri,
        Some(&host),
        b"",
    );
    let key = RecordKey::unscoped(idem_core::IdempotencyKey::new("k").unwrap());
    (key, fingerprint)
}

#[tokio::test]
async fn a_crashed_holders_claim_is_taken_over_after_its_lease() {
    use idem_core::{Clock, ManualClock, SystemClock};
    use idem_http::IdempotencyContext;

    let clock = ManualClock::new(SystemClock.now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let app = App::serve(store.clone(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            post(
                move |axum::Extension(ctx): axum::Extension<IdempotencyContext>| async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    format!("attempt {}", ctx.attempt())
                },
            ),
        )
    })
    .await;
    // Another process claimed the key, then died without settling it.
    let (key, fingerprint) = run_key(&app);
    let crashed = store
        .claim(&ClaimRequest::new(
            key,
            fingerprint,
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let ClaimOutcome::Acquired { lease: dead, .. } = crashed else {
        panic!("{crashed:?}")
    };
    // While its lease runs, retries wait.
    let conflict = app.post(Some("k"), "").await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    // Just claimed, no history: come back in a second.
    assert_eq!(conflict.header("retry-after"), Some("1"));
    // Once it lapses, the next request takes the key over, with a higher fence.
    clock.advance(Duration::from_secs(31));
    let taken = app.post(Some("k"), "").await;
    assert_eq!(taken.status, StatusCode::OK);
    assert_eq!(taken.body, "attempt 2");
    assert_eq!(app.count(), 1);
    // The dead holder can no longer settle the key.
    assert!(
        store
            .complete(&dead, Bytes::new(), Duration::from_secs(60))
            .await
            .is_err()
    );
    assert_eq!(app.post(Some("k"), "").await.body, "attempt 2");
}

#[tokio::test]
async fn an_unreadable_stored_response_is_500_and_never_a_panic() {
    use idem_core::{Clock, Fence, OwnerToken, State, SystemClock};

    let store = MemoryStore::new();
    let app = App::counting(store.clone(), Config::builder()).await;
    let (key, fingerprint) = run_key(&app);
    let now = SystemClock.now();
    store.put_raw(Record {
        key,
        state: State::Completed,
        fingerprint,
        owner: OwnerToken::random(),
        fence: Fence::new(7),
        lease_until: now,
        attempt: 1,
        created_at: now,
        completed_at: Some(now),
        expires_at: now.saturating_add(Duration::from_secs(3600)),
        result: Some(Bytes::from_static(b"not a stored response")),
        failure: None,
        unknown: None,
        hold_until: None,
    });
    let answer = app.post(Some("k"), "").await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(answer.outcome(), "store_error");
    assert_eq!(app.count(), 0);
}

/// A body of several frames and no known length: the layer streams it to the caller while it
/// captures it for the record.
struct Chunks(std::collections::VecDeque<&'static str>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(
            self.0
                .pop_front()
                .map(|chunk| Ok(http_body::Frame::data(Bytes::from_static(chunk.as_bytes())))),
        )
    }
}

#[tokio::test]
async fn a_streamed_response_of_unknown_length_is_stored_and_replayed() {
    let app = App::serve(MemoryStore::new(), Config::builder(), |counter| {
        Router::new().route(
            "/run",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let chunks = Chunks(["one,", "two,", "three"].into_iter().collect());
                (StatusCode::ACCEPTED, Body::new(chunks))
            }),
        )
    })
    .await;
    let first = app.post(Some("k"), "").await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(first.body, "one,two,three");
    assert!(
        first.header("content-length").is_none(),
        "streamed, not buffered"
    );
    let replay = app.post(Some("k"), "").await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, "one,two,three");
    assert_eq!(app.count(), 1);
}
