//! Microbenchmarks of the object checksum (`proto/src/checksum.rs`) beside the machine's
//! ceiling, plain `memcpy` of the same bytes.
//!
//! Group `checksum/<size>` for 64 KiB, 1 MiB and 16 MiB, throughput in bytes:
//! * `ceiling_memcpy`: `dst.copy_from_slice(src)`;
//! * `ceiling_read`: a wrapping sum of `src` as `u64` words, the read-only ceiling beside
//!   `hash_chunks`;
//! * `hash_chunks`: hashing alone (reads `src` once);
//! * `copy_then_hash`: the unfused path, whole copy then `hash_chunks` of the destination;
//! * `copy_and_hash`: the fused path the data plane uses, each 64 KiB chunk hashed right after
//!   it is copied;
//! * `par_copy_and_hash` (16 MiB only): the fused path split over the machine's cores (up to
//!   four), what the client uses for large local copies.
//!
//! 64 KiB and 1 MiB use one source and one destination, both cache-resident, as when a slice is
//! hashed while it is hot. 16 MiB rotates over source/destination pairs whose total is at least
//! four times the last-level cache (and at least 2 GiB), so each iteration reads and writes memory
//! that is not in any cache: the DRAM-bound case of a large put.
//!
//! Run: `cargo bench -p regolith-proto --bench checksum`. Under `cargo test --benches` every
//! benchmark runs once, with a small rotation.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use regolith_proto::checksum::{
    chunk_count, copy_and_hash, hash_chunks, par_copy_and_hash, seed, PAR_MIN,
};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// Whether criterion runs in test mode (`cargo test --benches`): no `--bench` argument.
fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// The last-level cache in bytes, from sysfs (0 when unknown).
fn llc_bytes() -> usize {
    let mut best = 0;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(size) = std::fs::read_to_string(format!("{dir}/size")) else {
            continue;
        };
        let size = size.trim();
        let (num, mult) = match size.chars().last() {
            Some('K') => (&size[..size.len() - 1], KIB),
            Some('M') => (&size[..size.len() - 1], MIB),
            Some('G') => (&size[..size.len() - 1], 1024 * MIB),
            _ => (size, 1),
        };
        best = best.max(num.parse::<usize>().unwrap_or(0) * mult);
    }
    best
}

fn filled(len: usize, salt: usize) -> Vec<u8> {
    // Written byte by byte so every page is faulted in before measuring.
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ salt) as u8)
        .collect()
}

fn label(len: usize) -> String {
    if len >= MIB {
        format!("{}MiB", len / MIB)
    } else {
        format!("{}KiB", len / KIB)
    }
}

/// Source/destination buffers, rotated per iteration.
struct Buffers {
    src: Vec<Vec<u8>>,
    dst: Vec<Vec<u8>>,
    next: usize,
}

impl Buffers {
    fn new(len: usize, pairs: usize) -> Self {
        Self {
            src: (0..pairs).map(|i| filled(len, i)).collect(),
            dst: (0..pairs).map(|i| filled(len, !i)).collect(),
            next: 0,
        }
    }

    fn pair(&mut self) -> (&[u8], &mut [u8]) {
        let i = self.next;
        self.next = (i + 1) % self.src.len();
        (&self.src[i], &mut self.dst[i])
    }
}

fn checksum(c: &mut Criterion) {
    let quick = test_mode();
    let s = seed(7, 42);
    for len in [64 * KIB, MIB, 16 * MIB] {
        let cold = len >= 16 * MIB;
        let pairs = if !cold || quick {
            1
        } else {
            // Each pair is touched once per rotation: the bytes touched in between (the whole
            // rotation) must exceed the cache several times over.
            let want = (4 * llc_bytes()).max(2048 * MIB);
            want.div_ceil(2 * len)
        };
        // Allocated by the first benchmark that runs (none when all are filtered out).
        let mut bufs: Option<Buffers> = None;
        let mut hashes = vec![0u64; chunk_count(len as u64)];

        let mut g = c.benchmark_group(format!("checksum/{}", label(len)));
        g.throughput(Throughput::Bytes(len as u64));
        if cold {
            g.sampling_mode(SamplingMode::Flat)
                .sample_size(20)
                .warm_up_time(Duration::from_millis(500));
        }
        let id = |name: &str| {
            let p = if cold {
                format!("cold_{pairs}x2")
            } else {
                "hot".to_string()
            };
            BenchmarkId::new(name, p)
        };
        g.bench_function(id("ceiling_memcpy"), |b| {
            let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
            b.iter(|| {
                let (src, dst) = bufs.pair();
                dst.copy_from_slice(black_box(src));
                black_box(dst.as_ptr());
            })
        });
        g.bench_function(id("ceiling_read"), |b| {
            let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
            b.iter(|| {
                let (src, _) = bufs.pair();
                black_box(src).chunks_exact(8).fold(0u64, |a, w| {
                    a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()))
                })
            })
        });
        g.bench_function(id("hash_chunks"), |b| {
            let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
            b.iter(|| {
                let (src, _) = bufs.pair();
                hash_chunks(s, black_box(src), &mut hashes);
                black_box(hashes[0]);
            })
        });
        g.bench_function(id("copy_then_hash"), |b| {
            let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
            b.iter(|| {
                let (src, dst) = bufs.pair();
                dst.copy_from_slice(black_box(src));
                hash_chunks(s, dst, &mut hashes);
                black_box(hashes[0]);
            })
        });
        g.bench_function(id("copy_and_hash"), |b| {
            let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
            b.iter(|| {
                let (src, dst) = bufs.pair();
                copy_and_hash(s, dst, black_box(src), &mut hashes);
                black_box(hashes[0]);
            })
        });
        if len >= PAR_MIN {
            g.bench_function(id("par_copy_and_hash"), |b| {
                let bufs = bufs.get_or_insert_with(|| Buffers::new(len, pairs));
                b.iter(|| {
                    let (src, dst) = bufs.pair();
                    par_copy_and_hash(s, dst, black_box(src), &mut hashes);
                    black_box(hashes[0]);
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, checksum);
criterion_main!(benches);
