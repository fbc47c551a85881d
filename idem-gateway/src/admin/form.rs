//! The small text codecs of the admin listener: percent-encoding of URL parts, query strings
//! and `application/x-www-form-urlencoded` bodies, cookies, and HTML escaping. Written out
//! here (a few dozen lines) rather than adding crates to the tree.

use std::fmt::Write as _;

/// Percent-encodes `text` for a URL path segment or a query value: everything but
/// `A-Z a-z 0-9 - . _ ~` is escaped.
#[must_use]
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Decodes percent escapes (and `+` as a space when `plus` is set); `None` for a broken
/// escape or text that is not UTF-8.
#[must_use]
pub fn decode(text: &str, plus: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let high = hex(*bytes.get(i + 1)?)?;
                let low = hex(*bytes.get(i + 2)?)?;
                out.push(high << 4 | low);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The pairs of a query string or a form body (`a=1&b=two+words`); undecodable pairs are
/// dropped.
#[must_use]
pub fn pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(name, true)?, decode(value, true)?))
        })
        .collect()
}

/// The first value of `name` among `pairs`.
#[must_use]
pub fn value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The value of cookie `name` in a `Cookie` header.
#[must_use]
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|part| {
        let (n, v) = part.trim().split_once('=')?;
        (n == name).then_some(v)
    })
}

/// Escapes `text` for HTML text and attribute values.
#[must_use]
pub fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn encoding_round_trips() {
        for text in ["plain", "a b/c?d&e=f%g+h", "<script>\"'", "é"] {
            assert_eq!(decode(&encode(text), false).unwrap(), text);
        }
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(decode("%zz", false), None);
        assert_eq!(decode("%4", false), None);
    }

    #[test]
    fn forms_cookies_and_html() {
        let form = pairs("key=a+b%26c&scope=&csrf=x%3D");
        assert_eq!(value(&form, "key"), Some("a b&c"));
        assert_eq!(value(&form, "scope"), Some(""));
        assert_eq!(value(&form, "csrf"), Some("x="));
        assert_eq!(value(&form, "missing"), None);
        assert_eq!(cookie("a=1; idem_session=xyz", "idem_session"), Some("xyz"));
        assert_eq!(cookie("a=1", "idem_session"), None);
        assert_eq!(
            html("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
