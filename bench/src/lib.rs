//! The pieces idem's criterion benchmarks share (`benches/`): running a workload on several
//! threads at once, and the baselines each measurement is compared with.
//!
//! Run them with `cargo bench -p idem-bench`; the figures are in the repository README.
//! `bench/instructions.sh` counts the instructions of the same cycles with valgrind, a figure
//! that does not depend on the load of the machine.

use std::collections::HashMap;
use std::error::Error;
use std::hint::black_box;
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::{Bytes, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, RecordKey, Store};
use idem_store_memory::MemoryStore;

/// Runs `work(thread, iters)` on `threads` threads that start together, and returns the wall
/// time from the start until the last one is done.
///
/// One benchmark iteration is then one call of the workload on every thread, so criterion's
/// throughput in elements (`threads` per iteration) is the total rate over all threads.
///
/// # Errors
/// The first error a thread's workload returned.
pub fn run_on_threads<W, E>(threads: usize, iters: u64, work: W) -> Result<Duration, E>
where
    W: Fn(usize, u64) -> Result<(), E> + Sync,
    E: Send,
{
    let start = Barrier::new(threads + 1);
    let (started, outcomes) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (start, work) = (&start, &work);
                scope.spawn(move || {
                    start.wait();
                    work(thread, iters)
                })
            })
            .collect();
        start.wait();
        let started = Instant::now();
        let outcomes: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        (started, outcomes)
    });
    let elapsed = started.elapsed();
    for outcome in outcomes {
        match outcome {
            Ok(result) => result?,
            // A workload that panicked: carry its panic on to the benchmark.
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    Ok(elapsed)
}

/// The baseline of a claim+complete cycle: a plain `Mutex<HashMap>` that inserts an empty value
/// for a key (the claim) and then updates it with the result (the completion), taking the lock
/// once for each, as the store does. No expiry, no fences, no fingerprints, no capacity.
#[derive(Debug, Default)]
pub struct MutexMap {
    map: Mutex<HashMap<String, Vec<u8>>>,
}

impl MutexMap {
    /// An empty map.
    #[must_use]
    pub fn new() -> Self {
        MutexMap::default()
    }

    /// Inserts `key` with an empty value if it is absent, then replaces the value with
    /// `result`. Returns whether the insert found the key absent.
    pub fn insert_then_update(&self, key: String, result: &[u8]) -> bool {
        let fresh = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            match map.entry(key.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(Vec::new());
                    true
                }
            }
        };
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = map.get_mut(&key) {
            *value = result.to_vec();
        }
        fresh
    }

    /// How many keys the map holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the map holds no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The lease of a benchmark claim.
pub const LEASE: Duration = Duration::from_secs(30);
/// How long a benchmark result is kept.
pub const RETENTION: Duration = Duration::from_secs(3600);
/// The result a benchmark cycle records.
pub const RESULT: &[u8] = b"{\"status\":\"captured\"}";

/// The error of a benchmark's workload.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Runs `work` on the runtime `builder` makes, for an example's `main`: its error, or the
/// runtime's, is printed and the exit code is a failure.
pub fn run_main<F>(mut builder: tokio::runtime::Builder, work: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), BoxError>>,
{
    let result = builder
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|runtime| runtime.block_on(work));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `iters` claim+complete cycles on fresh keys of `thread` (`payment:{thread}:{n}`), driven by
/// a current-thread tokio runtime of its own.
///
/// # Errors
/// The first store error, or a fresh key that was not acquired.
pub fn store_cycles(store: &MemoryStore, thread: usize, iters: u64) -> Result<(), BoxError> {
    let fingerprint = Fingerprint::of(&[b"POST", b"/payments", RESULT]);
    let result = Bytes::from_static(RESULT);
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    runtime.block_on(async {
        for n in 0..iters {
            let key = IdempotencyKey::new(format!("payment:{thread}:{n}"))?;
            let request = ClaimRequest::new(RecordKey::unscoped(key), fingerprint, LEASE);
            let ClaimOutcome::Acquired { lease, .. } = store.claim(&request).await? else {
                return Err("a fresh key was not acquired".into());
            };
            store.complete(&lease, result.clone(), RETENTION).await?;
        }
        Ok(())
    })
}

/// `iters` insert-then-update cycles on the same fresh keys as [`store_cycles`].
///
/// # Errors
/// A fresh key that was already in the map.
pub fn baseline_cycles(map: &MutexMap, thread: usize, iters: u64) -> Result<(), BoxError> {
    for n in 0..iters {
        if !black_box(map.insert_then_update(format!("payment:{thread}:{n}"), RESULT)) {
            return Err("a fresh key was already in the map".into());
        }
    }
    Ok(())
}
