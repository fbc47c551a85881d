//! The store contract, clause by clause, and the big hammer, against a three-node Redis
//! Cluster this test binary starts from `redis-server --cluster-enabled yes` processes (or
//! `IDEM_TEST_REDIS_CLUSTER`); and the first operations after a restart of the whole Cluster
//! or of one node, on Clusters of their own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{RETENTION, RedisHarness, big_hammer, cluster_harness, key, request, test_config};
use idem_core::{Bytes, ClaimOutcome, RecordKey, ScanQuery, State, Store, StoreError};
use idem_store_redis::{ClockOffset, RedisConfig, RedisStore};
use idem_testkit::redis_server::Cluster;

async fn harness() -> Option<RedisHarness> {
    cluster_harness().await
}

idem_testkit::store_conformance!(harness);

/// 32 tasks x 2,000 keys over the Cluster: exactly 2,000 executions, and no CROSSSLOT (any
/// error fails the hammer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hammer_32_tasks_2000_keys_on_the_cluster() {
    let Some(h) = harness().await else { return };
    big_hammer(&h, "the cluster").await;
}

// ---- restarts ------------------------------------------------------------------------------

/// A store on a Cluster of the test's own, with the tests' settings.
async fn store_on(cluster: &Cluster) -> RedisStore {
    let config = test_config(
        RedisConfig::cluster(cluster.seeds.clone()).unwrap(),
        &ClockOffset::new(),
    );
    RedisStore::connect(config)
        .await
        .expect("connect to the cluster")
}

/// Claims and completes `key` with the result `kept`.
async fn complete(store: &RedisStore, key: &RecordKey) {
    let lease = match store.claim(&request(key)).await.unwrap() {
        ClaimOutcome::Acquired { lease, .. } => lease,
        other => panic!("expected Acquired, got {other:?}"),
    };
    store
        .complete(&lease, Bytes::from_static(b"kept"), RETENTION)
        .await
        .unwrap();
}

/// What the Redis error under a store error is, for the failure messages.
fn explain(err: &StoreError) -> String {
    let source = std::error::Error::source(err);
    match source.and_then(|s| s.downcast_ref::<redis::RedisError>()) {
        Some(redis) => format!(
            "{err:?}: kind {:?}, is_connection_dropped {}, is_io_error {}, is_timeout {}, \
             is_connection_refusal {}, retry_method {:?}",
            redis.kind(),
            redis.is_connection_dropped(),
            redis.is_io_error(),
            redis.is_timeout(),
            redis.is_connection_refusal(),
            redis.retry_method(),
        ),
        None => format!("{err:?}"),
    }
}

/// The first claim (a replay of `held`), get (of `held`), ping and scan after `restart`
/// each succeed on the first try: `restart` runs before each of them.
async fn first_operations_succeed(
    store: &RedisStore,
    held: &RecordKey,
    restart: impl Fn(),
    after: &str,
) {
    restart();
    match store.claim(&request(held)).await {
        Ok(ClaimOutcome::Completed(record)) => {
            assert_eq!(record.result.as_deref(), Some(&b"kept"[..]));
        }
        Ok(other) => panic!("the first claim after {after}: {other:?}"),
        Err(err) => panic!("the first claim after {after}: {}", explain(&err)),
    }
    restart();
    match store.get(held).await {
        Ok(Some(record)) => assert_eq!(record.state, State::Completed),
        Ok(None) => panic!("the first get after {after}: the record is gone"),
        Err(err) => panic!("the first get after {after}: {}", explain(&err)),
    }
    restart();
    if let Err(err) = store.ping().await {
        panic!("the first ping after {after}: {}", explain(&err));
    }
    restart();
    match store.scan(&ScanQuery::all().with_limit(1_000)).await {
        Ok(page) => assert!(
            page.records.iter().any(|record| record.key == *held),
            "the first scan after {after} missed the record"
        ),
        Err(err) => panic!("the first scan after {after}: {}", explain(&err)),
    }
}

/// Every node of the Cluster killed and started again on its port (same `nodes.conf`, same
/// data): once `CLUSTER INFO` says `cluster_state:ok`, the first claim, get, ping and scan of a
/// store that was connected before succeed, each on its first try. Every connection of the
/// store is dead then: the Cluster client's own retries of a claim go from one dead connection
/// to the next and fail with a broken pipe; the store sends once more (`resend_after`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_operations_after_the_whole_cluster_restarted_succeed() {
    let Some(cluster) = Cluster::start_own() else {
        return;
    };
    let store = store_on(&cluster).await;
    let held = key("held-across-restarts");
    complete(&store, &held).await;
    let restart = || {
        cluster.restart_all();
        cluster.wait_until_ok();
    };
    first_operations_succeed(&store, &held, restart, "the whole cluster restarted").await;
}

/// One primary killed and started again while the others stay up: the first claim, get, ping
/// and scan on its records succeed, for each primary in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_operations_after_one_node_restarted_succeed() {
    let Some(cluster) = Cluster::start_own() else {
        return;
    };
    let store = store_on(&cluster).await;
    // A completed record on every node.
    let mut held: Vec<Option<RecordKey>> = vec![None; cluster.nodes.len()];
    for i in 0..1_000 {
        if held.iter().all(Option::is_some) {
            break;
        }
        let k = key(&format!("held-{i}"));
        complete(&store, &k).await;
        let node = cluster.node_holding(&store.redis_key(&k));
        held[node].get_or_insert(k);
    }
    for (node, k) in held.iter().enumerate() {
        let k = k.as_ref().expect("a key on every node");
        let restart = || {
            cluster.restart_node(node);
            cluster.wait_until_ok();
        };
        first_operations_succeed(&store, k, restart, &format!("node {node} restarted")).await;
    }
}
