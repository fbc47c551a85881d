//! Test support: harnesses on a single server and on a Redis Cluster, and cleanup of each
//! harness's namespace. The servers and Clusters the tests start and stop themselves are
//! idem-testkit's (`idem_testkit::redis_server`).
#![allow(dead_code, unreachable_pub)] // each test binary uses a part of this module

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_redis::{ClockOffset, RedisConfig, RedisStore};
use idem_testkit::hammer::{HammerConfig, hammer};
use idem_testkit::probe::{require_tcp, service_url};
use idem_testkit::redis_server::{cluster, host_port};
use idem_testkit::{Harness, SkewedClock};
use redis::aio::ConnectionLike;

/// The lease of the tests' claims.
pub const LEASE: Duration = Duration::from_secs(30);
/// The retention of the tests' completions.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// The unscoped record key `name`.
pub fn key(name: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(name).unwrap())
}

/// A claim of `key` for the same payload every time, with [`LEASE`].
pub fn request(key: &RecordKey) -> ClaimRequest {
    ClaimRequest::new(key.clone(), Fingerprint::of(&[b"payload"]), LEASE)
}

/// The single test server: `IDEM_TEST_REDIS_URL`, by default the machine's Redis.
pub fn single_url() -> String {
    service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// A fresh random namespace.
pub fn namespace() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

/// A harness: a store in its own namespace, its clock offset, and a raw connection for
/// planting broken records. Its namespace is deleted when it is dropped.
pub struct RedisHarness {
    pub store: RedisStore,
    pub offset: ClockOffset,
    raw: RawConn,
    cleanup: Cleanup,
}

#[derive(Clone)]
enum RawConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RawConn {
    pub async fn query(&self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self.clone() {
            RawConn::Single(mut c) => c.req_packed_command(cmd).await,
            RawConn::Cluster(mut c) => c.req_packed_command(cmd).await,
        }
    }
}

struct Cleanup {
    /// Plain (non-cluster) URLs of every node that may hold keys.
    nodes: Vec<String>,
    namespace: String,
}

impl RedisHarness {
    /// A raw command on the harness's server (routed by key on a Cluster).
    pub async fn raw(&self, cmd: &redis::Cmd) -> redis::Value {
        self.raw.query(cmd).await.expect("raw command")
    }
}

#[async_trait]
impl Harness for RedisHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    /// Moves store time by `by` plus the error bound of the store's clock estimate: a lease
    /// counts as lapsed for a takeover only once it has lapsed by more than the bound, so a
    /// step that lapses a lease on the clause's (exact) clock lapses it here too.
    async fn advance(&self, by: Duration) {
        self.offset.advance(by + self.store.clock_bound());
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.store.round_trips())
    }

    async fn skewed_store(&self, skew: Duration, ahead: bool) -> Option<Arc<dyn Store>> {
        let clock = Arc::new(SkewedClock { skew, ahead });
        let config = self.store.config().clone().with_local_clock(clock);
        Some(Arc::new(
            RedisStore::connect(config).await.expect("connect"),
        ))
    }

    async fn corrupt(&self, key: &RecordKey) {
        // A value no layout of the store writes.
        self.raw(redis::cmd("SET").arg(self.store.redis_key(key)).arg("?"))
            .await;
    }
}

impl Drop for RedisHarness {
    fn drop(&mut self) {
        let nodes = self.cleanup.nodes.clone();
        let pattern = format!("idem:{{{}:*", self.cleanup.namespace);
        // Synchronous cleanup on its own thread: Drop cannot await.
        let done = std::thread::spawn(move || {
            for url in nodes {
                let _ = delete_matching(&url, &pattern);
            }
        });
        let _ = done.join();
    }
}

fn delete_matching(url: &str, pattern: &str) -> redis::RedisResult<()> {
    let mut conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)?;
        for key in keys {
            redis::cmd("UNLINK").arg(key).exec(&mut conn)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The configuration every harness uses: its own namespace and clock offset.
pub fn test_config(config: RedisConfig, offset: &ClockOffset) -> RedisConfig {
    config
        .with_namespace(namespace())
        .unwrap()
        .with_clock_offset(offset.clone())
        .with_command_timeout(Duration::from_secs(5))
        .unwrap()
}

/// A harness on the single server, or `None` (skipped loudly, with `IDEM_TEST_SKIP_MISSING=1`)
/// if it is not there.
pub async fn single_harness() -> Option<RedisHarness> {
    single_harness_with(|config| config).await
}

/// A harness on the single server with settings of its own (`tune` changes the test
/// configuration), or `None` (skipped loudly, with `IDEM_TEST_SKIP_MISSING=1`) if the server is
/// not there.
pub async fn single_harness_with(
    tune: impl FnOnce(RedisConfig) -> RedisConfig,
) -> Option<RedisHarness> {
    let url = single_url();
    if !require_tcp("Redis", &host_port(&url)) {
        return None;
    }
    let offset = ClockOffset::new();
    let config = tune(test_config(RedisConfig::new(url.clone()).unwrap(), &offset));
    let cleanup = Cleanup {
        nodes: vec![url.clone()],
        namespace: config.namespace().to_owned(),
    };
    let store = RedisStore::connect(config).await.expect("connect");
    let raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    Some(RedisHarness {
        store,
        offset,
        raw: RawConn::Single(raw),
        cleanup,
    })
}

/// A harness on the test Cluster, or `None` (skipped loudly, with `IDEM_TEST_SKIP_MISSING=1`) if
/// none can be had.
pub async fn cluster_harness() -> Option<RedisHarness> {
    let cluster = cluster()?;
    let offset = ClockOffset::new();
    let config = test_config(
        RedisConfig::cluster(cluster.seeds.clone()).unwrap(),
        &offset,
    );
    let cleanup = Cleanup {
        nodes: cluster.nodes.clone(),
        namespace: config.namespace().to_owned(),
    };
    let store = RedisStore::connect(config)
        .await
        .expect("connect to the cluster");
    let raw = redis::cluster::ClusterClient::new(cluster.seeds.clone())
        .unwrap()
        .get_async_connection()
        .await
        .expect("raw cluster connection");
    Some(RedisHarness {
        store,
        offset,
        raw: RawConn::Cluster(raw),
        cleanup,
    })
}

/// Parses `INFO commandstats` into (command, calls).
pub fn command_calls(info: &str) -> std::collections::BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The big hammer of issue 3: 32 tasks x 2,000 keys must run exactly 2,000 executions.
pub async fn big_hammer(h: &RedisHarness, server: &str) {
    let config = HammerConfig {
        tasks: 32,
        keys: 2_000,
        ..HammerConfig::default()
    };
    let report = hammer(h.store(), config).await;
    eprintln!("hammer 32 x 2000 on {server}: {report}");
    report.assert_exactly_once();
    assert_eq!(report.total_executions(), 2_000);
}
