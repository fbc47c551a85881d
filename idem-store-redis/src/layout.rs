//! Where a record lives in Redis.
//!
//! One value per record at `idem:{<namespace>:<scope>:<digest>}`:
//! - `<namespace>` is the configured namespace (letters, digits, `_`, `-`, `.`);
//! - `<scope>` is the record's scope, percent-escaped (every byte outside `A-Za-z0-9_.-`
//!   becomes `%XX`), empty for no scope;
//! - `<digest>` is the first 84 bits of [`RecordKey::digest_hex`] (SHA-256 of scope and key)
//!   in 14 characters of base64url.
//!
//! Raw client input never appears in a Redis key, and the hash tag (the part in braces) holds
//! the whole record identity, so Redis Cluster keeps a record on one node and every command
//! touches exactly one slot.
//!
//! Why 84 bits: Redis allocates a key of up to 30 bytes in 32 bytes and one of 31 to 44 bytes
//! in 48, and a completed record with a 200-byte result stays at 392 bytes only with the
//! smaller key (see the README). With 14 digest characters, `idem:{default::<digest>}` is 30
//! bytes. Two keys of one namespace share a digest with a probability of about n^2 / 2^85 for
//! n live records (3e-10 for a hundred million); and a shared digest is never a wrong answer:
//! the record keeps its key and scope, and every read of a record for a key checks them (a
//! collision is reported as `Corrupt`).

use idem_core::RecordKey;

/// The fixed prefix of every key.
pub(crate) const PREFIX: &str = "idem:{";

/// Base64url characters of the key digest kept in the Redis key (84 bits).
pub(crate) const DIGEST_CHARS: usize = 14;

/// The Redis key of `key` in `namespace`.
pub(crate) fn redis_key(namespace: &str, key: &RecordKey) -> String {
    let digest = key.digest_hex();
    let scope = key.scope.as_str();
    let mut out =
        String::with_capacity(PREFIX.len() + namespace.len() + 3 * scope.len() + DIGEST_CHARS + 3);
    out.push_str(PREFIX);
    out.push_str(namespace);
    out.push(':');
    escape_into(&mut out, scope.as_bytes());
    out.push(':');
    base64url_into(&mut out, digest.as_bytes());
    out.push('}');
    out
}

/// Appends the first [`DIGEST_CHARS`] base64url characters of the bits that the hex digits
/// `hex` spell (three hex digits, 12 bits, are two characters).
fn base64url_into(out: &mut String, hex: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let nibble = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    };
    for triple in hex.chunks_exact(3).take(DIGEST_CHARS / 2) {
        let bits = (u16::from(nibble(triple[0])) << 8)
            | (u16::from(nibble(triple[1])) << 4)
            | u16::from(nibble(triple[2]));
        out.push(char::from(ALPHABET[usize::from(bits >> 6)]));
        out.push(char::from(ALPHABET[usize::from(bits & 0x3f)]));
    }
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
            "idem:{prod:".len() + "tenant%20%7Ba%7D%3A%2A".len() + 1 + DIGEST_CHARS + 1
        );
    }

    #[test]
    fn the_digest_is_84_bits_of_base64url() {
        let k = key("", "order:1");
        let hex = k.digest_hex();
        let redis_key = redis_key("default", &k);
        // The key of the default namespace fits Redis's 32-byte key allocation (30 bytes).
        assert_eq!(redis_key.len(), 30, "{redis_key}");
        // The README's example.
        assert_eq!(
            super::redis_key("default", &key("", "order:7:ship")),
            "idem:{default::2zb0V4JOGWMkuP}"
        );
        let digest = &redis_key["idem:{default::".len()..redis_key.len() - 1];
        assert_eq!(digest.len(), DIGEST_CHARS);
        // Decoded back, the characters are the first 21 hex digits of the digest.
        let mut bits = String::new();
        for c in digest.bytes() {
            let value = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'-' => 62,
                b'_' => 63,
                _ => panic!("not base64url: {digest}"),
            };
            bits.push_str(&format!("{value:06b}"));
        }
        let from_hex: String = hex[..21]
            .chars()
            .map(|c| format!("{:04b}", c.to_digit(16).unwrap()))
            .collect();
        assert_eq!(bits, from_hex);
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
}
