//! The gateway's configuration: a TOML file (serde types with `deny_unknown_fields`) turned
//! into a validated [`Config`] by one function ([`from_str`], or [`load`] for a file), with the
//! command line and the environment ([`Overrides`]) winning over the file.
//!
//! ```
//! use idem_gateway::config::{self, Overrides};
//!
//! let text = r#"
//! [upstream]
//! url = "http://127.0.0.1:3000"
//!
//! [[route]]
//! path = "/payments"
//! key = "required"
//! lease = "1m"
//! "#;
//! let overrides = Overrides { retention: Some("2h".into()), ..Overrides::default() };
//! let config = config::from_str("idem.toml", text, &overrides)?;
//! let route = &config.routes[0];
//! assert_eq!(route.name, "/payments");
//! assert_eq!(route.settings.lease.as_secs(), 60);
//! assert_eq!(route.settings.retention.as_secs(), 7200);
//!
//! // Errors are one line with the position in the file.
//! let err = config::from_str("idem.toml", "[upstream]\ntimeout = \"3x\"\n", &overrides).unwrap_err();
//! assert!(err.to_string().starts_with("idem.toml:2:11: invalid duration \"3x\""), "{err}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::Path;

mod build;
pub(crate) mod internal;
pub(crate) mod lint;
mod routes;
mod tls;
pub(crate) mod toml;
pub(crate) mod value;

pub use crate::fence::FenceHeaders;
pub use idem::StoreSpec;
pub(crate) use internal::Origin;
pub use internal::{
    AdminConfig, Config, LogConfig, Overrides, Route, RouteSettings, ServerConfig, StoreConfig,
    UpstreamConfig,
};
pub use lint::ConfigWarning;
pub use tls::UpstreamTls;
pub use toml::{KeyMode, LogFormat, OnStoreError, OnUnknown};
pub(crate) use value::HumanDuration;
pub use value::{PathPattern, RoutePath, ScopeSpec, UpstreamUrl};

/// A configuration that cannot be used: one line, naming where the bad value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfigError {
    location: Option<String>,
    message: String,
}

impl GatewayConfigError {
    /// An error at `location` (`file:line:column`, a flag such as `--lease`, or nothing).
    #[must_use]
    pub(crate) fn new(location: Option<String>, message: impl Into<String>) -> Self {
        // One line, whatever the message holds.
        let message = message
            .into()
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        GatewayConfigError { location, message }
    }

    /// Where the bad value is, when known.
    #[must_use]
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// What is wrong with it.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for GatewayConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(location) => write!(f, "{location}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for GatewayConfigError {}

/// Parses and validates configuration text; `name` is how errors name the file.
///
/// Beyond the text, it reads what the settings name: a listening address given by host name
/// is resolved (the first address is taken), and for an `https` upstream the `ca_file` (or the
/// system's root certificates) is read, so that `check-config` refuses what `serve` would.
///
/// # Errors
/// [`GatewayConfigError`]: a TOML syntax error, an unknown key, a bad value or a refused setting, with
/// its position.
pub fn from_str(
    name: &str,
    text: &str,
    overrides: &Overrides,
) -> Result<Config, GatewayConfigError> {
    let origin = Origin::file(name, text);
    let file: toml::FileConfig = ::toml::from_str(text).map_err(|err| {
        origin.error_at(err.span().map(|span| span.start), err.message().to_owned())
    })?;
    Config::build(file, overrides, &origin)
}

/// Loads the configuration: the file at `path` if any (else the defaults), then the overrides.
///
/// # Errors
/// [`GatewayConfigError`]: the file cannot be read, or [`from_str`] refuses it.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, GatewayConfigError> {
    match path {
        None => Config::build(toml::FileConfig::default(), overrides, &Origin::none()),
        Some(path) => {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|err| {
                GatewayConfigError::new(
                    Some(name.clone()),
                    format!("cannot read the config: {err}"),
                )
            })?;
            from_str(&name, &text, overrides)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Overrides, from_str};
    use crate::normal_path::NormalPath;

    #[test]
    fn another_spelling_of_a_path_takes_the_same_route() {
        let text = "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[[route]]\npath = \"/payments\"\n";
        let config = from_str("idem.toml", text, &Overrides::default()).unwrap();
        let route_for = |path: &str| {
            let path = NormalPath::new(path).unwrap();
            let route = config.routes.iter().find(|route| route.path.matches(&path));
            route.map(|route| route.name.as_str())
        };
        assert_eq!(route_for("/payments/7"), Some("/payments"));
        assert_eq!(route_for("//x/../%70ayments/"), Some("/payments"));
        assert_eq!(route_for("/other"), Some("default"));
    }

    #[test]
    fn unknown_outcomes_are_held_by_default_and_released_after_a_grace_on_request() {
        let text = "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[idempotency]\nlease = \"20s\"\n\
            [[route]]\npath = \"/a\"\non_unknown = \"release\"\n\
            [[route]]\npath = \"/b\"\non_unknown = \"release\"\nrelease_grace = \"5s\"\n\
            [[route]]\npath = \"/c\"\nunknown_hold = \"10m\"\nreconcile = \"/by-key/{key}?v=1\"\n";
        let config = from_str("idem.toml", text, &Overrides::default()).unwrap();
        let hold = |name: &str| {
            let route = config.routes.iter().find(|r| r.name == name).unwrap();
            route.settings.unknown_hold()
        };
        let second = std::time::Duration::from_secs;
        assert_eq!(hold("default"), None, "held until resolved");
        assert_eq!(hold("/a"), Some(second(20)), "the lease");
        assert_eq!(hold("/b"), Some(second(5)));
        assert_eq!(hold("/c"), Some(second(600)));
        let c = config.routes.iter().find(|r| r.name == "/c").unwrap();
        assert_eq!(c.settings.reconcile.as_deref(), Some("/by-key/{key}?v=1"));
        // Its keys are scoped (by Authorization, the default), and reconcile asks by key alone.
        let warned = |config: &super::Config| {
            config.warnings.iter().any(|w| {
                w.message()
                    .contains("reconcile asks the upstream by key alone")
            })
        };
        assert!(warned(&config));
        let unscoped = text.replace("reconcile =", "scope = \"none\"\nreconcile =");
        let config = from_str("idem.toml", &unscoped, &Overrides::default()).unwrap();
        assert!(!warned(&config));
    }

    #[test]
    fn a_reconcile_template_is_a_path_that_names_the_key_once() {
        for (template, why) in [
            ("by-key/{key}", "starts with /"),
            ("/by-key", "exactly once"),
            ("/{key}/{key}", "exactly once"),
            ("/by key/{key}", "not a valid path"),
            ("/{id}/{key}", "not a valid path"),
            ("//evil.example/{key}", "another host"),
            ("/by-key/{key}#x", "fragment"),
            ("/x/../by-key/{key}", "segment"),
        ] {
            let text = format!(
                "[upstream]\nurl = \"http://127.0.0.1:3000\"\n[[route]]\npath = \"/a\"\nreconcile = {template:?}\n"
            );
            let err = from_str("idem.toml", &text, &Overrides::default()).unwrap_err();
            let message = err.to_string();
            assert!(message.contains(why), "{template}: {message}");
            assert!(
                message.contains("idem.toml:"),
                "{template}: no position: {message}"
            );
        }
    }
}
