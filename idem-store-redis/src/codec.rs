//! Records to hash fields and back, and the result's compression.
//!
//! Decoding is defensive: a missing or garbled field is a [`StoreError::Corrupt`], never a
//! panic, and every decoded record is checked with [`Record::validate`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use idem_core::{
    Bytes, Failure, Fence, Fingerprint, IdempotencyKey, OwnerToken, Record, RecordKey, Scope,
    State, StoreError, Timestamp,
};

/// The codec flag of an lz4-compressed result (in the meta).
pub(crate) const LZ4: &str = "1";

/// The codec flag of a result stored as it is.
pub(crate) const RAW: &str = "0";

/// The named fields of a record (besides the result pieces `0`, `1`, ...).
const KNOWN: [&[u8]; 5] = [b"m", b"p", b"k", b"g", b"e"];

/// Bytes of the meta field (`m`) of a tombstone: state, codec, attempt and four times.
pub(crate) const META_BYTES: usize = 34;

/// Bytes of the meta field of an in-flight record: the tombstone's layout and the owner token.
pub(crate) const HELD_META_BYTES: usize = META_BYTES + 16;

/// Bytes of the meta field of a settled record: the in-flight layout and `completed_at`.
pub(crate) const SETTLED_META_BYTES: usize = HELD_META_BYTES + 7;

/// The meta field (`m`) of a record, as the scripts pack it (Lua `struct` format
/// `>c1c1I4I7I7I7I7c16`, then `I7` when settled): state, codec, attempt, fence, created_at,
/// lease_until, expires_at, the owner token, and a settled record's completed_at. A settled
/// record keeps the owner and the lease of the attempt that settled it, as idem-core's machine
/// leaves them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) state: State,
    /// `true` when the result is lz4-compressed.
    pub(crate) lz4: bool,
    pub(crate) attempt: u32,
    pub(crate) fence: u64,
    pub(crate) created: u64,
    /// The lease end of the attempt that holds (or held) the record.
    pub(crate) time: u64,
    pub(crate) expires: u64,
    /// The owner of the attempt that holds (or settled) the record.
    pub(crate) owner: u128,
    /// When a settled record settled; `None` in flight.
    pub(crate) completed: Option<u64>,
}

impl Meta {
    /// Decodes a meta field. Tombstones never reach the client (the scripts answer "no record"
    /// for them), so one here is garbled too.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Meta, String> {
        let garbled = || "the meta field is garbled".to_owned();
        let state = match bytes.first() {
            Some(b'i') => State::InFlight,
            Some(b'c') => State::Completed,
            Some(b'f') => State::Failed,
            Some(_) => return Err("unknown state".to_owned()),
            None => return Err(garbled()),
        };
        let expected = match state {
            State::InFlight => HELD_META_BYTES,
            State::Completed | State::Failed => SETTLED_META_BYTES,
        };
        if bytes.len() != expected {
            return Err(garbled());
        }
        let lz4 = match bytes[1] {
            b'0' => false,
            b'1' if state == State::Completed => true,
            _ => return Err("unknown result codec".to_owned()),
        };
        let attempt = bytes
            .get(2..6)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_be_bytes)
            .ok_or_else(garbled)?;
        let at = |offset: usize| bytes.get(offset..offset + 7).map(be56).ok_or_else(garbled);
        let owner = bytes
            .get(META_BYTES..HELD_META_BYTES)
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(u128::from_be_bytes)
            .ok_or_else(garbled)?;
        let completed = match state {
            State::InFlight => None,
            State::Completed | State::Failed => Some(at(HELD_META_BYTES)?),
        };
        Ok(Meta {
            state,
            lz4,
            attempt,
            fence: at(6)?,
            created: at(13)?,
            time: at(20)?,
            expires: at(27)?,
            owner,
            completed,
        })
    }
}

/// A big-endian number of up to 8 bytes (the scripts' `>I7`).
pub(crate) fn be56(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |n, &b| (n << 8) | u64::from(b))
}

/// A result as it is stored: maybe compressed, with its codec flag.
#[derive(Debug)]
pub(crate) struct StoredResult<'a> {
    /// The bytes to store: the result itself (not copied) when it is stored as it is.
    pub(crate) bytes: Cow<'a, [u8]>,
    /// [`RAW`] for the bytes as they are, [`LZ4`] for lz4 (size-prepended block format).
    pub(crate) codec: &'static str,
}

/// Compresses `result` with lz4 if it is longer than `threshold` bytes and compression makes
/// it smaller; otherwise keeps it as it is.
pub(crate) fn encode_result(result: &[u8], threshold: usize) -> StoredResult<'_> {
    if result.len() > threshold {
        let compressed = lz4_flex::compress_prepend_size(result);
        if compressed.len() < result.len() {
            return StoredResult {
                bytes: Cow::Owned(compressed),
                codec: LZ4,
            };
        }
    }
    StoredResult {
        bytes: Cow::Borrowed(result),
        codec: RAW,
    }
}

/// Reverses [`encode_result`]. A compressed result that claims to be longer than `max_len`
/// is refused before anything is allocated.
fn decode_result(stored: Vec<u8>, lz4: bool, max_len: usize) -> Result<Bytes, String> {
    match lz4 {
        false => Ok(Bytes::from(stored)),
        true => {
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
    }
}

/// The fields of a record, as `HGETALL` returns them (name, value, name, value...).
pub(crate) fn decode_record(
    expected: Option<&RecordKey>,
    fields: &[Vec<u8>],
    max_result: usize,
) -> Result<Record, StoreError> {
    let text = |key: Option<&RecordKey>| key.map_or_else(|| "?".to_owned(), ToString::to_string);
    let corrupt = |reason: String| StoreError::Corrupt {
        key: text(expected),
        reason,
    };
    let decoded = Fields::parse(fields).and_then(|f| f.record(max_result));
    let record = decoded.map_err(corrupt)?;
    if let Some(expected) = expected
        && &record.key != expected
    {
        return Err(StoreError::corrupt(
            expected,
            "the hash holds the record of another key",
        ));
    }
    record.validate()?;
    Ok(record)
}

/// The fields of one record.
#[derive(Default)]
struct Fields<'a> {
    named: BTreeMap<&'a [u8], &'a [u8]>,
    pieces: BTreeMap<usize, &'a [u8]>,
}

impl<'a> Fields<'a> {
    fn parse(flat: &'a [Vec<u8>]) -> Result<Self, String> {
        if !flat.len().is_multiple_of(2) {
            return Err("an odd number of field names and values".to_owned());
        }
        let mut fields = Fields::default();
        for pair in flat.chunks_exact(2) {
            let (name, value) = (pair[0].as_slice(), pair[1].as_slice());
            if !name.is_empty() && name.iter().all(u8::is_ascii_digit) {
                let index = std::str::from_utf8(name)
                    .ok()
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or("a result piece number is out of range")?;
                if fields.pieces.insert(index, value).is_some() {
                    return Err("a result piece appears twice".to_owned());
                }
            } else if !KNOWN.contains(&name) {
                return Err("unknown field (a record of another format?)".to_owned());
            } else if fields.named.insert(name, value).is_some() {
                return Err("a field appears twice".to_owned());
            }
        }
        Ok(fields)
    }

    fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.named.get(name.as_bytes()).copied()
    }

    fn text(&self, name: &str, what: &str) -> Result<Option<&'a str>, String> {
        self.get(name)
            .map(|v| std::str::from_utf8(v).map_err(|_| format!("the {what} is not UTF-8")))
            .transpose()
    }

    fn record(&self, max_result: usize) -> Result<Record, String> {
        let meta = Meta::parse(self.get("m").ok_or("the hash has no meta field")?)?;
        let fingerprint: [u8; 32] = self
            .get("p")
            .ok_or("the fingerprint is missing")?
            .try_into()
            .map_err(|_| "the fingerprint is not 32 bytes")?;
        let key = self
            .text("k", "key")?
            .ok_or("the key is missing")
            .and_then(|k| IdempotencyKey::new(k).map_err(|_| "the key breaks the key rules"))?;
        let scope = Scope::new(self.text("g", "scope")?.unwrap_or(""))
            .map_err(|_| "the scope breaks the key rules")?;
        let result = if self.pieces.is_empty() {
            None
        } else {
            let mut stored = Vec::new();
            for (expected, (&index, piece)) in self.pieces.iter().enumerate() {
                if index != expected {
                    return Err("the result pieces are not numbered 0 to n-1".to_owned());
                }
                stored.extend_from_slice(piece);
            }
            Some(decode_result(stored, meta.lz4, max_result)?)
        };
        let failure = self.text("e", "failure message")?.map(Failure::permanent);
        Ok(Record {
            key: RecordKey::new(scope, key),
            state: meta.state,
            fingerprint: Fingerprint::from_bytes(fingerprint),
            owner: OwnerToken::from_u128(meta.owner),
            fence: Fence::new(meta.fence),
            lease_until: Timestamp::from_micros(meta.time),
            attempt: meta.attempt,
            created_at: Timestamp::from_micros(meta.created),
            completed_at: meta.completed.map(Timestamp::from_micros),
            expires_at: Timestamp::from_micros(meta.expires),
            result,
            failure,
        })
    }
}

/// A canonical decimal `u64`: digits only, no sign, no leading zero (but `0` itself).
pub(crate) fn parse_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if text.len() > 1 && text[0] == b'0' {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &[u8])]) -> Vec<Vec<u8>> {
        pairs
            .iter()
            .flat_map(|(n, v)| [n.as_bytes().to_vec(), v.to_vec()])
            .collect()
    }

    /// A meta field as the scripts pack it.
    fn meta(state: u8, codec: u8, attempt: u32, times: [u64; 4], owner: Option<u128>) -> Vec<u8> {
        let mut out = vec![state, codec];
        out.extend_from_slice(&attempt.to_be_bytes());
        for time in times {
            out.extend_from_slice(&time.to_be_bytes()[1..]);
        }
        if let Some(owner) = owner {
            out.extend_from_slice(&owner.to_be_bytes());
        }
        out
    }

    /// Fence, created, lease end or completion, expiry.
    const TIMES: [u64; 4] = [
        1_700_000_000_000_000,
        1_699_999_999_000_000,
        1_700_000_001_000_000,
        1_700_003_600_000_000,
    ];

    /// When the settled records of the tests settled.
    const SETTLED_AT: u64 = 1_700_000_000_500_000;

    fn settled_meta(state: u8, codec: u8) -> Vec<u8> {
        let mut out = meta(state, codec, 2, TIMES, Some(0xfeed));
        out.extend_from_slice(&SETTLED_AT.to_be_bytes()[1..]);
        out
    }

    fn completed_with(meta: &[u8], result_pieces: &[(&str, &[u8])]) -> Vec<Vec<u8>> {
        let mut pairs: Vec<(&str, &[u8])> = vec![("m", meta), ("p", &[7u8; 32]), ("k", b"order:1")];
        pairs.extend_from_slice(result_pieces);
        fields(&pairs)
    }

    fn completed(result_pieces: &[(&str, &[u8])]) -> Vec<Vec<u8>> {
        completed_with(&settled_meta(b'c', b'0'), result_pieces)
    }

    fn key() -> RecordKey {
        RecordKey::unscoped(IdempotencyKey::new("order:1").unwrap())
    }

    #[test]
    fn a_record_decodes() {
        let record = decode_record(
            Some(&key()),
            &completed(&[("1", b"world"), ("0", b"hello ")]),
            1 << 20,
        )
        .unwrap();
        assert_eq!(record.result.as_deref(), Some(&b"hello world"[..]));
        // A settled record keeps the owner and the lease of the attempt that settled it.
        assert_eq!(record.owner, OwnerToken::from_u128(0xfeed));
        assert_eq!(record.fence, Fence::new(TIMES[0]));
        assert_eq!(record.created_at, Timestamp::from_micros(TIMES[1]));
        assert_eq!(
            record.completed_at,
            Some(Timestamp::from_micros(SETTLED_AT))
        );
        assert_eq!(record.lease_until, Timestamp::from_micros(TIMES[2]));
        assert_eq!(record.expires_at, Timestamp::from_micros(TIMES[3]));
        assert_eq!(record.attempt, 2);
        assert_eq!(record.state, State::Completed);
        assert_eq!(record.key, key());

        // In flight: the owner and the lease end are kept.
        let held = meta(b'i', b'0', 1, TIMES, Some(0xfeed));
        assert_eq!(held.len(), HELD_META_BYTES);
        let record = decode_record(
            Some(&key()),
            &fields(&[("m", &held), ("p", &[7u8; 32]), ("k", b"order:1")]),
            1 << 20,
        )
        .unwrap();
        assert_eq!(record.state, State::InFlight);
        assert_eq!(record.owner, OwnerToken::from_u128(0xfeed));
        assert_eq!(record.lease_until, Timestamp::from_micros(TIMES[2]));
        assert_eq!(record.completed_at, None);

        // A scoped record names its scope.
        let scoped = RecordKey::new(Scope::new("tenant 7").unwrap(), key().key);
        let mut with_scope = completed(&[("0", b"x")]);
        with_scope.extend(fields(&[("g", b"tenant 7")]));
        assert_eq!(
            decode_record(Some(&scoped), &with_scope, 1 << 20)
                .unwrap()
                .key,
            scoped
        );
    }

    #[test]
    fn garbled_fields_are_corrupt_not_panics() {
        let held = meta(b'i', b'0', 1, TIMES, Some(1));
        let short = settled_meta(b'c', b'0')[..20].to_vec();
        let tombstone = settled_meta(b'-', b'0');
        let lz4_failed = settled_meta(b'f', b'1');
        let mut zero_attempt = meta(b'c', b'0', 0, TIMES, Some(1));
        zero_attempt.extend_from_slice(&SETTLED_AT.to_be_bytes()[1..]);
        let settled_without_completion = meta(b'c', b'0', 2, TIMES, Some(1));
        let cases: Vec<Vec<Vec<u8>>> = vec![
            completed(&[]),                         // completed without a result
            completed(&[("0", b"a"), ("2", b"c")]), // a gap in the pieces
            completed_with(&settled_meta(b'c', b'9'), &[("0", b"a")]), // unknown codec
            completed_with(&settled_meta(b'c', b'1'), &[("0", b"a")]), // not lz4
            completed_with(&settled_meta(b'c', b'1'), &[("0", b"\xff\xff\xff\x7f...")]), // a huge claimed length
            completed_with(&settled_meta(b'q', b'0'), &[("0", b"a")]), // unknown state
            completed_with(&short, &[("0", b"a")]),                    // a short meta
            completed_with(&tombstone, &[("0", b"a")]),                // a tombstone
            completed_with(&held, &[("0", b"a")]),                     // in flight with a result
            completed_with(&lz4_failed, &[("e", b"x")]),               // a codec on a failure
            completed_with(&zero_attempt, &[("0", b"a")]),             // attempt 0
            completed_with(&settled_without_completion, &[("0", b"a")]), // no completed_at
            completed_with(&settled_meta(b'f', b'0'), &[]),            // failed without a failure
            completed(&[("0", b"a"), ("0", b"b")]),                    // a piece twice
            completed(&[("0", b"a"), ("99999999999999999999999", b"x")]),
            completed(&[("0", b"a"), ("e", b"\xff")]), // a message that is not UTF-8
            completed(&[("0", b"a"), ("s", b"c")]),    // a field of the old format
            completed(&[("0", b"a"), ("k", b"again")]), // a field twice
            fields(&[("m", &held), ("k", b"order:1")]), // no fingerprint
            fields(&[("m", &held), ("p", &[7u8; 31]), ("k", b"order:1")]),
            fields(&[("m", &held), ("p", &[7u8; 32])]), // no key
            fields(&[("s", b"c")]),
            vec![b"m".to_vec()],
            vec![],
        ];
        for (i, case) in cases.iter().enumerate() {
            let err = decode_record(Some(&key()), case, 1 << 20).unwrap_err();
            assert!(
                matches!(err, StoreError::Corrupt { .. }),
                "case {i}: {err:?}"
            );
        }
        let other = RecordKey::unscoped(IdempotencyKey::new("order:2").unwrap());
        assert!(decode_record(Some(&other), &completed(&[("0", b"a")]), 1 << 20).is_err());
    }

    #[test]
    fn every_meta_length_and_byte_is_checked() {
        // No byte string panics the meta decoder.
        for base in [
            meta(b'i', b'0', 1, TIMES, Some(7)),
            settled_meta(b'c', b'1'),
        ] {
            for len in 0..=base.len() + 1 {
                let mut bytes = base.clone();
                bytes.resize(len, 0xff);
                let _ = Meta::parse(&bytes);
            }
            assert!(Meta::parse(&base).is_ok());
        }
        assert_eq!(settled_meta(b'f', b'0').len(), SETTLED_META_BYTES);
        assert_eq!(be56(&[0, 0, 0, 0, 0, 1, 2]), 0x0102);
    }

    #[test]
    fn results_compress_only_when_it_helps() {
        let text = b"{\"status\":\"ok\"}".repeat(200);
        let stored = encode_result(&text, 1024);
        assert_eq!(stored.codec, LZ4);
        assert!(stored.bytes.len() < text.len() / 4);
        let back = decode_result(stored.bytes.into_owned(), true, 1 << 20).unwrap();
        assert_eq!(&back[..], &text[..]);

        let short = encode_result(b"tiny", 1024);
        assert_eq!((short.codec, &short.bytes[..]), (RAW, &b"tiny"[..]));

        // Bytes that do not compress are stored as they are.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[3]
            })
            .collect();
        assert_eq!(encode_result(&noise, 1024).codec, RAW);
        // A limit below the real length refuses the result.
        let stored = encode_result(&text, 1024);
        assert!(decode_result(stored.bytes.into_owned(), true, 100).is_err());
    }

    #[test]
    fn numbers_are_canonical() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"1700000000000000"), Some(1_700_000_000_000_000));
        for bad in [
            &b""[..],
            b"01",
            b"+1",
            b"-1",
            b"1e5",
            b" 1",
            b"18446744073709551616",
        ] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }
}
