//! Records as the admin tools show them: one JSON shape (the admin API's, `idem keys --json`)
//! and two text formats rendered from it (one line per record for `keys list`, the whole record
//! for `keys get`), so `idem keys` prints the same whether it reads the
//! store itself or asks a running gateway's admin listener. Also the parsing of the key, scope
//! and list filters that both paths share.

use idem_core::{
    IdempotencyKey, KeyError, MAX_KEY_LEN, Record, RecordKey, ScanPage, ScanQuery, Scope, State,
    Timestamp, UnreadableRecord,
};
use serde_json::{Value, json};

use crate::config::{GatewayConfigError, HumanDuration};

/// A store time as RFC 3339 text, to the millisecond.
#[must_use]
pub(crate) fn time(at: Timestamp) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(at.as_micros());
    humantime::format_rfc3339_millis(at).to_string()
}

/// The most bytes of a stored body that [`record_json`] shows.
pub(crate) const BODY_PREVIEW: usize = 512;

/// `bytes` as text that shows every byte: valid UTF-8 as it is, but control characters,
/// quotes and backslashes escaped as Rust escapes them (`\n`, `\u{1b}`), and each byte that is
/// not UTF-8 as `\xNN`; one line, whatever the body holds.
#[must_use]
pub(crate) fn escaped(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                text.extend(c.escape_debug());
            } else {
                text.push(c);
            }
        }
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02x}"));
        }
    }
    text
}

/// A stored HTTP response as JSON: its status, headers and trailers (in order, with repeats;
/// a value that is not text is escaped as [`escaped`] does), the length of its body (`null`
/// when it was stored without it, over the storage cap) and the first [`BODY_PREVIEW`] bytes
/// of the body, escaped.
fn response_json(response: &idem_http::codec::StoredResponse) -> Value {
    let fields = |fields: &[(http::HeaderName, http::HeaderValue)]| -> Vec<Value> {
        fields
            .iter()
            .map(|(name, value)| json!([name.as_str(), escaped(value.as_bytes())]))
            .collect()
    };
    let body = response.body.as_ref();
    json!({
        "status": response.status.as_u16(),
        "headers": fields(&response.headers),
        "trailers": fields(&response.trailers),
        "body_bytes": body.map(bytes::Bytes::len),
        "body_preview": body.map(|body| escaped(&body[..body.len().min(BODY_PREVIEW)])),
        "body_preview_truncated": body.is_some_and(|body| body.len() > BODY_PREVIEW),
    })
}

/// A record as JSON: its state, owner, fence, times and, for a stored HTTP response, its
/// status and the response itself (as `response_json` shapes it).
#[must_use]
pub fn record_json(record: &Record) -> Value {
    let response = record
        .result
        .as_ref()
        .and_then(|bytes| idem_http::codec::decode(bytes).ok());
    json!({
        "key": record.key.key.as_str(),
        "scope": record.key.scope.as_str(),
        "state": record.state.as_str(),
        "fingerprint": record.fingerprint.to_string(),
        "owner": record.owner.to_string(),
        "fence": record.fence.get(),
        "attempt": record.attempt,
        "created_at": time(record.created_at),
        "completed_at": record.completed_at.map(time),
        "lease_until": time(record.lease_until),
        "expires_at": time(record.expires_at),
        "result_bytes": record.result.as_ref().map(bytes::Bytes::len),
        "status": response.as_ref().map(|r| r.status.as_u16()),
        "response": response.as_ref().map(response_json),
        "failure": record.failure.as_ref().map(|f| json!({ "message": f.message, "retryable": f.retryable })),
    })
}

/// The `state` of a record the store could not read, in [`unreadable_json`] and `idem keys
/// list`.
pub(crate) const UNREADABLE: &str = "unreadable";

/// A record the store could not read, as JSON: `"state": "unreadable"`, its `key` and `scope`
/// where the store could read them (what `idem keys delete` and the key API take; `null`
/// otherwise), `stored_key` (the key as the store holds it, as text) and the `reason`.
#[must_use]
pub(crate) fn unreadable_json(unreadable: &UnreadableRecord) -> Value {
    let key = unreadable.key.as_ref();
    json!({
        "key": key.map(|k| k.key.as_str()),
        "scope": key.map(|k| k.scope.as_str()),
        "state": UNREADABLE,
        "stored_key": unreadable.stored_key,
        "reason": unreadable.reason,
    })
}

/// The entries of a scan page as JSON: its records ([`record_json`]), then the records it
/// could not read ([`unreadable_json`]).
#[must_use]
pub(crate) fn page_json(page: &ScanPage) -> Vec<Value> {
    page.records
        .iter()
        .map(record_json)
        .chain(page.unreadable.iter().map(unreadable_json))
        .collect()
}

/// A record, given as [`record_json`] made it, as one line of tab-separated fields: the key,
/// `scope=SCOPE`, the state alone (so `awk -F'\t' '$3 == "completed"'` finds it), then
/// `name=value` fields (a field whose value is missing, as the status of a record in flight, is
/// left out). A record the store could not read ([`unreadable_json`]) is
/// `KEY scope=SCOPE unreadable reason=REASON`, tab-separated like the others; where the store
/// could not read its key, `KEY` is the key as stored and `SCOPE` is `?`.
#[must_use]
pub(crate) fn record_line(record: &Value) -> String {
    if record["state"] == UNREADABLE {
        return unreadable_line(record);
    }
    let text = |name: &str| record[name].as_str().unwrap_or("?").to_owned();
    let number = |name: &str| {
        record[name]
            .as_u64()
            .map_or("?".to_owned(), |n| n.to_string())
    };
    let scope = record["scope"].as_str().unwrap_or_default();
    let status = record["status"]
        .as_u64()
        .map(|status| format!("\tstatus={status}"))
        .unwrap_or_default();
    format!(
        "{}\tscope={}\t{}{}\tfence={}\tattempt={}\tcreated={}\texpires={}",
        text("key"),
        if scope.is_empty() { "-" } else { scope },
        text("state"),
        status,
        number("fence"),
        number("attempt"),
        text("created_at"),
        text("expires_at"),
    )
}

/// The line of [`record_line`] for a record the store could not read. Its stored key and
/// reason are the store's text: control characters are escaped, so it stays one line.
fn unreadable_line(record: &Value) -> String {
    let one_line = |text: &str| {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
    };
    let (key, scope) = match record["key"].as_str() {
        Some(key) => {
            let scope = record["scope"].as_str().unwrap_or_default();
            (key.to_owned(), if scope.is_empty() { "-" } else { scope })
        }
        None => (one_line(record["stored_key"].as_str().unwrap_or("?")), "?"),
    };
    format!(
        "{key}\tscope={scope}\t{UNREADABLE}\treason={}",
        one_line(record["reason"].as_str().unwrap_or("?"))
    )
}

/// The fields of a record in `idem keys get`'s text, in order: what it is, who holds it, when,
/// and what it stored.
const RECORD_FIELDS: [&str; 14] = [
    "key",
    "scope",
    "state",
    "owner",
    "fence",
    "attempt",
    "created_at",
    "lease_until",
    "completed_at",
    "expires_at",
    "status",
    "result_bytes",
    "failure",
    "fingerprint",
];

/// A record, given as [`record_json`] made it, as `field: value` lines (the JSON's field names;
/// `-` for a value it does not have, such as the status of a record in flight).
#[must_use]
pub fn record_text(record: &Value) -> String {
    let value = |name: &str| match &record[name] {
        Value::String(text) if !text.is_empty() => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Object(failure) if name == "failure" => format!(
            "{} ({})",
            failure
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            if failure.get("retryable").and_then(Value::as_bool) == Some(true) {
                "retryable"
            } else {
                "permanent"
            }
        ),
        _ => "-".to_owned(),
    };
    let mut lines: Vec<String> = RECORD_FIELDS
        .iter()
        .map(|name| format!("{name}: {}", value(name)))
        .collect();
    if let Value::Object(response) = &record["response"] {
        lines.push("response:".to_owned());
        for (section, name) in [("headers", "header"), ("trailers", "trailer")] {
            for field in response
                .get(section)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let part = |at: usize| field.get(at).and_then(Value::as_str).unwrap_or("?");
                lines.push(format!("  {name}: {}: {}", part(0), part(1)));
            }
        }
        match response.get("body_bytes").and_then(Value::as_u64) {
            None => lines.push("  body: omitted (over the storage cap)".to_owned()),
            Some(len) => {
                let preview = response
                    .get("body_preview")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let more = if response.get("body_preview_truncated") == Some(&Value::Bool(true)) {
                    format!(" (the first {BODY_PREVIEW})")
                } else {
                    String::new()
                };
                lines.push(format!("  body: {len} bytes{more}: {preview}"));
            }
        }
    }
    lines.join("\n")
}

/// How errors name the arguments of a record query: the command line's ([`ArgNames::FLAGS`])
/// or those of the key API and the `/ui` form ([`ArgNames::PARAMS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArgNames {
    /// The key.
    pub key: &'static str,
    /// The scope.
    pub scope: &'static str,
    /// The state filter.
    pub state: &'static str,
    /// The age filter.
    pub older_than: &'static str,
    /// The most records.
    pub limit: &'static str,
}

impl ArgNames {
    /// `idem keys`: `KEY`, `--scope`, `--state`, `--older-than`, `--limit`.
    pub(crate) const FLAGS: ArgNames = ArgNames {
        key: "KEY",
        scope: "--scope",
        state: "--state",
        older_than: "--older-than",
        limit: "--limit",
    };
    /// The key API's query parameters and the `/ui` form's fields: `key`, `scope`, `state`,
    /// `older_than`, `limit`.
    pub(crate) const PARAMS: ArgNames = ArgNames {
        key: "key",
        scope: "scope",
        state: "state",
        older_than: "older_than",
        limit: "limit",
    };
}

/// The record key of `key` in `scope` (empty: no scope); errors name the argument as `names`
/// does.
///
/// # Errors
/// [`GatewayConfigError`] when the key or the scope is not valid.
pub(crate) fn record_key(
    key: &str,
    scope: &str,
    names: ArgNames,
) -> Result<RecordKey, GatewayConfigError> {
    let key = IdempotencyKey::new(key)
        .map_err(|err| GatewayConfigError::new(Some(names.key.to_owned()), err.to_string()))?;
    let scope = Scope::new(scope)
        .map_err(|err| GatewayConfigError::new(Some(names.scope.to_owned()), scope_error(&err)))?;
    Ok(RecordKey::new(scope, key))
}

/// The rule a scope breaks, in a scope's words ([`KeyError`] speaks of a key).
fn scope_error(err: &KeyError) -> String {
    match err {
        KeyError::TooLong { len } => {
            format!("the scope is {len} bytes long: a scope is at most {MAX_KEY_LEN} bytes")
        }
        KeyError::InvalidByte { byte, position } => format!(
            "byte {position} of the scope is 0x{byte:02x}: a scope holds only printable ASCII (0x20 to 0x7e)"
        ),
        other => other.to_string(),
    }
}

/// The scan of `keys list`: a state (`in_flight`, `completed`, `failed`), a minimum age (a
/// human duration such as `10m`) and a page size: at least 1 (a limit of 0 is refused, not
/// read as 1), and at most [`ScanQuery::DEFAULT_LIMIT`] a page.
///
/// # Errors
/// [`GatewayConfigError`] naming the state, the age or the limit as `names` does.
pub(crate) fn scan_query(
    state: Option<&str>,
    older_than: Option<&str>,
    limit: usize,
    names: ArgNames,
) -> Result<ScanQuery, GatewayConfigError> {
    if limit == 0 {
        return Err(GatewayConfigError::new(
            Some(names.limit.to_owned()),
            "the limit is 0: ask for at least 1 record",
        ));
    }
    let mut query = ScanQuery::all().with_limit(limit.min(ScanQuery::DEFAULT_LIMIT));
    if let Some(state) = state {
        let state: State = state.parse().map_err(|err: idem_core::ParseStateError| {
            GatewayConfigError::new(Some(names.state.to_owned()), err.to_string())
        })?;
        query = query.with_state(state);
    }
    if let Some(age) = older_than {
        let age: HumanDuration = age.parse().map_err(|err: String| {
            GatewayConfigError::new(Some(names.older_than.to_owned()), err)
        })?;
        query = query.with_min_age(age.0);
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_body_preview_shows_every_byte_on_one_line() {
        assert_eq!(escaped(b"plain text"), "plain text");
        assert_eq!(escaped("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(escaped(b"a\nb\t\\"), "a\\nb\\t\\\\");
        assert_eq!(escaped(b"\xff\x00ok"), "\\xff\\0ok");
    }

    #[test]
    fn the_line_is_rendered_from_the_json() {
        let value = json!({
            "key": "k", "scope": "", "state": "completed", "fence": 7, "attempt": 1,
            "created_at": "2026-01-01T00:00:00.000Z", "expires_at": "2026-01-02T00:00:00.000Z",
            "status": 201,
        });
        assert_eq!(
            record_line(&value),
            "k\tscope=-\tcompleted\tstatus=201\tfence=7\tattempt=1\tcreated=2026-01-01T00:00:00.000Z\texpires=2026-01-02T00:00:00.000Z"
        );
    }

    #[test]
    fn an_unreadable_record_is_one_line_saying_so() {
        let key = record_key("k-1", "tenant", ArgNames::FLAGS).unwrap();
        let named = UnreadableRecord::new("tenant/k-1", "unknown state").with_key(key);
        let value = unreadable_json(&named);
        assert_eq!(value["state"], "unreadable");
        assert_eq!(value["key"], "k-1");
        assert_eq!(value["scope"], "tenant");
        assert_eq!(value["stored_key"], "tenant/k-1");
        assert_eq!(
            record_line(&value),
            "k-1\tscope=tenant\tunreadable\treason=unknown state"
        );
        // Only the stored key known: it stands for the key, and odd bytes stay on the line.
        let stored = UnreadableRecord::new("\u{1}raw", "garbled\nmeta");
        let value = unreadable_json(&stored);
        assert_eq!(value["key"], Value::Null);
        assert_eq!(
            record_line(&value),
            "\\u{1}raw\tscope=?\tunreadable\treason=garbled\\nmeta"
        );
    }

    #[test]
    fn the_whole_record_is_rendered_from_the_json() {
        let value = json!({
            "key": "k", "scope": "", "state": "failed", "owner": "ab12", "fence": 7,
            "attempt": 2, "created_at": "2026-01-01T00:00:00.000Z",
            "lease_until": "2026-01-01T00:00:30.000Z", "completed_at": null,
            "expires_at": "2026-01-02T00:00:00.000Z", "status": null, "result_bytes": null,
            "failure": { "message": "card declined", "retryable": false },
            "fingerprint": "f00d",
        });
        assert_eq!(
            record_text(&value),
            "key: k\nscope: -\nstate: failed\nowner: ab12\nfence: 7\nattempt: 2\n\
             created_at: 2026-01-01T00:00:00.000Z\nlease_until: 2026-01-01T00:00:30.000Z\n\
             completed_at: -\nexpires_at: 2026-01-02T00:00:00.000Z\nstatus: -\n\
             result_bytes: -\nfailure: card declined (permanent)\nfingerprint: f00d"
        );
    }

    #[test]
    fn filters_are_checked_with_the_names_of_their_caller() {
        let query = scan_query(Some("in_flight"), Some("10m"), 1000, ArgNames::FLAGS).unwrap();
        assert_eq!(query.state, Some(State::InFlight));
        assert_eq!(query.limit, ScanQuery::DEFAULT_LIMIT);
        let zero = scan_query(None, None, 0, ArgNames::PARAMS).unwrap_err();
        assert_eq!(zero.location(), Some("limit"), "{zero}");
        assert!(
            scan_query(Some("done"), None, 1, ArgNames::FLAGS)
                .unwrap_err()
                .to_string()
                .contains("--state")
        );
        assert!(
            scan_query(None, Some("soon"), 1, ArgNames::FLAGS)
                .unwrap_err()
                .to_string()
                .contains("--older-than")
        );
        assert!(record_key("bad\u{1}", "", ArgNames::FLAGS).is_err());
        let long = record_key("k", &"s".repeat(300), ArgNames::FLAGS)
            .unwrap_err()
            .to_string();
        assert!(
            long.contains("--scope") && long.contains("the scope is 300 bytes long"),
            "{long}"
        );
        let control = record_key("k", "a\u{7}", ArgNames::FLAGS)
            .unwrap_err()
            .to_string();
        assert!(control.contains("byte 1 of the scope is 0x07"), "{control}");
        // The key API names its query parameters instead.
        let state = scan_query(Some("bogus"), None, 1, ArgNames::PARAMS).unwrap_err();
        assert!(state.to_string().starts_with("state: "), "{state}");
        let age = scan_query(None, Some("soon"), 1, ArgNames::PARAMS).unwrap_err();
        assert!(age.to_string().starts_with("older_than: "), "{age}");
        let scope = record_key("k", "a\u{7}", ArgNames::PARAMS).unwrap_err();
        assert!(scope.to_string().starts_with("scope: "), "{scope}");
    }
}
