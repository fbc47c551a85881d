//! The store contract, clause by clause, against PostgreSQL (each test in its own schema).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::PgHarness;

async fn harness() -> Option<PgHarness> {
    PgHarness::new().await
}

idem_testkit::store_conformance!(harness);
