//! The store contract, clause by clause, against PostgreSQL (each test in its own schema).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::PgHarness;

async fn harness() -> Option<PgHarness> {
    PgHarness::new().await
}

idem_testkit::store_conformance!(harness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_lease_refuses_a_lapsed_holder() {
    let Some(h) = PgHarness::with_policy(idem_core::machine::LeasePolicy::Strict).await else {
        return;
    };
    idem_testkit::conformance::strict_lease_refuses_a_lapsed_holder(&h).await;
}
