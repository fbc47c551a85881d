//! The Quick start's first command, `cargo run -p idem-example-burst`, run by `cargo test`: the
//! binary is built with the tests, so CI checks the README's claim without a second build.

use std::process::{Command, Output};

fn burst(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-example-burst"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("the burst binary does not run: {e}"))
}

/// The figure on the report line that starts with `label`.
fn figure(report: &str, label: &str) -> u64 {
    let line = report
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no line {label:?} in:\n{report}"));
    line.split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure on {line:?}"))
}

#[test]
fn the_default_burst_runs_each_key_once_and_answers_every_duplicate() {
    let output = burst(&["--seed", "2"]);
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\n{report}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(figure(&report, "jobs"), 10_000);
    assert_eq!(figure(&report, "distinct keys"), 1_000);
    assert_eq!(figure(&report, "executed"), 1_000);
    assert_eq!(figure(&report, "answered as duplicates"), 9_000);
    assert_eq!(figure(&report, "leases taken over"), 0);
    assert!(
        report.contains("effects per key: max 1 (min 1)"),
        "{report}"
    );
}

#[test]
fn a_bad_flag_is_an_error_with_the_usage() {
    let output = burst(&["--jobs", "many"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--jobs must be a whole number"), "{stderr}");
}
