//! Against the real PostgreSQL server (`IDEM_TEST_POSTGRES_URL`, default
//! postgres@127.0.0.1:5432/test), one schema per test: what commits for every way a handler
//! ends, and that a duplicate is answered while the first request's transaction is open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, Response, StatusCode};
use idem_core::{IdempotencyKey, RecordKey, State, Store};
use idem_http::Config;
use idem_http_postgres::{PgIdempotencyLayer, Tx};
use idem_store_postgres::tokio_postgres;
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_testkit::probe::{require_tcp, service_url};
use tokio::sync::{Notify, oneshot};
use tower::ServiceExt;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// A guard against a hang (a duplicate queued behind a lock): never reached when it works.
const HANG: Duration = Duration::from_secs(20);

fn url() -> String {
    service_url("IDEM_TEST_POSTGRES_URL", DEFAULT_URL)
}

/// A store on a schema of its own with a `payments` table; the schema is dropped at the end.
struct Fixture {
    store: PostgresStore,
    schema: String,
}

impl Fixture {
    async fn new() -> Option<Fixture> {
        let config: tokio_postgres::Config = url().parse().unwrap();
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if !require_tcp("PostgreSQL", &format!("{host}:{port}")) {
            return None;
        }
        let schema = format!("idem_hpg_{:016x}", rand::random::<u64>());
        let store = Self::connect(&schema).await;
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE {schema}.payments (key text NOT NULL, amount text NOT NULL)"
            ))
            .await
            .unwrap();
        Some(Fixture { store, schema })
    }

    async fn connect(schema: &str) -> PostgresStore {
        PostgresStore::connect(
            PostgresConfig::new(&url())
                .unwrap()
                .with_schema(schema)
                .unwrap()
                .with_op_timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap()
    }

    fn insert(&self) -> &'static str {
        format!("INSERT INTO {}.payments VALUES ($1, $2)", self.schema).leak()
    }

    async fn payments(&self, key: &str) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        let sql = format!(
            "SELECT count(*) FROM {}.payments WHERE key = $1",
            self.schema
        );
        client.query_one(&sql, &[&key]).await.unwrap().get(0)
    }

    async fn state(&self, key: &str) -> Option<State> {
        let key = RecordKey::unscoped(IdempotencyKey::new(key).unwrap());
        self.store.get(&key).await.unwrap().map(|r| r.state)
    }

    async fn drop_schema(self) {
        let client = self.store.pool().get().await.unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .unwrap();
    }
}

fn config() -> Config {
    Config::builder()
        .require_key()
        .no_scope()
        .lease(Duration::from_secs(3))
        .build()
        .unwrap()
}

fn pay(key: &str) -> Request<Body> {
    Request::post("/pay")
        .header("Idempotency-Key", key)
        .body(Body::from("10 EUR"))
        .unwrap()
}

async fn body(response: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The handler every test uses: INSERTs the payment in its transaction, then answers what
/// `answer` says for this call (calls counted from 0).
fn app(
    store: &PostgresStore,
    config: Config,
    insert: &'static str,
    answer: Arc<dyn Fn(usize) -> StatusCode + Send + Sync>,
    calls: Arc<AtomicUsize>,
) -> Router {
    let handler = move |tx: Tx, headers: http::HeaderMap, amount: String| {
        let answer = answer.clone();
        let calls = calls.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            tx.execute(insert, &[&key, &amount]).await.unwrap();
            let call = calls.fetch_add(1, Ordering::SeqCst);
            let status = answer(call);
            (status, format!("paid {amount} (call {call})"))
        }
    };
    Router::new()
        .route("/pay", post(handler))
        .layer(PgIdempotencyLayer::new(store.clone(), config))
}

#[tokio::test]
async fn the_payment_and_its_response_commit_together_and_a_retry_replays_it() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        &fx.store,
        config(),
        fx.insert(),
        Arc::new(|_| StatusCode::CREATED),
        calls.clone(),
    );
    let first = app.clone().oneshot(pay("ok-1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = body(first).await;
    assert_eq!(fx.state("ok-1").await, Some(State::Completed));
    let retry = app.clone().oneshot(pay("ok-1")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(body(retry).await, first);
    assert_eq!(fx.payments("ok-1").await, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Without a key there is no claim, hence no transaction: 400 (the key is required).
    let keyless = Request::post("/pay").body(Body::from("1")).unwrap();
    assert_eq!(
        app.oneshot(keyless).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    fx.drop_schema().await;
}

#[tokio::test]
async fn a_status_that_is_not_stored_rolls_the_payment_back_and_gives_the_key_back() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let answer = |call| match call {
        0 => StatusCode::SERVICE_UNAVAILABLE,
        1 => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::CREATED,
    };
    let app = app(
        &fx.store,
        config(),
        fx.insert(),
        Arc::new(answer),
        calls.clone(),
    );
    for expected in [
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let response = app.clone().oneshot(pay("status-1")).await.unwrap();
        assert_eq!(response.status(), expected);
        assert_eq!(fx.payments("status-1").await, 0, "rolled back");
        assert_ne!(
            fx.state("status-1").await,
            Some(State::InFlight),
            "released"
        );
    }
    let done = app.clone().oneshot(pay("status-1")).await.unwrap();
    assert_eq!(done.status(), StatusCode::CREATED);
    assert_eq!(fx.payments("status-1").await, 1);
    fx.drop_schema().await;
}

#[tokio::test]
async fn a_panicking_handler_rolls_back_and_a_retry_pays_once() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let answer = |call| {
        if call == 0 {
            panic!("the handler fails after its INSERT");
        }
        StatusCode::OK
    };
    let app = app(
        &fx.store,
        config(),
        fx.insert(),
        Arc::new(answer),
        calls.clone(),
    );
    let failed = app.clone().oneshot(pay("panic-1")).await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(fx.payments("panic-1").await, 0);
    // The layer releases the key in a task of its own: a retry may see it in flight a moment.
    let done = loop {
        let response = app.clone().oneshot(pay("panic-1")).await.unwrap();
        if response.status() != StatusCode::CONFLICT {
            break response;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done.status(), StatusCode::OK);
    assert_eq!(fx.payments("panic-1").await, 1);
    fx.drop_schema().await;
}

/// A handler that INSERTs, then tells the test it did and waits to be let go.
fn blocking_app(
    store: &PostgresStore,
    config: Config,
    insert: &'static str,
    inside: Arc<std::sync::Mutex<Option<oneshot::Sender<()>>>>,
    go: Arc<Notify>,
) -> Router {
    let handler = move |tx: Tx, amount: String| {
        let inside = inside.clone();
        let go = go.clone();
        async move {
            tx.execute(insert, &[&"dup-1", &amount]).await.unwrap();
            let first = inside.lock().unwrap().take();
            if let Some(inside) = first {
                let _ = inside.send(());
                go.notified().await;
            }
            (StatusCode::CREATED, "paid")
        }
    };
    Router::new()
        .route("/pay", post(handler))
        .layer(PgIdempotencyLayer::new(store.clone(), config))
}

#[tokio::test]
async fn a_duplicate_gets_409_at_once_while_the_first_transaction_is_open() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let (inside_tx, inside) = oneshot::channel();
    let go = Arc::new(Notify::new());
    let app = blocking_app(
        &fx.store,
        config(),
        fx.insert(),
        Arc::new(std::sync::Mutex::new(Some(inside_tx))),
        go.clone(),
    );
    let first = tokio::spawn(app.clone().oneshot(pay("dup-1")));
    inside.await.unwrap();
    // The first handler holds its transaction open: the duplicate is answered anyway.
    let duplicate = tokio::time::timeout(HANG, app.clone().oneshot(pay("dup-1")))
        .await
        .expect("the duplicate queued behind the first request's transaction")
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert!(duplicate.headers().contains_key("retry-after"));
    go.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let replay = app.oneshot(pay("dup-1")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(fx.payments("dup-1").await, 1);
    fx.drop_schema().await;
}

#[tokio::test]
async fn in_wait_mode_a_duplicate_waits_for_the_committed_answer() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let (inside_tx, inside) = oneshot::channel();
    let go = Arc::new(Notify::new());
    let config = Config::builder()
        .require_key()
        .no_scope()
        .lease(Duration::from_secs(3))
        .wait_for_in_flight(Duration::from_secs(10))
        .build()
        .unwrap();
    let app = blocking_app(
        &fx.store,
        config,
        fx.insert(),
        Arc::new(std::sync::Mutex::new(Some(inside_tx))),
        go.clone(),
    );
    let first = tokio::spawn(app.clone().oneshot(pay("dup-1")));
    inside.await.unwrap();
    // The duplicate polls the committed claim while the first transaction is open.
    let duplicate = tokio::spawn(app.clone().oneshot(pay("dup-1")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!duplicate.is_finished(), "the duplicate waits");
    go.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let duplicate = tokio::time::timeout(HANG, duplicate)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CREATED);
    assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
    assert_eq!(fx.payments("dup-1").await, 1);
    fx.drop_schema().await;
}

#[tokio::test]
async fn a_stale_attempt_whose_lease_was_taken_over_rolls_back() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let (inside_tx, entered) = oneshot::channel();
    let go = Arc::new(Notify::new());
    let inside = Arc::new(std::sync::Mutex::new(Some(inside_tx)));
    let stale = blocking_app(&fx.store, config(), fx.insert(), inside.clone(), go.clone());
    // A second instance whose clock is an hour ahead: the first's lease has lapsed for it.
    let ahead = Fixture::connect(&fx.schema).await;
    ahead.advance_clock(Duration::from_secs(3600));
    let takeover = blocking_app(&ahead, config(), fx.insert(), inside, go.clone());
    let first = tokio::spawn(stale.clone().oneshot(pay("dup-1")));
    entered.await.unwrap();
    let taken = tokio::time::timeout(HANG, takeover.clone().oneshot(pay("dup-1")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.status(), StatusCode::CREATED);
    assert_eq!(fx.payments("dup-1").await, 1);
    // The stale attempt answers now: its compare-and-set fails, and its INSERT rolls back.
    go.notify_one();
    let stale = first.await.unwrap().unwrap();
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    assert!(body(stale).await.contains("Claim lost"));
    assert_eq!(fx.payments("dup-1").await, 1);
    let replay = takeover.oneshot(pay("dup-1")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    fx.drop_schema().await;
}

#[tokio::test]
async fn a_commit_without_an_answer_is_reported_and_left_to_the_lease() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let schema = &fx.schema;
    // A deferred trigger that makes the first commit slower than the commit timeout.
    fx.store
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {schema}.slow (on_ boolean);
             INSERT INTO {schema}.slow VALUES (true);
             CREATE FUNCTION {schema}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM {schema}.slow) THEN PERFORM pg_sleep(1.5); END IF;
                 RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON {schema}.payments
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.slow_commit();"
        ))
        .await
        .unwrap();
    let config = Config::builder()
        .require_key()
        .no_scope()
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let insert = fx.insert();
    let handler = move |tx: Tx, amount: String| async move {
        tx.execute(insert, &[&"slow-1", &amount]).await.unwrap();
        (StatusCode::CREATED, format!("paid {amount}"))
    };
    let layer = PgIdempotencyLayer::with_commit_timeout(
        fx.store.clone(),
        config,
        Duration::from_millis(300),
    );
    let app = Router::new().route("/pay", post(handler)).layer(layer);
    let unknown = app.clone().oneshot(pay("slow-1")).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(unknown.headers()["retry-after"], "2");
    assert!(body(unknown).await.contains("Commit outcome unknown"));
    fx.store
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!("DELETE FROM {schema}.slow"))
        .await
        .unwrap();
    // Retries get 409 while the key is left to the lease, then the committed answer.
    let mut conflicts = 0;
    let done = loop {
        let response = tokio::time::timeout(HANG, app.clone().oneshot(pay("slow-1")))
            .await
            .unwrap()
            .unwrap();
        if response.status() != StatusCode::CONFLICT {
            break response;
        }
        conflicts += 1;
        assert!(conflicts < 200, "the key stayed blocked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done.status(), StatusCode::CREATED);
    assert_eq!(done.headers()["idempotent-replayed"], "true");
    assert_eq!(fx.payments("slow-1").await, 1);
    fx.drop_schema().await;
}

/// 16 tasks send each of 100 keys (in their own orders) until answered: one payment per key,
/// every answer of a key its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_16_tasks_on_100_keys_pay_each_key_once() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    const KEYS: usize = 100;
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        &fx.store,
        config(),
        fx.insert(),
        Arc::new(|_| StatusCode::CREATED),
        calls.clone(),
    );
    let mut tasks = Vec::new();
    for task in 0..16 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..KEYS {
                let key = format!("hammer-{}", (i * 7 + task * 13) % KEYS);
                loop {
                    let response = app.clone().oneshot(pay(&key)).await.unwrap();
                    if response.status() == StatusCode::CONFLICT {
                        tokio::time::sleep(Duration::from_millis(rand::random_range(1..10))).await;
                        continue;
                    }
                    assert_eq!(response.status(), StatusCode::CREATED);
                    answers.push((key.clone(), body(response).await));
                    break;
                }
            }
            answers
        }));
    }
    let mut first = std::collections::HashMap::new();
    for task in tasks {
        for (key, answer) in task.await.unwrap() {
            let first = first.entry(key).or_insert_with(|| answer.clone());
            assert_eq!(*first, answer, "an answer differed from its key's first");
        }
    }
    assert_eq!(first.len(), KEYS);
    assert_eq!(calls.load(Ordering::SeqCst), KEYS, "one execution per key");
    let client = fx.store.pool().get().await.unwrap();
    let sql = format!(
        "SELECT count(*), count(DISTINCT key) FROM {}.payments",
        fx.schema
    );
    let row = client.query_one(&sql, &[]).await.unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (KEYS as i64, KEYS as i64)
    );
    drop(client);
    fx.drop_schema().await;
}

/// The plain tower way: a `service_fn` takes its `Tx` out of the request's extensions. A copy
/// kept past the answer (moved into a task) rolls the transaction back: 500, nothing paid.
#[tokio::test]
async fn a_plain_tower_service_takes_its_tx_from_the_extensions() {
    let Some(fx) = Fixture::new().await else {
        return;
    };
    let insert = fx.insert();
    let (release_leak, leaked) = tokio::sync::watch::channel(false);
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let mut leaked = leaked.clone();
        async move {
            let tx = request.extensions_mut().remove::<Tx>().unwrap();
            let key = request.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_owned();
            tx.execute(insert, &[&key, &"1"]).await.unwrap();
            if key == "leak-1" {
                // Keeps a copy of the transaction past the answer.
                tokio::spawn(async move {
                    let _ = leaked.wait_for(|go| *go).await;
                    drop(tx);
                });
            }
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("paid")))
        }
    });
    let app = tower::ServiceBuilder::new()
        .layer(PgIdempotencyLayer::new(fx.store.clone(), config()))
        .service(service);
    let paid = app.clone().oneshot(pay("plain-1")).await.unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
    assert_eq!(fx.payments("plain-1").await, 1);
    let kept = app.clone().oneshot(pay("leak-1")).await.unwrap();
    assert_eq!(kept.status(), StatusCode::INTERNAL_SERVER_ERROR);
    release_leak.send(true).unwrap();
    // The kept copy goes back to the pool once dropped: no connection of the pool may still be
    // in that transaction (its INSERT would commit with the next user's work).
    let pool = fx.store.pool();
    let mut open = 1;
    for _ in 0..200 {
        let size = pool.status().max_size;
        let mut clients = Vec::new();
        for _ in 0..size {
            clients.push(pool.get().await.unwrap());
        }
        open = 0;
        for client in &clients {
            let row = client
                .query_one("SELECT txid_current_if_assigned() IS NOT NULL", &[])
                .await
                .unwrap();
            open += usize::from(row.get::<_, bool>(0));
        }
        if open == 0 {
            break;
        }
        drop(clients);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        open, 0,
        "a pooled connection is still in the kept transaction"
    );
    assert_eq!(fx.payments("leak-1").await, 0);
    fx.drop_schema().await;
}
