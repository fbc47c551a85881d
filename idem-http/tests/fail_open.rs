//! Fail-open over a real Redis whose connection is cut: the store is reached through a TCP
//! relay the test closes, so the layer meets a store that went down under it. The handler runs,
//! its response is marked (also the 500 of a handler that panics), and a handler that asks for
//! the `IdempotencyContext` learns why it has none.
#![cfg(feature = "axum")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_http::{Config, IdempotencyContext, IdempotencyLayer, Outcome, StoreFailure};
use idem_store_redis::{RedisConfig, RedisStore};
use idem_testkit::probe::{require_tcp, service_url};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// A TCP relay on 127.0.0.1:0 to `target`, until [`Relay::cut`] closes its port and every
/// connection through it.
struct Relay {
    addr: std::net::SocketAddr,
    accept: JoinHandle<()>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn to(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let links = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let links = links.clone();
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        return;
                    };
                    let target = target.clone();
                    let link = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Relay {
            addr,
            accept,
            links,
        }
    }

    /// Closes the port (the listener is dropped with its task) and every connection.
    fn cut(&self) {
        self.accept.abort();
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// `host:port` of a `redis://host:port` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

fn keyed(path: &str, key: &str) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
}

/// A handler that extracts the `IdempotencyContext` got a 500 in fail-open mode whose detail
/// said the route was not behind the layer or the request had no key, though it was and had
/// one: the docs of fail-open and of the extractor did not say that a request run unrecorded
/// carries no context. The 500 now says so, and `Option<IdempotencyContext>` runs the handler.
#[tokio::test]
async fn fail_open_runs_the_handler_without_a_context_and_says_so() {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let target = host_port(&url);
    if !require_tcp("Redis", &target) {
        return;
    }
    let relay = Relay::to(target).await;
    let namespace = format!("idem-http-fail-open-{}", std::process::id());
    let config = RedisConfig::new(format!("redis://{}", relay.addr))
        .unwrap()
        .with_namespace(namespace)
        .unwrap();
    let direct = RedisConfig::new(url.clone())
        .unwrap()
        .with_namespace(config.namespace())
        .unwrap();
    let store = RedisStore::connect(config).await.unwrap();
    let layer = IdempotencyLayer::with_config(
        store,
        Config::builder()
            .store_failure(StoreFailure::FailOpen)
            .build()
            .unwrap(),
    );
    let app = Router::new()
        .route(
            "/context",
            post(|ctx: IdempotencyContext| async move { ctx.key().to_string() }),
        )
        .route(
            "/optional",
            post(|ctx: Option<IdempotencyContext>| async move {
                ctx.map_or("unrecorded".to_owned(), |ctx| ctx.key().to_string())
            }),
        )
        .route(
            "/panics",
            post(|| async {
                panic!("the handler fails (expected in this test)");
                #[allow(unreachable_code)]
                ""
            }),
        )
        .layer(layer);
    let key = format!("fail-open-{}", std::process::id());

    // The store answers: the context is there.
    let recorded = app.clone().oneshot(keyed("/context", &key)).await.unwrap();
    assert_eq!(recorded.status(), StatusCode::OK);
    let body = recorded.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, key.as_str());

    relay.cut();
    let other = format!("{key}-down");
    let unrecorded = app
        .clone()
        .oneshot(keyed("/optional", &other))
        .await
        .unwrap();
    assert_eq!(unrecorded.status(), StatusCode::OK);
    assert_eq!(unrecorded.headers()["idempotency-status"], "unrecorded");
    assert_eq!(
        unrecorded.extensions().get::<Outcome>(),
        Some(&Outcome::StoreError)
    );
    let body = unrecorded.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "unrecorded");

    let refused = app
        .clone()
        .oneshot(keyed("/context", &other))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(refused.headers()["idempotency-status"], "unrecorded");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem = String::from_utf8_lossy(&body);
    assert!(problem.contains("fail open"), "{problem}");
    assert!(problem.contains("Option<IdempotencyContext>"), "{problem}");

    // A handler that panics while it runs unrecorded: its 500 is marked like any answer.
    let panicked = app.clone().oneshot(keyed("/panics", &other)).await.unwrap();
    assert_eq!(panicked.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(panicked.headers()["idempotency-status"], "unrecorded");
    assert_eq!(
        panicked.extensions().get::<Outcome>(),
        Some(&Outcome::StoreError)
    );

    // Clean up the one record written while the store answered.
    let direct = RedisStore::connect(direct).await.unwrap();
    let recorded = RecordKey::unscoped(IdempotencyKey::new(&key).unwrap());
    assert!(direct.delete(&recorded).await.unwrap());
}
