//! The store contract, clause by clause, and the big hammer, against a three-node Redis
//! Cluster this test binary starts from `redis-server --cluster-enabled yes` processes (or
//! `IDEM_TEST_REDIS_CLUSTER`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{RedisHarness, big_hammer, cluster_harness};

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
