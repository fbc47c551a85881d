//! The one script: compare-and-set. It compares the key's whole value with the version the
//! store read and, when they are equal, writes the new value with its physical TTL. It decides
//! nothing: no state, no expiry, no fence (idem-core's machine decided the value).
//!
//! Where the server has `SET ... IFEQ` (Redis 8.4 and later, Valkey 8.1 and later), the store
//! sends that plain command instead (see [`Swap`]).

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` the record; `ARGV[1]` the value expected, `ARGV[2]` the value to write, `ARGV[3]`
/// its TTL in milliseconds. Answers `1` when written, else what the key holds (nil: absent).
/// Safe to re-send: a second copy finds the value the first wrote, and answers it.
pub(crate) const SWAP_SOURCE: &str = "\
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return held
";

/// The compare-and-set script, hashed once.
pub(crate) static SWAP: LazyLock<Script> = LazyLock::new(|| Script::new(SWAP_SOURCE));

/// How a store sends compare-and-set, chosen once at connect from the server's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Swap {
    /// `EVALSHA` of [`SWAP_SOURCE`].
    Script,
    /// `SET key new IFEQ expected PX ttl`: `OK` when written; on nil (lost), a `GET` reads
    /// what won (a lost compare-and-set is rare: two writers of one key).
    IfEq,
}

impl Swap {
    /// The method for a server whose `INFO server` section is `info`: `IFEQ` from Redis 8.4
    /// and Valkey 8.1 on.
    pub(crate) fn for_server(info: &str) -> Swap {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let at_least = |version: Option<&str>, want: (u32, u32)| {
            let mut parts = version.unwrap_or("").split('.').map(|p| p.parse::<u32>());
            match (parts.next(), parts.next()) {
                (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= want,
                _ => false,
            }
        };
        let ifeq = if field("server_name") == Some("valkey") {
            at_least(field("valkey_version"), (8, 1))
        } else {
            at_least(field("redis_version"), (8, 4))
        };
        if ifeq { Swap::IfEq } else { Swap::Script }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifeq_only_where_the_server_has_it() {
        assert_eq!(Swap::for_server("redis_version:7.0.15\r\n"), Swap::Script);
        assert_eq!(Swap::for_server("redis_version:8.2.1\r\n"), Swap::Script);
        assert_eq!(Swap::for_server("redis_version:8.4.0\r\n"), Swap::IfEq);
        assert_eq!(
            Swap::for_server(
                "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n"
            ),
            Swap::IfEq
        );
        assert_eq!(
            Swap::for_server(
                "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.2\r\n"
            ),
            Swap::Script
        );
        assert_eq!(Swap::for_server("garbage"), Swap::Script);
    }
}
