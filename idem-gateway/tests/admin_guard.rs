//! The guards of the admin listener that hold whatever the token: a CSRF token per session of
//! `/ui` (also without an admin token), no state-changing request from another site, one
//! `Host` line, and the reason a store is not ready only for those who may read it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::raw_http::RawClient;
use common::{Fixture, Gateway, Http, Reply, config_with};
use http::Method;
use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store, StoreError};
use idem_gateway::config::Overrides;

const TOKEN: &str = "admin-guard-token";

fn with_token() -> Overrides {
    Overrides {
        admin_token: Some(TOKEN.to_owned()),
        ..Overrides::default()
    }
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

async fn hold(gateway: &Gateway, key: &str) {
    gateway
        .store
        .claim(&ClaimRequest::new(
            record_key(key),
            Fingerprint::of(&[b"t"]),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
}

/// The session cookie (`name=value`) a response sets, if it sets one.
fn cookie_of(reply: &Reply) -> Option<String> {
    let set = reply.header("set-cookie")?;
    Some(set.split(';').next()?.to_owned())
}

/// The CSRF token the page's forms carry.
fn csrf_of(page: &Reply) -> String {
    page.text()
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned()
}

/// `POST /ui/delete` of `key` with `headers` and the form's `csrf`; the status.
async fn delete_form(
    http: &Http,
    admin: &str,
    key: &str,
    csrf: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let mut all = vec![("content-type", "application/x-www-form-urlencoded")];
    all.extend_from_slice(headers);
    http.send(
        Method::POST,
        &format!("{admin}/ui/delete"),
        &all,
        format!("key={key}&scope=&csrf={csrf}"),
    )
    .await
    .status
}

/// Without an admin token, every visitor of `/ui` gets a session of its own, and its forms
/// its own CSRF token, which only its session's cookie makes good: before, the page had one
/// CSRF token for the whole process and set no cookie, so a form that carried it (from any
/// page that once read it, or a script on this machine) deleted without a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_each_visitor_of_the_page_has_its_own_csrf_token() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &Overrides::default())).await;
    let admin = gateway.admin.clone().unwrap();
    hold(&gateway, "held").await;
    let http = Http::new();

    let first = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await;
    let second = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await;
    assert_eq!((first.status, second.status), (200, 200));
    let set = first.header("set-cookie").unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(flag), "{flag} not in {set}");
    }
    let (cookie_a, cookie_b) = (cookie_of(&first).unwrap(), cookie_of(&second).unwrap());
    let (csrf_a, csrf_b) = (csrf_of(&first), csrf_of(&second));
    assert_ne!(cookie_a, cookie_b);
    assert_ne!(csrf_a, csrf_b);
    // The session stays: its page keeps its token, and sets no new cookie.
    let again = http
        .send(
            Method::GET,
            &format!("{admin}/ui"),
            &[("cookie", &cookie_a)],
            "",
        )
        .await;
    assert_eq!(csrf_of(&again), csrf_a);
    assert!(again.header("set-cookie").is_none());
    // No logout button: nobody signed in.
    assert!(!again.text().contains("/ui/logout"));

    let stored = || async {
        gateway
            .store
            .get(&record_key("held"))
            .await
            .unwrap()
            .is_some()
    };
    assert_eq!(
        delete_form(&http, &admin, "held", &csrf_a, &[]).await,
        403,
        "no session"
    );
    assert_eq!(
        delete_form(&http, &admin, "held", &csrf_b, &[("cookie", &cookie_a)]).await,
        403,
        "another session's token"
    );
    assert!(stored().await);
    assert_eq!(
        delete_form(&http, &admin, "held", &csrf_a, &[("cookie", &cookie_a)]).await,
        303
    );
    assert!(!stored().await);
}

/// With a token, a session of its own per login (as before), and the bearer header (curl)
/// needs no CSRF token: a browser never sends that header on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_bearer_header_needs_no_csrf_token() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    hold(&gateway, "held").await;
    let http = Http::new();
    let bearer = format!("Bearer {TOKEN}");
    let page = http
        .send(
            Method::GET,
            &format!("{admin}/ui"),
            &[("authorization", &bearer)],
            "",
        )
        .await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("set-cookie").is_none(),
        "a session for a bearer header"
    );
    assert_eq!(
        delete_form(&http, &admin, "held", "", &[("authorization", &bearer)]).await,
        303
    );
    assert!(
        gateway
            .store
            .get(&record_key("held"))
            .await
            .unwrap()
            .is_none()
    );
}

/// A state-changing request a browser sent from another site is 403, with a right session,
/// CSRF token or bearer token all the same: before, `Origin` and `Sec-Fetch-Site` were not
/// read. Another port of the same host (a page the gateway serves) is another site for this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_a_browser_sends_from_another_site_is_403() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &Overrides::default())).await;
    let admin = gateway.admin.clone().unwrap();
    let own = admin.clone();
    hold(&gateway, "held").await;
    let http = Http::new();
    let page = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await;
    let (cookie, csrf) = (cookie_of(&page).unwrap(), csrf_of(&page));
    let stored = || async {
        gateway
            .store
            .get(&record_key("held"))
            .await
            .unwrap()
            .is_some()
    };

    let gateway_page = gateway.url.clone();
    for foreign in [
        [("sec-fetch-site", "cross-site")],
        [("sec-fetch-site", "same-site")],
        [("origin", "http://evil.example")],
        [("origin", gateway_page.as_str())],
        [("origin", "null")],
    ] {
        let headers = [("cookie", cookie.as_str()), foreign[0]];
        assert_eq!(
            delete_form(&http, &admin, "held", &csrf, &headers).await,
            403,
            "{foreign:?}"
        );
        let api = http
            .send(
                Method::DELETE,
                &format!("{admin}/api/keys/held"),
                &foreign,
                "",
            )
            .await;
        assert_eq!(api.status, 403, "{foreign:?}");
        let json: serde_json::Value = serde_json::from_slice(&api.body).unwrap();
        assert!(
            json["error"].as_str().unwrap().contains("another site"),
            "{json}"
        );
        let logout = http
            .send(Method::POST, &format!("{admin}/ui/logout"), &headers, "")
            .await;
        assert_eq!(logout.status, 403, "{foreign:?}");
    }
    assert!(stored().await);
    // From the page itself, as a browser says it.
    let same = [
        ("cookie", cookie.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("origin", own.as_str()),
    ];
    assert_eq!(delete_form(&http, &admin, "held", &csrf, &same).await, 303);
    assert!(!stored().await);

    // The login form too, on a listener with a token.
    let tokened = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let tokened_admin = tokened.admin.clone().unwrap();
    let login = http
        .send(
            Method::POST,
            &format!("{tokened_admin}/ui/login"),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("sec-fetch-site", "cross-site"),
            ],
            format!("token={TOKEN}"),
        )
        .await;
    assert_eq!(login.status, 403);
    assert!(login.header("set-cookie").is_none());
}

/// A request with two `Host` lines is 400 on the admin listener, as on the gateway's own:
/// before, the admin listener took it (and read the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_lines_are_400() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &Overrides::default())).await;
    let admin = gateway.admin.clone().unwrap();
    let host = admin.trim_start_matches("http://").to_owned();
    for path in ["/readyz", "/api/keys", "/ui"] {
        let mut client = RawClient::connect(&admin).await;
        let answer = client
            .exchange(&format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
            ))
            .await
            .unwrap();
        assert!(
            answer.start().contains(" 400 "),
            "{path}: {}",
            answer.start()
        );
        assert!(
            String::from_utf8_lossy(&answer.body).contains("more than one Host"),
            "{path}"
        );
    }
}

/// A store that does not answer, with an error that names a user (as a PostgreSQL server's
/// does): a deferred store that never connects.
fn failing_store() -> Arc<dyn Store> {
    let why = StoreError::unavailable("password authentication failed for user \"payments\"");
    Arc::new(idem_core::Deferred::new(
        "postgres://payments@db/prod",
        &why,
        || async {
            Err(StoreError::unavailable(
                "password authentication failed for user \"payments\"",
            ))
        },
    ))
}

/// Without a token, `/readyz` says why the store is not ready only to a request from this
/// machine addressed by IP address or `localhost`: to any other (a page that rebound its name
/// to this machine, a proxy on it), 503 and no reason. Before, the store's error (a user
/// name, a host) went to any `Host`. With a token, the request that has it gets the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_shows_why_only_to_whom_may_read_it() {
    let fixture = Fixture::start();
    let http = Http::new();
    for overrides in [Overrides::default(), with_token()] {
        let tokened = overrides.admin_token.is_some();
        let config = config_with(fixture.addr, "", &overrides);
        let running =
            idem_gateway::start_with_store(&config, failing_store(), None, std::future::pending())
                .await
                .unwrap();
        let admin = running.admin.unwrap();
        let readyz = format!("http://{admin}/readyz");
        let bearer = format!("Bearer {TOKEN}");
        let rebound = format!("evil.example:{}", admin.port());
        let mut headers = vec![("host", rebound.as_str())];
        if tokened {
            headers.push(("authorization", bearer.as_str()));
        }
        let named = http.send(Method::GET, &readyz, &headers, "").await;
        assert_eq!(named.status, 503);
        if tokened {
            assert!(named.text().contains("payments"), "{}", named.text());
        } else {
            assert!(!named.text().contains("payments"), "{}", named.text());
            assert!(named.text().contains("not ready"), "{}", named.text());
        }
        let local = format!("localhost:{}", admin.port());
        let direct: Vec<(&str, &str)> = if tokened {
            vec![("authorization", bearer.as_str())]
        } else {
            vec![]
        };
        for host in [None, Some(local.as_str())] {
            let mut headers = direct.clone();
            headers.extend(host.map(|h| ("host", h)));
            let answer = http.send(Method::GET, &readyz, &headers, "").await;
            assert_eq!(answer.status, 503);
            assert!(
                answer
                    .text()
                    .contains("password authentication failed for user \"payments\""),
                "{host:?}: {}",
                answer.text()
            );
        }
    }
}
