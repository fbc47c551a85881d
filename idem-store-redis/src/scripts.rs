//! The Lua scripts, one per operation, and the shapes of their answers.
//!
//! Each script is the shared prelude (`lua/prelude.lua`: the time, the meta field's layout)
//! followed by the operation; the holder's steps also take `lua/holder.lua` (the owner and
//! fence check), and the steps that free a key `lua/bury.lua` (the tombstone). A script holds
//! only the helpers it uses: Redis builds every closure of a script again on every call. Every script touches exactly one key, reads the time from the server (`TIME`),
//! and answers a flat array of strings whose first element names the answer; numbers are
//! packed big-endian (7 bytes), never formatted as text inside Redis. Every script is safe to
//! re-send: the same owner and fence get the same answer.

use std::sync::LazyLock;

use idem_core::{Fence, Rejection, State, StoreError};
use redis::Script;

macro_rules! script_source {
    ($($file:literal),+) => {
        concat!(include_str!("lua/prelude.lua"), $(include_str!($file)),+)
    };
}

/// The source of the `get` script (scans send it with `SCRIPT LOAD` in their pipelines).
pub(crate) const GET_SOURCE: &str = script_source!("lua/get.lua");

/// A script: its source (sent with `SCRIPT LOAD` after a `NOSCRIPT`) and its SHA-1.
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) script: Script,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            script: Script::new(source),
        }
    }

    /// The script's SHA-1, for `EVALSHA`.
    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }
}

/// Every script, hashed once.
pub(crate) struct Scripts {
    pub(crate) claim: Lua,
    pub(crate) heartbeat: Lua,
    pub(crate) complete: Lua,
    pub(crate) fail: Lua,
    pub(crate) release: Lua,
    pub(crate) get: Lua,
    pub(crate) delete: Lua,
}

impl Scripts {
    /// The sources of every script, to load them ahead of use.
    pub(crate) const SOURCES: [&'static str; 7] = [
        script_source!("lua/claim.lua"),
        script_source!("lua/holder.lua", "lua/heartbeat.lua"),
        script_source!("lua/holder.lua", "lua/complete.lua"),
        script_source!("lua/bury.lua", "lua/holder.lua", "lua/fail.lua"),
        script_source!("lua/bury.lua", "lua/holder.lua", "lua/release.lua"),
        GET_SOURCE,
        script_source!("lua/bury.lua", "lua/delete.lua"),
    ];
}

/// The scripts of every store in the process.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let [claim, heartbeat, complete, fail, release, get, delete] = Scripts::SOURCES.map(Lua::new);
    Scripts {
        claim,
        heartbeat,
        complete,
        fail,
        release,
        get,
        delete,
    }
});

/// A script's answer: its parts, the first naming the answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) op: &'static str,
    pub(crate) parts: Vec<Vec<u8>>,
}

impl Reply {
    /// The answer's name.
    pub(crate) fn tag(&self) -> &[u8] {
        self.parts.first().map_or(&[][..], Vec::as_slice)
    }

    /// The part at `index` as text.
    pub(crate) fn text(&self, index: usize) -> Result<&str, StoreError> {
        self.parts
            .get(index)
            .and_then(|part| std::str::from_utf8(part).ok())
            .ok_or_else(|| self.unexpected())
    }

    /// The part at `index` as a packed number (7 bytes, big-endian).
    pub(crate) fn packed(&self, index: usize) -> Result<u64, StoreError> {
        self.parts
            .get(index)
            .filter(|part| part.len() == 7)
            .map(|part| crate::codec::be56(part))
            .ok_or_else(|| self.unexpected())
    }

    /// The part at `index` as a record's meta field.
    pub(crate) fn meta(&self, index: usize) -> Result<crate::codec::Meta, StoreError> {
        self.parts
            .get(index)
            .and_then(|part| crate::codec::Meta::parse(part).ok())
            .ok_or_else(|| self.unexpected())
    }

    /// The part at `index` as a canonical decimal number.
    pub(crate) fn number(&self, index: usize) -> Result<u64, StoreError> {
        self.parts
            .get(index)
            .and_then(|part| crate::codec::parse_u64(part))
            .ok_or_else(|| self.unexpected())
    }

    /// The error for an answer of a shape no script gives.
    pub(crate) fn unexpected(&self) -> StoreError {
        let shown: Vec<String> = self
            .parts
            .iter()
            .take(3)
            .map(|p| String::from_utf8_lossy(&p[..p.len().min(40)]).into_owned())
            .collect();
        StoreError::Backend {
            source: format!("unexpected answer from the {} script: {shown:?}", self.op).into(),
            retryable: false,
        }
    }

    /// The common answers of the holder's transitions: `ok`, `rejected`, `corrupt`.
    /// Answers the parts after `ok`.
    pub(crate) fn settle(self, key: &idem_core::RecordKey) -> Result<Vec<Vec<u8>>, StoreError> {
        match self.tag() {
            b"ok" => Ok(self.parts.into_iter().skip(1).collect()),
            b"rejected" => Err(StoreError::Rejected(self.rejection()?)),
            b"corrupt" => Err(StoreError::corrupt(key, self.text(1)?)),
            _ => Err(self.unexpected()),
        }
    }

    fn rejection(&self) -> Result<Rejection, StoreError> {
        Ok(match self.text(1)? {
            "not_found" => Rejection::NotFound,
            "superseded" => Rejection::Superseded {
                current: Fence::new(self.packed(2)?),
            },
            "lease_expired" => Rejection::LeaseExpired,
            "settled" => Rejection::AlreadySettled {
                state: match self.text(2)? {
                    "i" => State::InFlight,
                    "c" => State::Completed,
                    "f" => State::Failed,
                    _ => return Err(self.unexpected()),
                },
            },
            _ => return Err(self.unexpected()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_its_own_hash() {
        let hashes: std::collections::HashSet<&str> = [
            &SCRIPTS.claim,
            &SCRIPTS.heartbeat,
            &SCRIPTS.complete,
            &SCRIPTS.fail,
            &SCRIPTS.release,
            &SCRIPTS.get,
            &SCRIPTS.delete,
        ]
        .iter()
        .map(|s| s.hash())
        .collect();
        assert_eq!(hashes.len(), 7);
    }

    #[test]
    fn rejections_are_decoded() {
        let reply = |parts: &[&str]| Reply {
            op: "test",
            parts: parts.iter().map(|p| p.as_bytes().to_vec()).collect(),
        };
        let key = idem_core::RecordKey::unscoped(idem_core::IdempotencyKey::new("k").unwrap());
        let err = reply(&["rejected", "superseded", "\0\0\0\0\0\0\x2a"])
            .settle(&key)
            .unwrap_err();
        assert_eq!(
            err.rejection(),
            Some(Rejection::Superseded {
                current: Fence::new(42)
            })
        );
        let err = reply(&["rejected", "settled", "c"])
            .settle(&key)
            .unwrap_err();
        assert_eq!(
            err.rejection(),
            Some(Rejection::AlreadySettled {
                state: State::Completed
            })
        );
        assert!(matches!(
            reply(&["corrupt", "why"]).settle(&key),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            reply(&["what"]).settle(&key),
            Err(StoreError::Backend { .. })
        ));
        assert!(
            reply(&["rejected", "superseded", "42"])
                .settle(&key)
                .is_err()
        );
        assert_eq!(
            reply(&["ok", "5"]).settle(&key).unwrap(),
            vec![b"5".to_vec()]
        );
    }
}
