//! Runs N claim+complete cycles on one thread, on `MemoryStore` or on the `Mutex<HashMap>`
//! baseline, and nothing else: `bench/instructions.sh` runs it under valgrind's callgrind to
//! count the instructions of one cycle.
//!
//! `cargo run --release -p idem-bench --example instructions -- store|baseline N`

use std::process::ExitCode;

use idem_bench::{BoxError, MutexMap, baseline_cycles, store_cycles};
use idem_store_memory::MemoryStore;

fn run() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (Some(what), Some(cycles)) = (args.next(), args.next()) else {
        return Err("usage: instructions store|baseline N".into());
    };
    let cycles: u64 = cycles.parse()?;
    match what.as_str() {
        "store" => store_cycles(&MemoryStore::new(), 0, cycles),
        "baseline" => baseline_cycles(&MutexMap::new(), 0, cycles),
        other => Err(format!("unknown workload {other:?}: store or baseline").into()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
