//! Fuzzes the Redis store's decoding of what its Lua scripts answer: a record's hash fields
//! (`HGETALL` order: name, value, ...), its result cut into pieces and maybe lz4-compressed, and
//! the common transition answers. Garbage must be `Corrupt` (or `Backend` for an answer of an
//! unknown shape), never a panic or an allocation the limit does not allow; a result the store
//! wrote, in any number of pieces, compressed or not, must decode to the same bytes.
#![no_main]

use arbitrary::Arbitrary;
use idem_core::{IdempotencyKey, RecordKey, State, StoreError};
use idem_store_redis::fuzzing::{decode_record, encode_result, settle};
use libfuzzer_sys::fuzz_target;

/// A field name: a one-letter name (the record's fields are one letter each), a result piece
/// number, or anything.
#[derive(Arbitrary, Debug)]
enum Name {
    Letter(u8),
    Piece(u8),
    Other(Vec<u8>),
}

impl Name {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Name::Letter(n) => vec![b'a' + n % 26],
            Name::Piece(n) => n.to_string().into_bytes(),
            Name::Other(name) => name.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any fields, as a script could answer them.
    Fields {
        fields: Vec<(Name, Vec<u8>)>,
        odd: bool,
        expected: bool,
        max_result: u16,
    },
    /// A completed record whose result the store encoded, cut into pieces.
    Result {
        result: Vec<u8>,
        threshold: u16,
        cuts: Vec<u16>,
    },
    /// A holder's transition answer.
    Reply { parts: Vec<Vec<u8>> },
}

fn key() -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new("order:1").unwrap())
}

/// The fields of a completed record of key [`key`] whose result is stored with `codec`,
/// without its result pieces, as the scripts write them: `m` the meta (Lua `struct` format
/// `>c1c1I4I7I7I7I7c16I7`: state, codec, attempt, fence, created_at, lease_until, expires_at,
/// owner, completed_at),
/// `p` the fingerprint, `k` the key. Follows the record layout of idem-store-redis: change it
/// with the layout (every input of the `Result` kind fails until then).
fn completed(codec: &str) -> Vec<Vec<u8>> {
    let be56 = |n: u64| n.to_be_bytes()[1..].to_vec();
    let mut meta = vec![b'c', codec.as_bytes().first().copied().unwrap_or(b'0')];
    meta.extend(1u32.to_be_bytes());
    for n in [
        1_700_000_000_000_001,
        1_700_000_000_000_000,
        1_700_000_001_000_000,
        1_700_003_600_000_000,
    ] {
        meta.extend(be56(n));
    }
    meta.extend([9; 16]);
    meta.extend(be56(1_700_000_000_500_000));
    vec![
        b"m".to_vec(),
        meta,
        b"p".to_vec(),
        vec![7; 32],
        b"k".to_vec(),
        b"order:1".to_vec(),
    ]
}

fuzz_target!(|input: Input| {
    match input {
        Input::Fields {
            fields,
            odd,
            expected,
            max_result,
        } => {
            let mut flat: Vec<Vec<u8>> = fields
                .iter()
                .flat_map(|(name, value)| [name.bytes(), value.clone()])
                .collect();
            if odd {
                flat.push(b"m".to_vec());
            }
            let expected = expected.then(key);
            let limit = usize::from(max_result);
            match decode_record(expected.as_ref(), &flat, limit) {
                Ok(record) => {
                    assert!(record.validate().is_ok());
                    if let Some(expected) = &expected {
                        assert_eq!(&record.key, expected);
                    }
                    // A compressed result is refused over the limit; a raw one is as stored.
                    if let Some(result) = &record.result {
                        let stored: usize = flat
                            .chunks(2)
                            .filter(|p| p[0].iter().all(u8::is_ascii_digit))
                            .map(|p| p.get(1).map_or(0, Vec::len))
                            .sum();
                        assert!(result.len() <= limit.max(stored), "{record:?}");
                    }
                }
                Err(err) => assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}"),
            }
        }
        Input::Result {
            result,
            threshold,
            cuts,
        } => {
            let (stored, codec) = encode_result(&result, usize::from(threshold));
            let mut pieces = Vec::new();
            let mut rest = &stored[..];
            for cut in cuts {
                let at = usize::from(cut).min(rest.len());
                let (piece, tail) = rest.split_at(at);
                pieces.push(piece.to_vec());
                rest = tail;
            }
            pieces.push(rest.to_vec());
            let mut fields = completed(codec);
            // Pieces in reverse order: the decoder orders them by number.
            for (i, piece) in pieces.iter().enumerate().rev() {
                fields.extend([i.to_string().into_bytes(), piece.clone()]);
            }
            let record = decode_record(Some(&key()), &fields, result.len()).unwrap();
            assert_eq!(record.state, State::Completed);
            assert_eq!(record.result.as_deref(), Some(&result[..]));
        }
        Input::Reply { parts } => match settle(parts.clone(), &key()) {
            Ok(rest) => {
                assert_eq!(parts[0], b"ok");
                assert_eq!(rest, parts[1..]);
            }
            Err(
                StoreError::Rejected(_) | StoreError::Corrupt { .. } | StoreError::Backend { .. },
            ) => {}
            Err(err) => panic!("an answer gave {err:?}"),
        },
    }
});
