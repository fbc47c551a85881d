//! Exactly once over HTTP, under `kill -9`.
//!
//! A server process (this test binary, run as its own ignored child test) serves an axum app
//! whose handler INSERTs a payment into PostgreSQL and answers its id. A client sends 1,000
//! keyed requests with retries: one key in seven is sent twice at once, one in ten is slow
//! and its first attempt times out and is retried, one in five is sent again once answered (a
//! replay). Meanwhile the server is killed with `kill -9` at random moments and restarted,
//! until every key has a 2xx. Each mode prints one line:
//! `http-crash mode=NAME keys=N effects=E doubled=D lost=L kills=K`.
//!
//! - `tx` (idem-http-postgres): the handler's INSERT and the stored response commit in one
//!   transaction, so no kill doubles or loses a payment, and every answer of a key is the
//!   first (asserted).
//! - `plain` (idem-http's layer on the PostgreSQL store): the INSERT commits on its own, and a
//!   kill between it and the stored response leaves an in-flight record whose lease lapses:
//!   the retry pays again. Its doubled payments are printed (they depend on where the kills
//!   land), not asserted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::collections::HashMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use idem_crashtest::EffectCounts;
use idem_http::{Config, IdempotencyLayer};
use idem_http_postgres::{PgIdempotencyLayer, Tx};
use idem_store_postgres::deadpool_postgres::Object;
use idem_store_postgres::{PostgresConfig, PostgresStore};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{TestSchema, connect, postgres_up, runtime, spawn_child, url};

const KEYS: usize = 1_000;
/// Requests in flight at once.
const CLIENTS: usize = 16;
/// Restarts allowed before the test gives up.
const MAX_RUNS: usize = 500;
/// Short, so a killed server's claims lapse quickly.
const LEASE: Duration = Duration::from_secs(1);
/// How long a client waits for an answer; a slow key's handler takes longer.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(700);
const SLOW_HANDLER: Duration = Duration::from_millis(300);

const ENV_MODE: &str = "IDEM_HTTP_CRASH_MODE";
const ENV_SCHEMA: &str = "IDEM_HTTP_CRASH_SCHEMA";

/// A schema of the test's own, with the store's table and the payments.
fn test_schema() -> TestSchema {
    let schema = TestSchema::create(
        "idem_http_crash",
        "CREATE TABLE {schema}.payments (id bigserial PRIMARY KEY, key text NOT NULL)",
    );
    let config = PostgresConfig::new(&url())
        .unwrap()
        .with_schema(&schema.0)
        .unwrap();
    runtime()
        .block_on(idem_store_postgres::migrate(&config))
        .unwrap();
    schema
}

/// The key of request `n`, and whether its handler is slow.
fn key(n: usize) -> String {
    format!("pay-{n}")
}

fn is_slow(key: &str) -> bool {
    key.strip_prefix("pay-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n % 10 == 3)
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The payment of the request's key on `client` (slowly for a slow key), answered with its id.
async fn pay_on(client: &Object, insert: &str, headers: &HeaderMap) -> (StatusCode, String) {
    let key = key_of(headers);
    if is_slow(&key) {
        tokio::time::sleep(SLOW_HANDLER).await;
    }
    match client.query_one(insert, &[&key]).await {
        Ok(row) => (
            StatusCode::CREATED,
            format!("{key} paid as {}", row.get::<_, i64>(0)),
        ),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
    }
}

/// The server: the app of `mode` on an ephemeral port, printed as `READY <port>`.
#[test]
#[ignore = "the child process of the HTTP crash tests"]
fn child_server_of_the_http_crash_test() {
    let (Ok(mode), Ok(schema)) = (std::env::var(ENV_MODE), std::env::var(ENV_SCHEMA)) else {
        return;
    };
    runtime().block_on(async {
        let store = PostgresStore::connect(
            PostgresConfig::new(&url())
                .unwrap()
                .with_schema(&schema)
                .unwrap()
                .with_migrate_on_connect(false),
        )
        .await
        .unwrap();
        let config = Config::builder()
            .require_key()
            .no_scope()
            .lease(LEASE)
            .build()
            .unwrap();
        let insert: &'static str =
            format!("INSERT INTO {schema}.payments (key) VALUES ($1) RETURNING id").leak();
        let app = if mode == "tx" {
            // The INSERT in the transaction that records the response.
            let pay = move |tx: Tx, headers: HeaderMap| async move {
                pay_on(&tx, insert, &headers).await
            };
            Router::new()
                .route("/pay", post(pay))
                .layer(PgIdempotencyLayer::new(store, config))
        } else {
            // The INSERT commits on its own; the layer stores the response after it.
            let pool = store.pool().clone();
            let pay = move |headers: HeaderMap| {
                let pool = pool.clone();
                async move {
                    match pool.get().await {
                        Ok(client) => pay_on(&client, insert, &headers).await,
                        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
                    }
                }
            };
            Router::new()
                .route("/pay", post(pay))
                .layer(IdempotencyLayer::with_config(store, config))
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("READY {}", listener.local_addr().unwrap().port());
        axum::serve(listener, app).await.unwrap();
    });
}

/// What the client saw of one request: a status and a body, or no answer.
async fn send(port: u16, key: &str, timeout: Duration) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!(
            "POST /pay HTTP/1.1\r\nHost: crash\r\nIdempotency-Key: {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let answer = String::from_utf8(answer).ok()?;
        let status = answer.get(9..12)?.parse().ok()?;
        let (_, body) = answer.split_once("\r\n\r\n")?;
        Some((status, body.to_owned()))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// What the client learned.
#[derive(Default)]
struct Answers {
    /// The first 2xx body of each key.
    first: HashMap<String, String>,
    /// 2xx answers that differ from their key's first.
    differing: usize,
    /// Requests retried after a timeout.
    timeouts: usize,
}

impl Answers {
    fn record(&mut self, key: &str, body: String) {
        match self.first.get(key) {
            Some(first) if *first != body => self.differing += 1,
            Some(_) => {}
            None => {
                self.first.insert(key.to_owned(), body);
            }
        }
    }
}

/// Sends `key` until it gets a 2xx, through restarts of the server; records every 2xx.
async fn until_answered(
    port: &AtomicU16,
    answers: &Mutex<Answers>,
    key: &str,
    first_timeout: Duration,
) {
    let mut timeout = first_timeout;
    loop {
        let current = port.load(Ordering::SeqCst);
        if current == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        match send(current, key, timeout).await {
            Some((status, body)) if (200..300).contains(&status) => {
                answers.lock().unwrap().record(key, body);
                return;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            None => {
                answers.lock().unwrap().timeouts += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        timeout = CLIENT_TIMEOUT.max(LEASE + SLOW_HANDLER);
    }
}

/// The client: every key until it has a 2xx (duplicates, timeouts and replays as described
/// in the module documentation).
async fn client(port: Arc<AtomicU16>) -> Answers {
    let answers = Arc::new(Mutex::new(Answers::default()));
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (port, answers, next) = (port.clone(), answers.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= KEYS {
                    return;
                }
                let key = key(n);
                // A slow key's first attempt times out, and is retried.
                let first = if is_slow(&key) {
                    SLOW_HANDLER / 3
                } else {
                    CLIENT_TIMEOUT
                };
                if n % 7 == 0 {
                    tokio::join!(
                        until_answered(&port, &answers, &key, first),
                        until_answered(&port, &answers, &key, first),
                    );
                } else {
                    until_answered(&port, &answers, &key, first).await;
                }
                if n % 5 == 0 {
                    until_answered(&port, &answers, &key, CLIENT_TIMEOUT).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    Arc::try_unwrap(answers).ok().unwrap().into_inner().unwrap()
}

/// A server of `mode`, and the port it serves on once it is ready.
fn spawn_server(mode: &str, schema: &str) -> (Child, mpsc::Receiver<u16>) {
    let envs = [(ENV_MODE, mode), (ENV_SCHEMA, schema)];
    let (child, lines) = spawn_child("child_server_of_the_http_crash_test", &envs);
    let (ports, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines {
            if let Some(port) = line
                .split("READY ")
                .nth(1)
                .and_then(|p| p.trim().parse().ok())
            {
                let _ = ports.send(port);
            }
        }
    });
    (child, received)
}

/// Runs the client against servers killed at random moments; returns the answers and the
/// number of kills.
fn run_with_kills(mode: &str, schema: &str) -> (Answers, usize) {
    let port = Arc::new(AtomicU16::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let client = {
        let (port, done) = (port.clone(), done.clone());
        std::thread::spawn(move || {
            let answers = runtime().block_on(client(port));
            done.store(true, Ordering::SeqCst);
            answers
        })
    };
    let mut rng = rand::rng();
    // A run the client was not done by counts as a kill (the last one ends with a kill too).
    for kills in 0..MAX_RUNS {
        let (mut child, ports) = spawn_server(mode, schema);
        let Ok(served) = ports.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("the server did not start");
        };
        port.store(served, Ordering::SeqCst);
        let run_for = Duration::from_millis(rng.random_range(100..800));
        let step = Duration::from_millis(10);
        let mut ran = Duration::ZERO;
        while ran < run_for && !done.load(Ordering::SeqCst) {
            std::thread::sleep(step);
            ran += step;
        }
        port.store(0, Ordering::SeqCst);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if done.load(Ordering::SeqCst) {
            return (client.join().unwrap(), kills);
        }
    }
    panic!("the client was not done after {MAX_RUNS} runs");
}

/// Payments per key, and the ids of the payments.
fn payments(schema: &str) -> (Vec<u64>, HashMap<String, Vec<i64>>) {
    runtime().block_on(async {
        let rows = connect()
            .await
            .query(&format!("SELECT key, id FROM {schema}.payments"), &[])
            .await
            .unwrap();
        let mut ids: HashMap<String, Vec<i64>> = HashMap::new();
        for row in rows {
            ids.entry(row.get(0)).or_default().push(row.get(1));
        }
        let per_key = (0..KEYS)
            .map(|n| ids.get(&key(n)).map_or(0, |ids| ids.len() as u64))
            .collect();
        (per_key, ids)
    })
}

/// Runs `mode` to the end with kills, prints its line, and answers its counts.
fn demonstrate(mode: &str) -> (EffectCounts, usize, Answers) {
    let schema = test_schema();
    let (answers, kills) = run_with_kills(mode, &schema.0);
    let (per_key, ids) = payments(&schema.0);
    let counts = EffectCounts::from_per_job(&per_key);
    // Lost: a key answered 2xx whose answered payment is not in the table.
    let lost = (0..KEYS)
        .filter(|&n| {
            let key = key(n);
            let answered = answers.first.get(&key).and_then(|body| {
                body.rsplit_once(" paid as ")
                    .and_then(|(_, id)| id.trim().parse::<i64>().ok())
            });
            !answered.is_some_and(|id| ids.get(&key).is_some_and(|ids| ids.contains(&id)))
        })
        .count();
    let effects: u64 = per_key.iter().sum();
    println!(
        "http-crash mode={mode} keys={KEYS} effects={effects} doubled={} lost={lost} kills={kills}",
        counts.doubled
    );
    eprintln!(
        "http-crash mode={mode}: {} answers differed from their key's first, {} requests timed out or were cut off",
        answers.differing, answers.timeouts
    );
    assert_eq!(answers.first.len(), KEYS, "every key got a 2xx");
    assert!(kills >= 10, "only {kills} kills: the test proved little");
    (
        EffectCounts {
            missing: lost,
            ..counts
        },
        kills,
        answers,
    )
}

#[test]
fn http_in_one_transaction_never_doubles_or_loses_a_payment() {
    if !postgres_up() {
        return;
    }
    let (counts, _, answers) = demonstrate("tx");
    assert_eq!(counts.doubled, 0, "a payment was doubled");
    assert_eq!(counts.missing, 0, "an answered payment was lost");
    assert_eq!(
        answers.differing, 0,
        "a replay differed from the first answer"
    );
}

#[test]
fn http_plain_layer_doubles_payments_killed_between_insert_and_record() {
    if !postgres_up() {
        return;
    }
    // Printed, not asserted: how many kills land between an INSERT and its record is chance.
    let _ = demonstrate("plain");
}
