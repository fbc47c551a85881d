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
//! use idem_gateway::config::toml::KeyMode;
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
//! # Ok::<(), idem_gateway::config::ConfigError>(())
//! ```
//!
//! This library is what the binary is made of, for tests and embedding:
//! - [`config`]: the TOML file, the overrides, and the one function that validates them;
//! - [`cli`]: the command line;
//! - [`commands`]: the subcommands, each returning a [`commands::Failure`] with its exit code,
//!   and [`commands::start`], which runs a gateway from the current runtime (the store and the
//!   admin listener on it, the serving threads of [`server::serve_workers`] beside it);
//! - [`gateway`], [`proxy`], [`server`], [`admin`]: the request path, the upstream client, the
//!   listener with its graceful shutdown, and the admin endpoints (metrics, health, the key API,
//!   the operator's page `/ui`);
//! - [`fence`]: the attempt's fence and number as request headers to the upstream, and the
//!   client's copies removed;
//! - [`normal_path`]: the normal form of a request path, which routes are matched against;
//! - [`in_flight`]: the claims this gateway holds in flight, kept as they happen (what
//!   `/metrics` reports, without scanning the store);
//! - [`records`]: records as the admin tools show them (JSON and one line);
//! - [`demo`]: the built-in upstream of `idem demo`.

pub mod admin;
pub mod body;
pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub mod fence;
pub mod gateway;
pub mod in_flight;
pub mod normal_path;
mod pool;
pub mod proxy;
pub mod records;
pub mod server;
pub mod store;
pub mod telemetry;
