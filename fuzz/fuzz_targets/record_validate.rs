//! Stands in for the PostgreSQL store's row decoding, which only maps typed columns (the driver
//! decodes the bytes): the record it builds from arbitrary column values, through the same
//! parsers (`State` from its text, `OwnerToken` from the uuid's text without dashes), checked
//! by `Record::validate`. Nothing may panic; `validate` must accept exactly the records that
//! keep the invariants of the design (section 3), and the parsers must accept only what they
//! print.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use idem_core::{
    Failure, Fence, Fingerprint, IdempotencyKey, OwnerToken, Record, RecordKey, Scope, State,
    StoreError, Timestamp, UnknownOutcome,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Row {
    scope: String,
    key: String,
    state: String,
    fingerprint: [u8; 32],
    owner: String,
    fence: u64,
    lease_until: u64,
    attempt: u32,
    created_at: u64,
    completed_at: Option<u64>,
    expires_at: u64,
    result: Option<Vec<u8>>,
    failure: Option<(String, bool)>,
    unknown: Option<(String, bool, bool)>,
    hold_until: Option<u64>,
    now: u64,
}

/// The invariants, written from the design rather than from `validate`.
fn keeps_invariants(record: &Record) -> bool {
    let settled = record.completed_at.is_some();
    let plain = record.unknown.is_none() && record.hold_until.is_none();
    let shape = match record.state {
        State::InFlight => {
            record.result.is_none() && record.failure.is_none() && !settled && plain
        }
        State::Completed => record.result.is_some() && settled && plain,
        State::Failed => record.failure.is_some() && settled && plain,
        State::Unknown => {
            record.unknown.is_some()
                && record.result.is_none()
                && record.failure.is_none()
                && settled
        }
    };
    shape && record.fence >= Fence::MIN && record.attempt > 0
}

fuzz_target!(|row: Row| {
    let state = row.state.parse::<State>();
    if let Ok(state) = state {
        assert_eq!(state.as_str(), row.state);
    }
    let owner = row.owner.replace('-', "").parse::<OwnerToken>();
    if let Ok(owner) = owner {
        assert!(
            owner
                .to_string()
                .eq_ignore_ascii_case(&row.owner.replace('-', ""))
        );
    }
    let (Ok(scope), Ok(key)) = (Scope::new(&row.scope), IdempotencyKey::new(&row.key)) else {
        return;
    };
    assert_eq!(scope.as_str(), row.scope);
    assert_eq!(key.as_str(), row.key);
    let record = Record {
        key: RecordKey::new(scope, key),
        state: state.unwrap_or(State::InFlight),
        fingerprint: Fingerprint::from_bytes(row.fingerprint),
        owner: owner.unwrap_or(OwnerToken::from_u128(0)),
        fence: Fence::new(row.fence),
        lease_until: Timestamp::from_micros(row.lease_until),
        attempt: row.attempt,
        created_at: Timestamp::from_micros(row.created_at),
        completed_at: row.completed_at.map(Timestamp::from_micros),
        expires_at: Timestamp::from_micros(row.expires_at),
        result: row.result.map(Bytes::from),
        failure: row
            .failure
            .map(|(message, retryable)| Failure { message, retryable }),
        unknown: row
            .unknown
            .map(|(reason, request_sent, head_seen)| UnknownOutcome {
                reason,
                request_sent,
                head_seen,
            }),
        hold_until: row.hold_until.map(Timestamp::from_micros),
    };
    match record.validate() {
        Ok(()) => assert!(keeps_invariants(&record), "{record:?} was accepted"),
        Err(StoreError::Corrupt { key, .. }) => {
            assert!(!keeps_invariants(&record), "{record:?} was refused");
            assert_eq!(key, record.key.to_string());
        }
        Err(err) => panic!("validate gave {err:?}"),
    }
    let now = Timestamp::from_micros(row.now);
    let _ = (record.is_expired(now), record.is_live(now), record.age(now));
});
