//! Service probes: find a test server, skip loudly when it is missing, fail under `CI=true`.

use std::net::ToSocketAddrs;
use std::time::Duration;

/// Whether this run is CI (`CI=true`), where a missing server fails the test.
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The URL of a test service: the environment variable `var` (for example
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
/// Returns `true` if it does. If not: under CI this panics (a missing server is a failure,
/// never a silent skip); otherwise it prints a loud SKIP line to stderr and returns `false`.
///
/// # Panics
/// Under `CI=true`, when the server does not answer.
#[must_use]
pub fn require_tcp(service: &str, host_port: &str) -> bool {
    let reachable = host_port.to_socket_addrs().is_ok_and(|mut addrs| {
        addrs
            .any(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
    });
    if reachable {
        return true;
    }
    skip(&format!(
        "{service} is not reachable at {host_port}: start it (see .ci/run) or set its IDEM_TEST_* URL"
    ));
    false
}

/// Skips loudly: prints a SKIPPED line with `message` to stderr; under CI a missing tool or
/// server is a failure, never a silent skip, so this panics instead.
///
/// # Panics
/// Under `CI=true`.
pub fn skip(message: &str) {
    assert!(!in_ci(), "CI=true and {message}");
    eprintln!("\n!!!!! SKIPPED: {message} !!!!!\n");
}
