//! The binary encoding of keys and records that stores keep as bytes (redb's tables, the value
//! of a Redis record): a hand-written, versioned format, decoded defensively (anything
//! unexpected is [`StoreError::Corrupt`], never a panic).
//!
//! Key: `[scope length: u8][scope][key]`, so records sort by scope, then key.
//!
//! Record, format 1 (integers big-endian):
//!
//! ```text
//! offset size  field
//!      0    1  format version (1)
//!      1    1  state: 0 in_flight, 1 completed, 2 failed, 3 unknown
//!      2   32  fingerprint
//!     34   16  owner token
//!     50    8  fence
//!     58    8  lease_until (µs since the epoch)
//!     66    4  attempt
//!     70    8  created_at
//!     78    8  expires_at
//!     86    1  flags: 1 completed_at, 2 result, 4 failure, 8 failure retryable,
//!                     16 unknown outcome, 32 its request sent, 64 its head seen, 128 hold_until
//!     87       [completed_at: 8] [result: length u32, bytes] [failure: length u32, UTF-8]
//!              [unknown reason: length u32, UTF-8] [hold_until: 8]
//! ```
//! Nothing may follow the last field. The unknown state and its flags came later in format 1:
//! every record written before reads as it did (its flags never set them), and a record
//! written in the unknown state is not readable by a build that predates it (it is reported
//! as corrupt there).

use bytes::Bytes;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{Failure, Record, State, UnknownOutcome};
use crate::time::Timestamp;
use crate::token::{Fence, OwnerToken};

/// The format version this build writes.
pub const FORMAT: u8 = 1;
/// Where the fence sits, so a removal reads it without decoding the record.
const FENCE: usize = 50;
/// Where `expires_at` sits, so the sweep reads it without decoding the record.
const EXPIRES_AT: usize = 78;
const FIXED_LEN: usize = 87;
const HAS_COMPLETED_AT: u8 = 1;
const HAS_RESULT: u8 = 2;
const HAS_FAILURE: u8 = 4;
const FAILURE_RETRYABLE: u8 = 8;
const HAS_UNKNOWN: u8 = 16;
const UNKNOWN_REQUEST_SENT: u8 = 32;
const UNKNOWN_HEAD_SEEN: u8 = 64;
const HAS_HOLD_UNTIL: u8 = 128;

/// The bytes of `key`.
pub fn encode_key(key: &RecordKey) -> Vec<u8> {
    let scope = key.scope.as_str().as_bytes();
    let name = key.key.as_str().as_bytes();
    let mut out = Vec::with_capacity(1 + scope.len() + name.len());
    // A scope is at most 255 bytes (the key rules), so its length fits a byte.
    out.push(u8::try_from(scope.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(scope);
    out.extend_from_slice(name);
    out
}

/// The record key whose bytes are `raw`.
///
/// # Errors
/// [`StoreError::Corrupt`] if `raw` is not the bytes of a key.
pub fn decode_key(raw: &[u8]) -> Result<RecordKey, StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt {
        key: String::from_utf8_lossy(raw).into_owned(),
        reason: reason.to_owned(),
    };
    let (&len, rest) = raw.split_first().ok_or_else(|| corrupt("an empty key"))?;
    let scope = rest
        .get(..usize::from(len))
        .ok_or_else(|| corrupt("a key shorter than its scope"))?;
    let name = &rest[usize::from(len)..];
    let scope = std::str::from_utf8(scope)
        .ok()
        .and_then(|s| Scope::new(s).ok())
        .ok_or_else(|| corrupt("the scope breaks the key rules"))?;
    let name =
        IdempotencyKey::from_bytes(name).map_err(|_| corrupt("the key breaks the key rules"))?;
    Ok(RecordKey::new(scope, name))
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), StoreError> {
    let len = u32::try_from(bytes.len()).map_err(|_| StoreError::TooLarge {
        size: bytes.len(),
        limit: u32::MAX as usize,
    })?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// The stored form of `record` (without its key: see [`encode_key`]).
///
/// # Errors
/// [`StoreError::TooLarge`] for a result or failure message over 4 GiB.
pub fn encode_record(record: &Record) -> Result<Vec<u8>, StoreError> {
    let extra = record.result.as_ref().map_or(0, |r| r.len() + 4)
        + record.failure.as_ref().map_or(0, |f| f.message.len() + 4)
        + record.unknown.as_ref().map_or(0, |u| u.reason.len() + 4)
        + 16;
    let mut out = Vec::with_capacity(FIXED_LEN + extra);
    out.push(FORMAT);
    out.push(match record.state {
        State::InFlight => 0,
        State::Completed => 1,
        State::Failed => 2,
        State::Unknown => 3,
    });
    out.extend_from_slice(record.fingerprint.as_bytes());
    out.extend_from_slice(&record.owner.as_u128().to_be_bytes());
    put_u64(&mut out, record.fence.get());
    put_u64(&mut out, record.lease_until.as_micros());
    out.extend_from_slice(&record.attempt.to_be_bytes());
    put_u64(&mut out, record.created_at.as_micros());
    put_u64(&mut out, record.expires_at.as_micros());
    let mut flags = 0;
    if record.completed_at.is_some() {
        flags |= HAS_COMPLETED_AT;
    }
    if record.result.is_some() {
        flags |= HAS_RESULT;
    }
    if let Some(failure) = &record.failure {
        flags |= HAS_FAILURE;
        if failure.retryable {
            flags |= FAILURE_RETRYABLE;
        }
    }
    if let Some(unknown) = &record.unknown {
        flags |= HAS_UNKNOWN;
        if unknown.request_sent {
            flags |= UNKNOWN_REQUEST_SENT;
        }
        if unknown.head_seen {
            flags |= UNKNOWN_HEAD_SEEN;
        }
    }
    if record.hold_until.is_some() {
        flags |= HAS_HOLD_UNTIL;
    }
    out.push(flags);
    if let Some(at) = record.completed_at {
        put_u64(&mut out, at.as_micros());
    }
    if let Some(result) = &record.result {
        put_bytes(&mut out, result)?;
    }
    if let Some(failure) = &record.failure {
        put_bytes(&mut out, failure.message.as_bytes())?;
    }
    if let Some(unknown) = &record.unknown {
        put_bytes(&mut out, unknown.reason.as_bytes())?;
    }
    if let Some(until) = record.hold_until {
        put_u64(&mut out, until.as_micros());
    }
    Ok(out)
}

/// A cursor over the bytes of a stored value; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    fn sized(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        self.take(len)
    }
}

/// The record of `key` stored as `raw`, checked against the record invariants.
///
/// # Errors
/// [`StoreError::Corrupt`] if `raw` is not a record of a known format or breaks the invariants.
pub fn decode_record(key: &RecordKey, raw: &[u8]) -> Result<Record, StoreError> {
    let record = parse(key, raw).map_err(|reason| StoreError::corrupt(key, reason))?;
    record.validate()?;
    Ok(record)
}

fn parse(key: &RecordKey, raw: &[u8]) -> Result<Record, String> {
    let truncated = || "the record is truncated".to_owned();
    let mut r = Reader { bytes: raw };
    let version = r.u8().ok_or_else(truncated)?;
    if version != FORMAT {
        return Err(format!("unknown record format {version}"));
    }
    let state = match r.u8().ok_or_else(truncated)? {
        0 => State::InFlight,
        1 => State::Completed,
        2 => State::Failed,
        3 => State::Unknown,
        other => return Err(format!("unknown state {other}")),
    };
    let fingerprint = Fingerprint::from_bytes(r.array().ok_or_else(truncated)?);
    let owner = OwnerToken::from_u128(u128::from_be_bytes(r.array().ok_or_else(truncated)?));
    let fence = Fence::new(r.u64().ok_or_else(truncated)?);
    let lease_until = Timestamp::from_micros(r.u64().ok_or_else(truncated)?);
    let attempt = r.u32().ok_or_else(truncated)?;
    let created_at = Timestamp::from_micros(r.u64().ok_or_else(truncated)?);
    let expires_at = Timestamp::from_micros(r.u64().ok_or_else(truncated)?);
    let flags = r.u8().ok_or_else(truncated)?;
    // Each record has one encoding: the failure's retryable bit is never set without a failure,
    // nor the bits of an unknown outcome without one.
    if flags & (HAS_FAILURE | FAILURE_RETRYABLE) == FAILURE_RETRYABLE {
        return Err("the retryable flag is set without a failure".to_owned());
    }
    if flags & HAS_UNKNOWN == 0 && flags & (UNKNOWN_REQUEST_SENT | UNKNOWN_HEAD_SEEN) != 0 {
        return Err("the flags of an unknown outcome are set without one".to_owned());
    }
    let completed_at = if flags & HAS_COMPLETED_AT != 0 {
        Some(Timestamp::from_micros(r.u64().ok_or_else(truncated)?))
    } else {
        None
    };
    let result = if flags & HAS_RESULT != 0 {
        Some(Bytes::copy_from_slice(r.sized().ok_or_else(truncated)?))
    } else {
        None
    };
    let failure = if flags & HAS_FAILURE != 0 {
        let message = std::str::from_utf8(r.sized().ok_or_else(truncated)?)
            .map_err(|_| "the failure message is not UTF-8".to_owned())?;
        Some(Failure {
            message: message.to_owned(),
            retryable: flags & FAILURE_RETRYABLE != 0,
        })
    } else {
        None
    };
    let unknown = if flags & HAS_UNKNOWN != 0 {
        let reason = std::str::from_utf8(r.sized().ok_or_else(truncated)?)
            .map_err(|_| "the unknown outcome's reason is not UTF-8".to_owned())?;
        Some(UnknownOutcome {
            reason: reason.to_owned(),
            request_sent: flags & UNKNOWN_REQUEST_SENT != 0,
            head_seen: flags & UNKNOWN_HEAD_SEEN != 0,
        })
    } else {
        None
    };
    let hold_until = if flags & HAS_HOLD_UNTIL != 0 {
        Some(Timestamp::from_micros(r.u64().ok_or_else(truncated)?))
    } else {
        None
    };
    if !r.bytes.is_empty() {
        return Err(format!("{} bytes after the record", r.bytes.len()));
    }
    Ok(Record {
        key: key.clone(),
        state,
        fingerprint,
        owner,
        fence,
        lease_until,
        attempt,
        created_at,
        completed_at,
        expires_at,
        result,
        failure,
        unknown,
        hold_until,
    })
}

/// The `u64` at `offset` of a stored record, read without decoding it (`None` if it is not a
/// record of a known format).
fn fixed_u64(raw: &[u8], offset: usize) -> Option<u64> {
    if raw.first() != Some(&FORMAT) || raw.len() < FIXED_LEN {
        return None;
    }
    let bytes = raw.get(offset..offset + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// `expires_at` of a stored record, read without decoding it.
pub fn expires_at(raw: &[u8]) -> Option<Timestamp> {
    fixed_u64(raw, EXPIRES_AT).map(Timestamp::from_micros)
}

/// The fence of a stored record, read without decoding it.
pub fn fence(raw: &[u8]) -> Option<u64> {
    fixed_u64(raw, FENCE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> RecordKey {
        RecordKey::new(
            Scope::new("tenant").unwrap(),
            IdempotencyKey::new("k:1").unwrap(),
        )
    }

    fn record(state: State) -> Record {
        Record {
            key: key(),
            state,
            fingerprint: Fingerprint::of(&[b"x"]),
            owner: OwnerToken::random(),
            fence: Fence::new(1_700_000_000_000_001),
            lease_until: Timestamp::from_micros(1_700_000_030_000_000),
            attempt: 2,
            created_at: Timestamp::from_micros(1_700_000_000_000_000),
            completed_at: (state != State::InFlight)
                .then(|| Timestamp::from_micros(1_700_000_001_000_000)),
            expires_at: Timestamp::from_micros(1_700_003_600_000_000),
            result: (state == State::Completed).then(|| Bytes::from_static(b"\x00\xffresult")),
            failure: (state == State::Failed).then(|| Failure::permanent("déclinée")),
            unknown: (state == State::Unknown)
                .then(|| UnknownOutcome::new("délai dépassé").head_seen(true)),
            hold_until: (state == State::Unknown)
                .then(|| Timestamp::from_micros(1_700_000_901_000_000)),
        }
    }

    #[test]
    fn records_round_trip() {
        for state in State::ALL {
            let record = record(state);
            let raw = encode_record(&record).unwrap();
            assert_eq!(decode_record(&key(), &raw).unwrap(), record);
            assert_eq!(expires_at(&raw), Some(record.expires_at));
            assert_eq!(fence(&raw), Some(record.fence.get()));
        }
    }

    #[test]
    fn unknown_records_round_trip_with_and_without_a_hold() {
        let mut record = record(State::Unknown);
        for (sent, head, hold) in [
            (true, true, true),
            (true, false, false),
            (false, false, true),
            (false, true, false),
        ] {
            record.unknown = Some(UnknownOutcome::new("").request_sent(sent).head_seen(head));
            record.hold_until = hold.then(|| Timestamp::from_micros(7));
            let raw = encode_record(&record).unwrap();
            assert_eq!(decode_record(&key(), &raw).unwrap(), record);
        }
    }

    /// A record written before the unknown state existed (format 1, flags of its time) reads
    /// as it did: these are the bytes of a failed record of that build.
    #[test]
    fn records_of_earlier_builds_still_read() {
        let failed = record(State::Failed);
        let raw = encode_record(&failed).unwrap();
        assert_eq!(raw[FIXED_LEN - 1], HAS_COMPLETED_AT | HAS_FAILURE);
        let mut old = raw[..FIXED_LEN].to_vec();
        old.extend_from_slice(
            &Timestamp::from_micros(1_700_000_001_000_000)
                .as_micros()
                .to_be_bytes(),
        );
        old.extend_from_slice(&(u32::try_from("déclinée".len()).unwrap()).to_be_bytes());
        old.extend_from_slice("déclinée".as_bytes());
        assert_eq!(old, raw);
        assert_eq!(decode_record(&key(), &old).unwrap(), failed);
    }

    #[test]
    fn unknown_flags_without_an_outcome_are_corrupt() {
        let raw = encode_record(&record(State::Completed)).unwrap();
        for bit in [UNKNOWN_REQUEST_SENT, UNKNOWN_HEAD_SEEN] {
            let mut flagged = raw.clone();
            flagged[FIXED_LEN - 1] |= bit;
            let err = decode_record(&key(), &flagged).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        }
        // An unknown record without its outcome breaks the invariants.
        let mut unknown = record(State::Unknown);
        unknown.unknown = None;
        let raw = encode_record(&unknown).unwrap();
        assert!(matches!(
            decode_record(&key(), &raw),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn keys_round_trip_and_sort_by_scope() {
        let raw = encode_key(&key());
        assert_eq!(decode_key(&raw).unwrap(), key());
        let unscoped = RecordKey::unscoped(IdempotencyKey::new("z").unwrap());
        assert_eq!(decode_key(&encode_key(&unscoped)).unwrap(), unscoped);
        assert!(decode_key(&[]).is_err());
        assert!(decode_key(&[9, b'a']).is_err());
        assert!(decode_key(&[0]).is_err(), "an empty key name");
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_corrupt() {
        let raw = encode_record(&record(State::Completed)).unwrap();
        for len in 0..raw.len() {
            assert!(
                matches!(
                    decode_record(&key(), &raw[..len]),
                    Err(StoreError::Corrupt { .. })
                ),
                "{len} bytes decoded"
            );
        }
        let mut longer = raw.clone();
        longer.push(0);
        assert!(decode_record(&key(), &longer).is_err());
        let mut other_format = raw;
        other_format[0] = 2;
        assert!(decode_record(&key(), &other_format).is_err());
    }

    /// Found by the fuzz target `redb_record`: a completed record whose flags byte also held
    /// the failure's retryable bit (0x0b) decoded, and re-encoded to other bytes.
    #[test]
    fn the_retryable_flag_without_a_failure_is_corrupt() {
        let raw = encode_record(&record(State::Completed)).unwrap();
        assert_eq!(raw[FIXED_LEN - 1], HAS_COMPLETED_AT | HAS_RESULT);
        let mut flagged = raw;
        flagged[FIXED_LEN - 1] |= FAILURE_RETRYABLE;
        let err = decode_record(&key(), &flagged).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");

        let crash = b"\x01\x01\x00\x01\x02\x03\x04\x0a\x24\x19\xe8\x03\x80\x00\x00\x00\
            \x02\x00\x06\x0a\x24\x18\x1e\x40\x00\x00\x06\x0a\x24\xee\xb1\xe4\
            \x00\x03\x00\x06\x0a\x24\x18\x2d\x82\x07\x08\x09\x0a\x0b\x0c\x0d\
            \x0e\x0f\x00\x06\x0a\x24\x18\x1e\x40\x01\x00\x06\x0a\x24\x19\xe8\
            \x03\x80\x00\x00\x00\x02\x00\x06\x0a\x24\x18\x1e\x40\x00\x00\x06\
            \x0a\x24\xee\xb1\xe4\x00\x0b\x00\x06\x0a\x24\x18\x2d\x82\x40\x00\
            \x00\x00\x08\x00\xffresult";
        assert_eq!(crash.len(), 107);
        assert!(decode_record(&key(), crash).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_record(&key(), &raw);
            let _ = decode_key(&raw);
            let _ = expires_at(&raw);
        }

        #[test]
        fn flipped_bytes_never_panic(flip in 0usize..120, bit in 0u8..8) {
            let mut raw = encode_record(&record(State::Failed)).unwrap();
            let i = flip % raw.len();
            raw[i] ^= 1 << bit;
            let _ = decode_record(&key(), &raw);
        }
    }
}
