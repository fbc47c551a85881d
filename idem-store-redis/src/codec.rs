//! The value of a Redis record: one string per key, its encoding in this one module.
//!
//! Layout 1 (integers big-endian):
//!
//! ```text
//! offset size  field
//!      0    1  layout version (1)
//!      1    1  kind: 't' a tombstone, 'r' a record
//! tombstone:
//!      2    8  the last fence the key granted (nothing follows)
//! record:
//!      2    1  result codec: 0 as it is, 1 lz4 (size-prepended block)
//!      3    2  length of the key bytes
//!      5    n  the key bytes: idem_core::codec::encode_key (scope length, scope, key)
//!    5+n       the record: idem_core::codec::encode_record, its result as stored
//! ```
//!
//! Decoding is defensive: anything unexpected is [`StoreError::Corrupt`], never a panic, and
//! every decoded record is checked with [`Record::validate`]. A value of another layout (or a
//! hash of the earlier, script-era layout) is `Corrupt`: no release shipped it.

use std::borrow::Cow;

use idem_core::atomic::Slot;
use idem_core::codec::{decode_key, decode_record, encode_key, encode_record};
use idem_core::{Bytes, Fence, Record, RecordKey, StoreError};

/// The layout version this build writes and reads.
pub(crate) const LAYOUT: u8 = 1;

const TOMBSTONE: u8 = b't';
const RECORD: u8 = b'r';
const RAW: u8 = 0;
const LZ4: u8 = 1;
const TOMBSTONE_LEN: usize = 10;
const HEADER_LEN: usize = 5;

/// The value of a tombstone of `fence`.
pub(crate) fn encode_tombstone(fence: Fence) -> Vec<u8> {
    let mut out = Vec::with_capacity(TOMBSTONE_LEN);
    out.extend_from_slice(&[LAYOUT, TOMBSTONE]);
    out.extend_from_slice(&fence.get().to_be_bytes());
    out
}

/// The value of `record`, its result lz4-compressed when over `threshold` bytes and smaller so.
///
/// # Errors
/// [`StoreError::TooLarge`] for a result or message over 4 GiB.
pub(crate) fn encode_value(record: &Record, threshold: usize) -> Result<Vec<u8>, StoreError> {
    let key = encode_key(&record.key);
    let (codec, stored) = match &record.result {
        Some(result) => match encode_result(result, threshold) {
            Cow::Owned(compressed) => (LZ4, Some(Bytes::from(compressed))),
            Cow::Borrowed(_) => (RAW, None),
        },
        None => (RAW, None),
    };
    let body = match stored {
        Some(stored) => encode_record(&Record {
            result: Some(stored),
            ..record.clone()
        })?,
        None => encode_record(record)?,
    };
    // A key is at most 1 + 255 + 255 bytes (the key rules).
    let key_len = u16::try_from(key.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(HEADER_LEN + key.len() + body.len());
    out.extend_from_slice(&[LAYOUT, RECORD, codec]);
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(&key);
    out.extend_from_slice(&body);
    Ok(out)
}

/// The slot in `raw`, read at the Redis key that `stored_key` spells (called only for an error
/// about a value read without an `expected` key: a replay does not pay for it) for `expected`
/// (when known). A record of another key (a digest collision) is `Corrupt`.
///
/// # Errors
/// [`StoreError::Corrupt`] for anything this layout does not write.
pub(crate) fn decode_value(
    stored_key: &dyn Fn() -> String,
    expected: Option<&RecordKey>,
    raw: &[u8],
    max_result: usize,
) -> Result<Slot, StoreError> {
    let name = || expected.map_or_else(stored_key, ToString::to_string);
    let corrupt = |reason: &str| StoreError::Corrupt {
        key: name(),
        reason: reason.to_owned(),
    };
    match raw {
        [LAYOUT, TOMBSTONE, fence @ ..] => {
            let fence = <[u8; 8]>::try_from(fence)
                .map(u64::from_be_bytes)
                .map_err(|_| corrupt("the tombstone is garbled"))?;
            if fence == 0 {
                return Err(corrupt("the fence is zero"));
            }
            Ok(Slot::Tombstone(Fence::new(fence)))
        }
        [LAYOUT, RECORD, codec, l0, l1, rest @ ..] => {
            let key_len = usize::from(u16::from_be_bytes([*l0, *l1]));
            let (key, body) = rest
                .split_at_checked(key_len)
                .ok_or_else(|| corrupt("the record is truncated"))?;
            let key = decode_key(key).map_err(|_| corrupt("the key is garbled"))?;
            if expected.is_some_and(|expected| *expected != key) {
                return Err(corrupt("the value holds the record of another key"));
            }
            let mut record = decode_record(&key, body)?;
            record.result = match (*codec, record.result.take()) {
                (RAW, result) => result,
                (LZ4, Some(stored)) => {
                    Some(
                        decode_result(&stored, max_result).map_err(|r| StoreError::Corrupt {
                            key: name(),
                            reason: r,
                        })?,
                    )
                }
                _ => return Err(corrupt("unknown result codec")),
            };
            Ok(Slot::Record(record))
        }
        [LAYOUT, ..] => Err(corrupt("the value is garbled")),
        _ => Err(corrupt("not a record of this layout")),
    }
}

/// `result` compressed with lz4 (size-prepended block format) if it is longer than `threshold`
/// bytes and that makes it smaller; otherwise as it is (borrowed).
pub(crate) fn encode_result(result: &[u8], threshold: usize) -> Cow<'_, [u8]> {
    if result.len() > threshold {
        let compressed = lz4_flex::compress_prepend_size(result);
        if compressed.len() < result.len() {
            return Cow::Owned(compressed);
        }
    }
    Cow::Borrowed(result)
}

/// Reverses [`encode_result`] for a compressed result. One that claims to be longer than
/// `max_len` is refused before anything is allocated.
fn decode_result(stored: &[u8], max_len: usize) -> Result<Bytes, String> {
    let (prefix, body) = stored
        .split_first_chunk::<4>()
        .ok_or("the compressed result has no length")?;
    let len = usize::try_from(u32::from_le_bytes(*prefix))
        .map_err(|_| "the compressed result is too long")?;
    if len > max_len {
        return Err(format!(
            "the compressed result claims {len} bytes, over the limit of {max_len}"
        ));
    }
    let mut out = vec![0u8; len];
    let written = lz4_flex::decompress_into(body, &mut out)
        .map_err(|err| format!("the compressed result does not decompress: {err}"))?;
    if written != len {
        return Err("the compressed result has the wrong length".to_owned());
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use idem_core::machine::{self, LeasePolicy, Write};
    use idem_core::{
        ClaimOutcome, ClaimRequest, Failure, Fingerprint, IdempotencyKey, OwnerToken, Scope, State,
        Timestamp, UnknownOutcome,
    };

    fn key() -> RecordKey {
        RecordKey::new(
            Scope::new("tenant").unwrap(),
            IdempotencyKey::new("k:1").unwrap(),
        )
    }

    /// A record in `state` as idem-core's machine leaves it, with `result` if completed.
    fn record(state: State, result: &[u8]) -> Record {
        let now = Timestamp::from_micros(1_700_000_000_000_000);
        let lease = Duration::from_secs(30);
        let request = ClaimRequest::new(key(), Fingerprint::of(&[b"x"]), lease);
        let granted = machine::claim(None, &request, now, Fence::MIN, OwnerToken::random());
        let granted = granted.unwrap();
        let (Write::Put(held), ClaimOutcome::Acquired { lease, .. }) =
            (granted.write, granted.answer)
        else {
            panic!("a grant")
        };
        let policy = LeasePolicy::Lenient;
        let step = match state {
            State::InFlight => return held,
            State::Completed => {
                let result = Bytes::copy_from_slice(result);
                machine::complete(Some(&held), &lease, result, lease_hour(), now, policy)
            }
            State::Failed => {
                let failure = Failure::permanent("declined");
                machine::fail(Some(&held), &lease, failure, lease_hour(), now, policy)
            }
            State::Unknown => {
                let outcome = UnknownOutcome::new("timed out").head_seen(true);
                let hold = Some(Duration::from_secs(60));
                machine::settle_unknown(
                    Some(&held),
                    &lease,
                    outcome,
                    hold,
                    lease_hour(),
                    now,
                    policy,
                )
            }
        };
        match step.unwrap().write {
            Write::Put(record) => record,
            other => panic!("{other:?}"),
        }
    }

    fn lease_hour() -> Duration {
        Duration::from_secs(3600)
    }

    #[test]
    fn records_and_tombstones_round_trip() {
        let long = vec![7u8; 5000];
        for (state, result) in [
            (State::InFlight, &b""[..]),
            (State::Completed, &b"done"[..]),
            (State::Completed, &long[..]),
            (State::Failed, &b""[..]),
            (State::Unknown, &b""[..]),
        ] {
            let record = record(state, result);
            let raw = encode_value(&record, 1024).unwrap();
            let slot = decode_value(&|| "k".into(), Some(&key()), &raw, 1 << 20).unwrap();
            assert_eq!(slot, Slot::Record(record));
        }
        let raw = encode_tombstone(Fence::new(9));
        assert_eq!(raw.len(), TOMBSTONE_LEN);
        assert_eq!(
            decode_value(&|| "k".into(), None, &raw, 0).unwrap(),
            Slot::Tombstone(Fence::new(9))
        );
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        let raw = encode_value(&record(State::Completed, &[7; 5000]), 1024).unwrap();
        assert_eq!(raw[2], LZ4);
        for len in 0..raw.len() {
            let read = decode_value(&|| "k".into(), Some(&key()), &raw[..len], 1 << 20);
            assert!(matches!(read, Err(StoreError::Corrupt { .. })), "{len}");
        }
        // Over the result limit, another key, another layout, a zero fence.
        assert!(decode_value(&|| "k".into(), Some(&key()), &raw, 100).is_err());
        let other = RecordKey::unscoped(IdempotencyKey::new("other").unwrap());
        assert!(decode_value(&|| "k".into(), Some(&other), &raw, 1 << 20).is_err());
        let mut later = raw.clone();
        later[0] = 2;
        assert!(decode_value(&|| "k".into(), None, &later, 1 << 20).is_err());
        assert!(decode_value(&|| "k".into(), None, &encode_tombstone(Fence::new(0)), 0).is_err());
        assert!(decode_value(&|| "k".into(), None, b"?", 0).is_err());
    }

    #[test]
    fn results_compress_only_when_it_helps() {
        assert!(matches!(encode_result(&[1; 100], 10), Cow::Owned(_)));
        assert!(matches!(encode_result(&[1; 100], 1000), Cow::Borrowed(_)));
        let noise: Vec<u8> = (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect();
        let _ = encode_result(&noise, 10);
    }
}
