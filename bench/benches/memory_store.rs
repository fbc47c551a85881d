//! A `MemoryStore` claim+complete cycle on fresh keys, on 1 and 2 threads, next to a plain
//! `Mutex<HashMap<String, Vec<u8>>>` insert-then-update baseline on the same threads.
//!
//! One iteration is one cycle on every thread; the throughput is cycles per second over all
//! threads. Each sample starts from an empty store (and an empty map), dropped after timing.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use idem_bench::{BoxError, MutexMap, baseline_cycles, run_on_threads, store_cycles};
use idem_store_memory::MemoryStore;

/// Benchmarks `cycles` on `threads` threads as `name`; each sample runs on a fresh target from
/// `fresh` (dropped after timing) and checks it holds one entry per cycle afterwards.
fn bench_cycles<T: Sync>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    fresh: impl Fn() -> T,
    len: impl Fn(&T) -> usize,
    cycles: impl Fn(&T, usize, u64) -> Result<(), BoxError> + Sync,
) {
    group.bench_function(BenchmarkId::new(name, threads), |b| {
        b.iter_custom(|iters| {
            let target = fresh();
            let elapsed = run_on_threads(threads, iters, |thread, iters| {
                cycles(&target, thread, iters)
            })
            .unwrap_or_else(|e| panic!("{name} failed: {e}"));
            assert_eq!(len(&target), threads * iters as usize);
            elapsed
        });
    });
}

fn claim_complete(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_complete");
    for threads in [1, 2] {
        group.throughput(Throughput::Elements(threads as u64));
        bench_cycles(
            &mut group,
            "memory_store",
            threads,
            MemoryStore::new,
            MemoryStore::len,
            store_cycles,
        );
        bench_cycles(
            &mut group,
            "mutex_hashmap_baseline",
            threads,
            MutexMap::new,
            MutexMap::len,
            baseline_cycles,
        );
    }
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default()
        // A warm-up round starts from an empty store too: keep it short so the largest one
        // stays well under a million records.
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    claim_complete(&mut criterion);
    criterion.final_summary();
}
