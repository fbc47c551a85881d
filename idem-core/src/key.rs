//! [`IdempotencyKey`], [`Scope`] and the [`RecordKey`] that joins them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 bytes of printable ASCII (`0x20..=0x7E`).
///
/// The key names one business operation (`payment:42:capture`, a client's `Idempotency-Key`
/// header), never a value that changes per attempt.
///
/// ```
/// use idem_core::{IdempotencyKey, KeyError};
///
/// let key = IdempotencyKey::new("payment:42:capture")?;
/// assert_eq!(key.as_str(), "payment:42:capture");
/// assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
/// # Ok::<(), KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

/// Why a text is not an [`IdempotencyKey`] (or a [`Scope`]). Each variant names the rule broken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty; a key is at least one byte.
    #[error("the key is empty: a key is 1 to 255 bytes of printable ASCII")]
    Empty,
    /// The key is longer than 255 bytes.
    #[error("the key is {len} bytes long: a key is at most 255 bytes")]
    TooLong {
        /// The length found, in bytes.
        len: usize,
    },
    /// The key holds a byte outside printable ASCII (a control byte or a non-ASCII byte).
    #[error(
        "byte {position} of the key is 0x{byte:02x}: a key holds only printable ASCII (0x20 to 0x7e)"
    )]
    InvalidByte {
        /// The byte found.
        byte: u8,
        /// Its position, counting from 0.
        position: usize,
    },
}

/// Checks the key rules on raw bytes: length 1..=`max`, printable ASCII only.
fn check_printable(bytes: &[u8], max: usize, allow_empty: bool) -> Result<(), KeyError> {
    if bytes.is_empty() && !allow_empty {
        return Err(KeyError::Empty);
    }
    if bytes.len() > max {
        return Err(KeyError::TooLong { len: bytes.len() });
    }
    match bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
        Some(position) => Err(KeyError::InvalidByte {
            byte: bytes[position],
            position,
        }),
        None => Ok(()),
    }
}

impl IdempotencyKey {
    /// Validates `key` against the key rules.
    ///
    /// # Errors
    /// [`KeyError`] naming the rule the text breaks.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        Self::from_bytes(key.as_ref().as_bytes())
    }

    /// Validates raw bytes (a header value, a message field) against the key rules.
    ///
    /// # Errors
    /// [`KeyError`] naming the rule the bytes break.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        check_printable(bytes, MAX_KEY_LEN, false)?;
        // Printable ASCII is valid UTF-8: the error arm is never taken.
        let text = std::str::from_utf8(bytes).map_err(|err| KeyError::InvalidByte {
            byte: bytes.get(err.valid_up_to()).copied().unwrap_or_default(),
            position: err.valid_up_to(),
        })?;
        Ok(IdempotencyKey(text.into()))
    }

    /// The key as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", &*self.0)
    }
}

impl FromStr for IdempotencyKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdempotencyKey::new(s)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = KeyError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        IdempotencyKey::new(s)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The namespace a key lives in: one principal (a tenant, an API credential) can never see
/// another's records. The empty scope is "no scope".
///
/// Scopes follow the key rules (printable ASCII, at most 255 bytes) but may be empty. Build one
/// from a secret (an `Authorization` header) with [`Scope::from_secret`], which stores only a
/// hash of it.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

impl Scope {
    /// No scope: every caller shares one namespace.
    #[must_use]
    pub fn none() -> Self {
        Scope::default()
    }

    /// A scope from a name (a tenant id).
    ///
    /// # Errors
    /// [`KeyError`] if the name is longer than 255 bytes or holds a byte outside printable
    /// ASCII.
    pub fn new(name: impl AsRef<str>) -> Result<Self, KeyError> {
        let name = name.as_ref();
        check_printable(name.as_bytes(), MAX_KEY_LEN, true)?;
        Ok(Scope(name.into()))
    }

    /// A scope named by the SHA-256 of a secret (for example an `Authorization` header value),
    /// so the secret itself is never stored. 32 hex digits (128 bits of the hash).
    #[must_use]
    pub fn from_secret(secret: &[u8]) -> Self {
        let digest = Sha256::digest(secret);
        Scope(hex(&digest[..16]).into())
    }

    /// The scope's name; empty for [`Scope::none`].
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is [`Scope::none`].
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", &*self.0)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a record lives: a [`Scope`] and an [`IdempotencyKey`] within it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey {
    /// The namespace.
    pub scope: Scope,
    /// The key within the scope.
    pub key: IdempotencyKey,
}

impl RecordKey {
    /// A record key from its parts.
    #[must_use]
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        RecordKey { scope, key }
    }

    /// A record key in [`Scope::none`].
    #[must_use]
    pub fn unscoped(key: IdempotencyKey) -> Self {
        RecordKey {
            scope: Scope::none(),
            key,
        }
    }

    /// A fixed-length digest of scope and key (SHA-256, 64 hex digits): a storage key fragment
    /// that never contains raw client input.
    #[must_use]
    pub fn digest_hex(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update((self.scope.0.len() as u64).to_be_bytes());
        hasher.update(self.scope.0.as_bytes());
        hasher.update(self.key.0.as_bytes());
        hex(&hasher.finalize())
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordKey({:?} / {:?})", &*self.scope.0, &*self.key.0)
    }
}

impl fmt::Display for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scope.is_none() {
            f.write_str(&self.key.0)
        } else {
            write!(f, "{}/{}", self.scope, self.key)
        }
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rules_are_named() {
        assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::new("a".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("ab\ncd"),
            Err(KeyError::InvalidByte {
                byte: b'\n',
                position: 2
            })
        );
        assert_eq!(
            IdempotencyKey::new("é"),
            Err(KeyError::InvalidByte {
                byte: 0xc3,
                position: 0
            })
        );
        let message = IdempotencyKey::new("a\u{7f}").unwrap_err().to_string();
        assert!(message.contains("printable ASCII"), "{message}");
    }

    #[test]
    fn scopes_may_be_empty_and_hash_secrets() {
        assert!(Scope::new("").is_ok_and(|s| s.is_none()));
        let scope = Scope::from_secret(b"Bearer secret");
        assert_eq!(scope.as_str().len(), 32);
        assert!(!scope.as_str().contains("secret"));
        assert_ne!(scope, Scope::from_secret(b"Bearer other"));
    }

    #[test]
    fn digests_separate_scope_from_key() {
        let a = RecordKey::new(Scope::new("ab").unwrap(), IdempotencyKey::new("c").unwrap());
        let b = RecordKey::new(Scope::new("a").unwrap(), IdempotencyKey::new("bc").unwrap());
        assert_ne!(a.digest_hex(), b.digest_hex());
        assert_eq!(a.digest_hex().len(), 64);
    }

    proptest! {
        #[test]
        fn any_bytes_are_accepted_exactly_when_they_follow_the_rules(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let valid = !bytes.is_empty() && bytes.len() <= 255 && bytes.iter().all(|b| (0x20..=0x7e).contains(b));
            let parsed = IdempotencyKey::from_bytes(&bytes);
            prop_assert_eq!(parsed.is_ok(), valid);
            if let Ok(key) = parsed {
                prop_assert_eq!(key.as_str().as_bytes(), &bytes[..]);
            }
        }
    }
}
