use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::{Fingerprint, IdempotencyKey, RecordKey};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

fn request(body: &[u8]) -> ClaimRequest {
    let key = RecordKey::unscoped(IdempotencyKey::new("k").unwrap());
    ClaimRequest::new(key, Fingerprint::of(&[body]), LEASE)
}

fn at(secs: u64) -> Timestamp {
    Timestamp::from_micros(secs * 1_000_000)
}

fn acquire(existing: Option<&Record>, req: &ClaimRequest, now: Timestamp) -> (Record, Lease) {
    let step = claim(existing, req, now, Fence::MIN, OwnerToken::random()).unwrap();
    match (step.write, step.answer) {
        (Write::Put(record), ClaimOutcome::Acquired { lease, .. }) => (record, lease),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn mismatch_wins_over_in_flight_and_writes_nothing() {
    let (record, _) = acquire(None, &request(b"a"), at(1));
    let step = claim(
        Some(&record),
        &request(b"b"),
        at(2),
        Fence::MIN,
        OwnerToken::random(),
    )
    .unwrap();
    assert_eq!(step.answer, ClaimOutcome::Mismatch);
    assert_eq!(step.write, Write::Nothing);
}

#[test]
fn a_resent_claim_with_its_owner_is_its_grant_and_writes_nothing() {
    let owner = OwnerToken::random();
    let req = request(b"a").with_owner(owner);
    let step = claim(None, &req, at(1), Fence::MIN, req.grant_owner()).unwrap();
    let (Write::Put(record), ClaimOutcome::Acquired { lease, .. }) = (step.write, step.answer)
    else {
        panic!("not granted")
    };
    assert_eq!(lease.owner, owner);
    let again = claim(Some(&record), &req, at(2), Fence::MIN, req.grant_owner()).unwrap();
    assert_eq!(again.write, Write::Nothing);
    assert_eq!(
        again.answer,
        ClaimOutcome::Acquired {
            lease,
            taken_over: false
        }
    );
    // Anyone else sees it in flight.
    let other = claim(
        Some(&record),
        &request(b"a"),
        at(2),
        Fence::MIN,
        OwnerToken::random(),
    );
    assert!(matches!(
        other.unwrap().answer,
        ClaimOutcome::InFlight { .. }
    ));
}

#[test]
fn lapsed_lease_is_taken_over_with_a_higher_fence() {
    let (record, first) = acquire(None, &request(b"a"), at(1));
    let step = claim(
        Some(&record),
        &request(b"a"),
        at(40),
        Fence::MIN,
        OwnerToken::random(),
    )
    .unwrap();
    let ClaimOutcome::Acquired { lease, taken_over } = step.answer else {
        panic!("not acquired")
    };
    assert!(taken_over);
    assert!(lease.fence > first.fence);
    assert_eq!(lease.attempt, 2);
}

#[test]
fn stale_holder_is_refused_after_takeover() {
    let (record, stale) = acquire(None, &request(b"a"), at(1));
    let (record, _) = acquire(Some(&record), &request(b"a"), at(40));
    let err = complete(
        Some(&record),
        &stale,
        Bytes::new(),
        RETENTION,
        at(41),
        LeasePolicy::Lenient,
    )
    .unwrap_err();
    assert!(matches!(
        err.rejection(),
        Some(TransitionRejection::Superseded { .. })
    ));
    assert!(heartbeat(Some(&record), &stale, LEASE, at(41), LeasePolicy::Lenient).is_err());
    assert!(
        fail(
            Some(&record),
            &stale,
            Failure::permanent("x"),
            RETENTION,
            at(41),
            LeasePolicy::Lenient
        )
        .is_err()
    );
    assert!(release(Some(&record), &stale, at(41)).is_err());
}

#[test]
fn strict_policy_refuses_a_lapsed_lease() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let lenient = complete(
        Some(&record),
        &lease,
        Bytes::new(),
        RETENTION,
        at(35),
        LeasePolicy::Lenient,
    );
    assert!(lenient.is_ok());
    let strict = complete(
        Some(&record),
        &lease,
        Bytes::new(),
        RETENTION,
        at(35),
        LeasePolicy::Strict,
    );
    assert_eq!(
        strict.unwrap_err().rejection(),
        Some(TransitionRejection::LeaseExpired)
    );
}

#[test]
fn resent_transitions_are_answered_ok() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let Write::Put(done) = complete(
        Some(&record),
        &lease,
        Bytes::from("r"),
        RETENTION,
        at(2),
        LeasePolicy::Lenient,
    )
    .unwrap()
    .write
    else {
        panic!()
    };
    let again = complete(
        Some(&done),
        &lease,
        Bytes::from("r"),
        RETENTION,
        at(3),
        LeasePolicy::Lenient,
    )
    .unwrap();
    assert_eq!(again.write, Write::Nothing);
    assert!(release(None, &lease, at(3)).is_ok());
    assert!(
        fail(
            None,
            &lease,
            Failure::retryable("x"),
            RETENTION,
            at(3),
            LeasePolicy::Lenient
        )
        .is_ok()
    );
    assert!(release(Some(&done), &lease, at(3)).is_err());
}

#[test]
fn corrupt_records_are_reported_not_decided() {
    let (mut record, lease) = acquire(None, &request(b"a"), at(1));
    record.state = State::Completed;
    let err = claim(
        Some(&record),
        &request(b"a"),
        at(2),
        Fence::MIN,
        OwnerToken::random(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), "corrupt");
    assert!(
        complete(
            Some(&record),
            &lease,
            Bytes::new(),
            RETENTION,
            at(2),
            LeasePolicy::Lenient
        )
        .is_err()
    );
}

#[test]
fn fences_keep_rising_after_expiry() {
    let (record, first) = acquire(None, &request(b"a"), at(1));
    // Long after the record expired, with a clock that went backwards.
    let step = claim(
        Some(&record),
        &request(b"b"),
        at(0),
        Fence::MIN,
        OwnerToken::random(),
    )
    .unwrap();
    let ClaimOutcome::Acquired { lease, .. } = step.answer else {
        // At time 0 the record has not expired; a different fingerprint is a mismatch.
        assert_eq!(step.answer, ClaimOutcome::Mismatch);
        return;
    };
    assert!(lease.fence > first.fence);
}

#[derive(Clone, Debug)]
enum Op {
    Claim { worker: usize, body: u8 },
    Heartbeat { worker: usize },
    Complete { worker: usize },
    Fail { worker: usize, retryable: bool },
    Release { worker: usize },
    Advance { secs: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..2u8).prop_map(|(worker, body)| Op::Claim { worker, body }),
        (0..3usize).prop_map(|worker| Op::Heartbeat { worker }),
        (0..3usize).prop_map(|worker| Op::Complete { worker }),
        (0..3usize, any::<bool>()).prop_map(|(worker, retryable)| Op::Fail { worker, retryable }),
        (0..3usize).prop_map(|worker| Op::Release { worker }),
        (0..80u64).prop_map(|secs| Op::Advance { secs }),
    ]
}

proptest! {
    /// Random interleavings of every transition keep the invariants: fences strictly increase
    /// per grant, at most one lease is live at any time, a refused step writes nothing, a
    /// mismatch never writes, and every stored record validates.
    #[test]
    fn transitions_keep_the_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut now = at(1);
        let mut stored: Option<Record> = None;
        let mut leases: [Option<Lease>; 3] = [None, None, None];
        let mut last_fence = Fence::new(0);
        for op in ops {
            let apply = |stored: &mut Option<Record>, write: Write| match write {
                Write::Nothing => {}
                Write::Put(r) => *stored = Some(r),
                Write::Remove => *stored = None,
            };
            match op {
                Op::Advance { secs } => now = now.saturating_add(Duration::from_secs(secs)),
                Op::Claim { worker, body } => {
                    let req = request(&[body]);
                    // As a store does: the lowest fence allowed is one above the last one granted.
                    let step = claim(stored.as_ref(), &req, now, last_fence.successor(), OwnerToken::random()).unwrap();
                    if let ClaimOutcome::Acquired { lease, .. } = &step.answer {
                        prop_assert!(lease.fence > last_fence);
                        last_fence = lease.fence;
                        // No other worker may hold a live lease on the same record.
                        for (other, held) in leases.iter().enumerate() {
                            if let (Some(held), Some(record)) = (held, stored.as_ref()) {
                                prop_assert!(other == worker || !(lease_is_live(held, record, now)));
                            }
                        }
                        leases[worker] = Some(lease.clone());
                    }
                    if step.answer == ClaimOutcome::Mismatch {
                        prop_assert_eq!(&step.write, &Write::Nothing);
                    }
                    apply(&mut stored, step.write);
                }
                Op::Heartbeat { worker } => {
                    if let Some(lease) = leases[worker].clone() {
                        match heartbeat(stored.as_ref(), &lease, LEASE, now, LeasePolicy::Lenient) {
                            Ok(step) => { leases[worker] = Some(step.answer); apply(&mut stored, step.write) }
                            Err(e) => prop_assert!(e.rejection().is_some()),
                        }
                    }
                }
                Op::Complete { worker } => {
                    if let Some(lease) = &leases[worker] {
                        match complete(stored.as_ref(), lease, Bytes::from_static(b"r"), RETENTION, now, LeasePolicy::Lenient) {
                            Ok(step) => apply(&mut stored, step.write),
                            Err(e) => prop_assert!(e.rejection().is_some()),
                        }
                    }
                }
                Op::Fail { worker, retryable } => {
                    if let Some(lease) = &leases[worker] {
                        let failure = if retryable { Failure::retryable("t") } else { Failure::permanent("p") };
                        match fail(stored.as_ref(), lease, failure, RETENTION, now, LeasePolicy::Lenient) {
                            Ok(step) => apply(&mut stored, step.write),
                            Err(e) => prop_assert!(e.rejection().is_some()),
                        }
                    }
                }
                Op::Release { worker } => {
                    if let Some(lease) = &leases[worker] {
                        match release(stored.as_ref(), lease, now) {
                            Ok(step) => apply(&mut stored, step.write),
                            Err(e) => prop_assert!(e.rejection().is_some()),
                        }
                    }
                }
            }
            if let Some(record) = &stored {
                prop_assert!(record.validate().is_ok());
            }
        }
    }
}

fn lease_is_live(lease: &Lease, record: &Record, now: Timestamp) -> bool {
    lease.holds(record) && record.is_live(now)
}
