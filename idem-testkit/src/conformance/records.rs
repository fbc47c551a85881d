//! What `get` returns in each state: the record as idem-core's state machine leaves it, field
//! for field, on every store.

use std::time::Duration;

use idem_core::machine::{self, LeasePolicy, Write};
use idem_core::{Bytes, ClaimRequest, Failure, Fence, Lease, Record, Store, Timestamp};

use super::{LEASE, RETENTION, acquire, key, record, request};
use crate::Harness;

/// The record the machine writes for `step`, with the fence the store granted (how a fence is
/// chosen is a clause of its own: `fences_strictly_increase_*`).
fn written(step: Write, fence: Fence, what: &str) -> Record {
    match step {
        Write::Put(mut record) => {
            record.fence = fence;
            record
        }
        other => panic!("{what}: the machine writes {other:?}, not a record"),
    }
}

/// The in-flight record the machine makes for a grant of `lease` at the store time it started
/// (`lease.until` less the lease), over `existing` (a lapsed record it takes over, or none).
fn granted(existing: Option<&Record>, req: &ClaimRequest, lease: &Lease) -> Record {
    let now = lease.until.saturating_sub(LEASE);
    let step = machine::claim(existing, req, now, Fence::MIN, lease.owner).expect("claim");
    written(step.write, lease.fence, "claim")
}

/// The time a settled record says it settled at.
fn settled_at(record: &Record) -> Timestamp {
    record
        .completed_at
        .unwrap_or_else(|| panic!("a settled record without completed_at: {record:?}"))
}

/// `get` answers, for each state, the record the machine's functions leave: in flight (a first
/// grant and a takeover: owner, fence, lease, attempt, times), completed (the owner and fence of
/// the attempt that completed it, its lease as it ran, `completed_at`, the result) and failed
/// (the same, with the failure). After a release or a retryable failure the key is absent.
pub async fn get_returns_each_state_as_the_machine_leaves_it(h: &impl Harness) {
    let store = h.store();
    let (done, failed) = (key("shape-done"), key("shape-failed"));
    let req = request(&done, "a");
    let first = acquire(&*store, &req).await;
    let in_flight = record(&*store, &done).await;
    assert_eq!(in_flight, granted(None, &req, &first), "a first grant");

    h.advance(LEASE + Duration::from_secs(1)).await;
    let second = acquire(&*store, &req).await;
    let taken_over = record(&*store, &done).await;
    assert_eq!(
        taken_over,
        granted(Some(&in_flight), &req, &second),
        "a takeover"
    );

    h.advance(Duration::from_secs(5)).await;
    let result = Bytes::from_static(b"the stored result");
    store
        .complete(&second, result.clone(), RETENTION)
        .await
        .expect("complete");
    let completed = record(&*store, &done).await;
    let now = settled_at(&completed);
    let step = machine::complete(
        Some(&taken_over),
        &second,
        result,
        RETENTION,
        now,
        LeasePolicy::Lenient,
    )
    .expect("complete");
    assert_eq!(
        completed,
        written(step.write, second.fence, "complete"),
        "a completed record"
    );

    let req = request(&failed, "b");
    let lease = acquire(&*store, &req).await;
    let in_flight = record(&*store, &failed).await;
    h.advance(Duration::from_secs(5)).await;
    let failure = Failure::permanent("card declined");
    store
        .fail(&lease, failure.clone(), RETENTION)
        .await
        .expect("fail");
    let settled = record(&*store, &failed).await;
    let step = machine::fail(
        Some(&in_flight),
        &lease,
        failure,
        RETENTION,
        settled_at(&settled),
        LeasePolicy::Lenient,
    )
    .expect("fail");
    assert_eq!(
        settled,
        written(step.write, lease.fence, "fail"),
        "a failed record"
    );

    for (turn, name) in ["shape-released", "shape-retryable"]
        .into_iter()
        .enumerate()
    {
        let k = key(name);
        let lease = acquire(&*store, &request(&k, "c")).await;
        if turn == 0 {
            store.release(&lease).await.expect("release");
        } else {
            let failure = Failure::retryable("try later");
            store.fail(&lease, failure, RETENTION).await.expect("fail");
        }
        assert_eq!(store.get(&k).await.expect("get"), None, "{name}");
    }
}
