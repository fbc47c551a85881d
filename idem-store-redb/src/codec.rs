//! The on-disk encoding of keys and records: idem-core's binary record format
//! ([`idem_core::codec`]), which the Redis store's values share.

pub(crate) use idem_core::codec::{
    FORMAT, decode_key, decode_record, encode_key, encode_record, expires_at, fence,
};
