//! [`KeySource`]: where a request's idempotency key comes from when it is not the
//! `Idempotency-Key` header, as webhook senders send it: a header of their own
//! (`X-GitHub-Delivery`, `X-Shopify-Webhook-Id`, `webhook-id`), a query parameter, or a field
//! of the JSON body (Stripe's `"id": "evt_..."`) named by a JSON Pointer (RFC 6901, resolved by
//! serde_json). A source is a list of alternatives, the first one present wins; an alternative
//! is one part or several joined into one key (each part length-prefixed, so no two lists of
//! values make the same key).
//!
//! ```
//! use idem_http::key_source::{KeyPart, KeySource};
//!
//! // Stripe: the event id in the body.
//! let stripe = KeySource::one(KeyPart::json("/id")?);
//! let request = http::Request::post("/hooks/stripe").body(())?;
//! let (head, ()) = request.into_parts();
//! let body: serde_json::Value = serde_json::from_str(r#"{"id": "evt_1", "type": "charge"}"#)?;
//! let key = stripe.resolve(&head, Some(&body))?.expect("present");
//! assert_eq!(key.as_str(), "evt_1");
//!
//! // A vendor header, or else a query parameter.
//! let either = KeySource::one(KeyPart::header("x-event-id")?).or(KeySource::one(KeyPart::query("id")));
//! let request = http::Request::post("/hooks?id=42").body(())?;
//! let (head, ()) = request.into_parts();
//! assert_eq!(either.resolve(&head, None)?.expect("present").as_str(), "42");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use http::HeaderName;
use http::request::Parts;
use idem_core::{IdempotencyKey, KeyError};
use serde_json::Value;

/// One place a key (or a part of one) is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// A request header, its one value as sent.
    Header(HeaderName),
    /// A query parameter, percent-decoded (its first occurrence).
    Query(String),
    /// A field of the JSON body: a string, or a number as written.
    Json(JsonPointer),
}

impl KeyPart {
    /// A header part.
    ///
    /// # Errors
    /// [`KeySourceError::Config`] when `name` is not a header name.
    pub fn header(name: &str) -> Result<Self, KeySourceError> {
        HeaderName::try_from(name)
            .map(KeyPart::Header)
            .map_err(|_| KeySourceError::Config(format!("{name:?} is not a header name")))
    }

    /// A query parameter part.
    #[must_use]
    pub fn query(name: impl Into<String>) -> Self {
        KeyPart::Query(name.into())
    }

    /// A JSON body part.
    ///
    /// # Errors
    /// [`KeySourceError::Config`] when `pointer` is not an RFC 6901 JSON Pointer.
    pub fn json(pointer: &str) -> Result<Self, KeySourceError> {
        JsonPointer::new(pointer).map(KeyPart::Json)
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Header(name) => write!(f, "the {name} header"),
            KeyPart::Query(name) => write!(f, "the query parameter {name:?}"),
            KeyPart::Json(pointer) => write!(f, "the JSON field {:?}", pointer.0),
        }
    }
}

/// An RFC 6901 JSON Pointer: empty (the whole document) or `/`-separated reference tokens in
/// which `~` is only ever `~0` or `~1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonPointer(String);

impl JsonPointer {
    /// A pointer, checked.
    ///
    /// # Errors
    /// [`KeySourceError::Config`] naming what is wrong.
    pub fn new(pointer: &str) -> Result<Self, KeySourceError> {
        let bad =
            |why: &str| KeySourceError::Config(format!("{pointer:?} is not a JSON Pointer: {why}"));
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return Err(bad("it starts with /"));
        }
        let mut chars = pointer.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(bad("~ is written ~0, and / in a name ~1"));
            }
        }
        Ok(JsonPointer(pointer.to_owned()))
    }

    /// The pointer as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a request's key comes from: alternatives, the first one whose parts are all present
/// wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySource {
    alternatives: Vec<Vec<KeyPart>>,
}

/// Why a key could not be taken from a request, or a source not built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeySourceError {
    /// A source that cannot be built (a bad header name or JSON Pointer).
    #[error("{0}")]
    Config(String),
    /// A part is present but cannot be a key part: a header sent twice or not text, a JSON
    /// field that is not a string or a number.
    #[error("{part}: {why}")]
    Unusable {
        /// The part, as [`KeyPart`] displays it.
        part: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The key taken is not a valid key (too long, a byte that is not printable ASCII).
    #[error("the key from {from}: {error}")]
    Invalid {
        /// Where it came from.
        from: String,
        /// The key rule it breaks.
        error: KeyError,
    },
}

impl KeySource {
    /// A source of one part.
    #[must_use]
    pub fn one(part: KeyPart) -> Self {
        KeySource {
            alternatives: vec![vec![part]],
        }
    }

    /// A source whose key is all of `parts`, joined (each value length-prefixed: `5:evt_1`,
    /// then `/` and the next).
    ///
    /// # Errors
    /// [`KeySourceError::Config`] for no parts.
    pub fn all(parts: impl IntoIterator<Item = KeyPart>) -> Result<Self, KeySourceError> {
        let parts: Vec<KeyPart> = parts.into_iter().collect();
        if parts.is_empty() {
            return Err(KeySourceError::Config("a key made of no parts".to_owned()));
        }
        Ok(KeySource {
            alternatives: vec![parts],
        })
    }

    /// This source, or else `other` when this one is absent.
    #[must_use]
    pub fn or(mut self, other: KeySource) -> Self {
        self.alternatives.extend(other.alternatives);
        self
    }

    /// Whether a part reads the body (the body must then be read, and be JSON, first).
    #[must_use]
    pub fn needs_body(&self) -> bool {
        self.alternatives
            .iter()
            .flatten()
            .any(|part| matches!(part, KeyPart::Json(_)))
    }

    /// The key of a request with head `head` and, where the source reads it, its body parsed
    /// as JSON (`None`: no JSON body; a JSON part is then absent). `Ok(None)`: no alternative is
    /// present, as for a request without a key.
    ///
    /// # Errors
    /// [`KeySourceError::Unusable`] or [`KeySourceError::Invalid`] for a part present but not
    /// a key (a present part that is wrong is an error, never a fall-through to the next
    /// alternative).
    pub fn resolve(
        &self,
        head: &Parts,
        body: Option<&Value>,
    ) -> Result<Option<IdempotencyKey>, KeySourceError> {
        'alternatives: for parts in &self.alternatives {
            let mut values = Vec::with_capacity(parts.len());
            for part in parts {
                match value_of(part, head, body)? {
                    Some(value) => values.push(value),
                    None => continue 'alternatives,
                }
            }
            let text = match values.as_slice() {
                [one] => one.clone(),
                many => many
                    .iter()
                    .map(|value| format!("{}:{value}", value.len()))
                    .collect::<Vec<_>>()
                    .join("/"),
            };
            return IdempotencyKey::new(&text)
                .map(Some)
                .map_err(|error| KeySourceError::Invalid {
                    from: describe(parts),
                    error,
                });
        }
        Ok(None)
    }
}

impl fmt::Display for KeySource {
    /// What a client is told a key is taken from: `the X-GitHub-Delivery header, or the
    /// query parameter "id"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let described: Vec<String> = self.alternatives.iter().map(|p| describe(p)).collect();
        f.write_str(&described.join(", or "))
    }
}

fn describe(parts: &[KeyPart]) -> String {
    let parts: Vec<String> = parts.iter().map(ToString::to_string).collect();
    parts.join(" with ")
}

/// The value of one part in a request, if present.
fn value_of(
    part: &KeyPart,
    head: &Parts,
    body: Option<&Value>,
) -> Result<Option<String>, KeySourceError> {
    let unusable = |why| KeySourceError::Unusable {
        part: part.to_string(),
        why,
    };
    match part {
        KeyPart::Header(name) => {
            let mut values = head.headers.get_all(name).iter();
            let Some(value) = values.next() else {
                return Ok(None);
            };
            if values.next().is_some() {
                return Err(unusable("sent more than once"));
            }
            let text = value.to_str().map_err(|_| unusable("not text"))?.trim();
            Ok((!text.is_empty()).then(|| text.to_owned()))
        }
        KeyPart::Query(name) => {
            let query = head.uri.query().unwrap_or("");
            Ok(form_urlencoded::parse(query.as_bytes())
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
                .filter(|value| !value.is_empty()))
        }
        KeyPart::Json(pointer) => match body.and_then(|body| body.pointer(pointer.as_str())) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.is_empty() => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(Value::Number(number)) => Ok(Some(number.to_string())),
            Some(_) => Err(unusable("not a string or a number")),
        },
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn head(uri: &str, headers: &[(&'static str, &str)]) -> Parts {
        let mut request = http::Request::post(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_first_present_alternative_wins_and_a_present_bad_part_is_an_error() {
        let source = KeySource::one(KeyPart::header("x-github-delivery").unwrap())
            .or(KeySource::one(KeyPart::json("/id").unwrap()));
        let body = serde_json::json!({"id": "evt_9", "data": [1, 2]});
        let plain = head("/", &[]);
        assert_eq!(
            source
                .resolve(&plain, Some(&body))
                .unwrap()
                .unwrap()
                .as_str(),
            "evt_9"
        );
        let github = head("/", &[("x-github-delivery", "d-1")]);
        assert_eq!(
            source
                .resolve(&github, Some(&body))
                .unwrap()
                .unwrap()
                .as_str(),
            "d-1"
        );
        assert_eq!(source.resolve(&plain, None).unwrap(), None);
        let twice = head(
            "/",
            &[("x-github-delivery", "a"), ("x-github-delivery", "b")],
        );
        assert!(matches!(
            source.resolve(&twice, Some(&body)),
            Err(KeySourceError::Unusable { .. })
        ));
        let into_array = KeySource::one(KeyPart::json("/data").unwrap());
        assert!(matches!(
            into_array.resolve(&plain, Some(&body)),
            Err(KeySourceError::Unusable { .. })
        ));
        let element = KeySource::one(KeyPart::json("/data/1").unwrap());
        assert_eq!(
            element
                .resolve(&plain, Some(&body))
                .unwrap()
                .unwrap()
                .as_str(),
            "2"
        );
        assert_eq!(
            source.to_string(),
            "the x-github-delivery header, or the JSON field \"/id\""
        );
    }

    #[test]
    fn several_parts_make_one_key_that_no_other_values_make() {
        let source = KeySource::all([KeyPart::query("a"), KeyPart::json("/b").unwrap()]).unwrap();
        let body = serde_json::json!({"b": "c"});
        let key = source
            .resolve(&head("/?a=x%2Fy", &[]), Some(&body))
            .unwrap()
            .unwrap();
        assert_eq!(key.as_str(), "3:x/y/1:c");
        let other = serde_json::json!({"b": "y/1:c"});
        let shifted = source
            .resolve(&head("/?a=x", &[]), Some(&other))
            .unwrap()
            .unwrap();
        assert_ne!(key, shifted);
        // One part absent: the whole alternative is.
        assert_eq!(source.resolve(&head("/", &[]), Some(&body)).unwrap(), None);
    }

    #[test]
    fn keys_over_the_limit_and_bad_pointers_are_refused() {
        let source = KeySource::one(KeyPart::json("/id").unwrap());
        let long = serde_json::json!({"id": "x".repeat(300)});
        assert!(matches!(
            source.resolve(&head("/", &[]), Some(&long)),
            Err(KeySourceError::Invalid { .. })
        ));
        for bad in ["id", "/a~2", "/a~"] {
            assert!(KeyPart::json(bad).is_err(), "{bad}");
        }
        for good in ["", "/", "/a~0b/c~1d", "/0"] {
            assert!(KeyPart::json(good).is_ok(), "{good}");
        }
        assert!(KeyPart::header("bad header").is_err());
        assert!(KeySource::all([]).is_err());
    }

    proptest! {
        /// Any query, header value and body resolve to a key, nothing, or an error: never a
        /// panic, and a key is always a valid one.
        #[test]
        fn any_request_resolves_without_a_panic(
            query in "[a-z=&%0-9A-F]{0,40}",
            value in "[ -~]{0,40}",
            body in ".{0,60}",
        ) {
            let source = KeySource::one(KeyPart::header("x-id").unwrap())
                .or(KeySource::one(KeyPart::query("id")))
                .or(KeySource::all([KeyPart::json("/a/0").unwrap(), KeyPart::json("/b").unwrap()]).unwrap());
            let Ok(uri) = http::Uri::try_from(format!("/?{query}")) else { return Ok(()); };
            let mut request = http::Request::post(uri);
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                request = request.header("x-id", value);
            }
            let (parts, ()) = request.body(()).unwrap().into_parts();
            let json: Option<Value> = serde_json::from_str(&body).ok();
            if let Ok(Some(key)) = source.resolve(&parts, json.as_ref()) {
                prop_assert!(IdempotencyKey::new(key.as_str()).is_ok());
            }
        }
    }
}
