//! Fuzzes the `Idempotency-Key` parser: it must never panic, and whatever it accepts must be a
//! valid key that round-trips through its sf-string form.
#![no_main]

use idem_http::header::{parse_value, to_sf_string};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (strict, raw) = match data.split_first() {
        Some((first, rest)) => (first & 1 == 1, rest),
        None => (false, data),
    };
    if let Ok(key) = parse_value(raw, strict) {
        let text = key.as_str();
        assert!((1..=255).contains(&text.len()));
        assert!(text.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        let again = parse_value(to_sf_string(&key).as_bytes(), true);
        assert_eq!(again.as_ref(), Ok(&key));
    }
});
