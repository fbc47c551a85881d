//! End-to-end: the scopes for cookie and API-key authentication, and the request body timeout,
//! through `idem serve` (in this process, on the memory store) in front of the idem-fixture
//! upstream, all on 127.0.0.1 port 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Fixture, Gateway, Http, config};
use http::Method;
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_gateway::config::{self as gateway_config, Overrides, ScopeSpec};
use idem_testkit::trickle::trickle;

/// POST `/echo` with the key `k`, the body `{}` and `headers`.
async fn pay(http: &Http, gateway: &Gateway, headers: &[(&str, &str)]) -> common::Reply {
    let mut all = vec![("idempotency-key", "k")];
    all.extend_from_slice(headers);
    http.send(Method::POST, &gateway.url("/echo"), &all, "{}")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cookie_scope_another_session_is_executed_not_replayed() {
    let fixture = Fixture::start();
    let route = "[[route]]\npath = \"/echo\"\nscope = \"cookie:session\"\n";
    let gateway = Gateway::start(&config(fixture.addr, route)).await;
    let http = Http::new();
    let alice = pay(&http, &gateway, &[("cookie", "session=alice; theme=dark")]).await;
    assert_eq!(alice.status, 201);
    assert!(!alice.replayed());
    let mallory = pay(&http, &gateway, &[("cookie", "session=mallory")]).await;
    assert_eq!(mallory.status, 201);
    assert!(
        !mallory.replayed(),
        "another session got the first one's response"
    );
    assert!(
        pay(&http, &gateway, &[("cookie", "session=alice")])
            .await
            .replayed()
    );
    assert_eq!(fixture.count().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_scope_keeps_every_source_apart() {
    let fixture = Fixture::start();
    let route = "[[route]]\npath = \"/echo\"\n\
                 scope = [\"authorization\", \"cookie:session\", \"header:X-Api-Key\"]\n";
    let gateway = Gateway::start(&config(fixture.addr, route)).await;
    let http = Http::new();
    assert!(
        !pay(&http, &gateway, &[("x-api-key", "key-a")])
            .await
            .replayed()
    );
    assert!(
        !pay(&http, &gateway, &[("x-api-key", "key-b")])
            .await
            .replayed()
    );
    assert!(
        !pay(&http, &gateway, &[("cookie", "session=key-a")])
            .await
            .replayed()
    );
    assert!(
        pay(&http, &gateway, &[("x-api-key", "key-a")])
            .await
            .replayed()
    );
    assert_eq!(fixture.count().await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_past_the_body_timeout_is_408_and_never_forwarded() {
    let fixture = Fixture::start();
    let route = "[[route]]\npath = \"/echo\"\nrequest_body_timeout = \"300ms\"\n";
    let gateway = Gateway::start(&config(fixture.addr, route)).await;
    let addr: SocketAddr = gateway.url.trim_start_matches("http://").parse().unwrap();
    // One byte every 50 ms, until the gateway answers and closes the connection.
    let head =
        "POST /echo HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\ncontent-length: 1000\r\n\r\n";
    let answer = trickle(addr, head, Duration::from_millis(50), 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert_eq!(fixture.count().await, 0);
    let key = RecordKey::unscoped(IdempotencyKey::new("k").unwrap());
    assert!(
        gateway.store.get(&key).await.unwrap().is_none(),
        "the key is free"
    );
}

#[test]
fn scopes_and_body_timeouts_are_parsed_and_checked() {
    let parse = |route: &str| {
        gateway_config::from_str(
            "idem.toml",
            &format!("[upstream]\nurl = \"http://127.0.0.1:1\"\n[[route]]\npath = \"/p\"\n{route}"),
            &Overrides::default(),
        )
    };
    let config = parse(
        "scope = [\"cookie:session\", \"header:X-Api-Key\"]\nrequest_body_timeout = \"2s\"\n",
    )
    .unwrap();
    let settings = &config.routes[0].settings;
    assert_eq!(
        settings.scope,
        ScopeSpec::All(vec![
            ScopeSpec::Cookie("session".into()),
            ScopeSpec::Header("X-Api-Key".into())
        ])
    );
    assert_eq!(
        settings.scope.to_string(),
        "[\"cookie:session\", \"header:X-Api-Key\"]"
    );
    assert_eq!(settings.request_body_timeout, Duration::from_secs(2));
    // The default, for the routes that set none.
    assert_eq!(
        config.routes[1].settings.request_body_timeout,
        Duration::from_secs(10)
    );
    for (bad, says) in [
        ("scope = []", "empty scope list"),
        ("scope = [\"none\"]", "sources only"),
        ("scope = [\"cookie:a b\"]", "invalid scope"),
        ("scope = \"cookie:\"", "invalid scope"),
        (
            "request_body_timeout = \"0s\"",
            "request_body_timeout must be longer than zero",
        ),
    ] {
        let error = parse(bad).unwrap_err().to_string();
        assert!(error.starts_with("idem.toml:"), "{bad}: {error}");
        assert!(error.contains(says), "{bad}: {error}");
    }
}

/// Under `scope = "cookie:session"`, a `Session=` cookie (another name: case counts) is not
/// the configured cookie, yet two such requests with different values are two principals:
/// the second runs, never gets the first's response (before, both fell into the shared "no
/// cookie" scope). The same without any cookie scope: an unscoped route but for `none`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_the_scope_does_not_name_never_share_a_record() {
    let fixture = Fixture::start();
    let route = "[[route]]\npath = \"/echo\"\nscope = \"cookie:session\"\n";
    let gateway = Gateway::start(&config(fixture.addr, route)).await;
    let http = Http::new();
    let a = pay(&http, &gateway, &[("cookie", "Session=aaa")]).await;
    let b = pay(&http, &gateway, &[("cookie", "Session=bbb")]).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed(), "B got A's response");
    let again = pay(&http, &gateway, &[("cookie", "Session=aaa")]).await;
    assert!(again.replayed());
    assert_eq!(fixture.count().await, 2);
}

/// The same key through another `Host` is a 422, never the other host's response (an
/// upstream that serves tenants by host); the host's case does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_made_through_one_host_is_not_replayed_through_another() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config(fixture.addr, "")).await;
    let http = Http::new();
    let one = pay(&http, &gateway, &[("host", "tenant-a.example")]).await;
    assert_eq!(one.status, 201);
    let same = pay(&http, &gateway, &[("host", "Tenant-A.example")]).await;
    assert!(same.replayed());
    let other = pay(&http, &gateway, &[("host", "tenant-b.example")]).await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(fixture.count().await, 1);
}

/// With a scope secret, the scope of `Authorization: Bearer AAA` is not its plain SHA-256,
/// which anyone could compute from a guessed token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_secret_keys_the_stored_scope() {
    let fixture = Fixture::start();
    let overrides = Overrides {
        scope_secret: Some("0123456789abcdef-of-this-test".to_owned()),
        ..Overrides::default()
    };
    let config = common::config_with(fixture.addr, "", &overrides);
    let gateway = Gateway::start(&config).await;
    let http = Http::new();
    let reply = pay(&http, &gateway, &[("authorization", "Bearer AAA")]).await;
    assert_eq!(reply.status, 201);
    let key = IdempotencyKey::new("k").unwrap();
    let plain = RecordKey::new(idem_core::Scope::from_secret(b"Bearer AAA"), key.clone());
    assert!(gateway.store.get(&plain).await.unwrap().is_none());
    assert_eq!(gateway.store.len(), 1);
}
