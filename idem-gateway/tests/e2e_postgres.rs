//! End-to-end on the PostgreSQL store (feature `postgres`): the gateway records in a fresh
//! schema, and the admin commands (`idem keys`, `idem store`) see and change those records;
//! the section-5 basics hold; two `idem serve` processes share one schema under a storm of one key, and one killed with
//! `kill -9` mid-request is taken over by the other. Each test has a schema of its own, dropped
//! at the end. A missing server fails the test (outside CI, `IDEM_TEST_SKIP_MISSING=1` skips it loudly).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{Fixture, Http, config, shared_store};
use idem::postgres::tokio_postgres::{self, NoTls};
use idem::postgres::{PostgresConfig, PostgresStore};
use idem_core::Store;
use idem_gateway::start;
use idem_testkit::probe::{require_tcp, service_url};

fn url() -> String {
    service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

fn host_port(url: &str) -> String {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    format!(
        "{host}:{}",
        config.get_ports().first().copied().unwrap_or(5432)
    )
}

/// Drops the test's schema at the end.
struct Schema(String);

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (url(), self.0.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .await
            })
        })
        .join();
    }
}

/// Runs `idem ARGS --config FILE` and returns (exit code, stdout).
fn idem(config_file: &std::path::Path, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .arg("--config")
        .arg(config_file)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_CONFIG")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_store_commands_see_what_the_gateway_recorded() {
    let url = url();
    if !require_tcp("PostgreSQL", &host_port(&url)) {
        return;
    }
    let name = shared_store::unique_name("idem_gw_");
    let _schema = Schema(name.clone());
    let store_section = shared_store::store_section(&url, &name);
    let file = std::env::temp_dir().join(format!("{name}.toml"));
    std::fs::write(&file, &store_section).unwrap();

    // An admin command does not migrate: on a schema never migrated it fails, and creates
    // nothing (a read-only role can run it on a migrated one).
    let (code, out) = idem(&file, &["keys", "get", "order-7"]);
    assert_eq!(code, 1, "{out}");
    // The server's own message, not just the driver's "db error".
    assert!(out.contains("does not exist"), "{out}");
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let schemas = client
        .query(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert!(schemas.is_empty(), "idem keys created the schema");

    let (code, out) = idem(&file, &["store", "migrate", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"command\":\"migrate\""), "{out}");

    let fixture = Fixture::start();
    let config = config(fixture.addr, &store_section);
    let running = start(&config, None, std::future::pending()).await.unwrap();
    let gateway = format!("http://{}", running.listen);
    let http = Http::new();
    let first = http
        .post_key(&format!("{gateway}/echo"), "order-7", "7 EUR")
        .await;
    assert_eq!(first.status, 201);
    assert!(
        http.post_key(&format!("{gateway}/echo"), "order-7", "7 EUR")
            .await
            .replayed()
    );

    let (code, out) = idem(&file, &["keys", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    let list: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(list[0]["key"], "order-7");
    assert_eq!(list[0]["state"], "completed");
    assert_eq!(list[0]["status"], 201);

    let (_, out) = idem(&file, &["keys", "list", "--state", "in_flight", "--json"]);
    assert_eq!(out.lines().next().unwrap(), "[]");
    let (_, out) = idem(&file, &["keys", "list", "--older-than", "1h", "--json"]);
    assert_eq!(out.lines().next().unwrap(), "[]");
    let (code, out) = idem(&file, &["keys", "list", "--state", "done"]);
    assert_eq!(code, 2, "{out}");

    let (code, out) = idem(&file, &["keys", "get", "order-7", "--json"]);
    assert_eq!(code, 0, "{out}");
    let record: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(record["attempt"], 1);

    let (code, out) = idem(&file, &["keys", "delete", "order-7", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"deleted\":true"), "{out}");
    // No record: exit 1 in either format; `--json` prints null.
    let (code, out) = idem(&file, &["keys", "get", "order-7", "--json"]);
    assert_eq!((code, out.lines().next()), (1, Some("null")), "{out}");
    let (code, out) = idem(&file, &["keys", "get", "order-7"]);
    assert_eq!(code, 1, "{out}");
    // Deleted: the next request runs again.
    let again = http
        .post_key(&format!("{gateway}/echo"), "order-7", "7 EUR")
        .await;
    assert!(!again.replayed());
    assert_eq!(fixture.count().await, 2);

    let (code, out) = idem(&file, &["store", "sweep"]);
    assert_eq!(code, 0, "{out}");
    running.stop().await.unwrap();
}

/// A fresh schema, dropped at the end of the test, and the `[store]` section naming it.
fn fresh_store() -> (Schema, String) {
    let name = shared_store::unique_name("idem_gw_");
    let section = shared_store::store_section(&url(), &name);
    (Schema(name), section)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_section_5_basics_hold_on_postgres() {
    if !require_tcp("PostgreSQL", &host_port(&url())) {
        return;
    }
    let (_schema, store) = fresh_store();
    shared_store::section_5_basics(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_one_postgres_200_concurrent_same_key_requests_execute_once() {
    if !require_tcp("PostgreSQL", &host_port(&url())) {
        return;
    }
    let (schema, store) = fresh_store();
    shared_store::two_gateways_200_concurrent_same_key_requests_execute_once(&schema.0, &store)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_request_on_postgres_is_taken_over_after_the_lease() {
    if !require_tcp("PostgreSQL", &host_port(&url())) {
        return;
    }
    let (schema, store) = fresh_store();
    // Connected once both gateways run: the first has migrated the schema.
    let connect = async {
        let config = PostgresConfig::new(&url())
            .unwrap()
            .with_schema(&schema.0)
            .unwrap()
            .with_migrate_on_connect(false);
        let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(config).await.unwrap());
        store
    };
    shared_store::a_gateway_killed_mid_request_is_taken_over_after_the_lease(
        &schema.0, &store, connect,
    )
    .await;
}

/// The same kill, with the fenced upstream of `examples/fenced-upstream`: the killed gateway's
/// attempt reaches it after the takeover's and is refused by its fence; one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_late_attempt_is_refused_by_a_fenced_upstream_on_postgres() {
    if !require_tcp("PostgreSQL", &host_port(&url())) {
        return;
    }
    let (schema, store) = fresh_store();
    shared_store::a_killed_gateways_late_attempt_is_refused_by_a_fenced_upstream(&schema.0, &store)
        .await;
}
