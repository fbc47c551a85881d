//! Service probes: find a test server or tool; when it is missing, fail the test with the
//! reason, or skip it loudly when the run asked for that.
//!
//! A test whose server or tool is missing must show in the run's result, never pass unseen
//! (cargo hides the stderr of a passing test). [`missing`] decides, in one place, for every
//! probe of the workspace (the browser test's too):
//! - under `CI=true` the test fails, whatever else is set;
//! - elsewhere it fails too, with its reason and the way to skip on purpose: set
//!   [`SKIP_MISSING`]`=1` (for a run on a machine without, say, chromedriver);
//! - with that variable set (and not under CI) it prints a loud SKIPPED line to stderr and the
//!   test returns early.

use std::net::ToSocketAddrs;
use std::time::Duration;

/// The environment variable that lets a run outside CI skip the tests whose service or tool
/// is missing (`IDEM_TEST_SKIP_MISSING=1`).
pub const SKIP_MISSING: &str = "IDEM_TEST_SKIP_MISSING";

/// Whether this run is CI (`CI=true`), where a missing server fails the test.
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether this run asked to skip the tests whose service is missing ([`SKIP_MISSING`] set to
/// `1` or `true`).
#[must_use]
pub fn skip_missing_requested() -> bool {
    std::env::var(SKIP_MISSING).is_ok_and(|v| v == "1" || v == "true")
}

/// What a test does when its service or tool is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The test fails with this message: the reason, and how to skip on purpose.
    Fail(String),
    /// The test is skipped (loudly): the run asked for it.
    Skip,
}

/// Decides what a test does when its service or tool is missing: `reason` says what is missing,
/// `ci` is [`in_ci`] and `skip_requested` is [`skip_missing_requested`].
#[must_use]
pub fn decide(reason: &str, ci: bool, skip_requested: bool) -> Missing {
    if ci {
        return Missing::Fail(format!(
            "CI=true and {reason}: under CI a missing service fails the test ({SKIP_MISSING} \
             does not apply)"
        ));
    }
    if skip_requested {
        return Missing::Skip;
    }
    Missing::Fail(format!(
        "{reason}. To skip the tests whose service is missing on purpose, run them with \
         {SKIP_MISSING}=1 (they are then reported SKIPPED on stderr)"
    ))
}

/// The service URL of a test: the environment variable `var` (for example
/// `IDEM_TEST_REDIS_URL`) or `default`.
#[must_use]
pub fn service_url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Checks that a TCP server answers at `host_port` (`127.0.0.1:6379`).
///
/// Returns `true` if it does. If not, [`missing`] decides: the test fails (under CI, or
/// outside it unless [`SKIP_MISSING`] is set), or a loud SKIPPED line is printed and this
/// returns `false`.
///
/// # Panics
/// When the server does not answer, unless the run asked to skip (see [`decide`]).
#[must_use]
pub fn require_tcp(service: &str, host_port: &str) -> bool {
    let reachable = host_port.to_socket_addrs().is_ok_and(|mut addrs| {
        addrs
            .any(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
    });
    if reachable {
        return true;
    }
    missing(&format!(
        "{service} is not reachable at {host_port}: start it (see .ci/run) or set its IDEM_TEST_* URL"
    ));
    false
}

/// A service or tool the test needs is missing, for `reason`: fails the test (see [`decide`]),
/// or, when the run asked to skip, prints a loud SKIPPED line to stderr and returns (the caller
/// then ends the test).
///
/// # Panics
/// Unless the run asked to skip and is not CI: that is how the test fails.
pub fn missing(reason: &str) {
    match decide(reason, in_ci(), skip_missing_requested()) {
        Missing::Fail(message) => panic!("{message}"),
        Missing::Skip => eprintln!("\n!!!!! SKIPPED ({SKIP_MISSING}=1): {reason} !!!!!\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_service_fails_outside_ci_unless_skipping_was_asked_for() {
        let Missing::Fail(message) = decide("Redis is not reachable", false, false) else {
            panic!("a missing service passed unseen");
        };
        assert!(message.starts_with("Redis is not reachable"), "{message}");
        assert!(message.contains("IDEM_TEST_SKIP_MISSING=1"), "{message}");
        assert_eq!(decide("Redis is not reachable", false, true), Missing::Skip);
    }

    #[test]
    fn under_ci_a_missing_service_fails_even_when_skipping_was_asked_for() {
        for skip_requested in [false, true] {
            let Missing::Fail(message) = decide("no chromedriver", true, skip_requested) else {
                panic!("CI skipped a test");
            };
            assert!(
                message.starts_with("CI=true and no chromedriver"),
                "{message}"
            );
        }
    }
}
