//! `--name value` arguments, durations and the two ways a command fails.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a command stopped.
pub(crate) enum Failure {
    /// Bad arguments or an environment the command cannot run in (exit 2).
    Usage(String),
    /// A checked invariant does not hold (exit 1).
    Check(String),
}

/// The `--name value` pairs of a command line.
pub(crate) struct Args(HashMap<String, String>);

impl Args {
    pub(crate) fn parse(mut argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut values = HashMap::new();
        while let Some(name) = argv.next() {
            let Some(name) = name.strip_prefix("--") else {
                return Err(format!("expected --name, got {name:?}"));
            };
            let value = argv
                .next()
                .ok_or_else(|| format!("--{name} needs a value"))?;
            values.insert(name.to_owned(), value);
        }
        Ok(Args(values))
    }

    /// The value of `--name`, which must be given.
    pub(crate) fn need(&self, name: &str) -> Result<&str, Failure> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Failure::Usage(format!("--{name} is required")))
    }

    /// The value of `--name` parsed, or `default`.
    pub(crate) fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, Failure> {
        match self.0.get(name) {
            None => Ok(default),
            Some(value) => value
                .parse()
                .map_err(|_| Failure::Usage(format!("--{name}: cannot read {value:?}"))),
        }
    }

    /// The duration `--name` ("500ms", "30s", "10m", "1h", or seconds), or `default`.
    pub(crate) fn duration(&self, name: &str, default: Duration) -> Result<Duration, Failure> {
        match self.0.get(name) {
            None => Ok(default),
            Some(value) => parse_duration(value)
                .ok_or_else(|| Failure::Usage(format!("--{name}: not a duration: {value:?}"))),
        }
    }
}

fn parse_duration(text: &str) -> Option<Duration> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(number)),
        "" | "s" => Some(Duration::from_secs(number)),
        "m" => Some(Duration::from_secs(number * 60)),
        "h" => Some(Duration::from_secs(number * 3600)),
        _ => None,
    }
}

/// Milliseconds since the Unix epoch: the scripts stamp their kills and restarts with the same
/// clock (`date +%s%3N`).
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("3d"), None);
    }

    #[test]
    fn pairs() {
        let args = Args::parse(
            ["--addr", "a:1", "--connections", "8"]
                .map(String::from)
                .into_iter(),
        )
        .ok()
        .unwrap();
        assert_eq!(args.need("addr").ok(), Some("a:1"));
        assert_eq!(args.get("connections", 1usize).ok(), Some(8));
        assert_eq!(args.get("missing", 3usize).ok(), Some(3));
        assert!(Args::parse(["--addr"].map(String::from).into_iter()).is_err());
    }
}
