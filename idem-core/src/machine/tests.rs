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

fn unknown_of(existing: &Record, lease: &Lease, hold: Option<Duration>, now: Timestamp) -> Record {
    let outcome = UnknownOutcome::new("upstream timed out");
    let step = settle_unknown(
        Some(existing),
        lease,
        outcome,
        hold,
        RETENTION,
        now,
        LeasePolicy::Lenient,
    )
    .unwrap();
    let Write::Put(record) = step.write else {
        panic!("settling unknown writes the record")
    };
    record
}

fn rejection<T: std::fmt::Debug>(result: Result<Step<T>, StoreError>) -> TransitionRejection {
    match result {
        Err(err) => err
            .rejection()
            .unwrap_or_else(|| panic!("not a rejection: {err:?}")),
        Ok(step) => panic!("not refused: {step:?}"),
    }
}

#[test]
fn the_holder_settles_unknown_and_a_stale_attempt_is_refused() {
    let (record, first) = acquire(None, &request(b"a"), at(1));
    // Taken over after the lease lapsed: the first holder is stale.
    let (taken, second) = acquire(Some(&record), &request(b"a"), at(40));
    let stale = settle_unknown(
        Some(&taken),
        &first,
        UnknownOutcome::new("timeout"),
        None,
        RETENTION,
        at(41),
        LeasePolicy::Lenient,
    );
    assert!(matches!(
        rejection(stale),
        TransitionRejection::Superseded { current } if current == second.fence
    ));
    let unknown = unknown_of(&taken, &second, Some(Duration::from_secs(60)), at(41));
    assert_eq!(unknown.state, State::Unknown);
    assert_eq!(unknown.fence, second.fence);
    assert_eq!(unknown.attempt, 2);
    assert_eq!(unknown.completed_at, Some(at(41)));
    assert_eq!(unknown.hold_until, Some(at(101)));
    assert_eq!(unknown.expires_at, at(41).saturating_add(RETENTION));
    assert_eq!(
        unknown.unknown,
        Some(UnknownOutcome::new("upstream timed out"))
    );
    assert!(unknown.validate().is_ok());

    // Sent again: Ok, nothing written. Every other holder transition is refused.
    let again = settle_unknown(
        Some(&unknown),
        &second,
        UnknownOutcome::new("upstream timed out"),
        None,
        RETENTION,
        at(42),
        LeasePolicy::Lenient,
    )
    .unwrap();
    assert_eq!(again.write, Write::Nothing);
    let settled = TransitionRejection::AlreadySettled {
        state: State::Unknown,
    };
    let lenient = LeasePolicy::Lenient;
    let done = complete(
        Some(&unknown),
        &second,
        Bytes::new(),
        RETENTION,
        at(42),
        lenient,
    );
    assert_eq!(rejection(done), settled);
    let failed = fail(
        Some(&unknown),
        &second,
        Failure::retryable("x"),
        RETENTION,
        at(42),
        lenient,
    );
    assert_eq!(rejection(failed), settled);
    assert_eq!(rejection(release(Some(&unknown), &second, at(42))), settled);
    let beat = heartbeat(Some(&unknown), &second, LEASE, at(42), lenient);
    assert_eq!(rejection(beat), settled);

    // A completed or failed record is not made unknown.
    let completed = complete(
        Some(&taken),
        &second,
        Bytes::new(),
        RETENTION,
        at(41),
        lenient,
    );
    let Write::Put(completed) = completed.unwrap().write else {
        panic!("completes")
    };
    let late = settle_unknown(
        Some(&completed),
        &second,
        UnknownOutcome::new("timeout"),
        None,
        RETENTION,
        at(42),
        lenient,
    );
    assert_eq!(
        rejection(late),
        TransitionRejection::AlreadySettled {
            state: State::Completed
        }
    );
}

#[test]
fn strict_policy_refuses_settling_unknown_on_a_lapsed_lease() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let late = settle_unknown(
        Some(&record),
        &lease,
        UnknownOutcome::new("timeout"),
        None,
        RETENTION,
        at(40),
        LeasePolicy::Strict,
    );
    assert_eq!(rejection(late), TransitionRejection::LeaseExpired);
}

#[test]
fn a_claim_of_an_unknown_key_is_answered_unknown_until_the_hold_lapses() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let unknown = unknown_of(&record, &lease, Some(Duration::from_secs(60)), at(2));
    for now in [at(2), at(40), at(61)] {
        let step = claim(
            Some(&unknown),
            &request(b"a"),
            now,
            Fence::MIN,
            OwnerToken::random(),
        );
        let step = step.unwrap();
        assert_eq!(step.write, Write::Nothing);
        assert_eq!(step.answer, ClaimOutcome::Unknown(unknown.clone()));
    }
    // Its own owner, sending its claim again, is not granted either.
    let own = request(b"a").with_owner(lease.owner);
    let step = claim(Some(&unknown), &own, at(3), Fence::MIN, lease.owner).unwrap();
    assert_eq!(step.answer, ClaimOutcome::Unknown(unknown.clone()));
    // Another payload is a mismatch, as for every record.
    let other = claim(
        Some(&unknown),
        &request(b"b"),
        at(3),
        Fence::MIN,
        OwnerToken::random(),
    );
    assert_eq!(other.unwrap().answer, ClaimOutcome::Mismatch);

    // After the hold: granted as a takeover, with a higher fence and the next attempt.
    let step = claim(
        Some(&unknown),
        &request(b"a"),
        at(62),
        Fence::MIN,
        OwnerToken::random(),
    );
    let step = step.unwrap();
    let (
        Write::Put(granted),
        ClaimOutcome::Acquired {
            lease: next,
            taken_over,
        },
    ) = (step.write, step.answer)
    else {
        panic!("not granted after the hold")
    };
    assert!(taken_over);
    assert!(next.fence > lease.fence);
    assert_eq!(next.attempt, 2);
    assert_eq!(granted.state, State::InFlight);
    assert_eq!((granted.unknown, granted.hold_until), (None, None));
    assert_eq!(granted.created_at, unknown.created_at);

    // Without a hold: unknown until it expires, then free.
    let forever = unknown_of(&record, &lease, None, at(2));
    let late = at(2)
        .saturating_add(RETENTION)
        .saturating_sub(Duration::from_secs(1));
    let step = claim(
        Some(&forever),
        &request(b"a"),
        late,
        Fence::MIN,
        OwnerToken::random(),
    );
    assert!(matches!(step.unwrap().answer, ClaimOutcome::Unknown(_)));
    let expired = at(2).saturating_add(RETENTION);
    acquire(Some(&forever), &request(b"a"), expired);
}

#[test]
fn resolving_completed_acts_only_on_an_unknown_record_at_its_fence() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let unknown = unknown_of(&record, &lease, None, at(2));
    let result = Bytes::from_static(b"charged");

    let wrong = resolve_completed(
        Some(&unknown),
        lease.fence.successor(),
        result.clone(),
        RETENTION,
        at(3),
    );
    assert_eq!(
        rejection(wrong),
        TransitionRejection::Superseded {
            current: lease.fence
        }
    );
    let absent = resolve_completed(None, lease.fence, result.clone(), RETENTION, at(3));
    assert_eq!(rejection(absent), TransitionRejection::NotFound);
    let in_flight = resolve_completed(Some(&record), lease.fence, result.clone(), RETENTION, at(3));
    assert_eq!(
        rejection(in_flight),
        TransitionRejection::NotUnknown {
            state: State::InFlight
        }
    );

    let step = resolve_completed(
        Some(&unknown),
        lease.fence,
        result.clone(),
        RETENTION,
        at(3),
    );
    let Write::Put(done) = step.unwrap().write else {
        panic!("resolving writes the record")
    };
    assert_eq!(done.state, State::Completed);
    assert_eq!(done.result.as_ref(), Some(&result));
    assert_eq!((done.unknown.clone(), done.hold_until), (None, None));
    assert_eq!((done.fence, done.attempt), (unknown.fence, unknown.attempt));
    assert_eq!(done.completed_at, Some(at(3)));
    assert!(done.validate().is_ok());
    // Replayed from then on.
    let replay = claim(
        Some(&done),
        &request(b"a"),
        at(4),
        Fence::MIN,
        OwnerToken::random(),
    );
    assert_eq!(
        replay.unwrap().answer,
        ClaimOutcome::Completed(done.clone())
    );
    // Sent again: Ok, nothing written; with another result: refused.
    let again = resolve_completed(Some(&done), lease.fence, result, RETENTION, at(4));
    assert_eq!(again.unwrap().write, Write::Nothing);
    let other = resolve_completed(Some(&done), lease.fence, Bytes::new(), RETENTION, at(4));
    assert_eq!(
        rejection(other),
        TransitionRejection::NotUnknown {
            state: State::Completed
        }
    );
}

#[test]
fn resolving_released_frees_the_key_and_never_a_newer_attempt() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let unknown = unknown_of(&record, &lease, Some(Duration::from_secs(10)), at(2));
    let step = resolve_released(Some(&unknown), lease.fence, at(3)).unwrap();
    assert_eq!(step.write, Write::Remove);
    // Sent again on the free key: Ok.
    assert_eq!(
        resolve_released(None, lease.fence, at(3)).unwrap().write,
        Write::Nothing
    );

    // The hold lapsed and a newer attempt took the key: the resolution is refused.
    let (newer, next) = acquire(Some(&unknown), &request(b"a"), at(20));
    let late = resolve_released(Some(&newer), lease.fence, at(21));
    assert_eq!(
        rejection(late),
        TransitionRejection::Superseded {
            current: next.fence
        }
    );
    let late = resolve_completed(Some(&newer), lease.fence, Bytes::new(), RETENTION, at(21));
    assert!(matches!(
        rejection(late),
        TransitionRejection::Superseded { .. }
    ));
    // At its own fence, an in-flight record is not unknown.
    let in_flight = resolve_released(Some(&newer), next.fence, at(21));
    assert_eq!(
        rejection(in_flight),
        TransitionRejection::NotUnknown {
            state: State::InFlight
        }
    );
}

#[test]
fn an_unknown_record_without_its_outcome_is_corrupt() {
    let (record, lease) = acquire(None, &request(b"a"), at(1));
    let mut broken = unknown_of(&record, &lease, None, at(2));
    broken.unknown = None;
    let step = claim(
        Some(&broken),
        &request(b"a"),
        at(3),
        Fence::MIN,
        OwnerToken::random(),
    );
    assert!(matches!(step, Err(StoreError::Corrupt { .. })));
    let mut held = record.clone();
    held.hold_until = Some(at(5));
    assert!(matches!(held.validate(), Err(StoreError::Corrupt { .. })));
}

#[derive(Clone, Debug)]
enum Op {
    Claim { worker: usize, body: u8 },
    Heartbeat { worker: usize },
    Complete { worker: usize },
    Fail { worker: usize, retryable: bool },
    Release { worker: usize },
    SettleUnknown { worker: usize, hold: Option<u64> },
    ResolveCompleted { stale: bool },
    ResolveReleased { stale: bool },
    Advance { secs: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..2u8).prop_map(|(worker, body)| Op::Claim { worker, body }),
        (0..3usize).prop_map(|worker| Op::Heartbeat { worker }),
        (0..3usize).prop_map(|worker| Op::Complete { worker }),
        (0..3usize, any::<bool>()).prop_map(|(worker, retryable)| Op::Fail { worker, retryable }),
        (0..3usize).prop_map(|worker| Op::Release { worker }),
        (0..3usize, proptest::option::of(0..120u64))
            .prop_map(|(worker, hold)| Op::SettleUnknown { worker, hold }),
        any::<bool>().prop_map(|stale| Op::ResolveCompleted { stale }),
        any::<bool>().prop_map(|stale| Op::ResolveReleased { stale }),
        (0..80u64).prop_map(|secs| Op::Advance { secs }),
    ]
}

proptest! {
    /// Random interleavings of every transition keep the invariants: fences strictly increase
    /// per grant, at most one lease is live at any time, a refused step writes nothing, a
    /// mismatch never writes, a claim of an unknown record is granted only after its hold,
    /// a resolution acts only on an unknown record at its fence, and every stored record
    /// validates.
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
                    let write = claim_checked(stored.as_ref(), worker, body, now, &mut leases, &mut last_fence)?;
                    apply(&mut stored, write);
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
                Op::SettleUnknown { worker, hold } => {
                    if let Some(lease) = &leases[worker] {
                        let outcome = UnknownOutcome::new("timeout");
                        let hold = hold.map(Duration::from_secs);
                        match settle_unknown(stored.as_ref(), lease, outcome, hold, RETENTION, now, LeasePolicy::Lenient) {
                            Ok(step) => {
                                if let Write::Put(record) = &step.write {
                                    prop_assert!(lease.holds(record));
                                    prop_assert_eq!(record.state, State::Unknown);
                                }
                                apply(&mut stored, step.write)
                            }
                            Err(e) => prop_assert!(e.rejection().is_some()),
                        }
                    }
                }
                Op::ResolveCompleted { .. } | Op::ResolveReleased { .. } => {
                    let write = resolve_checked(stored.as_ref(), &op, now)?;
                    apply(&mut stored, write);
                }
            }
            if let Some(record) = &stored {
                prop_assert!(record.validate().is_ok());
            }
        }
    }
}

/// A claim by `worker`, checked against the invariants: the write it asks for is returned.
fn claim_checked(
    stored: Option<&Record>,
    worker: usize,
    body: u8,
    now: Timestamp,
    leases: &mut [Option<Lease>; 3],
    last_fence: &mut Fence,
) -> Result<Write, TestCaseError> {
    let req = request(&[body]);
    // As a store does: the lowest fence allowed is one above the last one granted.
    let step = claim(
        stored,
        &req,
        now,
        last_fence.successor(),
        OwnerToken::random(),
    )
    .unwrap();
    if let (ClaimOutcome::Acquired { .. }, Some(record)) = (&step.answer, stored) {
        if record.state == State::Unknown && !record.is_expired(now) {
            prop_assert!(
                record.hold_lapsed(now),
                "an unknown record was granted in its hold"
            );
        }
    }
    if let ClaimOutcome::Acquired { lease, .. } = &step.answer {
        prop_assert!(lease.fence > *last_fence);
        *last_fence = lease.fence;
        // No other worker may hold a live lease on the same record.
        for (other, held) in leases.iter().enumerate() {
            if let (Some(held), Some(record)) = (held, stored) {
                prop_assert!(other == worker || !(lease_is_live(held, record, now)));
            }
        }
        leases[worker] = Some(lease.clone());
    }
    if step.answer == ClaimOutcome::Mismatch {
        prop_assert_eq!(&step.write, &Write::Nothing);
    }
    Ok(step.write)
}

/// A resolution of the stored record at its fence (or a stale one), checked: it writes only
/// an unknown record at its fence.
fn resolve_checked(
    stored: Option<&Record>,
    op: &Op,
    now: Timestamp,
) -> Result<Write, TestCaseError> {
    let stale = matches!(
        op,
        Op::ResolveCompleted { stale: true } | Op::ResolveReleased { stale: true }
    );
    let seen = stored.map_or(Fence::MIN, |r| r.fence);
    let fence = if stale { seen.successor() } else { seen };
    let step = match op {
        Op::ResolveCompleted { .. } => {
            resolve_completed(stored, fence, Bytes::from_static(b"r"), RETENTION, now)
        }
        _ => resolve_released(stored, fence, now),
    };
    match step {
        Ok(step) => {
            if step.write != Write::Nothing {
                let record = stored.filter(|r| !r.is_expired(now));
                prop_assert!(record.is_some_and(|r| r.state == State::Unknown && r.fence == fence));
            }
            Ok(step.write)
        }
        Err(e) => {
            prop_assert!(e.rejection().is_some());
            Ok(Write::Nothing)
        }
    }
}

fn lease_is_live(lease: &Lease, record: &Record, now: Timestamp) -> bool {
    lease.holds(record) && record.is_live(now)
}
