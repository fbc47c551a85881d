//! Fuzzes the gateway's configuration parser, `idem_gateway::config::from_str`: no text and no
//! command-line value may make it panic; an error is one line, and a TOML error at a position
//! names `file:line:column` within the text.
//!
//! Input: the TOML text, then optionally a NUL and the overrides separated by NULs (listen,
//! upstream, store, retention, lease, admin listen, admin token, no-admin; empty is unset).
//! TOML text cannot hold a NUL, so a plain config file is an input as it is.
#![no_main]

use idem_gateway::config::{self, Overrides};
use libfuzzer_sys::fuzz_target;

const NAME: &str = "idem.toml";

fn overrides(values: &[&str]) -> Overrides {
    let value = |i: usize| {
        values
            .get(i)
            .filter(|v| !v.is_empty())
            .map(|v| (*v).to_owned())
    };
    Overrides {
        listen: value(0),
        upstream: value(1),
        store: value(2),
        retention: value(3),
        lease: value(4),
        admin_listen: value(5),
        admin_token: value(6),
        no_admin: value(7).is_some(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let mut values = input.split('\0');
    let text = values.next().unwrap_or_default();
    let overrides = overrides(&values.collect::<Vec<_>>());
    let outcome = config::from_str(NAME, text, &overrides);
    let Err(err) = outcome else {
        return;
    };
    assert!(!err.message().contains('\n'), "{err:?}");
    assert!(!err.to_string().contains('\n'), "{err:?}");
    // Where TOML itself refuses the text at a position (its syntax: the file's types are the
    // gateway's own), the error must name it.
    if let Err(toml) = toml::from_str::<toml::Table>(text)
        && let Some(span) = toml.span()
    {
        let location = err
            .location()
            .unwrap_or_else(|| panic!("no location: {err:?}"));
        let position = location
            .strip_prefix(NAME)
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{location:?} does not name the file"));
        let (line, column) = position.split_once(':').unwrap();
        let (line, column): (usize, usize) = (line.parse().unwrap(), column.parse().unwrap());
        let before = &text[..span.start.min(text.len())];
        assert_eq!(
            line,
            before.matches('\n').count() + 1,
            "{err:?} at {span:?}"
        );
        assert!(
            column >= 1 && line <= text.lines().count().max(1) + 1,
            "{err:?}"
        );
    }
});
