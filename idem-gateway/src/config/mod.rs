//! The gateway's configuration: a TOML file ([`toml`], serde types with
//! `deny_unknown_fields`) turned into a validated [`Config`] by one function
//! ([`Config::build`]), with the command line and the environment
//! ([`Overrides`]) winning over the file.
//!
//! ```
//! use idem_gateway::config::{self, Overrides};
//! use idem_gateway::normal_path::NormalPath;
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
//! let route = config.route_for(&NormalPath::new("/payments/7")?).unwrap();
//! assert_eq!(route.settings.lease.as_secs(), 60);
//! assert_eq!(route.settings.retention.as_secs(), 7200);
//! // Routes match the normal form of the path: another spelling is the same route.
//! let same = config.route_for(&NormalPath::new("//x/../%70ayments/")?).unwrap();
//! assert_eq!(same.name, route.name);
//!
//! // Errors are one line with the position in the file.
//! let err = config::from_str("idem.toml", "[upstream]\ntimeout = \"3x\"\n", &overrides).unwrap_err();
//! assert!(err.to_string().starts_with("idem.toml:2:11: invalid duration \"3x\""), "{err}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::Path;

mod build;
pub mod internal;
pub mod lint;
mod routes;
pub mod toml;
pub mod value;

pub use build::MIN_TOKEN_LEN;
pub use internal::{
    AdminConfig, Config, LogConfig, Origin, Overrides, Route, RouteSettings, ServerConfig,
    StoreConfig, UpstreamConfig,
};
pub use lint::ConfigWarning;
pub use value::{
    ByteSize, HumanDuration, ListenAddr, PathPattern, RoutePath, ScopeSpec, StoreSpec, UpstreamUrl,
};

/// A configuration that cannot be used: one line, naming where the bad value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    location: Option<String>,
    message: String,
}

impl ConfigError {
    /// An error at `location` (`file:line:column`, a flag such as `--lease`, or nothing).
    #[must_use]
    pub fn new(location: Option<String>, message: impl Into<String>) -> Self {
        // One line, whatever the message holds.
        let message = message
            .into()
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        ConfigError { location, message }
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

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(location) => write!(f, "{location}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses and validates configuration text; `name` is how errors name the file.
///
/// # Errors
/// [`ConfigError`]: a TOML syntax error, an unknown key, a bad value or a refused setting, with
/// its position.
pub fn from_str(name: &str, text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    let origin = Origin::file(name, text);
    let file: toml::FileConfig = ::toml::from_str(text).map_err(|err| {
        origin.error_at(err.span().map(|span| span.start), err.message().to_owned())
    })?;
    Config::build(file, overrides, &origin)
}

/// Loads the configuration: the file at `path` if any (else the defaults), then the overrides.
///
/// # Errors
/// [`ConfigError`]: the file cannot be read, or [`from_str`] refuses it.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    match path {
        None => Config::build(toml::FileConfig::default(), overrides, &Origin::none()),
        Some(path) => {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|err| {
                ConfigError::new(Some(name.clone()), format!("cannot read the config: {err}"))
            })?;
            from_str(&name, &text, overrides)
        }
    }
}
