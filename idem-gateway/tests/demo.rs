//! `idem demo`, the README's first command: the process starts, prints its addresses, and the
//! six curl lines it prints behave as it says (executed, replayed, 422, 400, 409, executed for
//! another session), with the upstream counting one execution per key and session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::time::Duration;

use common::{Http, Proc, Reply, assert_one_error_line, drain, free_addr, idem_command};
use http::Method;

/// Starts `idem demo` with `args` and reads the gateway's and the upstream's addresses from
/// its output.
fn start_demo(args: &[&str]) -> (Proc, SocketAddr, SocketAddr) {
    let mut child = idem_command("demo").args(args).spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let (mut gateway, mut upstream) = (None, None);
    let mut line = String::new();
    while gateway.is_none() || upstream.is_none() {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "idem demo ended before printing its addresses");
        // "idem demo: a payments API at http://UPSTREAM behind the idem gateway at http://GATEWAY"
        let address_after = |marker: &str| {
            line.split(marker)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(|addr| addr.parse::<SocketAddr>().unwrap())
        };
        upstream = upstream.or_else(|| address_after("a payments API at http://"));
        gateway = gateway.or_else(|| address_after("the idem gateway at http://"));
    }
    drain(reader);
    (Proc { child }, gateway.unwrap(), upstream.unwrap())
}

/// Sends a slow payment (2 s) with `key`, and the same 300 ms later; returns the one that ran
/// and the duplicate (whichever reached the gateway first runs).
async fn race(http: &Http, gateway: SocketAddr, key: &str) -> (Reply, Reply) {
    let slow = format!("http://{gateway}/payments?delay=2s");
    let first = {
        let (http, slow, key) = (http.clone(), slow.clone(), key.to_owned());
        tokio::spawn(async move { http.post_key(&slow, &key, "x").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = http.post_key(&slow, key, "x").await;
    let first = first.await.unwrap();
    if first.status == 409 {
        (second, first)
    } else {
        (first, second)
    }
}

#[tokio::test]
async fn the_demo_answers_its_six_curl_lines_as_it_says() {
    let (_demo, gateway, upstream) = start_demo(&[]);
    let http = Http::new();
    let payments = format!("http://{gateway}/payments");

    // 1. A payment: executed.
    let first = http
        .post_key(&payments, "order-1", r#"{"amount": 10}"#)
        .await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());

    // 2. The retry: the same answer, replayed.
    let retry = http
        .post_key(&payments, "order-1", r#"{"amount": 10}"#)
        .await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);

    // 3. The same key with another payload: 422.
    let changed = http
        .post_key(&payments, "order-1", r#"{"amount": 99}"#)
        .await;
    assert_eq!(changed.status, 422, "{}", changed.text());

    // 4. No key: 400.
    let keyless = http
        .send(Method::POST, &payments, &[], r#"{"amount": 10}"#)
        .await;
    assert_eq!(keyless.status, 400, "{}", keyless.text());

    // 5. A retry while the first attempt runs: 409 with Retry-After. (Whichever of the two
    // reaches the gateway first runs; the other is the duplicate.)
    let (ran, duplicate) = race(&http, gateway, "order-2").await;
    assert_eq!(ran.status, 201, "{}", ran.text());
    assert_eq!(duplicate.status, 409, "{}", duplicate.text());
    assert!(duplicate.header("retry-after").is_some());

    // 6. The request of 1. from another session: executed, not the first session's replay.
    let other_session = http
        .send(
            Method::POST,
            &payments,
            &[("idempotency-key", "order-1"), ("cookie", "session=bob")],
            r#"{"amount": 10}"#,
        )
        .await;
    assert_eq!(other_session.status, 201, "{}", other_session.text());
    assert!(!other_session.replayed());

    // One execution per key.
    let executions = http
        .send(
            Method::GET,
            &format!("http://{upstream}/executions"),
            &[],
            "",
        )
        .await;
    assert_eq!(executions.text(), r#"{"executions":3}"#);
}

#[tokio::test]
async fn the_demo_takes_the_gateway_flags() {
    let (listen, admin) = (free_addr(), free_addr());
    let (_demo, gateway, _) = start_demo(&[
        "--listen",
        &listen.to_string(),
        "--admin-listen",
        &admin.to_string(),
        "--lease",
        "4s",
    ]);
    assert_eq!(gateway, listen);
    let http = Http::new();
    let ready = http
        .send(Method::GET, &format!("http://{admin}/readyz"), &[], "")
        .await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    // The lease applies: a duplicate in flight is told to come back within it, not in 30s.
    let (_, duplicate) = race(&http, gateway, "lease-1").await;
    assert_eq!(duplicate.status, 409, "{}", duplicate.text());
    let retry_after: u64 = duplicate.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after <= 4, "Retry-After {retry_after}");
}

#[test]
fn the_demo_refuses_a_config_an_upstream_or_a_store() {
    for (args, flag) in [
        (
            &["--store", "redis://127.0.0.1:6379"][..],
            "--store (or IDEM_STORE)",
        ),
        (
            &["--upstream", "http://127.0.0.1:3000"][..],
            "--upstream (or IDEM_UPSTREAM)",
        ),
        (
            &["--config", "idem.example.toml"][..],
            "--config (or IDEM_CONFIG)",
        ),
    ] {
        let output = idem_command("demo").args(args).output().unwrap();
        assert_one_error_line(
            &output,
            2,
            &format!("{flag}: idem demo runs its own upstream"),
        );
    }
}

/// With `--admin-token`, the metrics and health lines the demo prints carry the token, and work
/// as printed (run here by `sh`, as a reader would paste them): before, they had no
/// `Authorization` header and got 401. A `'` in the token is quoted for the shell.
#[test]
fn the_printed_admin_lines_work_with_a_token() {
    let token = "demo'token-of-16+bytes";
    let mut child = idem_command("demo")
        .args(["--admin-token", token])
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let demo = Proc { child };
    let mut printed = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "idem demo ended before its last line");
        if line.starts_with("Ctrl-C stops the demo.") {
            break;
        }
        printed.push(line.trim().to_owned());
    }
    drain(reader);
    for (path, expected) in [
        ("/readyz", "ready"),
        ("/metrics", "idem_claims_acquired_total 0"),
    ] {
        let command = printed
            .iter()
            .find(|l| l.starts_with("curl") && l.contains(path))
            .unwrap_or_else(|| panic!("no {path} line in {printed:#?}"));
        let output = std::process::Command::new("sh")
            .args(["-c", command])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.lines().any(|l| l == expected),
            "{command} printed {stdout:?}"
        );
    }
    drop(demo);
}
