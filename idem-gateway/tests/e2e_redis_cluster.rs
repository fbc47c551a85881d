//! End-to-end on a Redis Cluster (feature `redis`; the store URL
//! `redis+cluster://host:port,host:port,...`): the section-5 basics through the gateway, two
//! `idem serve` processes sharing one Cluster in front of one idem-fixture upstream, and a
//! gateway killed with `kill -9` mid-request. Each test starts a three-node Cluster of its own
//! (`redis-server --cluster-enabled yes`); without `redis-server` and `redis-cli` it skips
//! loudly, and fails under CI=true.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::shared_store;
use idem_testkit::redis_server::Cluster;

/// A namespace of its own for each test.
fn namespace(test: &str) -> String {
    shared_store::unique_name(&format!("gw-cluster-{test}-"))
}

/// The `[store]` section of a test: the Cluster and `namespace`.
fn store_section(cluster: &Cluster, namespace: &str) -> String {
    shared_store::store_section(&cluster.url(), namespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_section_5_basics_hold_on_a_redis_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    shared_store::section_5_basics(&store_section(&cluster, &namespace("basics"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_one_redis_cluster_200_concurrent_same_key_requests_execute_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let ns = namespace("concurrent");
    shared_store::two_gateways_200_concurrent_same_key_requests_execute_once(
        &ns,
        &store_section(&cluster, &ns),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_request_on_a_redis_cluster_is_taken_over_after_the_lease() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let ns = namespace("kill");
    let url = cluster.url();
    shared_store::a_gateway_killed_mid_request_is_taken_over_after_the_lease(
        &ns,
        &store_section(&cluster, &ns),
        shared_store::redis_store(&url, &ns),
    )
    .await;
}
