//! The `idem` binary: see `idem --help`.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem_gateway::RenderMetrics;

/// Installs the Prometheus recorder (the binary's alone: libraries only emit through the
/// `metrics` facade), behind the tap that keeps `/ui`'s totals, and returns what renders it.
/// Histograms are kept as summaries; their upkeep runs every few seconds on its own thread.
fn install_metrics() -> Option<RenderMetrics> {
    let handle = idem_gateway::install_prometheus()?;
    let upkeep = handle.clone();
    let _ = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(5));
                upkeep.run_upkeep();
            }
        });
    Some(Arc::new(move || handle.render()))
}

/// mimalloc, not the system allocator: a proxy allocates on one worker thread what it frees on
/// another, where glibc's per-thread arenas take a lock (bench/gateway.sh: about 8% more
/// requests per second, and less CPU per request).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match idem_gateway::run_command_line(&install_metrics) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = writeln!(std::io::stderr().lock(), "error: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
