//! `regolith bench --hit-ratio`: the cache's hit ratio on an LMCache-like trace against a real
//! cluster, beside an ideal LRU over the cluster's memory and disks simulated on the same trace
//! (docs/benchmarks.md, "Hit ratio").
//!
//! The working set is `--working-set` times the pool's memory, in objects of `--object-size`;
//! accesses pick objects by a Zipf law of exponent `--zipf` (ranks shuffled over the keys, a
//! fixed `--seed`). Each access is a `get_into`; a miss is followed by a put of the object, as
//! LMCache stores a chunk it had to compute (put once, got many times). Every hit's bytes are
//! compared with the object's. The ideal is an LRU cache of `(memory + disks) / object size`
//! objects fed the same accesses (a miss inserts); its hit ratio is what no policy over that
//! capacity beats by much on this trace, and the report gives ours as a share of it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use regolith_client::{AsyncClient, Dest, ReplicateConfig, ShmBuffer};
use serde::Serialize;

use crate::error::{Error, Result};

/// What the mode was asked for.
pub struct Params {
    pub working_set: f64,
    pub object_size: u64,
    pub accesses: Option<u64>,
    pub zipf: f64,
    pub seed: u64,
    pub depth: usize,
}

#[derive(Serialize, Debug, Clone)]
pub struct HitRatioReport {
    /// The pool's memory (metad's bytes total) and the disks' capacity (healthy disks of the
    /// sidecars that answered).
    pub dram_bytes: u64,
    pub disk_bytes: u64,
    pub object_size: u64,
    pub objects: u64,
    pub working_set_bytes: u64,
    pub accesses: u64,
    pub zipf: f64,
    pub seed: u64,
    /// Distinct objects the trace touches (each one's first access is a miss for any cache).
    pub distinct: u64,
    pub hits: u64,
    pub misses: u64,
    /// Reads that failed otherwise, or returned other bytes than the object's (`failed` +
    /// `wrong`).
    pub errors: u64,
    pub failed: u64,
    pub wrong: u64,
    /// What the first failed read said (null when none failed).
    pub first_error: Option<String>,
    /// Puts after a miss that failed (the next access misses again).
    pub put_errors: u64,
    pub hit_ratio: f64,
    /// The ideal LRU over memory + disks, and over memory alone, on the same trace.
    pub ideal_hit_ratio: f64,
    pub ideal_dram_hit_ratio: f64,
    /// `hit_ratio / ideal_hit_ratio`.
    pub ratio: f64,
    /// Reads the disks served meanwhile (`regolith_sidecar_disk_reads`, all sidecars).
    pub disk_reads: u64,
    pub seconds: f64,
}

/// The ranks' cumulative probabilities of a Zipf law over `n` ranks.
fn zipf_cdf(n: u64, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// The trace: object indices, ranks shuffled over the objects.
pub fn trace(objects: u64, accesses: u64, s: f64, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let cdf = zipf_cdf(objects, s);
    let mut of_rank: Vec<u64> = (0..objects).collect();
    for i in (1..of_rank.len()).rev() {
        let j = rng.gen_range(0..=i);
        of_rank.swap(i, j);
    }
    (0..accesses)
        .map(|_| {
            let u: f64 = rng.gen();
            let r = cdf.partition_point(|c| *c < u).min(cdf.len() - 1);
            of_rank[r]
        })
        .collect()
}

/// Hits of an LRU cache of `capacity` objects fed `trace` (a miss inserts).
pub fn lru_hits(trace: &[u64], capacity: u64) -> u64 {
    let mut stamp_of: HashMap<u64, u64> = HashMap::new();
    let mut by_stamp: BTreeMap<u64, u64> = BTreeMap::new();
    let mut hits = 0;
    for (t, k) in trace.iter().enumerate() {
        let t = t as u64;
        if let Some(old) = stamp_of.insert(*k, t) {
            by_stamp.remove(&old);
            hits += 1;
        }
        by_stamp.insert(t, *k);
        while stamp_of.len() as u64 > capacity {
            match by_stamp.pop_first() {
                Some((_, victim)) => stamp_of.remove(&victim),
                None => break,
            };
        }
    }
    hits
}

fn key(run: u64, i: u64) -> String {
    format!("bench/{run}/hit/{i}")
}

fn value(run: u64, seed: u64, i: u64, size: u64) -> Vec<u8> {
    super::value_of(run ^ seed.rotate_left(17) ^ (i << 20) ^ i, size)
}

/// One access's outcome.
enum Got {
    Hit,
    Miss,
    Wrong,
    Failed(String),
}

/// Runs the trace against the cluster; `disk_bytes` is the disks' capacity, `disk_reads` reads
/// the sidecars' disk read counters (before and after).
pub async fn run(
    client: &AsyncClient,
    p: &Params,
    disk_bytes: u64,
    disk_reads: impl Fn() -> u64,
) -> Result<HitRatioReport> {
    let dram = client.stats().await?.bytes_total;
    if dram == 0 || p.object_size == 0 {
        return Err(Error::Failed("the pool has no memory to measure".into()));
    }
    let ws_bytes = (dram as f64 * p.working_set) as u64;
    let objects = (ws_bytes / p.object_size).max(1);
    let accesses = p.accesses.unwrap_or(objects * 4);
    let tr = trace(objects, accesses, p.zipf, p.seed);
    let distinct = tr.iter().collect::<std::collections::HashSet<_>>().len() as u64;
    let ideal = lru_hits(&tr, (dram + disk_bytes) / p.object_size) as f64 / accesses as f64;
    let ideal_dram = lru_hits(&tr, dram / p.object_size) as f64 / accesses as f64;
    let run = rand::random::<u32>() as u64;
    let depth = p.depth.max(1);
    let mut shm: Vec<ShmBuffer> = Vec::with_capacity(depth);
    for _ in 0..depth {
        shm.push(client.alloc_buffer(p.object_size as usize).await?);
    }
    let cfg = ReplicateConfig::default();
    let reads0 = disk_reads();
    let (mut hits, mut misses, mut wrong, mut failed, mut put_errors) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut scratch = vec![0u8; p.object_size as usize];
    let start = Instant::now();
    let mut last_note = start;
    for (n, round) in tr.chunks(depth).enumerate() {
        let keys: Vec<String> = round.iter().map(|i| key(run, *i)).collect();
        let gets = keys.iter().zip(&shm).map(|(k, b)| {
            client.get_into(
                k,
                Dest::Shm {
                    buf: b,
                    offset: 0,
                    len: p.object_size as usize,
                },
            )
        });
        let got = futures::future::join_all(gets).await;
        let mut to_put = Vec::new();
        for ((i, r), b) in round.iter().zip(got).zip(&shm) {
            let outcome = match r {
                Ok(_) => {
                    let right = b.read(0, &mut scratch).is_ok()
                        && scratch == value(run, p.seed, *i, p.object_size);
                    if right {
                        Got::Hit
                    } else {
                        Got::Wrong
                    }
                }
                Err(e) if e.is_miss() => Got::Miss,
                Err(e) => Got::Failed(e.to_string()),
            };
            match outcome {
                Got::Hit => hits += 1,
                Got::Miss => {
                    misses += 1;
                    to_put.push(*i);
                }
                Got::Wrong => wrong += 1,
                Got::Failed(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        to_put.sort_unstable();
        to_put.dedup();
        let values: Vec<(String, Vec<u8>)> = to_put
            .iter()
            .map(|i| (key(run, *i), value(run, p.seed, *i, p.object_size)))
            .collect();
        let puts = values.iter().map(|(k, v)| client.put(k, v, &cfg));
        for r in futures::future::join_all(puts).await {
            // Another access of the same round may have put it: not a failure of the cache.
            if let Err(e) = r {
                if !e.to_string().contains("exists") {
                    put_errors += 1;
                }
            }
        }
        if last_note.elapsed() > Duration::from_secs(1) {
            last_note = Instant::now();
            eprint!(
                "\r\x1b[2K[hit ratio] {} of {accesses} accesses, {hits} hits",
                (n + 1) * depth
            );
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    eprintln!();
    let disk_reads = disk_reads().saturating_sub(reads0);
    for b in &shm {
        let _ = client.free_buffer(b).await;
    }
    let all: Vec<String> = (0..objects).map(|i| key(run, i)).collect();
    for chunk in all.chunks(512) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let _ = client.batch_remove(&refs).await;
    }
    let hit_ratio = hits as f64 / accesses as f64;
    Ok(HitRatioReport {
        dram_bytes: dram,
        disk_bytes,
        object_size: p.object_size,
        objects,
        working_set_bytes: objects * p.object_size,
        accesses,
        zipf: p.zipf,
        seed: p.seed,
        distinct,
        hits,
        misses,
        errors: failed + wrong,
        failed,
        wrong,
        first_error,
        put_errors,
        hit_ratio,
        ideal_hit_ratio: ideal,
        ideal_dram_hit_ratio: ideal_dram,
        ratio: if ideal > 0.0 { hit_ratio / ideal } else { 0.0 },
        disk_reads,
        seconds,
    })
}

pub fn print(r: &HitRatioReport) {
    eprintln!(
        "hit ratio: working set {} ({} objects of {}) over {} of memory and {} of disks; {} accesses, Zipf {}, seed {} ({} distinct objects)",
        crate::format::bytes(r.working_set_bytes),
        r.objects,
        crate::format::bytes(r.object_size),
        crate::format::bytes(r.dram_bytes),
        crate::format::bytes(r.disk_bytes),
        r.accesses,
        r.zipf,
        r.seed,
        r.distinct
    );
    eprintln!(
        "  measured {:.4} ({} hits, {} misses, {} disk reads), ideal LRU over memory + disks {:.4} (memory alone {:.4}): {:.3} of the ideal; {} failed reads, {} wrong, {} failed puts, {:.1} s",
        r.hit_ratio,
        r.hits,
        r.misses,
        r.disk_reads,
        r.ideal_hit_ratio,
        r.ideal_dram_hit_ratio,
        r.ratio,
        r.failed,
        r.wrong,
        r.put_errors,
        r.seconds
    );
    if let Some(e) = &r.first_error {
        eprintln!("  first failed read: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_lru_hits_what_it_still_holds() {
        // Capacity 2: a b a c b -> miss miss hit miss(evicts b) miss.
        assert_eq!(lru_hits(&[1, 2, 1, 3, 2], 2), 1);
        // Capacity 3 holds all three: the last two hit.
        assert_eq!(lru_hits(&[1, 2, 1, 3, 2], 3), 2);
        assert_eq!(lru_hits(&[], 3), 0);
        assert_eq!(lru_hits(&[5, 5, 5], 0), 0);
    }

    #[test]
    fn the_trace_is_skewed_reproducible_and_in_range() {
        let a = trace(1000, 20_000, 0.99, 7);
        assert_eq!(a, trace(1000, 20_000, 0.99, 7));
        assert_ne!(a, trace(1000, 20_000, 0.99, 8));
        assert!(a.iter().all(|i| *i < 1000));
        let mut count = vec![0u32; 1000];
        for i in &a {
            count[*i as usize] += 1;
        }
        count.sort_unstable_by(|x, y| y.cmp(x));
        // Rank 1 of a Zipf(0.99) law over 1000 ranks draws about 13 % of the accesses.
        let top = count[0] as f64 / a.len() as f64;
        assert!((0.10..0.17).contains(&top), "{top}");
        assert!(count[0] > 20 * count[100], "{:?}", &count[..5]);
    }
}
