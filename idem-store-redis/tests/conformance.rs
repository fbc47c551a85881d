//! The store contract, clause by clause, against a single Redis server
//! (`IDEM_TEST_REDIS_URL`, by default 127.0.0.1:6379).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{RedisHarness, single_harness, single_harness_with};
use idem_core::machine::LeasePolicy;

async fn harness() -> Option<RedisHarness> {
    single_harness().await
}

idem_testkit::store_conformance!(harness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_lease_refuses_a_lapsed_holder() {
    let Some(h) = single_harness_with(|config| config.with_lease_policy(LeasePolicy::Strict)).await
    else {
        return;
    };
    idem_testkit::conformance::strict_lease_refuses_a_lapsed_holder(&h).await;
}
