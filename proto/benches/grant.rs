//! Cost of the data-plane grant check (hardening finding 7, `proto/src/grant.rs`) beside what it
//! guards: the holder verifies one MAC per slice, metad signs one per extent it hands out.
//!
//! * `verify`: what a holder does per slice (one blake3 keyed hash of 66 bytes and a compare);
//! * `sign`: what metad does per extent of a replica in a reservation or placement;
//! * `ceiling_hash_4KiB_slice`: the object checksum of a 4 KiB slice (the smallest a get moves),
//!   the per-slice work the data plane did before grants, for scale.
//!
//! Run: `cargo bench -p regolith-proto --bench grant`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use regolith_proto::checksum::{hash_chunks, seed};
use regolith_proto::dataplane::Kind;
use regolith_proto::grant::{MasterKey, Scope};

fn grants(c: &mut Criterion) {
    let master = MasterKey::from_secret(b"bench-peer-credential");
    let key = master.node_key(3, 7);
    let scope = Scope {
        kind: Kind::Read,
        node: 3,
        generation: 7,
        term: 2,
        id: 1234,
    };
    let grant = key.grant(&scope, 1 << 20, 1 << 20);
    let mut g = c.benchmark_group("grant");
    g.bench_function("verify", |b| {
        b.iter(|| black_box(key.verify(black_box(&scope), black_box(&grant))))
    });
    g.bench_function("sign", |b| {
        b.iter(|| {
            let k = master.node_key(3, 7);
            black_box(k.grant(black_box(&scope), 1 << 20, 1 << 20))
        })
    });
    let slice = vec![7u8; 4096];
    let mut hashes = [0u64; 1];
    g.bench_function("ceiling_hash_4KiB_slice", |b| {
        b.iter(|| hash_chunks(seed(2, 1234), black_box(&slice), &mut hashes))
    });
    g.finish();
}

criterion_group!(benches, grants);
criterion_main!(benches);
