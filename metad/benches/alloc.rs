//! Microbenchmarks of the free-range allocator (`metad/src/alloc.rs`), the data structure under
//! both the state machine's free space and the leader's shadow allocator.
//!
//! * `range_alloc/churn/<F>_holes`: one `alloc` (best fit) and one `free` of a random live
//!   extent per iteration, in an allocator that starts with F live extents and F holes between
//!   them (sizes spread over 4 KiB – 8 MiB, a large free tail after them; the churn settles at
//!   about F/2 free ranges, printed after each run), next to the ceiling: one insert and one
//!   remove at random keys of a `BTreeMap<u64, u64>` of F entries — the least a range map keyed
//!   by offset does per allocate/free pair.
//! * `range_alloc/fragmented/<F>_holes`: `alloc_fragmented` of four times the largest hole in a full
//!   allocator with F holes (no tail), then `free` of what it took; beside it a plain scan of an
//!   F-entry `BTreeMap`.
//!
//! Run: `cargo bench -p regolith-metad --bench alloc`. Under `cargo test --benches` every
//! benchmark runs once, on small allocators.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use regolith_metad::alloc::{align_up, RangeAlloc};
use regolith_metad::types::Extent;

fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// splitmix64: deterministic and cheap next to what is measured.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// 4 KiB – 8 MiB, spread evenly over the octaves.
    fn size(&mut self) -> u64 {
        let base = 4096u64 << self.below(11);
        base + self.below(base)
    }
}

fn label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// An allocator with `holes` free ranges between live extents, and those extents. With `tail`
/// a large free range follows; without, the allocator is exactly full but for the holes.
fn fragmented(holes: usize, tail: bool, rng: &mut Rng) -> (RangeAlloc, Vec<Extent>) {
    let sizes: Vec<u64> = (0..2 * holes).map(|_| align_up(rng.size())).collect();
    let used: u64 = sizes.iter().sum();
    let mut a = RangeAlloc::new(if tail { used.max(1 << 30) * 8 } else { used });
    let all: Vec<Extent> = sizes.iter().map(|s| a.alloc(*s).unwrap()).collect();
    let mut live = Vec::with_capacity(holes);
    for (i, e) in all.into_iter().enumerate() {
        if i % 2 == 1 {
            assert!(a.free(&e));
        } else {
            live.push(e);
        }
    }
    (a, live)
}

fn churn(c: &mut Criterion) {
    let levels: &[usize] = if test_mode() {
        &[100]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let mut g = c.benchmark_group("range_alloc/churn");
    g.throughput(Throughput::Elements(1));
    for &holes in levels {
        let mut rng = Rng(holes as u64);
        let mut map: BTreeMap<u64, u64> = (0..holes).map(|_| (rng.next(), 0)).collect();
        let mut keys: Vec<u64> = map.keys().copied().collect();
        g.bench_function(
            BenchmarkId::new("ceiling_btreemap", label(holes) + "_holes"),
            |b| {
                b.iter(|| {
                    let i = rng.below(keys.len() as u64) as usize;
                    map.remove(&keys[i]);
                    let k = rng.next();
                    map.insert(k, k);
                    keys[i] = k;
                })
            },
        );
        let (mut a, mut live) = fragmented(holes, true, &mut rng);
        g.bench_function(
            BenchmarkId::new("alloc_free", label(holes) + "_holes"),
            |b| {
                b.iter(|| {
                    let e = a.alloc(black_box(rng.size())).expect("the tail has room");
                    let i = rng.below(live.len() as u64) as usize;
                    let old = std::mem::replace(&mut live[i], e);
                    assert!(a.free(&old));
                })
            },
        );
        eprintln!(
            "range_alloc/churn/{}_holes: {} free ranges after the run",
            label(holes),
            a.fragments()
        );
    }
    g.finish();
}

fn fragmented_alloc(c: &mut Criterion) {
    let levels: &[usize] = if test_mode() {
        &[100]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let mut g = c.benchmark_group("range_alloc/fragmented");
    g.throughput(Throughput::Elements(1));
    for &holes in levels {
        let mut rng = Rng(holes as u64 + 1);
        let (mut a, _) = fragmented(holes, false, &mut rng);
        let want = 4 * a.largest_free();
        let map: BTreeMap<u64, u64> = a.free_ranges().map(|e| (e.offset, e.end())).collect();
        g.bench_function(
            BenchmarkId::new("ceiling_btreemap_scan", label(holes) + "_holes"),
            |b| b.iter(|| black_box(&map).iter().map(|(s, e)| e - s).max()),
        );
        g.bench_function(
            BenchmarkId::new("alloc_fragmented_free", label(holes) + "_holes"),
            |b| {
                b.iter(|| {
                    let got = a.alloc_fragmented(black_box(want), 16).expect("fits in 16");
                    for e in &got {
                        assert!(a.free(e));
                    }
                    got.len()
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, churn, fragmented_alloc);
criterion_main!(benches);
