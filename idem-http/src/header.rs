//! The `Idempotency-Key` header parser.
//!
//! The value is an RFC 8941 sf-string (`"abc"`, with `\"` and `\\` as the only escapes). In
//! lenient mode (the default) a bare key (`abc`) is accepted as the same key. The key inside is
//! 1 to 255 bytes of printable ASCII ([`idem_core::IdempotencyKey`]'s rules).
//!
//! Refused, each with its own [`KeyHeaderError`]: an empty value, a key over 255 bytes, a control
//! or non-ASCII byte, two field lines of the header, a list (`"a", "b"`), parameters
//! (`"a";p=1`), a broken sf-string, and in strict mode a bare key. A bare key is printable ASCII
//! without spaces, double quotes, backslashes, commas or semicolons (those need the quoted form).
//!
//! ```
//! use idem_http::header::{parse_value, KeyHeaderError};
//!
//! assert_eq!(parse_value(br#""order-7""#, false).unwrap().as_str(), "order-7");
//! assert_eq!(parse_value(b"order-7", false).unwrap().as_str(), "order-7");
//! assert_eq!(parse_value(b"order-7", true), Err(KeyHeaderError::NotAString));
//! assert_eq!(parse_value(br#""a", "b""#, false), Err(KeyHeaderError::List));
//! assert_eq!(parse_value(b"", false), Err(KeyHeaderError::Empty));
//! ```

use std::fmt;

use http::{HeaderMap, HeaderName};
use idem_core::{IdempotencyKey, KeyError, MAX_KEY_LEN};

/// The longest raw header value looked at: a quoted key of 255 escaped bytes, its quotes and
/// some whitespace. Anything longer is refused without being scanned.
const MAX_RAW_LEN: usize = 2 * MAX_KEY_LEN + 2 + 16;

/// Why an `Idempotency-Key` header was refused (answered with 400).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The value (or the string inside the quotes) is empty.
    Empty,
    /// The key is longer than 255 bytes.
    TooLong {
        /// The length found, in bytes (of the raw value when it is far too long to parse).
        len: usize,
    },
    /// A control byte or a non-ASCII byte.
    InvalidByte {
        /// The byte found.
        byte: u8,
        /// Its position in the header value, counting from 0.
        position: usize,
    },
    /// The header was sent on two or more field lines.
    MultipleFieldLines,
    /// The value is a list of several keys.
    List,
    /// The string carries RFC 8941 parameters, which this header does not take.
    Parameters,
    /// Strict mode: the value is not an sf-string (a bare key, or another kind of item).
    NotAString,
    /// The value is not a well-formed sf-string or bare key.
    Malformed {
        /// What is wrong.
        reason: &'static str,
    },
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyHeaderError::Empty => f.write_str("the key is empty: a key is 1 to 255 bytes"),
            KeyHeaderError::TooLong { len } => {
                write!(f, "the key is {len} bytes long: a key is at most 255 bytes")
            }
            KeyHeaderError::InvalidByte { byte, position } => write!(
                f,
                "byte {position} of the header is 0x{byte:02x}: a key holds only printable ASCII"
            ),
            KeyHeaderError::MultipleFieldLines => {
                f.write_str("the header was sent more than once: send exactly one key")
            }
            KeyHeaderError::List => f.write_str("the header holds a list: send exactly one key"),
            KeyHeaderError::Parameters => {
                f.write_str("the key carries parameters, which this header does not take")
            }
            KeyHeaderError::NotAString => {
                f.write_str(r#"the key must be a quoted string (RFC 8941 sf-string), like "abc""#)
            }
            KeyHeaderError::Malformed { reason } => write!(f, "malformed key: {reason}"),
        }
    }
}

impl std::error::Error for KeyHeaderError {}

impl From<KeyError> for KeyHeaderError {
    fn from(error: KeyError) -> Self {
        match error {
            KeyError::Empty => KeyHeaderError::Empty,
            KeyError::TooLong { len } => KeyHeaderError::TooLong { len },
            KeyError::InvalidByte { byte, position } => {
                KeyHeaderError::InvalidByte { byte, position }
            }
            _ => KeyHeaderError::Malformed {
                reason: "the key breaks the key rules",
            },
        }
    }
}

/// Finds the key header `name` in `headers`: `Ok(None)` when it is absent.
///
/// # Errors
/// [`KeyHeaderError`] if the header is sent twice or its value is refused by [`parse_value`].
pub fn parse_header(
    headers: &HeaderMap,
    name: &HeaderName,
    strict: bool,
) -> Result<Option<IdempotencyKey>, KeyHeaderError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyHeaderError::MultipleFieldLines);
    }
    parse_value(value.as_bytes(), strict).map(Some)
}

fn is_ows(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

fn is_printable(byte: u8) -> bool {
    (0x20..=0x7e).contains(&byte)
}

/// Parses one header value. `strict`: only the sf-string form is accepted.
///
/// Never panics, whatever the bytes.
///
/// # Errors
/// [`KeyHeaderError`] naming the rule the value breaks.
pub fn parse_value(raw: &[u8], strict: bool) -> Result<IdempotencyKey, KeyHeaderError> {
    if raw.len() > MAX_RAW_LEN {
        return Err(KeyHeaderError::TooLong { len: raw.len() });
    }
    let start = raw.iter().position(|&b| !is_ows(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|&b| !is_ows(b))
        .map_or(start, |i| i + 1);
    let value = raw.get(start..end).unwrap_or_default();
    match value.first() {
        None => Err(KeyHeaderError::Empty),
        Some(b'"') => parse_string(value, start),
        Some(_) if strict => {
            check_bytes(value, start)?;
            Err(KeyHeaderError::NotAString)
        }
        Some(_) => parse_bare(value, start),
    }
}

/// Rejects the first control or non-ASCII byte of `value` (which starts at `offset` in the
/// header).
fn check_bytes(value: &[u8], offset: usize) -> Result<(), KeyHeaderError> {
    match value.iter().position(|&b| !is_printable(b)) {
        Some(i) => Err(KeyHeaderError::InvalidByte {
            byte: value[i],
            position: offset + i,
        }),
        None => Ok(()),
    }
}

fn parse_bare(value: &[u8], offset: usize) -> Result<IdempotencyKey, KeyHeaderError> {
    check_bytes(value, offset)?;
    for &byte in value {
        match byte {
            b',' => return Err(KeyHeaderError::List),
            b';' => return Err(KeyHeaderError::Parameters),
            b' ' | b'"' | b'\\' => {
                return Err(KeyHeaderError::Malformed {
                    reason: "a bare key holds no spaces, quotes or backslashes: quote it",
                });
            }
            _ => {}
        }
    }
    Ok(IdempotencyKey::from_bytes(value)?)
}

/// Parses an sf-string starting at `value[0] == b'"'`, then checks that nothing but whitespace
/// follows it.
fn parse_string(value: &[u8], offset: usize) -> Result<IdempotencyKey, KeyHeaderError> {
    // The common case, a string without escapes and with nothing after it: the key is the
    // bytes between the quotes, taken without a copy.
    if let Some(inner) = value
        .strip_prefix(b"\"")
        .and_then(|rest| rest.strip_suffix(b"\""))
    {
        if !inner
            .iter()
            .any(|&b| b == b'"' || b == b'\\' || !is_printable(b))
        {
            return Ok(IdempotencyKey::from_bytes(inner)?);
        }
    }
    let mut key = Vec::with_capacity(value.len());
    let mut index = 1;
    let rest = loop {
        let Some(&byte) = value.get(index) else {
            return Err(KeyHeaderError::Malformed {
                reason: "the string has no closing quote",
            });
        };
        match byte {
            b'"' => break value.get(index + 1..).unwrap_or_default(),
            b'\\' => match value.get(index + 1) {
                Some(&escaped @ (b'"' | b'\\')) => {
                    key.push(escaped);
                    index += 2;
                    continue;
                }
                _ => {
                    return Err(KeyHeaderError::Malformed {
                        reason: r#"a backslash escapes only '"' or '\'"#,
                    });
                }
            },
            _ if !is_printable(byte) => {
                return Err(KeyHeaderError::InvalidByte {
                    byte,
                    position: offset + index,
                });
            }
            _ => key.push(byte),
        }
        index += 1;
    };
    let rest_start = rest.iter().position(|&b| !is_ows(b)).unwrap_or(rest.len());
    match rest.get(rest_start) {
        None => {}
        Some(b',') => return Err(KeyHeaderError::List),
        Some(b';') => return Err(KeyHeaderError::Parameters),
        Some(_) => {
            return Err(KeyHeaderError::Malformed {
                reason: "characters follow the closing quote",
            });
        }
    }
    Ok(IdempotencyKey::from_bytes(&key)?)
}

/// Serialises `key` as an sf-string: the form a client sends.
///
/// ```
/// use idem_core::IdempotencyKey;
/// use idem_http::header::{parse_value, to_sf_string};
///
/// let key = IdempotencyKey::new(r#"say "hi""#)?;
/// assert_eq!(to_sf_string(&key), r#""say \"hi\"""#);
/// assert_eq!(parse_value(to_sf_string(&key).as_bytes(), true), Ok(key));
/// # Ok::<(), idem_core::KeyError>(())
/// ```
#[must_use]
pub fn to_sf_string(key: &IdempotencyKey) -> String {
    let mut out = String::with_capacity(key.as_str().len() + 2);
    out.push('"');
    for c in key.as_str().chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &[u8], strict: bool) -> String {
        parse_value(raw, strict).unwrap().as_str().to_owned()
    }

    #[test]
    fn quoted_and_bare_are_the_same_key() {
        assert_eq!(ok(br#""abc""#, false), "abc");
        assert_eq!(ok(b"abc", false), "abc");
        assert_eq!(ok(br#"  "a b"  "#, true), "a b");
        assert_eq!(ok(br#""a\"b\\c""#, true), r#"a"b\c"#);
        assert_eq!(ok(br#""a,b""#, true), "a,b");
    }

    #[test]
    fn refusals_are_named() {
        assert_eq!(parse_value(b"", false), Err(KeyHeaderError::Empty));
        assert_eq!(parse_value(b"  ", false), Err(KeyHeaderError::Empty));
        assert_eq!(parse_value(br#""""#, false), Err(KeyHeaderError::Empty));
        let long = format!("\"{}\"", "a".repeat(256));
        assert_eq!(
            parse_value(long.as_bytes(), false),
            Err(KeyHeaderError::TooLong { len: 256 })
        );
        assert!(parse_value(format!("\"{}\"", "a".repeat(255)).as_bytes(), true).is_ok());
        assert_eq!(
            parse_value(&[b'a'; 4000], false),
            Err(KeyHeaderError::TooLong { len: 4000 })
        );
        assert_eq!(
            parse_value(b"\"a\tb\"", false),
            Err(KeyHeaderError::InvalidByte {
                byte: b'\t',
                position: 2
            })
        );
        assert_eq!(
            parse_value("é".as_bytes(), false),
            Err(KeyHeaderError::InvalidByte {
                byte: 0xc3,
                position: 0
            })
        );
        assert_eq!(
            parse_value(br#""a", "b""#, false),
            Err(KeyHeaderError::List)
        );
        assert_eq!(parse_value(b"a, b", false), Err(KeyHeaderError::List));
        assert_eq!(
            parse_value(br#""a";x=1"#, false),
            Err(KeyHeaderError::Parameters)
        );
        assert_eq!(parse_value(b"abc", true), Err(KeyHeaderError::NotAString));
        assert!(matches!(
            parse_value(br#""abc"#, false),
            Err(KeyHeaderError::Malformed { .. })
        ));
        assert!(matches!(
            parse_value(br#""a\b""#, false),
            Err(KeyHeaderError::Malformed { .. })
        ));
        assert!(matches!(
            parse_value(br#""a"b"#, false),
            Err(KeyHeaderError::Malformed { .. })
        ));
    }

    #[test]
    fn two_field_lines_are_refused() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(parse_header(&headers, &name, false), Ok(None));
        headers.append(&name, http::HeaderValue::from_static("\"a\""));
        assert!(parse_header(&headers, &name, false).is_ok_and(|k| k.is_some()));
        headers.append(&name, http::HeaderValue::from_static("\"a\""));
        assert_eq!(
            parse_header(&headers, &name, false),
            Err(KeyHeaderError::MultipleFieldLines)
        );
    }
}
