//! The test harness of the PostgreSQL store: one schema per test, dropped afterwards.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::LeasePolicy;
use idem_core::{RecordKey, Store};
use idem_store_postgres::tokio_postgres::{self, NoTls};
use idem_store_postgres::{PostgresConfig, PostgresStore};
use idem_testkit::probe::{require_tcp, service_url};
use idem_testkit::{Harness, SkewedClock};

/// The server the tests use unless `IDEM_TEST_POSTGRES_URL` says otherwise.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test server's URL.
pub fn url() -> String {
    service_url("IDEM_TEST_POSTGRES_URL", DEFAULT_URL)
}

/// `host:port` of a PostgreSQL URL, for the TCP probe.
pub fn host_port(url: &str) -> String {
    let config: tokio_postgres::Config = url.parse().expect("a valid IDEM_TEST_POSTGRES_URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// Whether the test server answers; if not, the test fails, or skips loudly when the run set
/// `IDEM_TEST_SKIP_MISSING=1` outside CI (see `idem_testkit::probe`).
pub fn server_up() -> bool {
    require_tcp("PostgreSQL", &host_port(&url()))
}

/// A fresh schema name.
pub fn fresh_schema(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// A schema that is dropped (with everything in it) when this guard is dropped.
pub struct SchemaGuard {
    pub name: String,
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let url = url();
        let name = self.name.clone();
        // Drop may run inside a runtime: do the async work on a thread of its own.
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await
            })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {done:?}", self.name);
        }
    }
}

/// A store on its own schema.
pub struct PgHarness {
    pub store: PostgresStore,
    /// The configuration of the store, for more handles on its schema.
    config: PostgresConfig,
    /// The handles of `skewed_store`, and how far the clock has been advanced: every handle
    /// moves with the first.
    skewed: std::sync::Mutex<(Vec<PostgresStore>, Duration)>,
    // Dropped after the store, so the pool is idle when the schema goes.
    pub schema: SchemaGuard,
}

impl PgHarness {
    /// A store on a fresh schema, or `None` if the server is missing (outside CI).
    pub async fn new() -> Option<Self> {
        Self::with_policy(LeasePolicy::Lenient).await
    }

    /// A store on a fresh schema with the lease policy `policy`.
    pub async fn with_policy(policy: LeasePolicy) -> Option<Self> {
        if !server_up() {
            return None;
        }
        let name = fresh_schema("idem_test");
        let schema = SchemaGuard { name: name.clone() };
        let config = PostgresConfig::new(&url())
            .unwrap()
            .with_schema(&name)
            .unwrap()
            .with_pool_size(std::num::NonZeroUsize::new(16).unwrap())
            .with_lease_policy(policy);
        let store = PostgresStore::connect(config.clone())
            .await
            .expect("connect");
        Some(PgHarness {
            store,
            config,
            skewed: std::sync::Mutex::default(),
            schema,
        })
    }
}

#[async_trait]
impl Harness for PgHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    /// Moves store time by `by` plus the error bound of the store's clock estimate: a lease
    /// counts as lapsed for a takeover only once it has lapsed by more than the bound.
    async fn advance(&self, by: Duration) {
        let by = by + self.store.clock_bound();
        self.store.advance_clock(by);
        let mut skewed = self.skewed.lock().unwrap();
        skewed.0.iter().for_each(|store| store.advance_clock(by));
        skewed.1 += by;
    }

    async fn skewed_store(&self, skew: Duration, ahead: bool) -> Option<Arc<dyn Store>> {
        let config = self
            .config
            .clone()
            .with_migrate_on_connect(false)
            .with_local_clock(Arc::new(SkewedClock { skew, ahead }));
        let store = PostgresStore::connect(config).await.expect("connect");
        let mut skewed = self.skewed.lock().unwrap();
        store.advance_clock(skewed.1);
        skewed.0.push(store.clone());
        Some(Arc::new(store))
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.store.round_trips())
    }

    async fn corrupt(&self, key: &RecordKey) {
        let client = self.store.pool().get().await.unwrap();
        let changed = client
            .execute(
                &format!(
                    "UPDATE {}.idem_records SET state = 'half-written' WHERE scope = $1 AND key = $2",
                    self.schema.name
                ),
                &[&key.scope.as_str(), &key.key.as_str()],
            )
            .await
            .unwrap();
        assert_eq!(changed, 1, "a record to corrupt");
    }
}
