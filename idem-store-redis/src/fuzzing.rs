//! Entry points for the fuzz targets of the workspace's `fuzz/` crate: the decoding of what
//! the Lua scripts answer (record fields, lz4-compressed results, the common answers),
//! otherwise private. Only with the `fuzzing` feature; not a stable API.

use idem_core::{Record, RecordKey, StoreError};

/// The record in `fields`, flat as `HGETALL` and the scripts return them (name, value, ...),
/// as the store decodes it; `expected` is the key it was read under, if known.
///
/// # Errors
/// [`StoreError::Corrupt`] for a missing, unknown or garbled field, a result over
/// `max_result` bytes, or a record that breaks the invariants.
pub fn decode_record(
    expected: Option<&RecordKey>,
    fields: &[Vec<u8>],
    max_result: usize,
) -> Result<Record, StoreError> {
    crate::codec::decode_record(expected, fields, max_result)
}

/// A result as the store writes it: its bytes and its codec flag (the second byte of the meta
/// field `m`: `"0"` for raw bytes, `"1"` for lz4), lz4-compressed when over `threshold` bytes
/// and smaller that way.
#[must_use]
pub fn encode_result(result: &[u8], threshold: usize) -> (Vec<u8>, &'static str) {
    let stored = crate::codec::encode_result(result, threshold);
    (stored.bytes.to_vec(), stored.codec)
}

/// A holder's transition answer (`ok`, `rejected`, `corrupt`) as the store reads it: the parts
/// after `ok`.
///
/// # Errors
/// The rejection or corruption the answer reports, or [`StoreError::Backend`] for an answer
/// of a shape no script gives.
pub fn settle(parts: Vec<Vec<u8>>, key: &RecordKey) -> Result<Vec<Vec<u8>>, StoreError> {
    crate::scripts::Reply { op: "fuzz", parts }.settle(key)
}
