//! A small payments API behind the idem idempotency layer (being built).

fn main() {}
