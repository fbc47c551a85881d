//! End-to-end on the Redis store (feature `redis`): two `idem serve` processes share one Redis
//! in front of one idem-fixture upstream. A missing server fails the test (outside CI,
//! `IDEM_TEST_SKIP_MISSING=1` skips it loudly). Each test has its own namespace; its records
//! expire with a short retention.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Fixture, Http, free_addr, shared_store, spawn_gateway};
use http::Method;
use idem_testkit::probe::{require_tcp, service_url};
use idem_testkit::redis_server::{ServerProcess, have_redis_binaries, host_port};

fn url() -> String {
    service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// Whether Redis answers (when it does not, the test fails, or skips loudly with
/// `IDEM_TEST_SKIP_MISSING=1` outside CI).
fn redis_up() -> bool {
    require_tcp("Redis", &host_port(&url()))
}

/// A namespace of its own for each test.
fn namespace(test: &str) -> String {
    shared_store::unique_name(&format!("gw-{test}-"))
}

/// The `[store]` section of a test: the Redis server and `namespace`.
fn store_section(namespace: &str) -> String {
    shared_store::store_section(&url(), namespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_section_5_basics_hold_on_redis() {
    if !redis_up() {
        return;
    }
    shared_store::section_5_basics(&store_section(&namespace("basics"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_one_redis_200_concurrent_same_key_requests_execute_once() {
    if !redis_up() {
        return;
    }
    let ns = namespace("concurrent");
    shared_store::two_gateways_200_concurrent_same_key_requests_execute_once(
        &ns,
        &store_section(&ns),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_request_is_taken_over_after_the_lease_and_runs_once() {
    if !redis_up() {
        return;
    }
    let ns = namespace("kill");
    shared_store::a_gateway_killed_mid_request_is_taken_over_after_the_lease(
        &ns,
        &store_section(&ns),
        shared_store::redis_store(&url(), &ns),
    )
    .await;
}

/// The same kill, with the fenced upstream of `examples/fenced-upstream`: the killed gateway's
/// attempt reaches it after the takeover's and is refused by its fence; one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_late_attempt_is_refused_by_a_fenced_upstream_on_redis() {
    if !redis_up() {
        return;
    }
    let ns = namespace("fenced");
    shared_store::a_killed_gateways_late_attempt_is_refused_by_a_fenced_upstream(
        &ns,
        &store_section(&ns),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_releases_and_a_slow_one_holds_the_key_on_redis() {
    if !redis_up() {
        return;
    }
    let upstream = free_addr();
    let ns = namespace("release");
    let file = shared_store::config_file(&ns, &store_section(&ns), "");
    let upstream_url = format!("http://{upstream}");
    let (_gw, addr) = spawn_gateway(&[
        "--config",
        file.path(),
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
    ]);
    let http = Http::new();
    assert_eq!(
        http.post_key(&format!("http://{addr}/echo"), "d", "x")
            .await
            .status,
        502
    );
    let fixture = Fixture::start_on(&upstream.to_string());
    let retry = http
        .post_key(&format!("http://{addr}/echo"), "d", "x")
        .await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(fixture.count().await, 1);

    let slow_ns = format!("{ns}-slow");
    let slow_file = shared_store::config_file(
        &slow_ns,
        &store_section(&slow_ns),
        "[upstream]\ntimeout = \"300ms\"\n",
    );
    let (_slow, slow_addr) = spawn_gateway(&[
        "--config",
        slow_file.path(),
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
    ]);
    let url = format!("http://{slow_addr}/slow?ms=1500");
    assert_eq!(http.post_key(&url, "s", "").await.status, 504);
    // The upstream had the request: its outcome is unknown, and the key is held on Redis.
    let retry = http.post_key(&url, "s", "").await;
    assert_eq!(retry.status, 409, "{}", retry.text());
    assert!(retry.text().contains("outcome-unknown"), "{}", retry.text());
}

/// A gateway whose Redis does not answer yet starts anyway: `/healthz` answers, `/readyz` and
/// covered requests say the store is down (503, `Retry-After`, the upstream not called),
/// uncovered ones pass. Once a server listens there, the gateway connects without a restart.
/// Before, `idem serve` exited 1 when its store did not answer at start, so `/readyz` could
/// never report it, and a gateway started before its store had to be restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starts_before_its_store_and_connects_when_it_answers() {
    let fixture = Fixture::start();
    let port = free_addr().port();
    let admin = free_addr();
    let store = format!("redis://127.0.0.1:{port}");
    let (_gateway, addr) = spawn_gateway(&[
        "--upstream",
        &format!("http://{}", fixture.addr),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        &admin.to_string(),
        "--store",
        &store,
    ]);
    let http = Http::new();
    let healthz = http
        .send(Method::GET, &format!("http://{admin}/healthz"), &[], "")
        .await;
    assert_eq!(healthz.status, 200);
    let readyz = http
        .send(Method::GET, &format!("http://{admin}/readyz"), &[], "")
        .await;
    assert_eq!(readyz.status, 503, "{}", readyz.text());
    assert!(readyz.text().contains("not reached"), "{}", readyz.text());
    let echo = format!("http://{addr}/echo");
    let refused = http.post_key(&echo, "early", "10 EUR").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    let passed = http
        .send(Method::GET, &format!("http://{addr}/counter"), &[], "")
        .await;
    assert_eq!(passed.status, 200);
    assert_eq!(fixture.count().await, 0);

    // A server comes up on the port: the gateway connects, no restart.
    if !have_redis_binaries() {
        return;
    }
    let _server = ServerProcess::start_on(port, &[]);
    let ready = common::eventually(Duration::from_secs(15), || {
        let http = http.clone();
        async move {
            http.send(Method::GET, &format!("http://{admin}/readyz"), &[], "")
                .await
                .status
                == 200
        }
    })
    .await;
    assert!(ready, "/readyz never saw the store come up");
    let executed = common::eventually(Duration::from_secs(15), || {
        let (http, echo) = (http.clone(), echo.clone());
        async move { http.post_key(&echo, "early", "10 EUR").await.status == 201 }
    })
    .await;
    assert!(executed, "the covered request never ran");
    // Each serving thread has a store connection of its own, which tries to connect at most
    // once a second: one that tried just before the server came up answers 503 (nothing run)
    // until its next try. The retry is a replay once it reaches the store, never a second run.
    let replayed = common::eventually(Duration::from_secs(15), || {
        let (http, echo) = (http.clone(), echo.clone());
        async move {
            let retry = http.post_key(&echo, "early", "10 EUR").await;
            assert!(retry.replayed() || retry.status == 503, "{}", retry.status);
            retry.replayed()
        }
    })
    .await;
    assert!(replayed, "the retry was never replayed");
    assert_eq!(fixture.count().await, 1);
}

/// A Redis store that does not answer at start is reported once, not once more for each
/// serving thread's own connection to it. Before, the warning came three times.
#[test]
fn a_store_that_does_not_answer_is_reported_once() {
    use std::io::{BufRead, BufReader, Read};
    let port = free_addr().port();
    let mut child = common::idem_command("serve")
        .args([
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--store",
            &format!("redis://127.0.0.1:{port}"),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("listening on") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no listening line"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(
        stderr.matches("the store does not answer").count(),
        1,
        "{stderr}"
    );
}
