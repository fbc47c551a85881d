//! Logs: tracing to stderr, as text or JSON lines, filtered by `RUST_LOG` or `[log] level`.

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;
use crate::config::toml::LogFormat;

/// Installs the log subscriber (once per process; later calls do nothing).
pub fn init_logs(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
