//! The identity of one attempt: [`OwnerToken`] and [`Fence`].

use std::fmt;
use std::str::FromStr;

/// A random 128-bit token naming the attempt that holds a claim.
///
/// Every grant of a key gets a fresh token; a transition is refused unless it presents the token
/// (and the [`Fence`]) of the current holder.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh random token (UUID v4 randomness).
    #[must_use]
    pub fn random() -> Self {
        OwnerToken(uuid::Uuid::new_v4().as_u128())
    }

    /// A token from its 128-bit value (for stores decoding a record).
    #[must_use]
    pub const fn from_u128(value: u128) -> Self {
        OwnerToken(value)
    }

    /// The 128-bit value.
    #[must_use]
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for OwnerToken {
    /// 32 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

/// The text was not 32 hex digits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an owner token is 32 hex digits")]
pub struct ParseOwnerTokenError;

impl FromStr for OwnerToken {
    type Err = ParseOwnerTokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseOwnerTokenError);
        }
        u128::from_str_radix(s, 16)
            .map(OwnerToken)
            .map_err(|_| ParseOwnerTokenError)
    }
}

/// A fencing token: strictly increasing across every grant of one key.
///
/// A downstream system that remembers the highest fence it has seen for a key can refuse a
/// write from a stale holder. Stores compute it as `max(previous + 1, now in microseconds)`,
/// so it keeps increasing after a record expired or was deleted and created again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// The lowest fence a grant can have.
    pub const MIN: Fence = Fence(1);

    /// A fence from its value.
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The value.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The next fence after this one.
    #[must_use]
    pub const fn successor(self) -> Fence {
        Fence(self.0.saturating_add(1))
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_token_round_trips_through_text() {
        let token = OwnerToken::random();
        assert_eq!(token.to_string().parse::<OwnerToken>(), Ok(token));
        assert!("xyz".parse::<OwnerToken>().is_err());
        assert!(
            "+0000000000000000000000000000000"
                .parse::<OwnerToken>()
                .is_err()
        );
    }

    #[test]
    fn random_tokens_differ() {
        assert_ne!(OwnerToken::random(), OwnerToken::random());
    }
}
