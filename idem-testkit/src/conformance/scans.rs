//! Clauses on scans and unreadable records: cursors, filters by state and age, a corrupt
//! record reported and never a panic.

use std::collections::HashSet;
use std::time::Duration;

use idem_core::{Bytes, Failure, Record, ScanQuery, State, Store, StoreError, UnreadableRecord};

use crate::Harness;

use super::{LEASE, RETENTION, acquire, completed_records, key, request};

/// A scan refuses a cursor the store did not hand out with [`StoreError::InvalidCursor`] (not
/// retryable): a garbled one, or one of another kind of store, is the caller's mistake, neither
/// an outage nor a silently empty page.
pub async fn scan_refuses_a_cursor_it_did_not_give(h: &impl Harness) {
    let store = h.store();
    completed_records(&*store, "scan-cursor", 3).await;
    for cursor in ["garbage", "zz:1:2", "%%%"] {
        let query = ScanQuery {
            cursor: Some(cursor.to_owned()),
            ..ScanQuery::all()
        };
        match store.scan(&query).await {
            Err(error @ StoreError::InvalidCursor { .. }) => {
                assert!(!error.is_retryable(), "{error}");
                assert_eq!(error.kind(), "invalid_cursor");
            }
            other => panic!("cursor {cursor:?}: expected InvalidCursor, got {other:?}"),
        }
    }
    // The cursors it hands out still page through everything.
    let all = scan_all(&*store, &ScanQuery::all().with_limit(1)).await;
    assert_eq!(all.len(), 3);
}

/// Scans filter by state and by age, and page through everything with cursors.
pub async fn scan_filters_by_state_and_age(h: &impl Harness) {
    let store = h.store();
    let completed = completed_records(&*store, "scan-old", 5).await;
    h.advance(Duration::from_secs(120)).await;
    let mut in_flight = HashSet::new();
    for i in 0..3 {
        let k = key(&format!("scan-new-{i}"));
        acquire(&*store, &request(&k, "a")).await;
        in_flight.insert(k);
    }
    let failed = key("scan-failed");
    let lease = acquire(&*store, &request(&failed, "a")).await;
    store
        .fail(&lease, Failure::permanent("no"), RETENTION)
        .await
        .expect("fail");

    let keys = |page: Vec<Record>| page.into_iter().map(|r| r.key).collect::<HashSet<_>>();
    let all = scan_all(&*store, &ScanQuery::all().with_limit(2)).await;
    assert_eq!(
        all.len(),
        9,
        "paging with limit 2 returns every record once"
    );
    assert_eq!(keys(all.clone()).len(), 9, "no record twice");

    let query = ScanQuery::all().with_state(State::Completed);
    assert_eq!(keys(scan_all(&*store, &query).await), completed);
    let query = ScanQuery::all().with_state(State::InFlight);
    assert_eq!(keys(scan_all(&*store, &query).await), in_flight);
    let query = ScanQuery::all().with_state(State::Failed);
    assert_eq!(
        keys(scan_all(&*store, &query).await),
        HashSet::from([failed])
    );
    let query = ScanQuery::all().with_min_age(Duration::from_secs(60));
    assert_eq!(keys(scan_all(&*store, &query).await), completed, "by age");
}

/// The records of every page of a scan.
pub async fn scan_all(store: &dyn Store, query: &ScanQuery) -> Vec<Record> {
    scan_entries(store, query).await.0
}

/// Every page of a scan: its records, and the records it reported unreadable. Checks that no
/// page is over its limit, which counts both.
pub async fn scan_entries(
    store: &dyn Store,
    query: &ScanQuery,
) -> (Vec<Record>, Vec<UnreadableRecord>) {
    let mut query = query.clone();
    let (mut records, mut unreadable) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        let page = store.scan(&query).await.expect("scan");
        assert!(page.len() <= query.page_size(), "page over its limit");
        records.extend(page.records);
        unreadable.extend(page.unreadable);
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return (records, unreadable),
        }
    }
    panic!("scan never ended")
}

/// A corrupt stored record is answered with `StoreError::Corrupt` by every operation that reads
/// it, never a panic, and an operator can delete it.
pub async fn corrupt_record_is_reported_not_panicked(h: &impl Harness) {
    let store = h.store();
    let k = key("corrupt");
    let lease = acquire(&*store, &request(&k, "a")).await;
    h.corrupt(&k).await;
    let corrupt = |what: &str, err: Option<StoreError>| match err {
        Some(StoreError::Corrupt { .. }) => {}
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    };
    corrupt("claim", store.claim(&request(&k, "a")).await.err());
    corrupt("get", store.get(&k).await.err());
    corrupt("heartbeat", store.heartbeat(&lease, LEASE).await.err());
    corrupt(
        "complete",
        store.complete(&lease, Bytes::new(), RETENTION).await.err(),
    );
    corrupt(
        "fail",
        store
            .fail(&lease, Failure::permanent("x"), RETENTION)
            .await
            .err(),
    );
    corrupt("release", store.release(&lease).await.err());
    store.delete(&k).await.expect("delete of a corrupt record");
    acquire(&*store, &request(&k, "a")).await;
}

/// One corrupt record does not stop a scan: over a store holding one among readable records,
/// a scan returns every readable record and reports the corrupt one in
/// [`ScanPage::unreadable`](idem_core::ScanPage::unreadable), exactly once, with pages of every
/// size (the limit counts it: a page of it alone moves the cursor on). A filtered scan still
/// answers, with every readable record that matches. `get` of the corrupt record still answers
/// `Corrupt`, and `delete` removes it.
pub async fn scan_reports_a_corrupt_record_beside_the_readable_ones(h: &impl Harness) {
    let store = h.store();
    let completed = completed_records(&*store, "scan-ok", 4).await;
    let held = key("scan-held");
    acquire(&*store, &request(&held, "a")).await;
    let mut readable = completed.clone();
    readable.insert(held);
    let bad = key("scan-corrupt");
    acquire(&*store, &request(&bad, "a")).await;
    h.corrupt(&bad).await;

    let keys = |records: &[Record]| {
        records
            .iter()
            .map(|r| r.key.clone())
            .collect::<HashSet<_>>()
    };
    for limit in [1, 2, 3, ScanQuery::DEFAULT_LIMIT] {
        let (records, unreadable) =
            scan_entries(&*store, &ScanQuery::all().with_limit(limit)).await;
        assert_eq!(
            keys(&records),
            readable,
            "limit {limit}: every readable record"
        );
        assert_eq!(
            records.len(),
            readable.len(),
            "limit {limit}: a record twice"
        );
        assert_eq!(
            unreadable.len(),
            1,
            "limit {limit}: the corrupt record, once: {unreadable:?}"
        );
        let unreadable = &unreadable[0];
        assert!(!unreadable.stored_key.is_empty(), "{unreadable:?}");
        assert!(!unreadable.reason.is_empty(), "{unreadable:?}");
        if let Some(named) = &unreadable.key {
            assert_eq!(named, &bad, "the unreadable record names another key");
        }
    }
    // A filter the corrupt record may or may not be judged by: the readable records it keeps
    // are all there, and the corrupt one is reported at most once.
    let query = ScanQuery::all().with_state(State::Completed).with_limit(2);
    let (records, unreadable) = scan_entries(&*store, &query).await;
    assert_eq!(keys(&records), completed, "a filtered scan");
    assert!(unreadable.len() <= 1, "{unreadable:?}");

    match store.get(&bad).await {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("get of the corrupt record: expected Corrupt, got {other:?}"),
    }
    store
        .delete(&bad)
        .await
        .expect("delete of a corrupt record");
    assert!(store.get(&bad).await.expect("get after delete").is_none());
    let (records, unreadable) = scan_entries(&*store, &ScanQuery::all().with_limit(2)).await;
    assert_eq!(keys(&records), readable, "after the delete");
    assert!(
        unreadable.is_empty(),
        "deleted, still reported: {unreadable:?}"
    );
}
