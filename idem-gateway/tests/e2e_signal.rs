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
