//! `Fingerprint` over 1 KiB, next to a bare SHA-256 of the same bytes (the floor: a fingerprint
//! is SHA-256 over length-prefixed parts).

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use idem_core::Fingerprint;
use sha2::{Digest, Sha256};

fn fingerprint_1kib(c: &mut Criterion) {
    let body: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    let mut group = c.benchmark_group("fingerprint_1KiB");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("fingerprint", |b| {
        b.iter(|| Fingerprint::of(&[black_box(&body)]));
    });
    group.bench_function("fingerprint_request", |b| {
        b.iter(|| Fingerprint::of(&[b"POST", b"/payments?currency=eur", black_box(&body)]));
    });
    group.bench_function("sha256_baseline", |b| {
        b.iter(|| Sha256::digest(black_box(&body)));
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    fingerprint_1kib(&mut criterion);
    criterion.final_summary();
}
