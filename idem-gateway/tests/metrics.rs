//! `/metrics` of an `idem serve` process (its own Prometheus recorder, as in production): the
//! metrics of the metrics table of ops/README.md are there, described and at zero, before anything happened,
//! and they count what a few requests do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use common::{Fixture, Http, Proc, free_addr, metric_value, spawn_gateway};
use http::Method;

/// The series a fresh gateway on the memory store exports at 0, each with its `# HELP`: the
/// layer's (claims acquired, duplicates, collisions, mismatches, failures by kind, takeovers,
/// lease losses, store latency and errors by store and op, requests by outcome), the
/// gateway's own, and the memory store's evictions by bound.
const AT_ZERO: [&str; 17] = [
    "idem_claims_acquired_total",
    "idem_duplicates_replayed_total",
    "idem_in_flight_collisions_total",
    "idem_mismatches_total",
    "idem_failures_total{kind=\"handler_error\"}",
    "idem_lease_takeovers_total",
    "idem_lease_losses_total",
    "idem_responses_omitted_total",
    "idem_store_operation_seconds_count{store=\"memory\",op=\"claim\"}",
    "idem_store_errors_total{store=\"memory\",op=\"claim\",kind=\"unavailable\"}",
    "idem_http_requests_total{outcome=\"executed\"}",
    "idem_http_requests_total{outcome=\"store_error\"}",
    "idem_gateway_requests_total{route=\"default\",status=\"2xx\"}",
    "idem_gateway_upstream_errors_total{kind=\"timeout\"}",
    "idem_gateway_refused_total{reason=\"host\"}",
    // Before, the memory store's evictions had no `# HELP` and appeared only at the first
    // eviction, which `increase()` in the shipped alert `IdemMemoryStoreEvicting` then missed.
    "idem_memory_store_evictions_total{bound=\"capacity\"}",
    "idem_memory_store_evictions_total{bound=\"bytes\"}",
];

/// An `idem serve` process in front of `upstream`, with its admin listener on a free port:
/// the process, its address and the admin listener's URL.
fn metered_gateway(upstream: SocketAddr) -> (Proc, SocketAddr, String) {
    let admin = free_addr().to_string();
    let (gateway, addr) = spawn_gateway(&[
        "--upstream",
        &format!("http://{upstream}"),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        &admin,
    ]);
    (gateway, addr, format!("http://{admin}"))
}

/// Before: a series appeared only once it had counted something, so a fresh gateway (or one
/// that never saw a takeover, a lease loss or a store error) did not export those at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_exported_from_the_start_and_counts_requests() {
    let fixture = Fixture::start();
    let (_gateway, addr, admin) = metered_gateway(fixture.addr);
    let http = Http::new();
    for series in AT_ZERO {
        let (value, text) = metric_value(&http, &admin, series).await;
        assert_eq!(value, Some(0.0), "{series} in:\n{text}");
        let name = series.split(['{', ' ']).next().unwrap();
        let family = name.strip_suffix("_count").unwrap_or(name);
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no help for {family}"
        );
    }

    // An execution, its replay, a mismatch, and a duplicate of a request in flight.
    let echo = format!("http://{addr}/echo");
    assert_eq!(http.post_key(&echo, "m-1", "10 EUR").await.status, 201);
    assert!(http.post_key(&echo, "m-1", "10 EUR").await.replayed());
    assert_eq!(http.post_key(&echo, "m-1", "99 EUR").await.status, 422);
    let slow = format!("http://{addr}/slow?ms=1500");
    let first = {
        let (http, slow) = (http.clone(), slow.clone());
        tokio::spawn(async move { http.post_key(&slow, "m-2", "").await })
    };
    // The duplicate goes once the first holds the key (the key API lists it in flight).
    let keys = format!("{admin}/api/keys?state=in_flight");
    let claimed = common::eventually(std::time::Duration::from_secs(10), || {
        let (http, keys) = (http.clone(), keys.clone());
        async move {
            http.send(Method::GET, &keys, &[], "")
                .await
                .text()
                .contains("\"m-2\"")
        }
    })
    .await;
    assert!(claimed, "the first request never held its key");
    assert_eq!(http.post_key(&slow, "m-2", "").await.status, 409);
    assert_eq!(first.await.unwrap().status, 200);
    let get = http
        .send(Method::GET, &format!("http://{addr}/counter"), &[], "")
        .await;
    assert_eq!(get.status, 200);

    for (series, expected) in [
        ("idem_claims_acquired_total", 2.0),
        ("idem_duplicates_replayed_total", 1.0),
        ("idem_mismatches_total", 1.0),
        ("idem_http_requests_total{outcome=\"executed\"}", 2.0),
        ("idem_http_requests_total{outcome=\"replayed\"}", 1.0),
        ("idem_http_requests_total{outcome=\"mismatch\"}", 1.0),
        ("idem_http_requests_total{outcome=\"bypassed\"}", 1.0),
        ("idem_lease_takeovers_total", 0.0),
        (
            "idem_store_operation_seconds_count{store=\"memory\",op=\"claim\"}",
            0.0,
        ),
    ] {
        let (value, text) = metric_value(&http, &admin, series).await;
        if series.starts_with("idem_store_operation_seconds_count") {
            // Every claim is timed: at least the two executions, the replay and the mismatch.
            assert!(value.is_some_and(|v| v >= 4.0), "{series} in:\n{text}");
        } else {
            assert_eq!(value, Some(expected), "{series} in:\n{text}");
        }
    }
    let (collisions, text) = metric_value(&http, &admin, "idem_in_flight_collisions_total").await;
    assert_eq!(collisions, Some(1.0), "{text}");
    let (conflicts, text) = metric_value(
        &http,
        &admin,
        "idem_http_requests_total{outcome=\"conflict\"}",
    )
    .await;
    assert_eq!(conflicts, Some(1.0), "{text}");
    // Durations are histograms (buckets add up across gateways), not summaries.
    assert!(
        text.contains(
            "idem_gateway_request_duration_seconds_bucket{route=\"default\",le=\"0.005\"}"
        ),
        "{text}"
    );
    assert!(
        text.contains("idem_store_operation_seconds_bucket{"),
        "{text}"
    );
    assert!(!text.contains("quantile=\""), "a summary in:\n{text}");
}

/// A request whose upstream call fails (502 here; a 504 goes the same way) is counted by its
/// outcome like any other: executed when it held a key (the claim is released), bypassed when
/// it passed through. Before, `idem_http_requests_total` did not count it at all, so the
/// outcomes summed to fewer requests than the gateway answered while its upstream was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_upstream_fails_is_counted_by_its_outcome() {
    let (_gateway, addr, admin) = metered_gateway(free_addr());
    let http = Http::new();
    let url = format!("http://{addr}/pay");
    assert_eq!(http.post_key(&url, "down-1", "x").await.status, 502);
    assert_eq!(http.send(Method::POST, &url, &[], "x").await.status, 502);
    for (series, expected) in [
        ("idem_http_requests_total{outcome=\"executed\"}", 1.0),
        ("idem_http_requests_total{outcome=\"bypassed\"}", 1.0),
        ("idem_failures_total{kind=\"handler_error\"}", 1.0),
        (
            "idem_gateway_upstream_errors_total{kind=\"unreachable\"}",
            2.0,
        ),
    ] {
        let (value, text) = metric_value(&http, &admin, series).await;
        assert_eq!(value, Some(expected), "{series} in:\n{text}");
    }
}

/// Requests the gateway refuses before any route (a repeated `Host`, a path above the root)
/// are counted by reason. Before, no series counted them: the route counters never see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_any_route_are_counted_by_reason() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fixture = Fixture::start();
    let (_gateway, addr, admin) = metered_gateway(fixture.addr);
    let raw = |head: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    };
    let two_hosts = "POST /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let above =
        "POST /a/../../echo HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for head in [two_hosts, two_hosts, above] {
        let answer = raw(head).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    let http = Http::new();
    for (series, expected) in [
        ("idem_gateway_refused_total{reason=\"host\"}", 2.0),
        ("idem_gateway_refused_total{reason=\"above_root\"}", 1.0),
        ("idem_gateway_refused_total{reason=\"no_path\"}", 0.0),
        ("idem_gateway_refused_total{reason=\"ambiguous_path\"}", 0.0),
        (
            "idem_gateway_refused_total{reason=\"too_many_headers\"}",
            0.0,
        ),
        (
            "idem_gateway_refused_total{reason=\"transfer_coding\"}",
            0.0,
        ),
    ] {
        let (value, text) = metric_value(&http, &admin, series).await;
        assert_eq!(value, Some(expected), "{series} in:\n{text}");
    }
    assert_eq!(fixture.count().await, 0);
}

/// `/ui` says what its numbers are. With nothing in flight it says so (it read "0 record(s), 0
/// with a lapsed lease; the oldest is 0ms old"); with two requests in flight and one 409, the
/// shares are of the requests answered, and say so (it read "Of 1 requests since start: ...
/// 100.0% in-flight conflicts", as if one request had been made in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_page_says_what_its_counts_count() {
    let fixture = Fixture::start();
    let (_gateway, addr, admin) = metered_gateway(fixture.addr);
    let http = Http::new();
    let ui = format!("{admin}/ui");
    let page = http.send(Method::GET, &ui, &[], "").await.text();
    assert!(page.contains("Nothing in flight."), "{page}");
    assert!(!page.contains("0 record(s)"), "{page}");

    let slow = format!("http://{addr}/slow?ms=3000");
    let running: Vec<_> = ["ui-1", "ui-2"]
        .into_iter()
        .map(|key| {
            let (http, slow) = (http.clone(), slow.clone());
            tokio::spawn(async move { http.post_key(&slow, key, "").await })
        })
        .collect();
    let keys = format!("{admin}/api/keys?state=in_flight");
    let claimed = common::eventually(std::time::Duration::from_secs(10), || {
        let (http, keys) = (http.clone(), keys.clone());
        async move {
            let text = http.send(Method::GET, &keys, &[], "").await.text();
            text.contains("\"ui-1\"") && text.contains("\"ui-2\"")
        }
    })
    .await;
    assert!(claimed, "the two requests never held their keys");
    assert_eq!(http.post_key(&slow, "ui-1", "").await.status, 409);

    let page = http.send(Method::GET, &ui, &[], "").await.text();
    assert!(
        page.contains(
            "Of the 1 request(s) answered since start (a request still running counts once it is \
             answered): 0.0% duplicates replayed, 100.0% in-flight conflicts (409)."
        ),
        "{page}"
    );
    assert!(
        page.contains("2 record(s), 0 with a lapsed lease"),
        "{page}"
    );
    assert!(page.contains("requests answered"), "{page}");
    for request in running {
        assert_eq!(request.await.unwrap().status, 200);
    }
}
