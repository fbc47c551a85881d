//! Fuzzes the stored-response decoder: a corrupt or foreign record must be an error, never a
//! panic, and what decodes must encode and decode to the same response.
#![no_main]

use bytes::Bytes;
use idem_http::codec::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(response) = decode(&Bytes::copy_from_slice(data)) {
        assert_eq!(decode(&encode(&response)), Ok(response));
    }
});
