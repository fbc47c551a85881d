//! The admin listener's key API and `/ui` over plain HTTP, and `idem keys --admin`: a gateway
//! in this process on the memory store, reached only through its admin listener.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{
    Fixture, Gateway, Http, Reply, config_with, eventually, metric_value, metrics_recorder,
};
use http::Method;
use idem_core::{ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_gateway::config::Overrides;
use idem_gateway::{record_json, record_text};

const TOKEN: &str = "admin-test-token";

fn record_key(key: &str) -> RecordKey {
    RecordKey::unscoped(IdempotencyKey::new(key).unwrap())
}

fn with_token() -> Overrides {
    Overrides {
        admin_token: Some(TOKEN.to_owned()),
        ..Overrides::default()
    }
}

/// A gateway in front of `fixture` without an admin token, with `/metrics` rendered.
async fn metered_gateway(fixture: &Fixture) -> Gateway {
    Gateway::start_with_metrics(
        &config_with(fixture.addr, "", &Overrides::default()),
        Some(metrics_recorder()),
    )
    .await
}

/// Scrapes `{admin}/metrics` until `shows` holds for its text or `limit` passes; whether it did.
async fn metrics_show(
    http: &Http,
    admin: &str,
    limit: Duration,
    shows: impl Fn(&str) -> bool + Clone + Send + 'static,
) -> bool {
    let url = format!("{admin}/metrics");
    eventually(limit, || {
        let (http, url, shows) = (http.clone(), url.clone(), shows.clone());
        async move { shows(&http.send(Method::GET, &url, &[], "").await.text()) }
    })
    .await
}

/// Whether `text` has `line` as a line of its own.
fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// `POST /ui/login` with `token` in the form.
async fn log_in(http: &Http, admin: &str, token: &str) -> Reply {
    http.send(
        Method::POST,
        &format!("{admin}/ui/login"),
        &[("content-type", "application/x-www-form-urlencoded")],
        format!("token={token}"),
    )
    .await
}

/// [`idem_keys_blocking`] off the runtime's threads.
async fn idem_keys(admin: &str, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let admin = admin.to_owned();
    let token = token.map(str::to_owned);
    let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idem_keys_blocking(&admin, token.as_deref(), &args)
    })
    .await
    .unwrap()
}

/// Runs `idem keys ARGS --admin URL` with `token` (none: no token at all); returns the exit
/// code, stdout and stderr.
fn idem_keys_blocking(admin: &str, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.arg("keys").args(args).args(["--admin", admin]);
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    if let Some(token) = token {
        command.env("IDEM_ADMIN_TOKEN", token);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_through_the_admin_listener_list_and_delete_a_request_in_flight() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();

    // A finished record, for the output formats.
    let done = http.post_key(&gateway.url("/echo"), "adm-done", "1").await;
    assert_eq!(done.status, 201);
    // A slow request in flight.
    let slow = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url("/slow?ms=20000"));
        async move {
            http.try_send(Method::POST, &url, &[("idempotency-key", "adm-slow")], "")
                .await
        }
    });
    let store = gateway.store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            store.get(&record_key("adm-slow")).await.unwrap().is_some()
        })
        .await
    );

    let (code, out, err) = idem_keys(
        &admin,
        Some(TOKEN),
        &["list", "--state", "in_flight", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{out}");
    assert_eq!(list[0]["key"], "adm-slow");
    assert_eq!(list[0]["state"], "in_flight");
    assert_eq!(list[0]["owner"].as_str().unwrap().len(), 32);

    // The same output as the store path renders, in both formats.
    let record = store.get(&record_key("adm-done")).await.unwrap().unwrap();
    let line_out = idem_keys(&admin, Some(TOKEN), &["get", "adm-done"]).await;
    let json_out = idem_keys(&admin, Some(TOKEN), &["get", "adm-done", "--json"]).await;
    assert_eq!(line_out.1.trim(), record_text(&record_json(&record)));
    for field in [
        "state: completed",
        "owner: ",
        "lease_until: ",
        "status: 201",
        // The stored response itself: what a user looks for first.
        "response:\n  header: content-type: ",
        "  body: ",
    ] {
        assert!(
            line_out.1.contains(field),
            "{field:?} not in {}",
            line_out.1
        );
    }
    assert_eq!(json_out.1.trim(), record_json(&record).to_string());
    let json: serde_json::Value = serde_json::from_str(json_out.1.trim()).unwrap();
    assert_eq!(json["response"]["status"], 201);
    assert!(json["response"]["body_bytes"].as_u64().is_some(), "{json}");
    assert!(json["response"]["body_preview"].is_string(), "{json}");

    // Without the token: refused, exit 1, one line saying so.
    let (code, _, err) = idem_keys(&admin, None, &["list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("401") && err.contains("IDEM_ADMIN_TOKEN"),
        "{err}"
    );

    // A wrong token: said to be refused, not missing.
    let (code, _, err) = idem_keys(&admin, Some("not-the-token-at-all"), &["list"]).await;
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("401") && err.contains("refused the token"),
        "{err}"
    );

    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["delete", "adm-slow"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "deleted adm-slow");
    assert!(store.get(&record_key("adm-slow")).await.unwrap().is_none());
    let (code, out, _) = idem_keys(&admin, Some(TOKEN), &["delete", "adm-slow", "--json"]).await;
    assert_eq!((code, out.trim()), (0, "{\"deleted\":false}"));
    slow.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_api_pages_filters_and_escapes_keys() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &Overrides::default())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    for i in 0..5 {
        let reply = http
            .post_key(&gateway.url("/echo"), &format!("page-{i}"), "x")
            .await;
        assert_eq!(reply.status, 201);
    }
    let odd = "a b/c?d&e=%";
    // A key with a space goes in the sf-string form.
    assert_eq!(
        http.post_key(&gateway.url("/echo"), &format!("\"{odd}\""), "x")
            .await
            .status,
        201
    );

    // Pages of 2 follow the cursor to all 6.
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{admin}/api/keys?limit=2&state=completed");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={}", common::encode(c)));
        }
        let reply = http.send(Method::GET, &url, &[], "").await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let page: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        seen += page["records"].as_array().unwrap().len();
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, 6);

    let key_url = format!("{admin}/api/keys/{}", common::encode(odd));
    let one = http.send(Method::GET, &key_url, &[], "").await;
    assert_eq!(one.status, 200, "{}", one.text());
    let one: serde_json::Value = serde_json::from_slice(&one.body).unwrap();
    assert_eq!(one["key"], odd);
    assert_eq!(one["status"], 201);

    // A bad filter is 400, and the error names the query parameter, not the command line's
    // flag.
    for (query, start) in [
        ("state=done", "state: unknown state"),
        ("older_than=soon", "older_than: invalid duration"),
        // A cursor the store never gave: bad input, not the store's outage (it was 503 on
        // the server stores and an empty page on the memory store).
        ("cursor=garbage", "cursor: not a scan cursor"),
    ] {
        let bad = http
            .send(Method::GET, &format!("{admin}/api/keys?{query}"), &[], "")
            .await;
        assert_eq!(bad.status, 400);
        let bad: serde_json::Value = serde_json::from_slice(&bad.body).unwrap();
        let message = bad["error"].as_str().unwrap();
        assert!(message.starts_with(start), "{message}");
    }
    // A key that does not decode to text is a bad argument, not a missing page.
    let undecodable = http
        .send(Method::GET, &format!("{admin}/api/keys/%ff"), &[], "")
        .await;
    assert_eq!(undecodable.status, 400);
    assert!(undecodable.text().contains("percent-encoded"));
    let old = http
        .send(
            Method::GET,
            &format!("{admin}/api/keys?older_than=1h"),
            &[],
            "",
        )
        .await;
    let old: serde_json::Value = serde_json::from_slice(&old.body).unwrap();
    assert_eq!(
        old,
        serde_json::json!({ "records": [], "unreadable": [], "next_cursor": null })
    );

    let deleted = http.send(Method::DELETE, &key_url, &[], "").await;
    assert_eq!(deleted.text(), "{\"deleted\":true}");
    assert_eq!(http.send(Method::GET, &key_url, &[], "").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_only_requests_addressed_by_ip_reach_the_keys_and_the_page() {
    let fixture = Fixture::start();
    let gateway = metered_gateway(&fixture).await;
    let admin = gateway.admin.clone().unwrap();
    let port = admin.rsplit(':').next().unwrap().to_owned();
    let http = Http::new();
    assert_eq!(
        http.post_key(&gateway.url("/echo"), "rebinding", "x")
            .await
            .status,
        201
    );
    // A page that pointed its own name at the listener (DNS rebinding) sends that name.
    let rebound = format!("evil.example:{port}");
    let host = [("host", rebound.as_str())];
    for path in ["/api/keys", "/api/keys/rebinding", "/ui"] {
        let reply = http
            .send(Method::GET, &format!("{admin}{path}"), &host, "")
            .await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.text());
        assert!(reply.text().contains("DNS rebinding"), "{path}");
    }
    let deleted = http
        .send(
            Method::DELETE,
            &format!("{admin}/api/keys/rebinding"),
            &host,
            "",
        )
        .await;
    assert_eq!(deleted.status, 403);
    assert!(
        gateway
            .store
            .get(&record_key("rebinding"))
            .await
            .unwrap()
            .is_some()
    );
    // The key API's refusal is its JSON, so `idem keys --admin` shows the reason.
    let listed = http
        .send(Method::GET, &format!("{admin}/api/keys"), &host, "")
        .await;
    let json: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert!(json["error"].as_str().unwrap().contains("[admin] token"));
    // Scrapes and probes by name still work; so does everything by IP or localhost.
    for path in ["/metrics", "/healthz"] {
        let reply = http
            .send(Method::GET, &format!("{admin}{path}"), &host, "")
            .await;
        assert_eq!(reply.status, 200, "{path}");
    }
    let local = format!("localhost:{port}");
    for host in [None, Some(local.as_str())] {
        let headers: Vec<(&str, &str)> = host.map(|h| ("host", h)).into_iter().collect();
        let reply = http
            .send(
                Method::GET,
                &format!("{admin}/api/keys/rebinding"),
                &headers,
                "",
            )
            .await;
        assert_eq!(reply.status, 200, "{host:?}");
        let page = http
            .send(Method::GET, &format!("{admin}/ui"), &headers, "")
            .await;
        assert_eq!(page.status, 200, "{host:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_a_host_name_is_fine() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let port = admin.rsplit(':').next().unwrap().to_owned();
    let named = format!("idem-admin.internal:{port}");
    let bearer = format!("Bearer {TOKEN}");
    let reply = Http::new()
        .send(
            Method::GET,
            &format!("{admin}/api/keys"),
            &[("host", named.as_str()), ("authorization", bearer.as_str())],
            "",
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

/// Ten wrong tokens from one address get that address's wrong tokens 429 for the rest of the
/// minute, and the right token still works: before, it was answered 429 too, so whoever shared
/// the operator's address locked the operator out with ten guesses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_wrong_tokens_are_throttled_and_the_right_token_still_works() {
    // The README's limit: 10 wrong tokens within a minute.
    const MAX_FAILURES: u32 = 10;
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let keys = format!("{admin}/api/keys");
    let right = format!("Bearer {TOKEN}");
    // No token at all is not a guess: it is not counted.
    for _ in 0..2 * MAX_FAILURES {
        assert_eq!(http.send(Method::GET, &keys, &[], "").await.status, 401);
    }
    assert_eq!(
        http.send(Method::GET, &keys, &[("authorization", right.as_str())], "")
            .await
            .status,
        200
    );
    for i in 0..MAX_FAILURES {
        let guess = format!("Bearer guess-{i}");
        let reply = http
            .send(Method::GET, &keys, &[("authorization", guess.as_str())], "")
            .await;
        assert_eq!(reply.status, 401, "guess {i}");
    }
    // A further wrong token waits.
    let reply = http
        .send(
            Method::GET,
            &keys,
            &[("authorization", "Bearer guess-x")],
            "",
        )
        .await;
    assert_eq!(reply.status, 429);
    let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let json: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains("too many wrong tokens")
    );
    let login = log_in(&http, &admin, "guess-y").await;
    assert_eq!(login.status, 429);
    assert!(login.header("set-cookie").is_none());
    assert!(login.header("retry-after").is_some());
    // The right token does not: on the key API, on a probe, and in the login form.
    let reply = http
        .send(Method::GET, &keys, &[("authorization", right.as_str())], "")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        http.send(
            Method::GET,
            &format!("{admin}/healthz"),
            &[("authorization", right.as_str())],
            ""
        )
        .await
        .status,
        200
    );
    let login = log_in(&http, &admin, TOKEN).await;
    assert_eq!(login.status, 303);
    assert!(login.header("set-cookie").is_some());
}

/// Without a session, or with a wrong token, the page answers 401 with its login form and its
/// challenge, no key in it and no cookie set.
async fn the_page_refuses_without_a_login(http: &Http, admin: &str) {
    let anonymous = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await;
    assert_eq!(anonymous.status, 401);
    assert!(anonymous.text().contains("action=\"/ui/login\""));
    assert!(!anonymous.text().contains("id=\"x\""));
    // Every 401 carries its challenge (RFC 9110 section 11.6.1), the page's too: before, only
    // the other admin paths sent one.
    assert_eq!(
        anonymous.header("www-authenticate"),
        Some("Bearer realm=\"idem admin\"")
    );

    let wrong = log_in(http, admin, "nope").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert_eq!(
        wrong.header("www-authenticate"),
        Some("Bearer realm=\"idem admin\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_needs_a_login_escapes_keys_and_deletes_only_with_its_csrf_token() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let hostile = "<b id=\"x\">'&'</b>";
    let lease = Duration::from_secs(60);
    gateway
        .store
        .claim(&ClaimRequest::new(
            record_key(hostile),
            Fingerprint::of(&[b"t"]),
            lease,
        ))
        .await
        .unwrap();

    the_page_refuses_without_a_login(&http, &admin).await;

    let login = log_in(&http, &admin, TOKEN).await;
    assert_eq!(login.status, 303);
    let set_cookie = login.header("set-cookie").unwrap().to_owned();
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
    let cookie = set_cookie.split(';').next().unwrap().to_owned();

    let page = http
        .send(
            Method::GET,
            &format!("{admin}/ui"),
            &[("cookie", &cookie)],
            "",
        )
        .await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let html = page.text();
    assert!(!html.contains(hostile), "a raw key in the page");
    assert!(html.contains("&lt;b id=&quot;x&quot;&gt;&#x27;&amp;&#x27;&lt;/b&gt;"));
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();

    let key_field = common::encode(hostile);
    let delete = |cookie: Option<&str>, csrf: &str| {
        let mut headers = vec![("content-type", "application/x-www-form-urlencoded")];
        if let Some(cookie) = cookie {
            headers.push(("cookie", cookie));
        }
        let body = format!("key={key_field}&scope=&csrf={csrf}");
        let (http, url) = (http.clone(), format!("{admin}/ui/delete"));
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            http.send(Method::POST, &url, &headers, body).await.status
        }
    };
    let stored = || async {
        gateway
            .store
            .get(&record_key(hostile))
            .await
            .unwrap()
            .is_some()
    };
    assert_eq!(delete(Some(&cookie), "forged").await, 403);
    assert_eq!(delete(None, &csrf).await, 401, "no session");
    assert!(stored().await);
    assert_eq!(delete(Some(&cookie), &csrf).await, 303);
    assert!(!stored().await);

    // The bearer header opens the page too (curl), with the process's CSRF token.
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
}

/// `/ui` shows a completed key's stored response, folded: its headers and a bounded body
/// preview in which every byte is visible and nothing is markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_stored_response_escaped_and_bounded() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let body = format!("<script>x</script>\u{1b}{}", "z".repeat(2000));
    let done = http.post_key(&gateway.url("/echo"), "shown", &body).await;
    assert_eq!(done.status, 201);
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
    let html = page.text();
    assert!(html.contains(&format!("{} bytes", body.len())), "{html}");
    assert!(
        html.contains("&lt;script&gt;x&lt;/script&gt;\\u{1b}zzz"),
        "{html}"
    );
    assert!(!html.contains("<script>"), "markup from a body in the page");
    assert!(
        !html.contains(&"z".repeat(600)),
        "the preview is not bounded"
    );
}

/// The session cookie is `Secure` when the browser reached the listener over HTTPS, through a
/// proxy that says so (`X-Forwarded-Proto: https`), and not over plain HTTP, where a browser
/// would drop a `Secure` cookie; before, it was never `Secure`. Logging out removes it with the
/// same flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_secure_behind_an_https_proxy() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let form = ("content-type", "application/x-www-form-urlencoded");
    let plain = log_in(&http, &admin, TOKEN).await;
    assert_eq!(plain.status, 303);
    let cookie = plain.header("set-cookie").unwrap().to_owned();
    assert!(!cookie.contains("Secure"), "{cookie}");
    let login = format!("{admin}/ui/login");
    let proxied = http
        .send(
            Method::POST,
            &login,
            &[form, ("x-forwarded-proto", "https")],
            format!("token={TOKEN}"),
        )
        .await;
    assert_eq!(proxied.status, 303);
    let cookie = proxied.header("set-cookie").unwrap().to_owned();
    for flag in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(flag), "{flag} not in {cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    let logout = http
        .send(
            Method::POST,
            &format!("{admin}/ui/logout"),
            &[("cookie", &session), ("x-forwarded-proto", "https")],
            "",
        )
        .await;
    assert_eq!(logout.status, 303);
    let removal = logout.header("set-cookie").unwrap();
    assert!(
        removal.contains("Max-Age=0") && removal.contains("Secure"),
        "{removal}"
    );
    // The session is over: the cookie no longer opens the page.
    let page = http
        .send(
            Method::GET,
            &format!("{admin}/ui"),
            &[("cookie", &session)],
            "",
        )
        .await;
    assert_eq!(page.status, 401);
}

/// What the listener's framework decides for it stays the listener's: a login form over 16 KiB
/// reads as a form without the token (401, not the framework's 413), a query that names a
/// parameter twice is the key API's JSON 400 (not plain text), and the listener speaks HTTP/2
/// with prior knowledge as well as HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_forms_repeated_parameters_and_http2_are_answered_by_the_admin_rules() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let padded = format!("{TOKEN}&pad={}", "x".repeat(20 * 1024));
    let large = log_in(&http, &admin, &padded).await;
    assert_eq!(large.status, 401, "{}", large.text());
    assert!(large.header("set-cookie").is_none());
    assert!(large.text().contains("Wrong token."));
    assert_eq!(log_in(&http, &admin, TOKEN).await.status, 303);

    let bearer = format!("Bearer {TOKEN}");
    let twice = http
        .send(
            Method::GET,
            &format!("{admin}/api/keys?state=completed&state=failed"),
            &[("authorization", bearer.as_str())],
            "",
        )
        .await;
    assert_eq!(twice.status, 400, "{}", twice.text());
    let json: serde_json::Value = serde_json::from_slice(&twice.body).unwrap();
    assert!(json["error"].as_str().unwrap().contains("state"), "{json}");

    let h2 = common::try_post(
        &format!("{admin}/healthz"),
        &[("authorization", bearer.as_str())],
        true,
    )
    .await
    .unwrap();
    assert_eq!(h2.version, http::Version::HTTP_2);
    assert_eq!(h2.status, 405);
    assert_eq!(h2.headers.get("allow").unwrap(), "GET, HEAD");
}

/// The in-flight gauges count this gateway's claims, kept as they happen: a request holding
/// its key counts, its lease lapses when the store stops taking heartbeats and it counts as
/// lapsed, and its completion ends it. No scrape reads the store's records: before, every
/// `/metrics` scrape scanned the in-flight records (on the memory store, a walk of every shard
/// under the locks the request path takes), and this test's scan count was above zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_this_gateways_claims_in_flight_without_scanning_the_store() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let fixture = Fixture::start();
    let config = config_with(
        fixture.addr,
        "[idempotency]\nlease = \"2s\"\n",
        &Overrides::default(),
    );
    let store = Arc::new(idem_testkit::faulty::FaultyStore::new(
        idem_store_memory::MemoryStore::new(),
    ));
    let faults = store.faults.clone();
    let running = idem_gateway::start_with_store(
        &config,
        store,
        Some(metrics_recorder()),
        std::future::pending(),
    )
    .await
    .unwrap();
    let admin = format!("http://{}", running.admin.unwrap());
    let url = format!("http://{}/slow?ms=5000", running.listen);
    let http = Http::new();
    let gauges = |records: u32, lapsed: u32| {
        move |text: &str| {
            has_line(text, &format!("idem_gateway_in_flight_records {records}"))
                && has_line(
                    text,
                    &format!("idem_gateway_in_flight_lapsed_records {lapsed}"),
                )
        }
    };
    assert!(metrics_show(&http, &admin, Duration::from_secs(10), gauges(0, 0)).await);

    let request = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move { http.post_key(&url, "held", "x").await })
    };
    let held = metrics_show(&http, &admin, Duration::from_secs(10), gauges(1, 0)).await;
    assert!(held, "the gauges never showed the request in flight");
    // The store stops taking heartbeats: the lease lapses while the upstream call runs.
    faults.heartbeat_down.store(true, Ordering::SeqCst);
    let lapsed_lease = gauges(1, 1);
    let lapsed = metrics_show(&http, &admin, Duration::from_secs(10), move |text| {
        lapsed_lease(text)
            && text.lines().any(|line| {
                line.strip_prefix("idem_gateway_oldest_in_flight_seconds ")
                    .and_then(|age| age.parse::<f64>().ok())
                    .is_some_and(|age| age >= 2.0)
            })
    })
    .await;
    assert!(lapsed, "the gauges never showed the lapsed lease");
    assert_eq!(request.await.unwrap().status, 200);
    let settled = metrics_show(&http, &admin, Duration::from_secs(10), gauges(0, 0)).await;
    assert!(settled, "the completed request still counts");
    assert_eq!(faults.scans.load(Ordering::SeqCst), 0, "a scrape scanned");

    // The page shows the counters with a recorder installed; its listing (asked for by an
    // operator, not a scrape) scans.
    let page = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await;
    assert!(page.text().contains("idem_duplicates_replayed_total"));
    assert!(faults.scans.load(Ordering::SeqCst) > 0);
}

/// `/ui`'s counters are the totals the recorder keeps, not numbers parsed back out of the
/// Prometheus text: with a renderer that renders nothing, the page still counts the replay.
/// Before, it parsed the rendered text and showed 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_counters_come_from_the_recorder_not_its_text() {
    // This process's recorder, behind the tap that keeps the totals.
    let _ = metrics_recorder();
    let fixture = Fixture::start();
    let blank: idem_gateway::RenderMetrics = std::sync::Arc::new(String::new);
    let gateway = Gateway::start_with_metrics(
        &config_with(fixture.addr, "", &Overrides::default()),
        Some(blank),
    )
    .await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let echo = gateway.url("/echo");
    assert_eq!(http.post_key(&echo, "tapped", "x").await.status, 201);
    assert!(http.post_key(&echo, "tapped", "x").await.replayed());
    let page = http
        .send(Method::GET, &format!("{admin}/ui"), &[], "")
        .await
        .text();
    let replays: f64 = page
        .split_once("<code>idem_duplicates_replayed_total</code></td><td class=\"n\">")
        .and_then(|(_, rest)| rest.split_once('<'))
        .and_then(|(total, _)| total.parse().ok())
        .unwrap_or_else(|| panic!("no replay total in:\n{page}"));
    // Other tests of this process replay too: at least this one.
    assert!(replays >= 1.0, "{page}");
}

/// Evictions by the memory store's bounds reach `/metrics`, by the bound that evicted: a
/// retry of an evicted key runs again, which an operator has to see. So do the records and
/// bytes the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_memory_stores_evictions_records_and_bytes() {
    let fixture = Fixture::start();
    let config = config_with(fixture.addr, "", &Overrides::default());
    let store = idem_store_memory::MemoryStore::builder()
        .capacity(std::num::NonZeroUsize::new(4).unwrap())
        .max_bytes(std::num::NonZeroUsize::new(1 << 20).unwrap())
        .build();
    let gateway = Gateway::start_on(&config, store, Some(metrics_recorder())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    for i in 0..10 {
        let reply = http
            .post_key(&gateway.url("/echo"), &format!("evicted-{i}"), "x")
            .await;
        assert_eq!(reply.status, 201);
    }
    assert_eq!(gateway.store.evicted(), 6);
    let (count, text) = metric_value(
        &http,
        &admin,
        "idem_memory_store_evictions_total{bound=\"capacity\"}",
    )
    .await;
    let count = count.unwrap_or_else(|| panic!("no eviction counter in:\n{text}"));
    // Other tests of this process may have evicted too: at least these six.
    assert!(count >= 6.0, "{text}");
    // The gauges are set at each scrape, by whichever gateway of this process answers it.
    let bytes = gateway.store.bytes();
    assert!(bytes > 0);
    let shown = metrics_show(&http, &admin, Duration::from_secs(10), move |text| {
        has_line(text, "idem_gateway_store_records 4")
            && has_line(text, &format!("idem_gateway_store_bytes {bytes}"))
    })
    .await;
    assert!(
        shown,
        "the store's gauges never showed 4 records and {bytes} bytes"
    );
}

/// A record the store cannot read does not stop a listing: the key API's page reports it in
/// `unreadable` (200), and `idem keys list --admin` shows it (a line saying unreadable, or an
/// entry with `"state": "unreadable"`) beside the readable records, exit 0. `get` still says
/// it is corrupt, `delete` removes it, and `/ui` says the store holds one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_listed_as_unreadable_not_an_error() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    for key in ["fine-1", "fine-2"] {
        assert_eq!(
            http.post_key(&gateway.url("/echo"), key, "x").await.status,
            201
        );
    }
    // A record restored as it was (put_raw), broken: completed without a result.
    let broken = record_key("broken");
    gateway
        .store
        .claim(&ClaimRequest::new(
            broken.clone(),
            Fingerprint::of(&[b"b"]),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let mut record = gateway.store.get(&broken).await.unwrap().unwrap();
    record.state = idem_core::State::Completed;
    gateway.store.put_raw(record);
    let reason = "a completed record has no result";

    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let page = http
        .send(Method::GET, &format!("{admin}/api/keys"), &auth, "")
        .await;
    assert_eq!(page.status, 200, "{}", page.text());
    let page: serde_json::Value = serde_json::from_slice(&page.body).unwrap();
    assert_eq!(page["records"].as_array().unwrap().len(), 2, "{page}");
    assert_eq!(
        page["unreadable"],
        serde_json::json!([{
            "key": "broken", "scope": "", "state": "unreadable",
            "stored_key": "broken", "reason": reason,
        }])
    );

    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["list"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        has_line(
            &out,
            &format!("broken\tscope=-\tunreadable\treason={reason}")
        ),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("fine-1\t")), "{out}");
    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["list", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let states: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["completed", "completed", "unreadable"], "{out}");
    // The limit counts it like a record.
    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["list", "--limit", "1"]).await;
    assert_eq!((code, out.lines().count()), (0, 1), "{out}{err}");

    // The page's in-flight scan meets it too.
    let ui = http
        .send(Method::GET, &format!("{admin}/ui"), &auth, "")
        .await;
    assert!(ui.text().contains("1 record(s) the store cannot read"));

    let (code, _, err) = idem_keys(&admin, Some(TOKEN), &["get", "broken"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("corrupt record at broken"), "{err}");
    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["delete", "broken"]).await;
    assert_eq!((code, out.trim()), (0, "deleted broken"), "{err}");
    let (code, out, _) = idem_keys(&admin, Some(TOKEN), &["list"]).await;
    assert_eq!(code, 0);
    assert!(!out.contains("unreadable"), "{out}");
}

/// The same on a store `idem keys` opens itself: a redb file holding a half-written record.
#[cfg(feature = "redb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_on_a_redb_file_shows_a_half_written_record() {
    let dir = std::env::temp_dir().join(format!("idem-gw-unreadable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records.redb");
    {
        let store = idem::redb::RedbStore::open(&file).unwrap();
        for key in ["whole", "half"] {
            store
                .claim(&ClaimRequest::new(
                    record_key(key),
                    Fingerprint::of(&[b"r"]),
                    Duration::from_secs(60),
                ))
                .await
                .unwrap();
        }
        // The format byte and the state, then nothing.
        store
            .put_raw(&record_key("half"), vec![1, 0])
            .await
            .unwrap();
    }
    let store = format!("redb:{}", file.display());
    let list = |json: bool| {
        let mut command = common::idem_command("keys");
        command.args(["list", "--store", &store]);
        if json {
            command.arg("--json");
        }
        command.output().unwrap()
    };
    let text = list(false);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    assert!(
        has_line(
            &out,
            "half\tscope=-\tunreadable\treason=the record is truncated"
        ),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("whole\t")), "{out}");
    let json = list(true);
    assert!(json.status.success());
    let list: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let unreadable: Vec<&serde_json::Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["state"] == "unreadable")
        .collect();
    assert_eq!(unreadable.len(), 1, "{list}");
    assert_eq!(unreadable[0]["key"], "half");
    assert_eq!(unreadable[0]["reason"], "the record is truncated");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A method a resource of the admin listener does not take is answered 405 with `Allow`, as RFC
/// 9110 requires: before, the 405s named no method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_405_names_the_methods_the_resource_takes() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let bearer = format!("Bearer {TOKEN}");
    for (method, path, allow) in [
        (Method::POST, "/healthz", "GET, HEAD"),
        (Method::DELETE, "/metrics", "GET, HEAD"),
        (Method::DELETE, "/api/keys", "GET, HEAD"),
        (Method::PUT, "/api/keys/k-1", "GET, HEAD, DELETE, POST"),
        (Method::PUT, "/ui", "GET, HEAD"),
        (Method::DELETE, "/ui/login", "GET, HEAD, POST"),
        (Method::GET, "/ui/delete", "POST"),
        (Method::GET, "/ui/resolve", "POST"),
    ] {
        let reply = http
            .send(
                method.clone(),
                &format!("{admin}{path}"),
                &[("authorization", &bearer)],
                "",
            )
            .await;
        assert_eq!(reply.status, 405, "{method} {path}");
        assert_eq!(reply.header("allow"), Some(allow), "{method} {path}");
    }
}

/// `idem keys list` prints one field per tab: the key, `scope=`, the state alone, then
/// `name=value` fields, so `awk -F'\t' '$3 == "completed"'` finds completed records as it
/// finds unreadable ones. Before, the stored status shared the state's field
/// (`completed status=201`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_gives_the_state_a_field_of_its_own() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let reply = Http::new()
        .post_key(&gateway.url("/echo"), "tab-1", "1")
        .await;
    assert_eq!(reply.status, 201);
    let (code, out, err) = idem_keys(&admin, Some(TOKEN), &["list"]).await;
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("tab-1\t")).unwrap();
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(
        fields[..4],
        ["tab-1", "scope=-", "completed", "status=201"],
        "{line}"
    );
    assert!(fields[4..].iter().all(|f| f.contains('=')), "{line}");
}

/// The key API refuses `limit=0` with 400 (it returned one record), answers `HEAD` where it
/// answers `GET` (it was 405), and shows only the start of a cursor it does not know (a 20 KB
/// cursor was echoed whole, a 20 KB answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_api_refuses_limit_0_answers_head_and_bounds_a_bad_cursor() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let reply = http.post_key(&gateway.url("/echo"), "head-1", "1").await;
    assert_eq!(reply.status, 201);

    let zero = http
        .send(Method::GET, &format!("{admin}/api/keys?limit=0"), &auth, "")
        .await;
    assert_eq!(zero.status, 400, "{}", zero.text());
    let json: serde_json::Value = serde_json::from_slice(&zero.body).unwrap();
    assert!(
        json["error"].as_str().unwrap().starts_with("limit: "),
        "{json}"
    );
    let (code, _, err) = idem_keys(&admin, Some(TOKEN), &["list", "--limit", "0"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--limit"), "{err}");

    for path in ["/api/keys", "/api/keys/head-1"] {
        let url = format!("{admin}{path}");
        let get = http.send(Method::GET, &url, &auth, "").await;
        let head = http.send(Method::HEAD, &url, &auth, "").await;
        assert_eq!((get.status, head.status), (200, 200), "{path}");
        assert!(head.body.is_empty(), "{path}");
        assert_eq!(head.header("content-type"), Some("application/json"));
    }
    let missing = http
        .send(Method::HEAD, &format!("{admin}/api/keys/nope"), &auth, "")
        .await;
    assert_eq!(missing.status, 404);

    let cursor = "x".repeat(20_000);
    let bad = http
        .send(
            Method::GET,
            &format!("{admin}/api/keys?cursor={cursor}"),
            &auth,
            "",
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.len() < 300, "{} bytes", bad.body.len());
    let json: serde_json::Value = serde_json::from_slice(&bad.body).unwrap();
    let message = json["error"].as_str().unwrap();
    assert!(
        message.starts_with("cursor: not a scan cursor of this store: \"xxx")
            && message.ends_with("... (20000 bytes)"),
        "{message}"
    );
}

/// An unknown outcome is resolved through the key API (`POST /api/keys/KEY`) and `idem keys
/// resolve`: a release frees the key, a completed resolution stores the response given (body
/// from a file), a resolution of a record that is not unknown, or at another fence, is 409 /
/// exit 1 and changes nothing, and bad flags are exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcomes_are_resolved_by_the_key_api_and_keys_resolve() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];

    let fence = common::an_unknown_record(&*gateway.store, "api-release").await;
    let stale = format!("{{\"resolve\":\"release\",\"fence\":{}}}", fence + 1);
    let url = format!("{admin}/api/keys/api-release");
    let refused = http.send(Method::POST, &url, &auth, stale).await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    let released = http
        .send(Method::POST, &url, &auth, "{\"resolve\":\"release\"}")
        .await;
    assert_eq!(released.status, 200, "{}", released.text());
    assert!(
        released.text().contains("\"resolved\":\"released\""),
        "{}",
        released.text()
    );
    assert!(
        gateway
            .store
            .get(&record_key("api-release"))
            .await
            .unwrap()
            .is_none()
    );
    let missing = http
        .send(Method::POST, &url, &auth, "{\"resolve\":\"release\"}")
        .await;
    assert_eq!(missing.status, 404);
    let bad = http
        .send(Method::POST, &url, &auth, "{\"resolve\":1}")
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text());

    common::an_unknown_record(&*gateway.store, "cli-done").await;
    let body = tempfile_with("{\"paid\":true}");
    let (code, out, err) = idem_keys(
        &admin,
        Some(TOKEN),
        &[
            "resolve",
            "cli-done",
            "--status",
            "201",
            "--header",
            "content-type: application/json",
            "--body",
            &format!("@{}", body.display()),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("completed cli-done at fence "), "{out}");
    let record = gateway
        .store
        .get(&record_key("cli-done"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, idem_core::State::Completed);
    let stored = idem_http::codec::decode(record.result.as_ref().unwrap()).unwrap();
    assert_eq!(stored.status.as_u16(), 201);
    assert_eq!(stored.body.as_deref(), Some(&b"{\"paid\":true}"[..]));
    // Completed now: another resolution is refused, exit 1.
    let (code, _, err) =
        idem_keys(&admin, Some(TOKEN), &["resolve", "cli-done", "--release"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not unknown"), "{err}");
    // Flags the resolution cannot take: exit 2, nothing asked.
    for args in [
        &["resolve", "cli-done"][..],
        &["resolve", "cli-done", "--release", "--status", "200"],
        &["resolve", "cli-done", "--status", "99"],
        &[
            "resolve", "cli-done", "--status", "200", "--header", "no colon",
        ],
    ] {
        let (code, _, err) = idem_keys(&admin, Some(TOKEN), args).await;
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    let _ = std::fs::remove_file(body);
}

/// A file holding `text`, in the temporary folder.
fn tempfile_with(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("idem-resolve-{}.json", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// `/ui` lists the unknown outcomes with Release and Completed buttons, which take the form
/// only with the session's CSRF token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_resolves_unknown_outcomes_with_its_csrf_token() {
    let fixture = Fixture::start();
    let gateway = Gateway::start(&config_with(fixture.addr, "", &with_token())).await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    let fence = common::an_unknown_record(&*gateway.store, "<ui-unknown>").await;
    let login = log_in(&http, &admin, TOKEN).await;
    let cookie = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = http
        .send(
            Method::GET,
            &format!("{admin}/ui"),
            &[("cookie", &cookie)],
            "",
        )
        .await;
    let html = page.text();
    assert!(html.contains("id=\"unknown\""), "{html}");
    assert!(html.contains("&lt;ui-unknown&gt;") && !html.contains("<ui-unknown>"));
    assert!(html.contains("did not answer within 8s"), "{html}");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let form = |csrf: &str| {
        format!(
            "key={}&scope=&fence={fence}&resolve=completed&status=200&body=done&csrf={csrf}",
            common::encode("<ui-unknown>")
        )
    };
    let headers = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("cookie", cookie.as_str()),
    ];
    let url = format!("{admin}/ui/resolve");
    let forged = http
        .send(Method::POST, &url, &headers, form("forged"))
        .await;
    assert_eq!(forged.status, 403);
    let done = http.send(Method::POST, &url, &headers, form(&csrf)).await;
    assert_eq!(done.status, 303, "{}", done.text());
    let record = gateway
        .store
        .get(&record_key("<ui-unknown>"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, idem_core::State::Completed);
}
