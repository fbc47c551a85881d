//! Entry points for the fuzz targets of the workspace's `fuzz/` crate: the decoding of a
//! record's value (layout, key, record, lz4-compressed result), otherwise private. Only with
//! the `fuzzing` feature; not a stable API.

use idem_core::atomic::Slot;
use idem_core::{Record, RecordKey, StoreError};

/// The slot in the value `raw`, as the store decodes it; `expected` is the key it was read
/// under, if known.
///
/// # Errors
/// [`StoreError::Corrupt`] for anything the layout does not write, a result over
/// `max_result` bytes, or a record that breaks the invariants.
pub fn decode_value(
    expected: Option<&RecordKey>,
    raw: &[u8],
    max_result: usize,
) -> Result<Slot, StoreError> {
    crate::codec::decode_value(&|| "fuzz".into(), expected, raw, max_result)
}

/// The value of `record` as the store writes it, its result lz4-compressed when over
/// `threshold` bytes and smaller that way.
///
/// # Errors
/// [`StoreError::TooLarge`] for a result over 4 GiB.
pub fn encode_value(record: &Record, threshold: usize) -> Result<Vec<u8>, StoreError> {
    crate::codec::encode_value(record, threshold)
}
