//! Where a record lives in Redis, and how its result is cut into hash fields.
//!
//! One HASH per record at `idem:{<namespace>:<scope>:<digest>}`:
//! - `<namespace>` is the configured namespace (letters, digits, `_`, `-`, `.`);
//! - `<scope>` is the record's scope, percent-escaped (every byte outside `A-Za-z0-9_.-`
//!   becomes `%XX`), empty for no scope;
//! - `<digest>` is the first 32 hex digits (128 bits) of [`RecordKey::digest_hex`].
//!
//! Raw client input never appears in a Redis key, and the hash tag (the part in braces) holds
//! the whole record identity, so Redis Cluster keeps a record on one node and every script
//! touches exactly one slot.

use idem_core::RecordKey;

/// The fixed prefix of every key.
pub(crate) const PREFIX: &str = "idem:{";

/// Hex digits of the key digest kept in the Redis key (128 bits).
const DIGEST_HEX: usize = 32;

/// The longest result piece that keeps a hash in Redis's compact listpack encoding (the default
/// `hash-max-listpack-value` is 64 bytes; a string of 63 bytes or less also takes a one-byte
/// length header).
pub(crate) const PIECE_BYTES: usize = 63;

/// The most pieces a result is cut into. A longer (stored) result is kept in one field: the
/// hash leaves listpack encoding anyway (`hash-max-listpack-entries` defaults to 128 entries),
/// and one large field costs less than many small ones.
pub(crate) const MAX_PIECES: usize = 32;

/// The Redis key of `key` in `namespace`.
pub(crate) fn redis_key(namespace: &str, key: &RecordKey) -> String {
    let digest = key.digest_hex();
    let scope = key.scope.as_str();
    let mut out = String::with_capacity(PREFIX.len() + namespace.len() + scope.len() + 36);
    out.push_str(PREFIX);
    out.push_str(namespace);
    out.push(':');
    escape_into(&mut out, scope.as_bytes());
    out.push(':');
    out.push_str(digest.get(..DIGEST_HEX).unwrap_or(&digest));
    out.push('}');
    out
}

/// The `SCAN ... MATCH` pattern of every record of `namespace`. Namespaces hold no glob
/// characters (see [`valid_namespace`]).
pub(crate) fn scan_pattern(namespace: &str) -> String {
    format!("{PREFIX}{namespace}:*")
}

/// Whether `namespace` may be used: 1 to 64 bytes of `A-Za-z0-9_.-`.
pub(crate) fn valid_namespace(namespace: &str) -> bool {
    (1..=64).contains(&namespace.len()) && namespace.bytes().all(plain)
}

fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

fn escape_into(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if plain(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
}

/// Cuts a stored result into the hash fields `0`, `1`, ...: pieces of [`PIECE_BYTES`] while
/// that takes at most [`MAX_PIECES`], else one piece. An empty result is one empty piece.
pub(crate) fn pieces(stored: &[u8]) -> Vec<&[u8]> {
    if stored.is_empty() {
        return vec![stored];
    }
    if stored.len() > PIECE_BYTES * MAX_PIECES {
        return vec![stored];
    }
    stored.chunks(PIECE_BYTES).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, Scope};

    fn key(scope: &str, key: &str) -> RecordKey {
        RecordKey::new(
            Scope::new(scope).unwrap(),
            IdempotencyKey::new(key).unwrap(),
        )
    }

    #[test]
    fn keys_hold_no_raw_input_and_one_hash_tag() {
        let k = redis_key("prod", &key("tenant {a}:*", "pay}{ment:*?[x]"));
        assert!(k.starts_with("idem:{prod:tenant%20%7Ba%7D%3A%2A:"), "{k}");
        assert!(k.ends_with('}'));
        // Exactly one brace pair: the whole identity is the hash tag.
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        assert!(!k.contains("pay"), "{k}");
        assert_eq!(
            k.len(),
            "idem:{prod:".len() + "tenant%20%7Ba%7D%3A%2A".len() + 1 + 32 + 1
        );
    }

    #[test]
    fn scopes_and_keys_stay_apart() {
        assert_ne!(
            redis_key("n", &key("a", "bc")),
            redis_key("n", &key("ab", "c"))
        );
        assert_ne!(redis_key("n", &key("", "x")), redis_key("m", &key("", "x")));
        // Escaping is injective: a literal "%41" differs from "A".
        assert_ne!(
            redis_key("n", &key("%41", "x")),
            redis_key("n", &key("A", "x"))
        );
        assert!(redis_key("n", &key("", "x")).starts_with("idem:{n::"));
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(valid_namespace("prod-eu.1_a"));
        assert!(!valid_namespace(""));
        assert!(!valid_namespace("a*b"));
        assert!(!valid_namespace("a:b"));
        assert!(!valid_namespace("a}b"));
        assert!(!valid_namespace(&"a".repeat(65)));
    }

    #[test]
    fn results_are_cut_into_small_pieces_up_to_a_limit() {
        assert_eq!(pieces(b""), vec![&b""[..]]);
        let small = vec![7u8; 200];
        let cut = pieces(&small);
        assert_eq!(cut.len(), 4);
        assert!(cut.iter().all(|p| p.len() <= PIECE_BYTES));
        assert_eq!(cut.concat(), small);
        let big = vec![1u8; PIECE_BYTES * MAX_PIECES + 1];
        assert_eq!(pieces(&big).len(), 1);
        let edge = vec![1u8; PIECE_BYTES * MAX_PIECES];
        assert_eq!(pieces(&edge).len(), MAX_PIECES);
    }
}
