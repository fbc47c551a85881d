//! Fuzzes the redb store's decoding of what it reads from its file: a stored record and a table
//! key. Anything that is not a record this store writes must be `Corrupt`, never a panic; what
//! decodes must encode to the same bytes (one encoding per record), keep the record invariants,
//! and agree with the fixed-offset reads the sweep and removals use.
#![no_main]

use idem_core::{IdempotencyKey, RecordKey, Scope, StoreError};
use idem_store_redb::fuzzing::{
    decode_key, decode_record, encode_key, encode_record, expires_at, fence,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = RecordKey::new(
        Scope::new("tenant").unwrap(),
        IdempotencyKey::new("order:1").unwrap(),
    );
    match decode_record(&key, data) {
        Ok(record) => {
            assert_eq!(record.key, key);
            assert!(record.validate().is_ok());
            assert_eq!(encode_record(&record).unwrap(), data, "{record:?}");
            assert_eq!(expires_at(data), Some(record.expires_at));
            assert_eq!(fence(data), Some(record.fence.get()));
        }
        Err(err) => assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}"),
    }
    match decode_key(data) {
        Ok(key) => assert_eq!(encode_key(&key), data, "{key:?}"),
        Err(err) => assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}"),
    }
});
