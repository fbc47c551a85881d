//! The scenario the worker examples' tests run against the real brokers: duplicates, a
//! permanent failure, a job that fails transiently once, a key in the body, a message without
//! a key. Every disposition happens at least once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_store_memory::MemoryStore;
use idem_worker::{JobError, JobGuard, RetryPolicy};

use crate::{DispositionFuture, Job};

/// The messages: `(key header, payload)`.
#[must_use]
pub fn messages() -> Vec<(Option<String>, String)> {
    let mut messages = Vec::new();
    for n in 0..30 {
        let copies = if n % 5 == 0 { 2 } else { 1 };
        for _ in 0..copies {
            messages.push((Some(format!("ok:{n}")), format!("{{\"n\":{n}}}")));
        }
    }
    messages.push((Some("perm:1".into()), "{}".into()));
    messages.push((Some("flaky:1".into()), "{}".into()));
    messages.push((None, r#"{"key":"body:1"}"#.into()));
    messages.push((None, "no key at all".into()));
    messages
}

/// Counts effects and attempts per key while the scenario runs.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    effects: Arc<Mutex<HashMap<String, u32>>>,
    attempts: Arc<Mutex<HashMap<String, u32>>>,
}

impl Tally {
    /// The handler: a guard on the memory store with a 100 ms first retry delay, and a job
    /// that fails `perm:*` permanently and `flaky:*` transiently on its first delivery.
    pub fn handler(&self) -> impl Fn(Job) -> DispositionFuture + Clone + Send + Sync + 'static {
        let guard = JobGuard::builder(Arc::new(MemoryStore::new()))
            .job_type("test")
            .retry_policy(RetryPolicy::default().with_initial_delay(Duration::from_millis(100)))
            .build()
            .unwrap();
        let tally = self.clone();
        move |job: Job| -> DispositionFuture {
            let (guard, tally) = (guard.clone(), tally.clone());
            Box::pin(async move {
                guard
                    .run_delivery(&job.key, job.fingerprint, job.delivery, |ctx| async move {
                        let key = ctx.key().to_string();
                        *tally
                            .attempts
                            .lock()
                            .unwrap()
                            .entry(key.clone())
                            .or_default() += 1;
                        if key.starts_with("perm:") {
                            return Err(JobError::permanent("invalid order"));
                        }
                        if key.starts_with("flaky:") && ctx.delivery() == 1 {
                            return Err(JobError::transient("downstream busy"));
                        }
                        *tally.effects.lock().unwrap().entry(key).or_default() += 1;
                        Ok(())
                    })
                    .await
                    .disposition
            })
        }
    }

    /// Waits (30 s at most) until every job took effect and the permanent failure was tried,
    /// then half a second more for any wrong redelivery to show.
    pub async fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.effects.lock().unwrap().len() < 32
            || !self.attempts.lock().unwrap().contains_key("perm:1")
        {
            assert!(
                Instant::now() < deadline,
                "not done: {:?}",
                self.effects.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// Every job took effect once; the transient one was delivered twice, the permanent one
    /// once.
    pub fn check(&self) {
        let effects = self.effects.lock().unwrap().clone();
        assert_eq!(effects.len(), 32, "{effects:?}");
        assert!(effects.values().all(|&n| n == 1), "{effects:?}");
        assert!(effects.contains_key("body:1") && effects.contains_key("flaky:1"));
        let attempts = self.attempts.lock().unwrap().clone();
        assert_eq!(attempts["flaky:1"], 2, "the retry redelivered it once");
        assert_eq!(attempts["perm:1"], 1, "the dead letter was not redelivered");
    }
}

/// A number unique to this moment, for queue and stream names of one test run.
#[must_use]
pub fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
