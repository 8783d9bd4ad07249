//! Microbenchmarks of the leader's hot paths (`metad/src/leader/`, `metad/src/state.rs`), each
//! beside a ceiling: the plain hash-map work the same operation cannot do without.
//!
//! Tables are built as a running leader has them: 4 mounted segments of 1 TiB (one per node),
//! objects of 64-byte keys and 64 KiB – 4 MiB, one replica each, committed through
//! `StateMachine::apply`; then the state is installed in a [`Core`], the core becomes leader and
//! every segment heartbeats so it takes placements.
//!
//! * `leader/reserve/<pool>` with 100k live objects, `compact` (one free tail per segment) or
//!   `fragmented` (about one hole of random size per two objects):
//!   - `reserve`: `Leader::reserve` alone (batches of 1024, aborted and released untimed);
//!   - `reserve_abort_release`: reserve, `abort`, and the owner's heartbeat releasing it;
//!   - `put_reserve_commit_apply`: reserve, `commit`, `Core::apply` of the `CommitPut` (the
//!     whole put as the leader sees it, less Raft; the objects are removed untimed);
//!   - `shadow_alloc_free`: the shadow allocator's share, `alloc_fragmented` + `free` on a copy
//!     of the fullest-free segment's free map;
//!   - `ceiling_hashmap_insert_remove`: insert and remove of a 64-byte key in a 100k-entry
//!     `HashMap` — the least a reservation table keyed by name costs.
//! * `leader/get_1key/<N>` and `leader/get_64keys/<N>`, N = 100k and 1M objects, random keys:
//!   - `get`: `Leader::get` (lookup, access time, read lease, replica addresses, ordering);
//!     every 1024 calls, untimed, the clock moves past the lease TTL and `tick` expires leases,
//!     so the lease table stays at its steady size;
//!   - `sm_object`: the object-table lookup alone (`StateMachine::object`);
//!   - `ceiling_hashmap`: a `std` `HashMap<Box<str>, [u64; 12]>` of the same keys.
//! * `state_machine/apply_commit_put/<N>`: `StateMachine::apply` of a `CommitPut` (checks,
//!   free-space take, indexes, insert) in a table of N objects; batches of 1024, removed
//!   untimed; beside it the ceiling, inserting a new 64-byte key with a 96-byte record into the
//!   `HashMap` above.
//!
//! Run: `cargo bench -p regolith-metad --bench leader`. Under `cargo test --benches` every
//! benchmark runs once, on tables 500 times smaller.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use regolith_metad::command::{Command, Outcome};
use regolith_metad::config::{CacheConfig, Now};
use regolith_metad::core::Core;
use regolith_metad::leader::{CommitStep, Heartbeat, PutRequest};
use regolith_metad::state::StateMachine;
use regolith_metad::types::{Extent, Pin, Replica, SegmentId, Version};

const SEGMENTS: usize = 4;
const SEGMENT_CAPACITY: u64 = 1 << 40;
/// Operations per timed batch where untimed clean-up follows.
const BATCH: usize = 1024;

fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// Table sizes, scaled down 500 times in test mode.
fn objects(n: usize) -> usize {
    if test_mode() {
        n / 500
    } else {
        n
    }
}

fn label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// splitmix64.
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

    /// 64 KiB – 4 MiB, spread evenly over the octaves (KV-cache blocks).
    fn size(&mut self) -> u64 {
        let base = (64 * 1024u64) << self.below(6);
        base + self.below(base)
    }
}

fn align64(n: u64) -> u64 {
    n.div_ceil(64) * 64
}

/// A 64-byte key.
fn key(kind: &str, i: u64) -> String {
    let mut k = format!(
        "{kind}/model-7b/{:016x}/{i:08}/",
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    );
    while k.len() < 64 {
        k.push('x');
    }
    k.truncate(64);
    k
}

struct Table {
    core: Core,
    now: Now,
    segs: Vec<SegmentId>,
    keys: Vec<String>,
}

impl Table {
    /// `n` objects; with `fragmented`, about every other object is followed by a hole.
    fn build(n: usize, fragmented: bool) -> Self {
        let mut sm = StateMachine::new();
        let mut fx = Vec::new();
        for i in 0..SEGMENTS {
            let out = sm.apply(
                &Command::MountSegment {
                    node_name: format!("node-{i}"),
                    node_id_hint: 0,
                    capacity: SEGMENT_CAPACITY,
                    data_addrs: vec![format!("10.0.0.{i}:7600")],
                    now_ms: 0,
                },
                &mut fx,
            );
            assert!(matches!(out, Outcome::Mounted { .. }), "{out:?}");
        }
        let segs: Vec<SegmentId> = sm.segments().map(|s| s.id).collect();
        let mut next = [0u64; SEGMENTS];
        let mut rng = Rng(n as u64 ^ fragmented as u64);
        let mut keys = Vec::with_capacity(n);
        for i in 0..n {
            let s = i % SEGMENTS;
            let size = rng.size();
            let len = align64(size);
            let offset = next[s];
            next[s] += len;
            if fragmented && rng.below(2) == 0 {
                next[s] += align64(rng.size());
            }
            let k = key("obj", i as u64);
            let out = sm.apply(
                &Command::CommitPut {
                    key: k.clone(),
                    size,
                    replicas: vec![Replica {
                        segment: segs[s],
                        extents: vec![Extent::new(offset, len)],
                    }],
                    checksum: i as u64,
                    version: Version {
                        term: 1,
                        id: i as u64 + 1,
                    },
                    pin: Pin::None,
                    expires_ms: 0,
                },
                &mut fx,
            );
            assert_eq!(out, Outcome::Committed);
            fx.clear();
            keys.push(k);
        }
        let now = Now {
            mono_ms: 1_000_000,
            wall_ms: 1_800_000_000_000,
        };
        let mut core = Core::new(CacheConfig::default());
        core.install(sm);
        core.become_leader(2, now);
        let mut t = Table {
            core,
            now,
            segs,
            keys,
        };
        for s in t.segs.clone() {
            t.heartbeat(s, Vec::new());
        }
        t
    }

    fn heartbeat(&mut self, segment: SegmentId, released: Vec<Version>) {
        let now = self.now;
        let (l, sm) = self.core.leader_parts().expect("leader");
        let hb = Heartbeat {
            segment,
            highest_term_seen: l.term,
            in_flight: Vec::new(),
            released,
            ..Default::default()
        };
        let reply = l.heartbeat(sm, &hb, now);
        assert!(!reply.remount);
    }

    /// Aborts `versions` and has every owner release them, as their heartbeats would.
    fn abort_and_release(&mut self, versions: &[Version]) {
        self.core.leader_parts().expect("leader").0.abort(versions);
        for s in self.segs.clone() {
            self.heartbeat(s, versions.to_vec());
        }
    }

    /// Moves the clock past every lease granted so far and lets the leader expire them.
    fn expire_leases(&mut self) {
        self.now.mono_ms += self.core.config().lease_ttl_ms + 1;
        self.now.wall_ms += self.core.config().lease_ttl_ms + 1;
        for s in self.segs.clone() {
            self.heartbeat(s, Vec::new());
        }
        let now = self.now;
        let (l, sm) = self.core.leader_parts().expect("leader");
        let cmds = l.tick(sm, now, true);
        assert!(cmds.is_empty(), "unexpected housekeeping: {cmds:?}");
    }

    /// The same keys in a plain hash map, records the size of the state machine's.
    fn hashmap(&self) -> HashMap<Box<str>, [u64; 12]> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str().into(), [i as u64; 12]))
            .collect()
    }
}

/// `n` keys of the table in random order (with repeats).
fn random_keys(t: &Table, n: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| t.keys[rng.below(t.keys.len() as u64) as usize].clone())
        .collect()
}

fn put_requests(n: usize) -> Vec<PutRequest> {
    let mut rng = Rng(99);
    (0..n)
        .map(|i| PutRequest {
            key: key("put", i as u64),
            size: rng.size(),
            replicas: 1,
            ..Default::default()
        })
        .collect()
}

fn reserve(c: &mut Criterion) {
    let n = objects(100_000);
    let reqs = put_requests(4 * BATCH);
    for fragmented in [false, true] {
        let pool = format!(
            "{}_{}",
            if fragmented { "fragmented" } else { "compact" },
            label(n)
        );
        let mut g = c.benchmark_group("leader/reserve");
        g.throughput(Throughput::Elements(1));
        let id = |name: &str| BenchmarkId::new(name, &pool);
        let mut table: Option<Table> = None;
        let mut build = || {
            let t = Table::build(n, fragmented);
            let l = t.core.leader().expect("leader");
            let ranges: usize = l
                .shadow()
                .segments()
                .map(|(_, s)| s.alloc.fragments())
                .sum();
            eprintln!("leader/reserve/{pool}: {ranges} free ranges in the shadow allocator");
            t
        };

        let mut map: Option<HashMap<String, u64>> = None;
        g.bench_function(id("ceiling_hashmap_insert_remove"), |b| {
            let map = map.get_or_insert_with(|| {
                (0..n as u64)
                    .map(|i| (key("obj", i), i))
                    .collect::<HashMap<_, _>>()
            });
            let mut i = 0;
            b.iter(|| {
                let k = &reqs[i % reqs.len()].key;
                i += 1;
                map.insert(k.clone(), i as u64);
                black_box(map.remove(k.as_str()))
            })
        });

        g.bench_function(id("shadow_alloc_free"), |b| {
            let t = table.get_or_insert_with(&mut build);
            let l = t.core.leader().expect("leader");
            let mut alloc = l
                .shadow()
                .segments()
                .max_by_key(|(_, s)| s.alloc.free_bytes())
                .map(|(_, s)| s.alloc.clone())
                .expect("segments");
            let max_extents = l.config().max_extents_per_replica;
            let mut i = 0;
            b.iter(|| {
                let size = reqs[i % reqs.len()].size;
                i += 1;
                let got = alloc
                    .alloc_fragmented(black_box(size), max_extents)
                    .expect("room");
                for e in &got {
                    assert!(alloc.free(e));
                }
                got
            })
        });

        g.bench_function(id("reserve"), |b| {
            let t = table.get_or_insert_with(&mut build);
            let mut at = 0;
            let mut versions = Vec::with_capacity(BATCH);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(BATCH);
                    if at + k > reqs.len() {
                        at = 0;
                    }
                    let now = t.now;
                    let (l, sm) = t.core.leader_parts().expect("leader");
                    let start = Instant::now();
                    for r in &reqs[at..at + k] {
                        versions.push(l.reserve(sm, r, now).expect("reserve").version);
                    }
                    total += start.elapsed();
                    t.abort_and_release(&versions);
                    versions.clear();
                    at += k;
                    left -= k;
                }
                total
            })
        });

        g.bench_function(id("reserve_abort_release"), |b| {
            let t = table.get_or_insert_with(&mut build);
            let mut i = 0;
            b.iter(|| {
                let r = &reqs[i % reqs.len()];
                i += 1;
                let now = t.now;
                let (l, sm) = t.core.leader_parts().expect("leader");
                let res = l.reserve(sm, r, now).expect("reserve");
                l.abort(&[res.version]);
                t.heartbeat(res.replicas[0].segment, vec![res.version]);
            })
        });

        g.bench_function(id("put_reserve_commit_apply"), |b| {
            let t = table.get_or_insert_with(&mut build);
            let mut at = 0;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(BATCH);
                    if at + k > reqs.len() {
                        at = 0;
                    }
                    let now = t.now;
                    let start = Instant::now();
                    for (j, r) in reqs[at..at + k].iter().enumerate() {
                        let (l, sm) = t.core.leader_parts().expect("leader");
                        let v = l.reserve(sm, r, now).expect("reserve").version;
                        let CommitStep::Propose(cmd) = l.commit(v, j as u64, now).expect("commit")
                        else {
                            panic!("not a fresh commit");
                        };
                        let out = t.core.apply(&cmd, now);
                        debug_assert_eq!(out, Outcome::Committed);
                        black_box(out);
                    }
                    total += start.elapsed();
                    let keys = reqs[at..at + k].iter().map(|r| r.key.clone()).collect();
                    let out = t.core.apply(&Command::Remove { keys }, now);
                    assert!(matches!(&out, Outcome::Removed(r) if r.iter().all(|x| *x)));
                    at += k;
                    left -= k;
                }
                total
            })
        });
        g.finish();
    }
}

/// Placement lookups and `CommitPut` applies in tables of 100k and 1M objects.
fn table(c: &mut Criterion) {
    for n in [objects(100_000), objects(1_000_000)] {
        let mut table: Option<Table> = None;
        let mut lookups: Vec<String> = Vec::new();
        let mut map: Option<HashMap<Box<str>, [u64; 12]>> = None;
        let fixture = || {
            let t = Table::build(n, false);
            let lookups = random_keys(&t, 64 * BATCH, 7);
            let map = t.hashmap();
            (t, lookups, map)
        };
        let ensure = |table: &mut Option<Table>,
                      lookups: &mut Vec<String>,
                      map: &mut Option<HashMap<Box<str>, [u64; 12]>>| {
            if table.is_none() {
                let (t, l, m) = fixture();
                *table = Some(t);
                *lookups = l;
                *map = Some(m);
            }
        };

        for keys_per_get in [1usize, 64] {
            let mut g = c.benchmark_group(if keys_per_get == 1 {
                "leader/get_1key"
            } else {
                "leader/get_64keys"
            });
            g.throughput(Throughput::Elements(keys_per_get as u64));
            let id = |name: &str| BenchmarkId::new(name, label(n));

            g.bench_function(id("ceiling_hashmap"), |b| {
                ensure(&mut table, &mut lookups, &mut map);
                let map = map.as_ref().unwrap();
                let mut at = 0;
                b.iter(|| {
                    if at + keys_per_get > lookups.len() {
                        at = 0;
                    }
                    for k in &lookups[at..at + keys_per_get] {
                        black_box(map.get(k.as_str()));
                    }
                    at += keys_per_get;
                })
            });
            g.bench_function(id("sm_object"), |b| {
                ensure(&mut table, &mut lookups, &mut map);
                let sm = table.as_ref().unwrap().core.sm();
                let mut at = 0;
                b.iter(|| {
                    if at + keys_per_get > lookups.len() {
                        at = 0;
                    }
                    for k in &lookups[at..at + keys_per_get] {
                        black_box(sm.object(k));
                    }
                    at += keys_per_get;
                })
            });
            g.bench_function(id("get"), |b| {
                ensure(&mut table, &mut lookups, &mut map);
                let t = table.as_mut().unwrap();
                let requester = t.segs[0].node;
                let mut at = 0;
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters as usize;
                    while left > 0 {
                        let k = left.min(BATCH);
                        let now = t.now;
                        let (l, sm) = t.core.leader_parts().expect("leader");
                        let start = Instant::now();
                        for _ in 0..k {
                            if at + keys_per_get > lookups.len() {
                                at = 0;
                            }
                            let got = l.get(sm, &lookups[at..at + keys_per_get], requester, now);
                            debug_assert!(got.iter().all(Option::is_some));
                            black_box(got);
                            at += keys_per_get;
                        }
                        total += start.elapsed();
                        t.expire_leases();
                        left -= k;
                    }
                    total
                })
            });
            g.finish();
        }

        let mut g = c.benchmark_group("state_machine/apply_commit_put");
        g.throughput(Throughput::Elements(1));
        let id = |name: &str| BenchmarkId::new(name, label(n));
        let new_keys: Vec<String> = (0..BATCH as u64).map(|i| key("apply", i)).collect();
        g.bench_function(id("ceiling_hashmap_insert"), |b| {
            ensure(&mut table, &mut lookups, &mut map);
            let map = map.as_mut().unwrap();
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(BATCH);
                    let start = Instant::now();
                    for (i, key) in new_keys[..k].iter().enumerate() {
                        black_box(map.insert(key.as_str().into(), [i as u64; 12]));
                    }
                    total += start.elapsed();
                    for key in &new_keys[..k] {
                        map.remove(key.as_str());
                    }
                    left -= k;
                }
                total
            })
        });
        g.bench_function(id("apply"), |b| {
            ensure(&mut table, &mut lookups, &mut map);
            let t = table.as_mut().unwrap();
            // The state machine alone, past the leader: its shadow allocator never sees these
            // extents, which are free again (removed) before anything else runs.
            let (_, sm) = t.core.leader_parts().expect("leader");
            let seg = t.segs[0];
            let tail = sm
                .free_space(&seg)
                .and_then(|f| f.free_ranges().last())
                .expect("free tail");
            let len = 1 << 20;
            let cmds: Vec<Command> = new_keys
                .iter()
                .enumerate()
                .map(|(i, k)| Command::CommitPut {
                    key: k.clone(),
                    size: len,
                    replicas: vec![Replica {
                        segment: seg,
                        extents: vec![Extent::new(tail.offset + i as u64 * len, len)],
                    }],
                    checksum: i as u64,
                    version: Version {
                        term: 1,
                        id: (1 << 40) + i as u64,
                    },
                    pin: Pin::None,
                    expires_ms: 0,
                })
                .collect();
            let mut fx = Vec::with_capacity(4);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(BATCH);
                    let start = Instant::now();
                    for cmd in &cmds[..k] {
                        let out = sm.apply(cmd, &mut fx);
                        debug_assert_eq!(out, Outcome::Committed);
                        black_box(out);
                        fx.clear();
                    }
                    total += start.elapsed();
                    let out = sm.apply(
                        &Command::Remove {
                            keys: new_keys[..k].to_vec(),
                        },
                        &mut fx,
                    );
                    assert!(matches!(&out, Outcome::Removed(r) if r.iter().all(|x| *x)));
                    fx.clear();
                    left -= k;
                }
                total
            })
        });
        g.finish();
    }
}

criterion_group!(benches, reserve, table);
criterion_main!(benches);
