//! `idem serve` as a process: SIGTERM stops accepting, lets the in-flight request finish and
//! exits 0.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Fixture, Http, spawn_gateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_in_flight_request_and_exits_0() {
    let fixture = Fixture::start();
    let upstream = format!("http://{}", fixture.addr);
    let (mut gateway, addr) = spawn_gateway(&[
        "--upstream",
        &upstream,
        "--listen",
        "127.0.0.1:0",
        "--no-admin",
    ]);
    let http = Http::new();
    let url = format!("http://{addr}/slow?ms=800");
    let request = tokio::spawn({
        let http = http.clone();
        async move { http.post_key(&url, "term", "").await }
    });
    // Let the request reach the upstream, then SIGTERM.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = gateway.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let reply = request.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.text(), "slept:800");
    // The process exits by itself, with 0.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = gateway.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "idem serve did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    // Nothing listens any more.
    let refused = http
        .try_send(
            http::Method::GET,
            &format!("http://{addr}/counter"),
            &[],
            "",
        )
        .await;
    assert!(refused.is_err());
    assert_eq!(fixture.count().await, 1);
}

/// `idem serve 2>&1 | head -c 1`: stdout and stderr closed while it serves. It keeps serving
/// and exits 0 on SIGTERM (before, the first log line after the pipe closed panicked: 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_and_stderr_are_no_panic() {
    let fixture = Fixture::start();
    let upstream = format!("http://{}", fixture.addr);
    let addr = common::free_addr();
    let mut child = common::idem_command("serve")
        .args([
            "--upstream",
            &upstream,
            "--listen",
            &addr.to_string(),
            "--no-admin",
        ])
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reading ends go at once: every write of the gateway's finds a closed pipe.
    drop(child.stdout.take());
    drop(child.stderr.take());
    let http = Http::new();
    let url = format!("http://{addr}/echo");
    let up = common::eventually(Duration::from_secs(30), || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            http.try_send(http::Method::GET, &url, &[], "")
                .await
                .is_ok()
        }
    })
    .await;
    assert!(up, "idem serve did not serve");
    let reply = http.post_key(&url, "closed-pipe", "x").await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "idem serve did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}
