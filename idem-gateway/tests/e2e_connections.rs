//! End-to-end: client connections that hold the gateway's resources. A connection that sends
//! nothing, or only the HTTP/2 preface, is closed after `header_timeout` (before, it stayed
//! open past 300 s, and about 20,000 of them exhausted the process's descriptors); at
//! `max_connections` the gateway keeps serving the connections it has and takes a new one
//! only once another closes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::raw_http::{Message, RawClient, RawUpstream};
use common::{Gateway, config_with_server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn upstream() -> RawUpstream {
    RawUpstream::start(|_: &Message, n| {
        format!("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n{n}")
    })
    .await
}

/// Whether the gateway closes `stream` (a read gives the end, or a reset) within `limit`;
/// what it wrote before is ignored.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_request_head_is_closed_after_header_timeout() {
    let upstream = upstream().await;
    let gateway = Gateway::start(&config_with_server(
        upstream.addr,
        "header_timeout = \"300ms\"",
        "",
    ))
    .await;
    let addr = gateway.url.trim_start_matches("http://").to_owned();
    // Nothing at all.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    // Half a head.
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"POST /pay HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    // The HTTP/2 preface and nothing after it.
    let mut preface = TcpStream::connect(&addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    for (what, stream) in [
        ("silent", &mut silent),
        ("half a head", &mut half),
        ("preface", &mut preface),
    ] {
        assert!(
            closed_within(stream, Duration::from_secs(30)).await,
            "{what}: the connection stayed open"
        );
    }
    // A connection that sends its request in time is served.
    let mut client = RawClient::connect(&gateway.url).await;
    let answer = client
        .exchange("GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(answer.start().contains(" 200 "), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_the_open_ones_are_served_and_a_new_one_waits() {
    let upstream = upstream().await;
    let gateway = Gateway::start(&config_with_server(
        upstream.addr,
        "max_connections = 2\nworkers = 1",
        "",
    ))
    .await;
    let request = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut first = RawClient::connect(&gateway.url).await;
    let mut second = RawClient::connect(&gateway.url).await;
    assert!(first.exchange(request).await.is_some());
    assert!(second.exchange(request).await.is_some());
    assert_eq!(upstream.runs(), 2);
    // A third connection is made by the kernel (the listen backlog) but not accepted.
    let third = tokio::spawn(async move {
        let mut third = RawClient::connect(&gateway.url).await;
        let answer = third
            .exchange("GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await;
        (answer, gateway)
    });
    // The open connections are served meanwhile.
    assert!(first.exchange(request).await.is_some());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        upstream.runs(),
        3,
        "the third connection was served over the cap"
    );
    drop(second);
    let (answer, _gateway) = tokio::time::timeout(Duration::from_secs(30), third)
        .await
        .expect("the third connection was served once one closed")
        .unwrap();
    assert!(answer.is_some());
    assert_eq!(upstream.runs(), 4);
}
