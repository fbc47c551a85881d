//! The subcommands of `idem`. Each returns `Ok` or a [`Failure`] that carries its exit code:
//! 2 for a configuration or usage error, 1 for anything that went wrong while running.

use std::fmt;

use serde_json::{Value, json};

use crate::cli::{Cli, Command};
use crate::config::{self, Config, ConfigError};

/// Why a command failed, and the exit code that says so.
#[derive(Debug)]
pub enum Failure {
    /// The configuration or the command line is wrong: exit 2.
    Config(ConfigError),
    /// The command ran and failed (a store error, a port in use): exit 1.
    Runtime(String),
}

impl Failure {
    /// The process exit code: 2 for a configuration error, 1 otherwise.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) => 2,
            Failure::Runtime(_) => 1,
        }
    }

    /// A runtime failure.
    pub fn runtime(message: impl fmt::Display) -> Self {
        Failure::Runtime(message.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Config(err) => err.fmt(f),
            Failure::Runtime(message) => f.write_str(message),
        }
    }
}

impl From<ConfigError> for Failure {
    fn from(err: ConfigError) -> Self {
        Failure::Config(err)
    }
}

/// Runs the command the command line names.
///
/// # Errors
/// [`Failure`], with the exit code to end with.
pub fn run(cli: Cli) -> Result<(), Failure> {
    let overrides = cli.overrides.to_overrides();
    match cli.command {
        Command::CheckConfig { path, json } => {
            let path = path.or(cli.config);
            let config = config::load(path.as_deref(), &overrides);
            check_config(config, json)
        }
        Command::Serve | Command::Keys { .. } | Command::Store { .. } | Command::Demo => {
            let _config = config::load(cli.config.as_deref(), &overrides)?;
            Err(Failure::runtime("this command is not built yet"))
        }
    }
}

/// `idem check-config`: prints a summary of a valid configuration (or one JSON object), or
/// fails with the one-line error.
fn check_config(config: Result<Config, ConfigError>, json: bool) -> Result<(), Failure> {
    let config = match config {
        Ok(config) => config,
        Err(err) if json => {
            say(&json!({ "ok": false, "error": err.to_string() }).to_string());
            return Err(Failure::Config(err));
        }
        Err(err) => return Err(Failure::Config(err)),
    };
    let upstream = config.require_upstream().map(|u| u.url.to_string());
    if json {
        let mut summary = summary(&config);
        summary["ok"] = Value::Bool(upstream.is_ok());
        if let Err(err) = &upstream {
            summary["error"] = Value::String(err.to_string());
        }
        say(&summary.to_string());
        return upstream.map(|_| ()).map_err(Failure::Config);
    }
    let upstream = upstream?;
    say(&format!(
        "ok: listen {}, upstream {upstream}, store {}, {} route(s), admin {}",
        config.server.listen,
        config.store.spec,
        config.routes.len(),
        config
            .admin
            .as_ref()
            .map_or_else(|| "off".to_owned(), |a| a.listen.to_string()),
    ));
    Ok(())
}

/// The resolved configuration as JSON (the admin token is never shown).
#[must_use]
pub fn summary(config: &Config) -> Value {
    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|route| {
            let s = &route.settings;
            json!({
                "name": route.name,
                "path": route.path.to_string(),
                "enabled": s.enabled,
                "header": s.header.as_str(),
                "methods": s.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "key": format!("{:?}", s.key).to_lowercase(),
                "scope": format!("{:?}", s.scope),
                "lease_ms": millis(s.lease),
                "heartbeat_ms": millis(s.heartbeat),
                "retention_ms": millis(s.retention),
                "wait_ms": s.wait.map(millis),
                "request_body_limit": s.request_body_limit.get(),
                "storage_cap": s.storage_cap.get(),
                "store_server_errors": s.store_server_errors,
            })
        })
        .collect();
    json!({
        "listen": config.server.listen.to_string(),
        "upstream": config.upstream.as_ref().map(|u| u.url.to_string()),
        "store": config.store.spec.to_string(),
        "namespace": config.store.namespace,
        "admin": config.admin.as_ref().map(|a| json!({
            "listen": a.listen.to_string(),
            "token": a.token.is_some(),
        })),
        "routes": routes,
    })
}

/// A duration in whole milliseconds, saturating.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Writes a line to stdout; a closed stdout (`idem ... | head`) is not an error worth a panic.
pub fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}
