//! `idem-load`: the load generator of `bench/faults.sh` and `bench/soak.sh`, and the second
//! client of `bench/http.sh` and `bench/gateway.sh`.
//!
//! wrk counts statuses but cannot say which request got which one, and these scripts need
//! exactly that: which keys were answered 503 while the store was down, whether a retry of a
//! key was a replay or a second execution, which kind of request (replay, conflict, mismatch)
//! got which status. So this client records every request (key, status, replayed or not,
//! when it was sent and answered) and checks the invariants itself.
//!
//! ```text
//! idem-load unique --addr HOST:PORT --duration 30s --log FILE [--connections 32] [--prefix P]
//! idem-load check  --addr HOST:PORT --fixture HOST:PORT --log FILE --gateway-log FILE
//!                  --down-ms T --up-ms T --ready-ms T --store NAME [--connections 32]
//! idem-load soak   --addr HOST:PORT --fixture HOST:PORT --pid PID --duration 10m
//!                  [--connections 32] [--conflict-workers 4] [--sample 5s] [--warmup 20]
//!                  [--large-bytes 65536] [--max-growth 10]
//! idem-load rate   --addr HOST:PORT [--mode unique|replay] [--connections 64] [--duration 10s]
//!                  [--warmup 2s] [--path /echo]
//! ```
//!
//! `rate` is the second client of `bench/http.sh` and `bench/gateway.sh`, beside wrk: it
//! prints requests per second, the p99 latency in ms and the count of non-2xx answers.
//! `unique` and `check` make the fault-injection run (bench/faults.sh kills the store between
//! them), `soak` the mixed-load run. Each prints its figures on stdout and exits 1 when a check
//! fails, 2 on a usage error.

mod args;
mod client;
mod faults;
mod rate;
mod soak;

use std::process::ExitCode;

use args::Args;

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().unwrap_or_default();
    let args = match Args::parse(argv) {
        Ok(args) => args,
        Err(error) => return usage(&error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return usage(&error.to_string()),
    };
    let outcome = runtime.block_on(async {
        match command.as_str() {
            "unique" => faults::unique(&args).await,
            "check" => faults::check(&args).await,
            "soak" => soak::soak(&args).await,
            "rate" => rate::rate(&args).await,
            other => Err(args::Failure::Usage(format!("unknown command {other:?}"))),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(args::Failure::Usage(error)) => usage(&error),
        Err(args::Failure::Check(error)) => {
            eprintln!("idem-load: FAILED: {error}");
            ExitCode::from(1)
        }
    }
}

fn usage(error: &str) -> ExitCode {
    eprintln!(
        "idem-load: {error}\nusage: idem-load unique|check|soak|rate --name value ... (see the source's header)"
    );
    ExitCode::from(2)
}
