//! The fenced upstream of `examples/fenced-upstream` (Python and SQLite), called directly as
//! the gateway calls it: its rules, and one payment per key under concurrent attempts. It needs
//! `python3`: a missing one fails the test under `CI=true` (outside CI,
//! `IDEM_TEST_SKIP_MISSING=1` skips it loudly).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::shared_store::FencedUpstream;
use common::{Http, Reply};
use http::Method;

/// POST /payments with `key`, `fence` and `attempt` (each left out when `None`), as `principal`
/// (its `Authorization`) when given.
async fn pay(
    http: &Http,
    upstream: &FencedUpstream,
    key: &str,
    fence: Option<u64>,
    attempt: Option<u32>,
    principal: Option<&str>,
) -> Reply {
    let fence = fence.map(|f| f.to_string());
    let attempt = attempt.map(|a| a.to_string());
    let mut headers = vec![("idempotency-key", key)];
    if let Some(fence) = &fence {
        headers.push(("idempotency-fence", fence));
    }
    if let Some(attempt) = &attempt {
        headers.push(("idempotency-attempt", attempt));
    }
    if let Some(principal) = principal {
        headers.push(("authorization", principal));
    }
    let url = format!("http://{}/payments", upstream.addr);
    http.send(Method::POST, &url, &headers, "10 EUR").await
}

fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_slice(&reply.body).unwrap()
}

#[tokio::test]
async fn a_lower_fence_is_refused_and_a_higher_one_gets_the_payment_already_made() {
    let Some(upstream) = FencedUpstream::start("fenced-rules") else {
        return;
    };
    let http = Http::new();
    let first = pay(&http, &upstream, "k1", Some(100), Some(1), None).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let payment = json(&first)["payment"].clone();
    // A stale attempt (a lower fence) arriving late: refused, nothing written.
    let stale = pay(&http, &upstream, "k1", Some(99), Some(1), None).await;
    assert_eq!(stale.status, 409, "{}", stale.text());
    assert_eq!(json(&stale)["highest_fence"], 100);
    // A takeover whose predecessor paid and died before its answer was stored: the same
    // payment, no second one, and its fence is now the highest.
    let takeover = pay(&http, &upstream, "k1", Some(200), Some(2), None).await;
    assert_eq!(takeover.status, 200, "{}", takeover.text());
    assert_eq!(json(&takeover)["payment"], payment);
    assert_eq!(json(&takeover)["paid_by_attempt"], 1);
    let late = pay(&http, &upstream, "k1", Some(100), Some(1), None).await;
    assert_eq!(
        late.status,
        409,
        "the first attempt is stale now: {}",
        late.text()
    );
    assert_eq!(upstream.payments("k1").await.len(), 1);
    // Without a fence or an attempt number: not through the gateway's claim, refused.
    for (fence, attempt) in [(None, Some(1)), (Some(300), None)] {
        let bare = pay(&http, &upstream, "k2", fence, attempt, None).await;
        assert_eq!(bare.status, 428, "{}", bare.text());
    }
    assert!(upstream.payments("k2").await.is_empty());
    // Another principal's key of the same name is another key.
    let other = pay(&http, &upstream, "k1", Some(1), Some(1), Some("Bearer b")).await;
    assert_eq!(other.status, 201, "{}", other.text());
}

/// 32 attempts of one key at once, each with its own fence, in any order: one payment; every
/// answer is that payment or a refusal by fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_attempts_of_one_key_make_one_payment() {
    let Some(upstream) = FencedUpstream::start("fenced-hammer") else {
        return;
    };
    let upstream = std::sync::Arc::new(upstream);
    let http = Http::new();
    let mut tasks = Vec::new();
    for fence in 1..=32u64 {
        let (http, upstream) = (http.clone(), upstream.clone());
        tasks.push(tokio::spawn(async move {
            pay(&http, &upstream, "storm", Some(fence), Some(1), None).await
        }));
    }
    let mut made = 0;
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            201 => made += 1,
            200 | 409 => {}
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    assert_eq!(made, 1);
    assert_eq!(upstream.payments("storm").await.len(), 1);
}
