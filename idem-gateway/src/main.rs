//! The `idem` binary: see `idem --help`.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use idem_gateway::cli::Cli;
use idem_gateway::commands;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = writeln!(std::io::stderr().lock(), "error: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}
