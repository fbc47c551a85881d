//! The store contract, clause by clause, against a single Redis server
//! (`IDEM_TEST_REDIS_URL`, by default 127.0.0.1:6379).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{RedisHarness, single_harness};

async fn harness() -> Option<RedisHarness> {
    single_harness().await
}

idem_testkit::store_conformance!(harness);
