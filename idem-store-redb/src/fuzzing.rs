//! Entry points for the fuzz targets of the workspace's `fuzz/` crate: the record and key
//! encoding, otherwise private. Only with the `fuzzing` feature; not a stable API.

use idem_core::{Record, RecordKey, StoreError, Timestamp};

/// The stored form of `record`, as the store writes it.
///
/// # Errors
/// [`StoreError::TooLarge`] for a result or failure message over 4 GiB.
pub fn encode_record(record: &Record) -> Result<Vec<u8>, StoreError> {
    crate::codec::encode_record(record)
}

/// The record stored under `key` as `raw`, as the store reads it.
///
/// # Errors
/// [`StoreError::Corrupt`] if `raw` is not a record of a known format or breaks the invariants.
pub fn decode_record(key: &RecordKey, raw: &[u8]) -> Result<Record, StoreError> {
    crate::codec::decode_record(key, raw)
}

/// The table key of `key`.
#[must_use]
pub fn encode_key(key: &RecordKey) -> Vec<u8> {
    crate::codec::encode_key(key)
}

/// The record key stored under table key `raw`.
///
/// # Errors
/// [`StoreError::Corrupt`] if `raw` is not a table key this store writes.
pub fn decode_key(raw: &[u8]) -> Result<RecordKey, StoreError> {
    crate::codec::decode_key(raw)
}

/// `expires_at` of a stored record, read without decoding it (as the sweep does).
#[must_use]
pub fn expires_at(raw: &[u8]) -> Option<Timestamp> {
    crate::codec::expires_at(raw)
}

/// The fence of a stored record, read without decoding it (as a removal does).
#[must_use]
pub fn fence(raw: &[u8]) -> Option<u64> {
    crate::codec::fence(raw)
}
