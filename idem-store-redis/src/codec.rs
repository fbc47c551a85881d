//! Records to hash fields and back, and the result's compression.
//!
//! Decoding is defensive: a missing or garbled field is a [`StoreError::Corrupt`], never a
//! panic, and every decoded record is checked with [`Record::validate`].

use std::collections::BTreeMap;

use idem_core::{
    Bytes, Failure, Fence, Fingerprint, IdempotencyKey, OwnerToken, Record, RecordKey, Scope,
    State, StoreError, Timestamp,
};

/// The codec flag of an lz4-compressed result (field `z`).
pub(crate) const LZ4: &str = "1";

/// The named fields of a record (besides the result pieces `0`, `1`, ...).
const KNOWN: [&[u8]; 13] = [
    b"s", b"p", b"o", b"n", b"l", b"a", b"c", b"d", b"x", b"k", b"g", b"e", b"z",
];

/// A result as it is stored: maybe compressed, with its codec flag.
#[derive(Debug)]
pub(crate) struct StoredResult {
    /// The bytes to store.
    pub(crate) bytes: Vec<u8>,
    /// `""` for raw bytes, [`LZ4`] for lz4 (size-prepended block format).
    pub(crate) codec: &'static str,
}

/// Compresses `result` with lz4 if it is longer than `threshold` bytes and compression makes
/// it smaller; otherwise keeps it as it is.
pub(crate) fn encode_result(result: &[u8], threshold: usize) -> StoredResult {
    if result.len() > threshold {
        let compressed = lz4_flex::compress_prepend_size(result);
        if compressed.len() < result.len() {
            return StoredResult {
                bytes: compressed,
                codec: LZ4,
            };
        }
    }
    StoredResult {
        bytes: result.to_vec(),
        codec: "",
    }
}

/// Reverses [`encode_result`]. A compressed result that claims to be longer than `max_len`
/// is refused before anything is allocated.
fn decode_result(stored: Vec<u8>, codec: Option<&[u8]>, max_len: usize) -> Result<Bytes, String> {
    match codec {
        None => Ok(Bytes::from(stored)),
        Some(b"1") => {
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
        Some(_) => Err("unknown result codec".to_owned()),
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

/// The named fields of one record.
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
                fields.pieces.insert(index, value);
            } else if !KNOWN.contains(&name) {
                return Err("unknown field".to_owned());
            } else if fields.named.insert(name, value).is_some() {
                return Err("a field appears twice".to_owned());
            }
        }
        Ok(fields)
    }

    fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.named.get(name.as_bytes()).copied()
    }

    fn required(&self, name: &str, what: &str) -> Result<&'a [u8], String> {
        self.get(name)
            .ok_or_else(|| format!("the {what} is missing"))
    }

    fn number(&self, name: &str, what: &str) -> Result<u64, String> {
        parse_u64(self.required(name, what)?).ok_or_else(|| format!("the {what} is not a number"))
    }

    fn text(&self, name: &str, what: &str) -> Result<Option<&'a str>, String> {
        self.get(name)
            .map(|v| std::str::from_utf8(v).map_err(|_| format!("the {what} is not UTF-8")))
            .transpose()
    }

    fn record(&self, max_result: usize) -> Result<Record, String> {
        let state = match self.required("s", "state")? {
            b"i" => State::InFlight,
            b"c" => State::Completed,
            b"f" => State::Failed,
            _ => return Err("unknown state".to_owned()),
        };
        let fingerprint: [u8; 32] = self
            .required("p", "fingerprint")?
            .try_into()
            .map_err(|_| "the fingerprint is not 32 bytes")?;
        let owner: [u8; 16] = self
            .required("o", "owner token")?
            .try_into()
            .map_err(|_| "the owner token is not 16 bytes")?;
        let key = self
            .text("k", "key")?
            .ok_or("the key is missing")
            .and_then(|k| IdempotencyKey::new(k).map_err(|_| "the key breaks the key rules"))?;
        let scope = Scope::new(self.text("g", "scope")?.unwrap_or(""))
            .map_err(|_| "the scope breaks the key rules")?;
        let attempt = u32::try_from(self.number("a", "attempt count")?)
            .map_err(|_| "the attempt count is out of range")?;
        let completed_at = match self.get("d") {
            Some(v) => Some(parse_u64(v).ok_or("the completion time is not a number")?),
            None => None,
        };
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
            Some(decode_result(stored, self.get("z"), max_result)?)
        };
        let failure = self.text("e", "failure message")?.map(Failure::permanent);
        Ok(Record {
            key: RecordKey::new(scope, key),
            state,
            fingerprint: Fingerprint::from_bytes(fingerprint),
            owner: OwnerToken::from_u128(u128::from_be_bytes(owner)),
            fence: Fence::new(self.number("n", "fence")?),
            lease_until: Timestamp::from_micros(self.number("l", "lease end")?),
            attempt,
            created_at: Timestamp::from_micros(self.number("c", "creation time")?),
            completed_at: completed_at.map(Timestamp::from_micros),
            expires_at: Timestamp::from_micros(self.number("x", "expiry time")?),
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

    fn completed(result_pieces: &[(&str, &[u8])]) -> Vec<Vec<u8>> {
        let mut pairs: Vec<(&str, &[u8])> = vec![
            ("s", b"c"),
            ("p", &[7u8; 32]),
            ("o", &[9u8; 16]),
            ("n", b"1700000000000000"),
            ("l", b"1700000030000000"),
            ("a", b"1"),
            ("c", b"1700000000000000"),
            ("d", b"1700000001000000"),
            ("x", b"1700003600000000"),
            ("k", b"order:1"),
        ];
        pairs.extend_from_slice(result_pieces);
        fields(&pairs)
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
        assert_eq!(
            record.owner,
            OwnerToken::from_u128(u128::from_be_bytes([9; 16]))
        );
        assert_eq!(record.fence, Fence::new(1_700_000_000_000_000));
        assert_eq!(record.state, State::Completed);
        assert_eq!(record.key, key());
    }

    #[test]
    fn garbled_fields_are_corrupt_not_panics() {
        let cases: Vec<Vec<Vec<u8>>> = vec![
            completed(&[]),                                           // completed without a result
            completed(&[("0", b"a"), ("2", b"c")]),                   // a gap in the pieces
            completed(&[("0", b"a"), ("z", b"9")]),                   // unknown codec
            completed(&[("0", b"a"), ("z", b"1")]),                   // not lz4
            completed(&[("0", b"\xff\xff\xff\x7f..."), ("z", b"1")]), // a huge claimed length
            completed(&[("0", b"a"), ("99999999999999999999999", b"x")]),
            completed(&[("0", b"a"), ("e", b"\xff")]), // a message that is not UTF-8
            fields(&[("s", b"c")]),
            fields(&[("s", b"q")]),
            vec![b"s".to_vec()],
            vec![],
        ];
        for (i, case) in cases.iter().enumerate() {
            let err = decode_record(Some(&key()), case, 1 << 20).unwrap_err();
            assert!(
                matches!(err, StoreError::Corrupt { .. }),
                "case {i}: {err:?}"
            );
        }
        let mut bad_number = completed(&[("0", b"a")]);
        bad_number[7] = b"+17".to_vec(); // the fence
        assert!(decode_record(Some(&key()), &bad_number, 1 << 20).is_err());
        let other = RecordKey::unscoped(IdempotencyKey::new("order:2").unwrap());
        assert!(decode_record(Some(&other), &completed(&[("0", b"a")]), 1 << 20).is_err());
    }

    #[test]
    fn results_compress_only_when_it_helps() {
        let text = b"{\"status\":\"ok\"}".repeat(200);
        let stored = encode_result(&text, 1024);
        assert_eq!(stored.codec, LZ4);
        assert!(stored.bytes.len() < text.len() / 4);
        let back = decode_result(stored.bytes, Some(b"1"), 1 << 20).unwrap();
        assert_eq!(&back[..], &text[..]);

        let short = encode_result(b"tiny", 1024);
        assert_eq!((short.codec, &short.bytes[..]), ("", &b"tiny"[..]));

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
        assert_eq!(encode_result(&noise, 1024).codec, "");
        // A limit below the real length refuses the result.
        let stored = encode_result(&text, 1024);
        assert!(decode_result(stored.bytes, Some(b"1"), 100).is_err());
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
