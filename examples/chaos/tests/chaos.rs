//! The chaos run of issue 7, as a test: `chaos run` against the local services (2,000 jobs by
//! default; `IDEM_CHAOS_JOBS` scales it). It prints one line per queue and store, for example
//! `queue=nats store=postgres kills=31 jobs=2000 effects=2000 duplicates=0 lost=0`, and fails
//! unless: with PostgreSQL in the same transaction, effects == jobs, duplicates == 0 and
//! lost == 0; with Redis, lost == 0 and duplicates <= kills x concurrency (see src/main.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::Command;

use idem_testkit::probe::require_tcp;

#[test]
fn jobs_survive_kill_9_with_effects_counted_in_postgres() {
    // Which servers: the same variables the binary reads.
    let services = [
        ("PostgreSQL", "IDEM_TEST_POSTGRES_URL", "127.0.0.1:5432"),
        ("Redis", "IDEM_TEST_REDIS_URL", "127.0.0.1:6379"),
        ("NATS", "IDEM_TEST_NATS_URL", "127.0.0.1:4222"),
        ("RabbitMQ", "IDEM_TEST_AMQP_URL", "127.0.0.1:5672"),
    ];
    for (name, var, default) in services {
        let target = std::env::var(var).map_or_else(|_| default.to_owned(), |url| host_port(&url));
        if !require_tcp(name, &target) {
            return;
        }
    }
    let jobs = std::env::var("IDEM_CHAOS_JOBS").unwrap_or_else(|_| "2000".to_owned());
    let output = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["run", "--jobs", &jobs])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Straight to the process's stderr, past the test harness's capture: the summary lines
    // belong in the CI log.
    let mut log = std::io::stderr();
    let _ = log.write_all(stdout.as_bytes());
    let _ = log.write_all(&output.stderr);
    assert!(output.status.success(), "the chaos run failed");
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(" jobs=")).collect();
    assert_eq!(lines.len(), 4, "one line per queue and store");
    assert!(lines.iter().all(|l| l.ends_with(" lost=0")), "{lines:?}");
}

/// `host:port` of a service URL (`scheme://user:pass@host:port/path`, or `host:port`).
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}
