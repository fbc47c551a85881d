//! [`NormalPath`]: the normal form of a request path, the form routes are matched against (as
//! nginx matches its locations), so that another spelling of a path cannot slip past the route
//! that covers it: `//payments`, `/./payments`, `/x/../payments` and `/%70ayments` are all
//! `/payments`, which an upstream that normalises paths serves as `/payments`.
//!
//! The normal form, in order:
//! 1. percent-escapes of unreserved characters (`A`-`Z`, `a`-`z`, `0`-`9`, `-`, `.`, `_`, `~`)
//!    are decoded; the other escapes stay encoded, their hex in upper case (`%2f` is `%2F`, and
//!    never a `/`); a `%` that starts no escape, and any byte that is not printable ASCII, are
//!    escaped (`%25`, `%C3%A9`);
//! 2. runs of `/` are one `/`;
//! 3. `.` segments are removed and `..` segments resolved (RFC 3986, 5.2.4); a `..` that would
//!    climb above the root is [`PathError::AboveRoot`] (the gateway answers 400, as nginx does).
//!
//! A trailing `/` is kept in the normal form; [`NormalPath::for_matching`] drops it, since
//! routes ignore it. Case is kept: a route folds it when it says so
//! ([`RoutePath`](crate::config::RoutePath)). Nothing else makes two paths one: `/a;x`,
//! `/a.json` and `/a%2F7` are other segments than `a`. Only the route is chosen with the normal
//! form: the request goes to the upstream as it came, and its fingerprint is over the path as
//! sent.

use std::borrow::Cow;
use std::fmt;

/// Why a path has no normal form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PathError {
    /// The path does not start with `/`: the request target `*` (`OPTIONS *`), or the
    /// authority of a `CONNECT`. No route covers it.
    #[error("the request target has no path that starts with /")]
    NotAbsolute,
    /// A `..` segment climbs above the root (`/../x`, `/a/../../x`, `/%2E%2E/x`).
    #[error("a .. segment of the path climbs above the root")]
    AboveRoot,
    /// The path is spelled in a way upstreams resolve differently ([`unambiguous`]).
    #[error("the path has {0}, which servers resolve differently")]
    Ambiguous(Ambiguity),
}

/// A spelling of a path that servers behind the gateway may resolve to another path than its
/// normal form: Tomcat and Spring drop the `;` parameters of a segment before they resolve
/// `/x/..;/payments` (to `/payments`), Windows and some frameworks take `\` for `/`, some
/// decode `%2F` before routing, a C string ends at `%00`, and an encoded dot is decoded before
/// or after dot segments are resolved, depending on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Ambiguity {
    /// A `\`.
    #[error("a backslash")]
    Backslash,
    /// `%5C`.
    #[error("an encoded backslash (%5C)")]
    EncodedBackslash,
    /// `%2F`.
    #[error("an encoded slash (%2F)")]
    EncodedSlash,
    /// `%2E`.
    #[error("an encoded dot (%2E)")]
    EncodedDot,
    /// `%00`.
    #[error("an encoded NUL (%00)")]
    Nul,
    /// A `.` or `..` segment with `;` parameters (`..;`, `.;x=1`).
    #[error("a dot segment with ; parameters")]
    DotParameters,
}

/// Checks that `path` has no spelling that servers resolve differently ([`Ambiguity`]): the
/// gateway refuses those (unless `[server] allow_ambiguous_paths` says otherwise), since a
/// route chosen by the normal form could then cover another path than the upstream serves.
/// Most paths have neither `%`, `\` nor `;`, and are checked in one pass over their bytes.
///
/// # Errors
/// [`PathError::Ambiguous`], naming the first ambiguity found.
pub(crate) fn unambiguous(path: &str) -> Result<(), PathError> {
    let bytes = path.as_bytes();
    if !bytes.iter().any(|b| matches!(b, b'%' | b'\\' | b';')) {
        return Ok(());
    }
    let ambiguity = |found| Err(PathError::Ambiguous(found));
    for (at, byte) in bytes.iter().enumerate() {
        match byte {
            b'\\' => return ambiguity(Ambiguity::Backslash),
            b'%' => {
                let hi = bytes.get(at + 1).copied().and_then(hex_value);
                let lo = bytes.get(at + 2).copied().and_then(hex_value);
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    match (hi << 4) | lo {
                        b'\\' => return ambiguity(Ambiguity::EncodedBackslash),
                        b'/' => return ambiguity(Ambiguity::EncodedSlash),
                        b'.' => return ambiguity(Ambiguity::EncodedDot),
                        0 => return ambiguity(Ambiguity::Nul),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    for segment in path.split('/') {
        if let Some((name, _parameters)) = segment.split_once(';') {
            if matches!(name, "." | "..") {
                return ambiguity(Ambiguity::DotParameters);
            }
        }
    }
    Ok(())
}

/// A path in normal form (see the [module](self)). Borrows the path when it is normal already,
/// as most are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NormalPath<'a>(Cow<'a, str>);

impl<'a> NormalPath<'a> {
    /// The normal form of `path` (a request path, without the query). Never panics.
    ///
    /// # Errors
    /// [`PathError::NotAbsolute`] when `path` does not start with `/`;
    /// [`PathError::AboveRoot`] when a `..` segment climbs above the root.
    pub(crate) fn new(path: &'a str) -> Result<Self, PathError> {
        if !path.starts_with('/') {
            return Err(PathError::NotAbsolute);
        }
        if is_normal(path) {
            return Ok(NormalPath(Cow::Borrowed(path)));
        }
        resolve(&decode(path)).map(|path| NormalPath(Cow::Owned(path)))
    }

    /// The normal form.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The form routes match: without a trailing `/` (the root stays `/`).
    #[must_use]
    pub(crate) fn for_matching(&self) -> &str {
        match self.0.strip_suffix('/') {
            Some(trimmed) if !trimmed.is_empty() => trimmed,
            _ => &self.0,
        }
    }
}

impl fmt::Display for NormalPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `path` (starting with `/`) is its own normal form: printable ASCII without `%`, no
/// empty segment but a trailing one, no `.` or `..` segment. The common case, checked without
/// allocating.
fn is_normal(path: &str) -> bool {
    if !path
        .bytes()
        .all(|b| b != b'%' && (0x21..=0x7e).contains(&b))
    {
        return false;
    }
    let mut segments = path.strip_prefix('/').unwrap_or(path).split('/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if matches!(segment, "." | "..") || segment.is_empty() && !last {
            return false;
        }
    }
    true
}

/// Whether `octet` is an unreserved character of RFC 3986 (2.3): its escape means the same as
/// the character itself.
fn unreserved(octet: u8) -> bool {
    octet.is_ascii_alphanumeric() || matches!(octet, b'-' | b'.' | b'_' | b'~')
}

/// The value of an ASCII hex digit.
fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// Appends the escape of `octet`, hex in upper case.
fn push_escape(out: &mut String, octet: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(octet >> 4)]));
    out.push(char::from(HEX[usize::from(octet & 0x0f)]));
}

/// Step 1 of the normal form: unreserved characters decoded, every other escape in upper case,
/// a stray `%` and bytes that are not printable ASCII escaped. The result is printable ASCII;
/// no `/` is made from an escape.
pub(crate) fn decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        if byte == b'%' {
            let hi = bytes.get(i + 1).copied().and_then(hex_value);
            let lo = bytes.get(i + 2).copied().and_then(hex_value);
            if let (Some(hi), Some(lo)) = (hi, lo) {
                let octet = (hi << 4) | lo;
                if unreserved(octet) {
                    out.push(char::from(octet));
                } else {
                    push_escape(&mut out, octet);
                }
                i += 3;
                continue;
            }
            // A `%` that starts no escape stands for itself. Escaped, it cannot combine with
            // what follows into an escape on a second pass.
            push_escape(&mut out, byte);
        } else if (0x21..=0x7e).contains(&byte) {
            out.push(char::from(byte));
        } else {
            push_escape(&mut out, byte);
        }
        i += 1;
    }
    out
}

/// Steps 2 and 3 of the normal form, over a decoded path that starts with `/`: runs of `/`
/// merged, `.` segments removed, `..` segments resolved. A path that ends in `/`, `/.` or `/..`
/// keeps a trailing `/` (RFC 3986, 5.2.4).
fn resolve(decoded: &str) -> Result<String, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing = false;
    for segment in decoded.strip_prefix('/').unwrap_or(decoded).split('/') {
        match segment {
            "" | "." => trailing = true,
            ".." => {
                kept.pop().ok_or(PathError::AboveRoot)?;
                trailing = true;
            }
            _ => {
                kept.push(segment);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if trailing || out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn normal(path: &str) -> String {
        NormalPath::new(path).unwrap().as_str().to_owned()
    }

    #[test]
    fn other_spellings_of_a_path_are_one_path() {
        for spelling in [
            "/payments",
            "//payments",
            "///payments",
            "/./payments",
            "/x/../payments",
            "/x/y/../../payments",
            "/%70ayments",
            "/%70%61%79ments",
            "/x/%2E%2E/payments",
            "/x/%2e./payments",
            "/%2e/payments",
        ] {
            assert_eq!(normal(spelling), "/payments", "{spelling}");
        }
    }

    #[test]
    fn reserved_escapes_stay_encoded_in_upper_case() {
        assert_eq!(normal("/a%2fb"), "/a%2Fb");
        assert_eq!(normal("/a%2Fb"), "/a%2Fb");
        assert_eq!(normal("/a%3bb%3D"), "/a%3Bb%3D");
        assert_eq!(normal("/%41%7a%30%2D%2e%5F%7E"), "/Az0-._~");
        assert_eq!(normal("/a%20b"), "/a%20b");
        // %2F is not a separator: it neither merges with / nor makes a segment.
        assert_eq!(normal("/a/%2F/b"), "/a/%2F/b");
        assert_eq!(normal("/a/%2F/.."), "/a/");
    }

    #[test]
    fn stray_percents_and_other_bytes_are_escaped() {
        assert_eq!(normal("/100%"), "/100%25");
        assert_eq!(normal("/a%zz"), "/a%25zz");
        assert_eq!(normal("/a%4"), "/a%254");
        // Escaping the stray % keeps it from making an escape with what a decode brings next
        // to it (a second pass would otherwise decode "%41").
        assert_eq!(normal("/%4%31"), "/%2541");
        assert_eq!(normal("/café"), "/caf%C3%A9");
        assert_eq!(normal("/a b\t"), "/a%20b%09");
    }

    #[test]
    fn dot_segments_are_resolved_as_rfc_3986_says() {
        assert_eq!(normal("/a/b/c/./../../g"), "/a/g");
        assert_eq!(normal("/mid/content=5/../6"), "/mid/6");
        assert_eq!(normal("/a/b/.."), "/a/");
        assert_eq!(normal("/a/b/."), "/a/b/");
        assert_eq!(normal("/a/.."), "/");
        assert_eq!(normal("/."), "/");
        assert_eq!(normal("/"), "/");
        assert_eq!(normal("/a/"), "/a/");
        assert_eq!(normal("/a//"), "/a/");
        assert_eq!(normal("/..a/b../.../c"), "/..a/b../.../c");
    }

    #[test]
    fn climbing_above_the_root_has_no_normal_form() {
        for path in [
            "/..",
            "/../",
            "/../echo",
            "/a/../../echo",
            "//..//echo",
            "/%2E%2E/echo",
            "/.%2e/echo",
        ] {
            assert_eq!(NormalPath::new(path), Err(PathError::AboveRoot), "{path}");
        }
        for path in ["*", "", "payments", "%2Fpayments"] {
            assert_eq!(NormalPath::new(path), Err(PathError::NotAbsolute), "{path}");
        }
    }

    #[test]
    fn a_normal_path_is_borrowed_and_matches_without_its_trailing_slash() {
        for path in ["/", "/payments", "/payments/", "/v1/a.b/..c/~x/"] {
            let normal = NormalPath::new(path).unwrap();
            assert!(matches!(normal.0, Cow::Borrowed(_)), "{path}");
            assert_eq!(normal.as_str(), path);
        }
        assert_eq!(NormalPath::new("/").unwrap().for_matching(), "/");
        assert_eq!(NormalPath::new("/a/").unwrap().for_matching(), "/a");
        assert_eq!(NormalPath::new("/a//").unwrap().for_matching(), "/a");
        assert_eq!(NormalPath::new("/a/b").unwrap().for_matching(), "/a/b");
    }

    #[test]
    fn spellings_servers_resolve_differently_are_ambiguous() {
        for (path, found) in [
            ("/x/..;/payments", Ambiguity::DotParameters),
            ("/x/.;a=1/payments", Ambiguity::DotParameters),
            ("/\\payments", Ambiguity::Backslash),
            ("/payments\\", Ambiguity::Backslash),
            ("/payments%5C", Ambiguity::EncodedBackslash),
            ("/payments%5c", Ambiguity::EncodedBackslash),
            ("/payments%00", Ambiguity::Nul),
            ("/payments%2E", Ambiguity::EncodedDot),
            ("/x/%2e%2e/payments", Ambiguity::EncodedDot),
            ("/%2Fpayments", Ambiguity::EncodedSlash),
            ("/a%2fb", Ambiguity::EncodedSlash),
        ] {
            assert_eq!(
                unambiguous(path),
                Err(PathError::Ambiguous(found)),
                "{path}"
            );
        }
        for path in [
            "/payments",
            "/payments;v=1",
            "/a;b/c",
            "/..a;/b",
            "/%70ayments",
            "/a%20b",
            "/100%",
            "/%zz",
            "/x/../payments",
        ] {
            assert_eq!(unambiguous(path), Ok(()), "{path}");
        }
    }

    /// Paths made of the pieces that normalisation is about.
    fn tricky_path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("%".to_owned()),
            Just("%2e".to_owned()),
            Just("%2E".to_owned()),
            Just("%2f".to_owned()),
            Just("%41".to_owned()),
            Just("%4".to_owned()),
            "[a-z0-9]{1,3}",
            "%[0-9a-fA-F]{2}",
            any::<char>().prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..16).prop_map(|pieces| format!("/{}", pieces.concat()))
    }

    proptest! {
        #[test]
        fn normalisation_is_idempotent(path in tricky_path()) {
            if let Ok(once) = NormalPath::new(&path) {
                let twice = NormalPath::new(once.as_str()).unwrap();
                prop_assert_eq!(twice.as_str(), once.as_str());
            }
        }

        #[test]
        fn normalisation_never_panics_and_starts_with_a_slash(path in any::<String>()) {
            for candidate in [path.clone(), format!("/{path}")] {
                if let Ok(normal) = NormalPath::new(&candidate) {
                    prop_assert!(normal.as_str().starts_with('/'));
                    prop_assert!(normal.for_matching().starts_with('/'));
                    prop_assert!(normal.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
                }
            }
        }

        #[test]
        fn the_ambiguity_check_never_panics(path in any::<String>()) {
            let _ = unambiguous(&path);
        }

        #[test]
        fn the_borrowed_fast_path_agrees_with_the_full_one(path in tricky_path()) {
            let full = resolve(&decode(&path));
            prop_assert_eq!(NormalPath::new(&path).map(|p| p.as_str().to_owned()), full);
        }
    }
}
