//! Fuzzes the Redis store's decoding of a record's value (layout byte, key, record, a result
//! maybe lz4-compressed). Garbage must be `Corrupt`, never a panic or an allocation the limit
//! does not allow; a record the store encoded, compressed or not, must decode to itself.
#![no_main]

use arbitrary::Arbitrary;
use idem_core::atomic::Slot;
use idem_core::{
    Bytes, Fence, Fingerprint, IdempotencyKey, OwnerToken, Record, RecordKey, State, StoreError,
    Timestamp,
};
use idem_store_redis::fuzzing::{decode_value, encode_value};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any bytes, as a key could hold them.
    Value {
        raw: Vec<u8>,
        expected: bool,
        max_result: u16,
    },
    /// A completed record whose value the store encoded.
    Result { result: Vec<u8>, threshold: u16 },
}

fn key() -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new("order:1").unwrap())
}

fn completed(result: Vec<u8>) -> Record {
    Record {
        key: key(),
        state: State::Completed,
        fingerprint: Fingerprint::from_bytes([7; 32]),
        owner: OwnerToken::from_u128(9),
        fence: Fence::new(1_700_000_000_000_001),
        lease_until: Timestamp::from_micros(1_700_000_001_000_000),
        attempt: 1,
        created_at: Timestamp::from_micros(1_700_000_000_000_000),
        completed_at: Some(Timestamp::from_micros(1_700_000_000_500_000)),
        expires_at: Timestamp::from_micros(1_700_003_600_000_000),
        result: Some(Bytes::from(result)),
        failure: None,
        unknown: None,
        hold_until: None,
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Value {
            raw,
            expected,
            max_result,
        } => {
            let expected = expected.then(key);
            let limit = usize::from(max_result);
            match decode_value(expected.as_ref(), &raw, limit) {
                Ok(Slot::Record(record)) => {
                    assert!(record.validate().is_ok());
                    if let Some(expected) = &expected {
                        assert_eq!(&record.key, expected);
                    }
                    // A compressed result is refused over the limit; a raw one is as stored.
                    if let Some(result) = &record.result {
                        assert!(result.len() <= limit.max(raw.len()), "{record:?}");
                    }
                }
                Ok(Slot::Tombstone(fence)) => assert!(fence >= Fence::MIN),
                Err(err) => assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}"),
            }
        }
        Input::Result { result, threshold } => {
            let record = completed(result);
            let raw = encode_value(&record, usize::from(threshold)).unwrap();
            let limit = record.result.as_ref().map_or(0, Bytes::len);
            let slot = decode_value(Some(&key()), &raw, limit).unwrap();
            assert_eq!(slot, Slot::Record(record));
        }
    }
});
