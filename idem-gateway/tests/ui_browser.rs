//! `/ui` in a real browser: headless Chromium, driven over WebDriver by chromedriver, signs in
//! with the admin token, finds the record of a slow request in flight, clicks its Delete
//! button, and the record is gone from the store; then releases an unknown outcome with its
//! Release button. A missing Chromium or chromedriver fails the
//! test; outside CI, `IDEM_TEST_SKIP_MISSING=1` skips it loudly instead.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::webdriver::{Browser, browser};
use common::{Fixture, Gateway, Http, config_with, eventually, metrics_recorder};
use http::Method;
use idem_core::{IdempotencyKey, RecordKey, Store};
use idem_gateway::config::Overrides;

const TOKEN: &str = "ui-browser-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_deletes_a_stuck_key_from_the_page() {
    let Some((chromium, driver)) = browser() else {
        return;
    };
    let fixture = Fixture::start();
    let overrides = Overrides {
        admin_token: Some(TOKEN.to_owned()),
        ..Overrides::default()
    };
    let gateway = Gateway::start_with_metrics(
        &config_with(fixture.addr, "", &overrides),
        Some(metrics_recorder()),
    )
    .await;
    let admin = gateway.admin.clone().unwrap();
    let http = Http::new();
    assert_eq!(
        http.post_key(&gateway.url("/echo"), "ui-done", "x")
            .await
            .status,
        201
    );
    let slow = tokio::spawn({
        let (http, url) = (http.clone(), gateway.url("/slow?ms=30000"));
        async move {
            http.try_send(Method::POST, &url, &[("idempotency-key", "ui-slow")], "")
                .await
        }
    });
    let key = RecordKey::unscoped(IdempotencyKey::new("ui-slow").unwrap());
    let store = gateway.store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            store.get(&key).await.unwrap().is_some()
        })
        .await
    );

    let browser = Browser::start(&chromium, &driver).await;
    browser.navigate(&format!("{admin}/ui")).await;
    let Some(token_field) = browser.find("#token").await else {
        panic!("no login form in {}", browser.source().await);
    };
    browser.type_text(&token_field, TOKEN).await;
    let login = browser.find("#login").await.unwrap();
    browser.click(&login).await;

    // The click submits the form; the page that comes back lists the record.
    assert!(
        eventually(Duration::from_secs(10), || async {
            browser.title().await == "idem admin"
        })
        .await,
        "not signed in: {}",
        browser.source().await
    );
    let page = browser.source().await;
    assert!(page.contains("ui-slow"), "{page}");
    assert!(page.contains("ui-done"), "recent completions: {page}");
    let delete = browser
        .find("tr[data-key=\"ui-slow\"] button.delete")
        .await
        .expect("a Delete button on the record's row");
    browser.click(&delete).await;

    assert!(
        eventually(Duration::from_secs(10), || async {
            store.get(&key).await.unwrap().is_none()
        })
        .await,
        "still in the store"
    );
    // Back on the page, the row is gone.
    assert!(
        eventually(Duration::from_secs(10), || async {
            browser.title().await == "idem admin"
                && !browser.source().await.contains("data-key=\"ui-slow\"")
        })
        .await,
        "the row is still on the page"
    );

    an_operator_releases_an_unknown_outcome(&browser, &admin, &*store).await;
    browser.quit().await;
    slow.abort();
}

/// An unknown outcome is listed on the page with its buttons; its Release button frees the key.
async fn an_operator_releases_an_unknown_outcome(
    browser: &Browser,
    admin: &str,
    store: &dyn Store,
) {
    let lost = RecordKey::unscoped(IdempotencyKey::new("ui-lost").unwrap());
    common::an_unknown_record(store, "ui-lost").await;
    browser.navigate(&format!("{admin}/ui")).await;
    let Some(release) = browser
        .find("tr[data-key=\"ui-lost\"] button.release")
        .await
    else {
        panic!("no Release button in {}", browser.source().await);
    };
    browser.click(&release).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            store.get(&lost).await.unwrap().is_none()
        })
        .await,
        "the unknown outcome was not released"
    );
}
