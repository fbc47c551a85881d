//! Property tests of the `Idempotency-Key` parser. Failing cases are kept in
//! `key_header_props.regressions` beside this file (commit it when it appears).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_core::IdempotencyKey;
use idem_http::header::{KeyHeaderError, parse_value, to_sf_string};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// A valid key: 1 to 255 bytes of printable ASCII.
fn key() -> impl Strategy<Value = String> {
    "[ -~]{1,255}"
}

/// A key that may be sent bare: no space, quote, backslash, comma or semicolon.
fn bare_key() -> impl Strategy<Value = String> {
    "[!#-+\\--:<-\\[\\]-~]{1,255}"
}

fn ows() -> impl Strategy<Value = String> {
    "[ \t]{0,3}"
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_panics_and_accepts_only_valid_keys(raw in proptest::collection::vec(any::<u8>(), 0..600), strict in any::<bool>()) {
        if let Ok(key) = parse_value(&raw, strict) {
            let len = key.as_str().len();
            prop_assert!((1..=255).contains(&len));
            prop_assert!(key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
        }
    }

    #[test]
    fn every_key_round_trips_as_an_sf_string(key in key(), before in ows(), after in ows(), strict in any::<bool>()) {
        let key = IdempotencyKey::new(&key).unwrap();
        let value = format!("{before}{}{after}", to_sf_string(&key));
        prop_assert_eq!(parse_value(value.as_bytes(), strict), Ok(key));
    }

    #[test]
    fn a_bare_key_is_the_same_key_unless_strict(key in bare_key(), before in ows(), after in ows()) {
        let value = format!("{before}{key}{after}");
        let parsed = parse_value(value.as_bytes(), false).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
        let quoted = to_sf_string(&IdempotencyKey::new(&key).unwrap());
        prop_assert_eq!(parse_value(value.as_bytes(), false), parse_value(quoted.as_bytes(), true));
        prop_assert_eq!(parse_value(value.as_bytes(), true), Err(KeyHeaderError::NotAString));
    }

    #[test]
    fn a_list_is_refused(a in "[ -~]{1,120}", b in "[ -~]{1,120}", sep in "[ \t]{0,2},[ \t]{0,2}", strict in any::<bool>()) {
        let value = format!(
            "{}{sep}{}",
            to_sf_string(&IdempotencyKey::new(&a).unwrap()),
            to_sf_string(&IdempotencyKey::new(&b).unwrap())
        );
        prop_assert_eq!(parse_value(value.as_bytes(), strict), Err(KeyHeaderError::List));
    }

    #[test]
    fn a_key_over_255_bytes_is_refused(len in 256usize..2_000, strict in any::<bool>()) {
        let value = format!("\"{}\"", "k".repeat(len));
        let refused = parse_value(value.as_bytes(), strict);
        prop_assert!(matches!(refused, Err(KeyHeaderError::TooLong { .. })), "{:?}", refused);
    }

    #[test]
    fn a_control_or_non_ascii_byte_is_refused_where_it_stands(
        key in "[a-z]{1,100}",
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![0u8..0x20, Just(0x7f), 0x80u8..=0xff],
        strict in any::<bool>(),
    ) {
        let mut value = format!("\"{key}\"").into_bytes();
        let position = 1 + at.index(key.len());
        value[position] = byte;
        let refused = parse_value(&value, strict);
        prop_assert_eq!(refused, Err(KeyHeaderError::InvalidByte { byte, position }));
    }
}
