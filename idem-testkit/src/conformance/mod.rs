//! The clauses of the store contract, one `async fn` each. [`crate::store_conformance!`] turns
//! every clause into a named test of the calling store crate.
//!
//! Every clause takes a fresh [`Harness`] (its own namespace) and uses the [`LEASE`] and
//! [`RETENTION`] below; time moves only through [`Harness::advance`].

use std::collections::HashSet;
use std::time::Duration;

use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fingerprint, IdempotencyKey, Lease, Record,
    RecordKey, Store, StoreError, TransitionRejection,
};

use crate::Harness;

mod claims;
mod leases;
mod records;
mod round_trips;
mod scans;
mod settle;
mod unknown;

pub use claims::*;
pub use leases::*;
pub use records::*;
pub use round_trips::*;
pub use scans::*;
pub use settle::*;
pub use unknown::*;

/// The lease every clause claims with.
pub const LEASE: Duration = Duration::from_secs(30);

/// The retention every clause completes with.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// A record key in no scope.
#[must_use]
pub fn key(name: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(name).expect("valid test key"))
}

/// A claim of `key` with the fingerprint of `payload`.
#[must_use]
pub fn request(key: &RecordKey, payload: &str) -> ClaimRequest {
    ClaimRequest::new(key.clone(), Fingerprint::of(&[payload.as_bytes()]), LEASE)
}

/// Claims and expects a grant.
pub async fn acquire(store: &dyn Store, request: &ClaimRequest) -> Lease {
    match store.claim(request).await {
        Ok(ClaimOutcome::Acquired { lease, .. }) => lease,
        other => panic!("expected Acquired for {:?}, got {other:?}", request.key),
    }
}

fn expect_rejected<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    what: &str,
) -> TransitionRejection {
    match result {
        Err(StoreError::Rejected(rejection)) => rejection,
        other => panic!("{what}: expected a rejection, got {other:?}"),
    }
}

async fn record(store: &dyn Store, key: &RecordKey) -> Record {
    store
        .get(key)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("no record at {key:?}"))
}

/// Claims until granted, letting an in-flight lease lapse.
async fn acquire_eventually(h: &impl Harness, store: &dyn Store, req: &ClaimRequest) -> Lease {
    for _ in 0..3 {
        match store.claim(req).await.expect("claim") {
            ClaimOutcome::Acquired { lease, .. } => return lease,
            ClaimOutcome::InFlight { .. } => h.advance(LEASE + Duration::from_secs(1)).await,
            other => panic!("expected a grant, got {other:?}"),
        }
    }
    panic!("never granted")
}

/// Ends a grant in one of the three ways that free its key, by `turn`: a release, a retryable
/// failure, or a completion and a delete.
async fn give_back(store: &dyn Store, lease: &Lease, turn: usize) {
    match turn % 3 {
        0 => store.release(lease).await.expect("release"),
        1 => store
            .fail(lease, Failure::retryable("t"), RETENTION)
            .await
            .expect("fail"),
        _ => {
            store
                .complete(lease, Bytes::new(), RETENTION)
                .await
                .expect("complete");
            assert!(store.delete(&lease.key).await.expect("delete"));
        }
    }
}

/// Claims and completes `count` records, `{prefix}-0` and on; their keys.
async fn completed_records(store: &dyn Store, prefix: &str, count: usize) -> HashSet<RecordKey> {
    let mut completed = HashSet::new();
    for i in 0..count {
        let k = key(&format!("{prefix}-{i}"));
        let lease = acquire(store, &request(&k, "a")).await;
        store
            .complete(&lease, Bytes::new(), RETENTION)
            .await
            .expect("complete");
        completed.insert(k);
    }
    completed
}
