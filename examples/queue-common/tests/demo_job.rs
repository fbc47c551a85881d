//! The demo job of the worker examples: the summary they print on Ctrl-C, and what a restarted
//! worker does with a message it shipped before, on the memory store and on the redb store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_core::{Bytes, IdempotencyKey};
use queue_common::{Job, demo_store, ship_orders};

fn order(n: u64, delivery: u32) -> Job {
    let key = IdempotencyKey::new(format!("order:{n}:ship")).unwrap();
    Job::new(key, Bytes::from(format!(r#"{{"order":{n}}}"#)), delivery)
}

fn args(list: &[&str]) -> impl Iterator<Item = String> {
    list.iter()
        .map(|a| (*a).to_owned())
        .collect::<Vec<_>>()
        .into_iter()
}

/// One worker's life: a store from `store_args`, the messages, and its summary counts.
async fn work(store_args: &[&str], jobs: Vec<Job>) -> (u64, u64, u64, String) {
    let (store, label) = demo_store(args(store_args)).unwrap();
    let (job, tally) = ship_orders(store, label).unwrap();
    for message in jobs {
        job(message).await;
    }
    (
        tally.processed(),
        tally.shipped(),
        tally.duplicates(),
        tally.summary(),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn the_summary_counts_processed_shipped_and_duplicates_answered() {
    let (processed, shipped, duplicates, summary) =
        work(&[], vec![order(1, 1), order(2, 1), order(1, 2)]).await;
    assert_eq!((processed, shipped, duplicates), (3, 2, 1));
    assert!(
        summary.starts_with(
            "processed 3 messages: shipped 2, answered 1 duplicates without shipping again, 0 other"
        ),
        "{summary}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_restarted_worker_reships_on_the_memory_store_but_not_on_redb() {
    // The memory store forgets: the redelivered order is shipped a second time.
    assert_eq!(work(&[], vec![order(7, 1)]).await.1, 1);
    assert_eq!(work(&[], vec![order(7, 2)]).await.1, 1);

    // The redb store keeps what it shipped across the restart: the redelivery is a duplicate.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shipped.redb");
    let path = path.to_str().unwrap();
    let first = work(&["--redb", path], vec![order(7, 1)]).await;
    assert_eq!((first.1, first.2), (1, 0));
    let restarted = work(&["--redb", path], vec![order(7, 2)]).await;
    assert_eq!((restarted.1, restarted.2), (0, 1), "{}", restarted.3);
}

#[test]
fn a_store_argument_it_does_not_know_is_refused() {
    assert!(demo_store(args(&["--redb"])).is_err());
    assert!(demo_store(args(&["--postgres", "x"])).is_err());
}
