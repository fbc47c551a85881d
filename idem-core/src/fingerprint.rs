//! [`Fingerprint`]: the identity of a request or a job, so a reused key with a different payload
//! is caught.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::key::hex;

/// SHA-256 over canonical parts of a request (method, path and query, body) or a job.
///
/// Parts are length-prefixed, so `["ab", "c"]` and `["a", "bc"]` differ.
///
/// ```
/// use idem_core::Fingerprint;
///
/// let a = Fingerprint::of(&[b"POST", b"/payments", br#"{"amount":10}"#]);
/// let b = Fingerprint::builder().part(b"POST").part(b"/payments").part(br#"{"amount":10}"#).finish();
/// assert_eq!(a, b);
/// assert_ne!(a, Fingerprint::of(&[b"POST", b"/payments", br#"{"amount":11}"#]));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `parts`, in order.
    #[must_use]
    pub fn of(parts: &[&[u8]]) -> Self {
        parts
            .iter()
            .fold(Fingerprint::builder(), |b, part| b.part(part))
            .finish()
    }

    /// A builder that takes parts one at a time.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder {
            hasher: Sha256::new(),
        }
    }

    /// A fingerprint from its 32 bytes (for stores decoding a record).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    /// The 32 bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    /// 64 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &hex(&self.0)[..16])
    }
}

/// The text was not 64 hex digits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a fingerprint is 64 hex digits")]
pub struct ParseFingerprintError;

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(ParseFingerprintError);
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| ParseFingerprintError)?;
            if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ParseFingerprintError);
            }
            out[i] = u8::from_str_radix(text, 16).map_err(|_| ParseFingerprintError)?;
        }
        Ok(Fingerprint(out))
    }
}

/// Builds a [`Fingerprint`] part by part. Made by [`Fingerprint::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct FingerprintBuilder {
    hasher: Sha256,
}

impl FingerprintBuilder {
    /// Adds one part (length-prefixed).
    pub fn part(mut self, bytes: &[u8]) -> Self {
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
        self
    }

    /// The fingerprint of the parts added so far.
    #[must_use]
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.hasher.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(
            Fingerprint::of(&[b"ab", b"c"]),
            Fingerprint::of(&[b"a", b"bc"])
        );
        assert_ne!(Fingerprint::of(&[b"", b"a"]), Fingerprint::of(&[b"a"]));
    }

    #[test]
    fn text_round_trip() {
        let fp = Fingerprint::of(&[b"x"]);
        assert_eq!(fp.to_string().parse::<Fingerprint>(), Ok(fp));
        assert!("zz".parse::<Fingerprint>().is_err());
        assert!("é".repeat(32).parse::<Fingerprint>().is_err());
        assert!("+0".repeat(32).parse::<Fingerprint>().is_err());
    }
}
