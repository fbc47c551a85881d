//! The idem gateway: idempotency in front of any HTTP service, in one binary (`idem`).
//!
//! `idem serve` is a reverse proxy: it records every request's `Idempotency-Key` in a store
//! and answers a retry with the stored response instead of calling the upstream again (the
//! HTTP semantics of `idem-http`, per route). `idem demo` runs it with a built-in upstream;
//! `idem check-config`, `idem keys` and `idem store` are the admin commands.
//!
//! ```
//! use std::time::Duration;
//! use idem_gateway::config::{self, Overrides};
//! use idem_gateway::config::KeyMode;
//!
//! // What `idem check-config` reads: the file (here as text), then the flags' overrides.
//! let text = r#"
//! [upstream]
//! url = "http://127.0.0.1:3000"
//!
//! [[route]]
//! path = "/payments"
//! key = "required"
//! "#;
//! let overrides = Overrides { lease: Some("45s".into()), ..Overrides::default() };
//! let config = config::from_str("idem.toml", text, &overrides)?;
//! let payments = &config.routes[0];
//! assert_eq!(payments.name, "/payments");
//! assert_eq!(payments.settings.key, KeyMode::Required);
//! assert_eq!(payments.settings.lease, Duration::from_secs(45)); // --lease, on every route
//! assert_eq!(payments.settings.retention, Duration::from_secs(24 * 3600)); // the default
//!
//! // A mistake is one error that names its position, as the command prints it.
//! let err = config::from_str("idem.toml", "[upstream]\nretries = 3\n", &Overrides::default())
//!     .unwrap_err();
//! assert!(err.to_string().starts_with("idem.toml:2:1: unknown field `retries`"), "{err}");
//! # Ok::<(), idem_gateway::config::GatewayConfigError>(())
//! ```
//!
//! This library is what the `idem` binary is made of, and exposes only what the binary, the
//! tests and an embedder need (the README's "As a library" says what each is for):
//! - [`config`]: the TOML file, the overrides, and the one function that validates them;
//! - [`start`] and [`start_with_store`]: a gateway on the current runtime, until a shutdown
//!   future resolves or [`Running::stop`]; [`Drained`] says how the drain went;
//! - [`Failure`]: why a command failed, with its exit code;
//! - [`install_prometheus`] and [`RenderMetrics`]: the recorder the binary installs and what
//!   renders `/metrics`;
//! - [`record_json`] and [`record_text`]: a record as `idem keys` shows it;
//! - [`run_command_line`]: the whole command line of `idem`.
//!
//! Everything else (the proxy, the admin listener, the store wiring) is private.

mod admin;
mod body;
mod cli;
mod commands;
pub mod config;
mod demo;
mod fence;
mod gateway;
mod in_flight;
mod normal_path;
mod pool;
mod proxy;
mod reconcile;
mod records;
mod request_head;
mod resolve;
mod server;
mod store;
mod telemetry;
mod unknowns;

pub use admin::RenderMetrics;
pub use commands::{Failure, Running, run_command_line, start, start_with_store};
pub use records::{record_json, record_text};
pub use server::Drained;
pub use telemetry::install_prometheus;
