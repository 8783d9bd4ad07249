//! The disk-tier rows of `regolith bench` (docs/benchmarks.md, "The disk tier"), when the
//! cluster's sidecars have disks:
//!
//! * the disks' own ceilings (sequential `O_DIRECT` write and read, [`super::disk_ceiling`]);
//! * `get_into` of objects that are only on a disk, 4 KiB / 256 KiB / 16 MiB: `local` (on a disk
//!   of this node: the sidecar reads its record into the client's buffer) and `remote` (on a
//!   disk of another node: its sidecar serves the bytes over the data plane), each beside the
//!   disk's read ceiling (remote: the lower of it and the network ceiling);
//! * `offload`: bytes moved from memory to the disks per second while puts keep the pool above
//!   the offload watermark, beside the disks' write ceiling.
//!
//! The objects read are made disk-only without any hook in metad: they are put first, then the
//! pool is filled above the offload watermark with soft-pinned fillers, so the leader's
//! offload (least recently used, unpinned objects before soft-pinned ones) moves them first;
//! the bench waits until their placements are disk replicas (`disk_tier`), tops the pool up
//! to [`HOLD_AT`] (below the offload watermark, above the promotion limit: metad promotes a
//! disk hit back to memory only below `offload_watermark - eviction_ratio`, 0.75 by default,
//! so the objects stay disk-only while they are read), reads, and removes the fillers. Every read is verified byte-exact outside the timed part, as in the
//! other rows, and the placements are checked again after each row (`disk_only_after`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_client::{AsyncClient, ReplicateConfig, ShmBuffer};
use regolith_proto::client::MetadClient;
use regolith_proto::disk_tier::is_disk_generation;
use serde::Serialize;

use super::disk_ceiling::{self, DiskCeiling};
use super::{human, timed_call, verify, Cell, Env, Mode, Op, Plan, Row, Tally};
use crate::error::{Error, Result};
use crate::tiers::SidecarStatus;

/// Sizes of the disk-tier get rows.
pub const DISK_SIZES: [u64; 3] = [4 << 10, 256 << 10, 16 << 20];
/// Size of the filler objects (a few per 16 MiB object, smaller than any disk's bucket).
const FILLER: u64 = 4 << 20;
/// Pool use the fill aims at: above metad's default offload watermark (0.8), below its
/// eviction watermark (0.9), so that the objects read are offloaded, never evicted.
pub const FILL_TO: f64 = 0.85;
/// Pool use held while the disk-only objects are read: below metad's default offload
/// watermark (0.8: no more offload), above its promotion limit (0.75: no promotion).
pub const HOLD_AT: f64 = 0.78;
/// Pool use below which offload has ended: metad offloads down to `offload_watermark -
/// eviction_ratio` (0.75 by default) once it started.
const OFFLOAD_LOW: f64 = 0.76;
/// Pool use of a fill after the first: just above the offload watermark, so that a cycle moves
/// as few fillers as it can to the disks.
const REFILL_TO: f64 = 0.82;
/// Fills of the pool while the measured objects are pushed to the disks, at most (and top-ups
/// to [`HOLD_AT`] after).
const FILL_CYCLES: u32 = 4;
/// Pool use is taken as settled when two readings this far apart agree.
const SETTLE_GAP: Duration = Duration::from_millis(500);
/// How long the bench waits for pool use to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the objects read may take to reach the disks.
const PUSH_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of the disk ceilings' file.
const CEILING_BYTES: u64 = 256 << 20;
/// Puts in flight in the offload row.
const OFFLOAD_DEPTH: usize = 4;
/// The offload row runs at least this long (its rate is a steady state, not a burst).
const OFFLOAD_MIN: Duration = Duration::from_secs(3);
/// How long fillers stay soft-pinned (longer than any run).
const PIN_TTL: Duration = Duration::from_secs(3600);

/// A node and its first disk in service.
#[derive(Clone, Debug)]
pub struct NodeDisk {
    pub node: String,
    pub status: SocketAddr,
    pub path: PathBuf,
}

/// The first healthy disk of each sidecar that answered.
pub fn node_disks(
    statuses: &[(SocketAddr, std::result::Result<SidecarStatus, String>)],
) -> Vec<NodeDisk> {
    statuses
        .iter()
        .filter_map(|(addr, st)| {
            let st = st.as_ref().ok()?;
            let d = st.disks.iter().find(|d| d.healthy)?;
            Some(NodeDisk {
                node: st.node_name.clone(),
                status: *addr,
                path: PathBuf::from(&d.path),
            })
        })
        .collect()
}

#[derive(Serialize, Debug)]
pub struct DiskReport {
    pub ceilings: Vec<DiskCeiling>,
    pub results: Vec<DiskRow>,
    /// The offload row (absent when filtered out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadRow>,
    /// Why the measured objects did not all reach the disks before the rows (each row then
    /// counts one error); absent when they did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_error: Option<String>,
}

/// A get row of disk-only objects: the memory rows' fields and what the ratio is taken to.
#[derive(Serialize, Clone, Debug)]
pub struct DiskRow {
    #[serde(flatten)]
    pub row: Row,
    /// The node whose disk holds the objects.
    pub owner: String,
    /// Distinct objects read (each read many times).
    pub objects: usize,
    /// Local: the owner disk's read ceiling; remote: the lower of it and the network ceiling.
    pub ceiling_gbps: f64,
    pub ratio: f64,
    /// Objects still only on disk after the row (a hit that promoted one to memory makes
    /// the rest of the row a memory read).
    pub disk_only_after: usize,
    /// Bytes the owner's disk read during the row (`regolith_sidecar_disk_read_bytes`).
    pub disk_read_bytes: u64,
}

#[derive(Serialize, Clone, Debug)]
pub struct OffloadRow {
    pub object_size: u64,
    pub seconds: f64,
    /// Objects moved to disk and committed (`regolith_sidecar_disk_offloads_total`, all nodes).
    pub offloaded_objects: u64,
    pub offload_gbps: f64,
    /// What the disks wrote meanwhile (records' headers and compaction included).
    pub disk_write_gbps: f64,
    pub put_gbps: f64,
    pub put_errors: u64,
    /// What the first failed put said (null when none failed).
    pub first_put_error: Option<String>,
    /// Objects metad dropped meanwhile (eviction, the fallback above its watermark).
    pub evicted_objects: u64,
    /// Pool use seen during the row (bytes used / total).
    pub pool_use_min: f64,
    pub pool_use_max: f64,
    /// The disks' write ceiling: the sum over the distinct devices they are on.
    pub ceiling_gbps: f64,
    pub ratio: f64,
}

/// Which rows the filter asks for.
pub struct Wanted {
    pub cells: Vec<(Mode, u64)>,
    pub offload: bool,
}

impl Wanted {
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty() && !self.offload
    }
}

/// The disks this run needs: this node's (local rows) and another node's (remote rows).
pub struct Disks<'a> {
    pub local: Option<&'a NodeDisk>,
    pub remote: Option<&'a NodeDisk>,
    pub all: &'a [NodeDisk],
}

impl<'a> Disks<'a> {
    pub fn of(all: &'a [NodeDisk], node: &str) -> Self {
        Self {
            local: all.iter().find(|d| d.node == node),
            remote: all.iter().find(|d| d.node != node),
            all,
        }
    }

    fn owner(&self, mode: Mode) -> Option<&'a NodeDisk> {
        match mode {
            Mode::Local => self.local,
            Mode::Remote => self.remote,
        }
    }
}

/// The objects of one row, put before the fill.
struct Measured {
    mode: Mode,
    size: u64,
    owner: NodeDisk,
    keys: Vec<String>,
    values: Vec<Vec<u8>>,
    /// Puts that failed or landed elsewhere.
    errors: u64,
}

/// Objects per row: 64 MiB of them at most, and a sixteenth of the pool's memory (the six
/// rows together stay well under the fill), 1 to 64.
fn ring_of(size: u64, pool: u64) -> u64 {
    ((64u64 << 20).min(pool / 16) / size.max(1)).clamp(1, 64)
}

/// Runs the wanted disk rows; `net_ceiling` is what remote rows are compared with beside the
/// disk (TCP, or TLS on a TLS data plane).
pub(super) async fn run(
    clients: &[AsyncClient],
    env: Arc<Env>,
    metad: &MetadClient,
    disks: &Disks<'_>,
    wanted: &Wanted,
    net_ceiling: f64,
) -> Result<DiskReport> {
    let ceilings = measure_ceilings(disks)?;
    let client = &clients[0];
    let pool = client.stats().await?.bytes_total;
    let mut measured = Vec::new();
    for (mode, size) in wanted.cells.iter().copied() {
        let Some(owner) = disks.owner(mode) else {
            continue;
        };
        let n = ring_of(size, pool);
        measured.push(put_measured(client, &env, mode, size, n, owner).await);
    }
    let mut results = Vec::new();
    let mut push_error = None;
    if !measured.is_empty() {
        let keys: Vec<(String, String)> = measured
            .iter()
            .flat_map(|m| m.keys.iter().map(|k| (k.clone(), m.owner.node.clone())))
            .collect();
        eprint!("\r\x1b[2K[disk] filling the pool above the offload watermark...");
        let (mut fillers, pushed) = push_to_disk(client, &env, metad, &keys).await;
        let held = hold(client, &env, fillers.len()).await;
        fillers.extend(held);
        if let Err(e) = &pushed {
            eprintln!("\n{e}");
            push_error = Some(e.to_string());
        }
        for m in &measured {
            eprint!(
                "\r\x1b[2K[disk] {} {} get_into",
                m.mode.name(),
                human(m.size)
            );
            let ceiling = ceiling_for(&ceilings, &m.owner, m.mode, net_ceiling);
            let mut row = read_row(clients, env.clone(), metad, m, ceiling).await;
            if pushed.is_err() {
                row.row.errors += 1;
            }
            results.push(row);
            remove_keys(client, &m.keys).await;
        }
        remove_keys(client, &fillers).await;
    }
    let offload = if wanted.offload {
        eprint!("\r\x1b[2K[disk] offload under eviction pressure");
        Some(offload_row(client, &env, metad, disks.all, &ceilings).await)
    } else {
        None
    };
    eprintln!();
    Ok(DiskReport {
        ceilings,
        results,
        offload,
        push_error,
    })
}

/// One ceiling per node with a disk, measured once per device.
fn measure_ceilings(disks: &Disks<'_>) -> Result<Vec<DiskCeiling>> {
    let mut out: Vec<(Option<u64>, DiskCeiling)> = Vec::new();
    for d in disks.all {
        let dev = disk_ceiling::device_of(&d.path);
        let known = out
            .iter()
            .find(|(v, _)| dev.is_some() && *v == dev)
            .map(|(_, c)| c.clone());
        let c = match known {
            Some(c) => DiskCeiling {
                node: d.node.clone(),
                path: d.path.display().to_string(),
                ..c
            },
            None => {
                eprint!(
                    "\r\x1b[2K[disk] measuring {}'s disk ceiling ({})",
                    d.node,
                    d.path.display()
                );
                disk_ceiling::measure(&d.node, &d.path, CEILING_BYTES)?
            }
        };
        out.push((dev, c));
    }
    Ok(out.into_iter().map(|(_, c)| c).collect())
}

fn ceiling_for(ceilings: &[DiskCeiling], owner: &NodeDisk, mode: Mode, net: f64) -> f64 {
    let disk = ceilings
        .iter()
        .find(|c| c.node == owner.node)
        .map(|c| c.read_gbps)
        .unwrap_or(0.0);
    match mode {
        Mode::Local => disk,
        Mode::Remote => disk.min(net),
    }
}

/// The sum of the write ceilings of the distinct devices the disks are on.
fn write_ceiling(disks: &[NodeDisk], ceilings: &[DiskCeiling]) -> f64 {
    let mut seen = Vec::new();
    let mut sum = 0.0;
    for d in disks {
        let dev = disk_ceiling::device_of(&d.path);
        if dev.is_some() && seen.contains(&dev) {
            continue;
        }
        seen.push(dev);
        sum += ceilings
            .iter()
            .find(|c| c.node == d.node)
            .map(|c| c.write_gbps)
            .unwrap_or(0.0);
    }
    sum
}

fn key(env: &Env, what: &str, i: u64) -> String {
    format!("bench/{}/disk/{what}/{i}", env.run)
}

/// Puts one row's objects on its owner node (unpinned: offload picks them first).
async fn put_measured(
    client: &AsyncClient,
    env: &Env,
    mode: Mode,
    size: u64,
    n: u64,
    owner: &NodeDisk,
) -> Measured {
    let cfg = ReplicateConfig {
        prefer_local: mode == Mode::Local,
        preferred_segments: vec![owner.node.clone()],
        ..Default::default()
    };
    let keys: Vec<String> = (0..n)
        .map(|i| key(env, &format!("{}/{size}", mode.name()), i))
        .collect();
    let values: Vec<Vec<u8>> = (0..n)
        .map(|i| super::value_of(env.run ^ (size << 8) ^ i, size))
        .collect();
    let mut errors = 0;
    for (k, v) in keys.iter().zip(&values) {
        match client.put(k, v, &cfg).await {
            Ok(info) if info.replicas.iter().all(|r| r.node_name == owner.node) => {}
            _ => errors += 1,
        }
    }
    Measured {
        mode,
        size,
        owner: owner.clone(),
        keys,
        values,
        errors,
    }
}

/// Per key, whether it is only on a disk of the node named (metad's placement).
async fn disk_only_on(metad: &MetadClient, keys: &[(String, String)]) -> Vec<bool> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(256) {
        let names: Vec<String> = chunk.iter().map(|(k, _)| k.clone()).collect();
        match metad.batch_get(names, 0).await {
            Ok(r) => {
                for (i, (_, owner)) in chunk.iter().enumerate() {
                    out.push(r.items.get(i).is_some_and(|p| {
                        !p.replicas.is_empty()
                            && p.replicas
                                .iter()
                                .all(|x| is_disk_generation(x.generation) && &x.node_name == owner)
                    }));
                }
            }
            Err(_) => out.extend(std::iter::repeat_n(false, chunk.len())),
        }
    }
    out
}

/// Pool use (bytes used / total) as the sidecar's `STATS` reports metad's figures.
async fn pool_use(client: &AsyncClient) -> Option<f64> {
    let s = client.stats().await.ok()?;
    (s.bytes_total > 0).then(|| s.bytes_used as f64 / s.bytes_total as f64)
}

/// Fills the pool to [`FILL_TO`] with soft-pinned fillers once, then waits until every key of
/// `keys` is only on its owner's disk. Returns the fillers put (to remove) and whether it got
/// there.
///
/// The fill is not topped up while offload runs: once started, offload goes on down to
/// `offload_watermark - eviction_ratio`, so a fill that kept the pool above the watermark would
/// cycle fillers through the disks without end, and the disks' own eviction (least recently
/// used bucket first) would drop the measured objects, which went there first. Only after a cycle
/// ended with objects still in memory (more of them than one cycle moves on a small pool, or an
/// offload that failed, retried by metad in the next cycle) is the pool filled again, to just
/// above the watermark, at most [`FILL_CYCLES`] times.
async fn push_to_disk(
    client: &AsyncClient,
    env: &Env,
    metad: &MetadClient,
    keys: &[(String, String)],
) -> (Vec<String>, Result<()>) {
    let mut fillers = Vec::new();
    let mut cycles = 0;
    let deadline = Instant::now() + PUSH_TIMEOUT;
    loop {
        let on_disk = disk_only_on(metad, keys).await;
        let done = on_disk.iter().filter(|d| **d).count();
        if done == keys.len() {
            return (fillers, Ok(()));
        }
        if Instant::now() > deadline {
            return (
                fillers,
                Err(Error::Failed(format!(
                    "only {done} of {} objects reached the disks within {PUSH_TIMEOUT:?} after {cycles} fill(s) of the pool (metad's --offload-watermark must be below {REFILL_TO})",
                    keys.len()
                ))),
            );
        }
        let idle = pool_use(client).await.is_some_and(|u| u < OFFLOAD_LOW);
        if idle && cycles < FILL_CYCLES {
            let to = if cycles == 0 { FILL_TO } else { REFILL_TO };
            let more = fill_to(client, env, to, fillers.len()).await;
            fillers.extend(more);
            cycles += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Soft-pinned fillers put until the pool is at `share` of its memory (numbered on from
/// `first`); answers their keys. It puts no more than the bytes missing when it starts: offload
/// may free memory as fast as the puts take it, and a fill that chased the share would then
/// cycle fillers through the disks.
async fn fill_to(client: &AsyncClient, env: &Env, share: f64, first: usize) -> Vec<String> {
    let cfg = ReplicateConfig {
        soft_pin: true,
        soft_pin_ttl: Some(PIN_TTL),
        ..Default::default()
    };
    let value = super::value_of(env.run ^ 0xF111, FILLER);
    let mut fillers = Vec::new();
    let Ok(s) = client.stats().await else {
        return fillers;
    };
    let want = (s.bytes_total as f64 * share) as u64;
    let budget = want.saturating_sub(s.bytes_used).div_ceil(FILLER);
    while (fillers.len() as u64) < budget && pool_use(client).await.is_some_and(|u| u < share) {
        let k = key(env, "fill", (first + fillers.len()) as u64);
        match client.put(&k, &value, &cfg).await {
            Ok(_) => fillers.push(k),
            Err(_) => break,
        }
    }
    fillers
}

/// Tops the pool up to [`HOLD_AT`] once offload has settled, and answers the fillers put.
/// Offload goes on for a while after the measured objects reached the disks (the fillers
/// ordered with them); a pool left below the promotion limit would bring the objects read
/// back to memory, and offload would then move them, or other fillers, out again.
async fn hold(client: &AsyncClient, env: &Env, first: usize) -> Vec<String> {
    let mut fillers = Vec::new();
    for _ in 0..FILL_CYCLES {
        let u = settled_use(client).await;
        if u.is_none_or(|u| u >= HOLD_AT - 0.01) {
            break;
        }
        fillers.extend(fill_to(client, env, HOLD_AT, first + fillers.len()).await);
    }
    fillers
}

/// Pool use once it stopped changing (two readings [`SETTLE_GAP`] apart agree), waiting
/// [`SETTLE_TIMEOUT`] at most.
async fn settled_use(client: &AsyncClient) -> Option<f64> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut last = pool_use(client).await?;
    loop {
        tokio::time::sleep(SETTLE_GAP).await;
        let now = pool_use(client).await?;
        if now == last || Instant::now() > deadline {
            return Some(now);
        }
        last = now;
    }
}

async fn remove_keys(client: &AsyncClient, keys: &[String]) {
    for chunk in keys.chunks(512) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let _ = client.batch_remove(&refs).await;
    }
}

/// A counter or gauge of a sidecar's `/metrics` (0 when absent or unreadable).
pub(super) fn sidecar_metric(addr: SocketAddr, series: &str) -> f64 {
    crate::http::get_text(addr, "/metrics", crate::tiers::STATUS_TIMEOUT)
        .and_then(|text| metric_value(&text, series))
        .unwrap_or(0.0)
}

/// The value of the line `series VALUE` of a Prometheus text page.
fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

pub(super) fn disk_series(name: &str, d: &NodeDisk) -> String {
    format!("{name}{{disk=\"{}\"}}", d.path.display())
}

/// One get_into row over a ring of disk-only objects, every client reading the whole ring.
async fn read_row(
    clients: &[AsyncClient],
    env: Arc<Env>,
    metad: &MetadClient,
    m: &Measured,
    ceiling: f64,
) -> DiskRow {
    let cell = Arc::new(Cell {
        mode: m.mode,
        size: m.size,
        op: Op::GetInto,
    });
    let keys = Arc::new(m.keys.clone());
    let values = Arc::new(m.values.clone());
    let read_series = disk_series("regolith_sidecar_disk_read_bytes", &m.owner);
    let read_before = sidecar_metric(m.owner.status, &read_series);
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(read_client(
                c,
                env.clone(),
                cell.clone(),
                keys.clone(),
                values.clone(),
                i,
            ))
        })
        .collect();
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await.ok().and_then(|r| r.ok()));
    }
    let mut row = super::row_of(&cell, tallies);
    row.errors += m.errors;
    let read_after = sidecar_metric(m.owner.status, &read_series);
    let owned: Vec<(String, String)> = m
        .keys
        .iter()
        .map(|k| (k.clone(), m.owner.node.clone()))
        .collect();
    let disk_only_after = disk_only_on(metad, &owned)
        .await
        .iter()
        .filter(|d| **d)
        .count();
    DiskRow {
        ratio: if ceiling > 0.0 {
            row.gbps / ceiling
        } else {
            0.0
        },
        row,
        owner: m.owner.node.clone(),
        objects: m.keys.len(),
        ceiling_gbps: ceiling,
        disk_only_after,
        disk_read_bytes: (read_after - read_before).max(0.0) as u64,
    }
}

/// One client's reads: rounds of `depth` get_into calls (timed), each verified after (not).
async fn read_client(
    client: AsyncClient,
    env: Arc<Env>,
    cell: Arc<Cell>,
    keys: Arc<Vec<String>>,
    values: Arc<Vec<Vec<u8>>>,
    idx: usize,
) -> Result<Tally> {
    let c = &*cell;
    let mut shm: Vec<ShmBuffer> = Vec::with_capacity(env.depth);
    for _ in 0..env.depth {
        shm.push(client.alloc_buffer(c.size as usize).await?);
    }
    let cfg = ReplicateConfig::default();
    let ring = keys.len();
    let mut t = Tally::default();
    let mut next = idx * 7;
    let mut scratch = Vec::new();
    let deadline = Instant::now() + env.duration;
    while Instant::now() < deadline {
        let plans: Vec<Plan> = (0..env.depth)
            .map(|slot| {
                let i = (next + slot) % ring;
                Plan {
                    slot,
                    keys: vec![keys[i].clone()],
                    vals: vec![i],
                }
            })
            .collect();
        next += env.depth;
        let round = Instant::now();
        let calls: Vec<_> = plans
            .iter()
            .map(|p| timed_call(&client, c, &cfg, p, &values, &shm, 1))
            .collect();
        let outcomes = futures::future::join_all(calls).await;
        t.timed += round.elapsed();
        for (p, (took, outcome)) in plans.iter().zip(outcomes) {
            t.lat.push(took);
            match verify(&env, c, p, &values, &shm, 1, outcome, &mut scratch) {
                Ok(n) => t.items += n,
                Err(_) => t.errors += 1,
            }
        }
    }
    for b in &shm {
        let _ = client.free_buffer(b).await;
    }
    Ok(t)
}

/// Sums a disk series (or the unlabelled offload counter) over the nodes with disks.
fn sum_over(disks: &[NodeDisk], name: &str, labelled: bool) -> f64 {
    disks
        .iter()
        .map(|d| {
            let series = if labelled {
                disk_series(name, d)
            } else {
                name.to_string()
            };
            sidecar_metric(d.status, &series)
        })
        .sum()
}

/// Puts unpinned fillers without pause (the pool stays above the offload watermark, at the
/// eviction watermark) and counts what the nodes move to their disks meanwhile.
async fn offload_row(
    client: &AsyncClient,
    env: &Env,
    metad: &MetadClient,
    disks: &[NodeDisk],
    ceilings: &[DiskCeiling],
) -> OffloadRow {
    let cfg = ReplicateConfig::default();
    let value = super::value_of(env.run ^ 0x0FF1, FILLER);
    let mut keys: Vec<String> = Vec::new();
    let mut put_errors = 0u64;
    // Above the watermark first (untimed).
    let warm_until = Instant::now() + Duration::from_secs(60);
    while pool_use(client).await.unwrap_or(1.0) < FILL_TO && Instant::now() < warm_until {
        for _ in 0..4 {
            let k = key(env, "offload", keys.len() as u64);
            if client.put(&k, &value, &cfg).await.is_ok() {
                keys.push(k);
            }
        }
    }
    let offloads = "regolith_sidecar_disk_offloads_total";
    let writes = "regolith_sidecar_disk_write_bytes";
    let (off0, wr0) = (
        sum_over(disks, offloads, false),
        sum_over(disks, writes, true),
    );
    let ev0 = metad.stats().await.map(|s| s.evicted_objects).unwrap_or(0);
    let window = env.duration.max(OFFLOAD_MIN);
    let (mut use_min, mut use_max) = (f64::MAX, 0.0f64);
    let mut put_ok = 0u64;
    let mut first_error = None;
    let start = Instant::now();
    let mut sampled = start;
    while start.elapsed() < window {
        let round: Vec<String> = (0..OFFLOAD_DEPTH)
            .map(|j| key(env, "offload", (keys.len() + j) as u64))
            .collect();
        let calls = round.iter().map(|k| client.put(k, &value, &cfg));
        for (k, r) in round.iter().zip(futures::future::join_all(calls).await) {
            match r {
                Ok(_) => put_ok += 1,
                Err(e) => {
                    put_errors += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
            keys.push(k.clone());
        }
        if sampled.elapsed() >= Duration::from_millis(200) {
            sampled = Instant::now();
            if let Some(u) = pool_use(client).await {
                use_min = use_min.min(u);
                use_max = use_max.max(u);
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let (off1, wr1) = (
        sum_over(disks, offloads, false),
        sum_over(disks, writes, true),
    );
    let ev1 = metad
        .stats()
        .await
        .map(|s| s.evicted_objects)
        .unwrap_or(ev0);
    remove_keys(client, &keys).await;
    let offloaded = (off1 - off0).max(0.0) as u64;
    let offload_gbps = offloaded as f64 * FILLER as f64 / seconds / 1e9;
    let ceiling = write_ceiling(disks, ceilings);
    OffloadRow {
        object_size: FILLER,
        seconds,
        offloaded_objects: offloaded,
        offload_gbps,
        disk_write_gbps: (wr1 - wr0).max(0.0) / seconds / 1e9,
        put_gbps: put_ok as f64 * FILLER as f64 / seconds / 1e9,
        put_errors,
        first_put_error: first_error,
        evicted_objects: ev1.saturating_sub(ev0),
        pool_use_min: if use_min == f64::MAX { 0.0 } else { use_min },
        pool_use_max: use_max,
        ceiling_gbps: ceiling,
        ratio: if ceiling > 0.0 {
            offload_gbps / ceiling
        } else {
            0.0
        },
    }
}

/// The disk section of the table (stderr).
pub fn print_table(r: &DiskReport) {
    for c in &r.ceilings {
        eprintln!(
            "disk ceiling {} ({}): sequential write {:.2} GB/s, read {:.2} GB/s ({}, {})",
            c.node,
            c.path,
            c.write_gbps,
            c.read_gbps,
            if c.direct_io { "O_DIRECT" } else { "buffered" },
            crate::format::bytes(c.bytes)
        );
    }
    if !r.results.is_empty() {
        eprintln!(
            "{:<12} {:>6} {:<9} {:>7} {:>9} {:>8} {:>7} {:>10} {:>10} {:>6} {:>9}",
            "disk mode",
            "size",
            "op",
            "objects",
            "ops/s",
            "GB/s",
            "ratio",
            "p50 us",
            "p99 us",
            "errors",
            "on disk"
        );
    }
    for d in &r.results {
        eprintln!(
            "{:<12} {:>6} {:<9} {:>7} {:>9.0} {:>8.2} {:>7.2} {:>10.1} {:>10.1} {:>6} {:>9}",
            format!("disk-{}", d.row.mode),
            human(d.row.size),
            d.row.op,
            d.objects,
            d.row.ops_per_s,
            d.row.gbps,
            d.ratio,
            d.row.p50_us,
            d.row.p99_us,
            d.row.errors,
            format!("{}/{}", d.disk_only_after, d.objects)
        );
    }
    if let Some(o) = &r.offload {
        eprintln!(
            "offload under eviction pressure: {:.2} GB/s = {:.2} of the disks' write ceiling {:.2} GB/s ({} objects of {} in {:.1} s; disks wrote {:.2} GB/s; puts {:.2} GB/s, {} failed; {} evicted; pool use {:.2}-{:.2})",
            o.offload_gbps,
            o.ratio,
            o.ceiling_gbps,
            o.offloaded_objects,
            human(o.object_size),
            o.seconds,
            o.disk_write_gbps,
            o.put_gbps,
            o.put_errors,
            o.evicted_objects,
            o.pool_use_min,
            o.pool_use_max
        );
        if let Some(e) = &o.first_put_error {
            eprintln!("  first failed put: {e}");
        }
    }
}

/// Errors of the disk rows (the bench fails on any).
pub fn errors(r: &DiskReport) -> u64 {
    r.results.iter().map(|d| d.row.errors).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines_are_found_by_their_whole_series() {
        let text = "# HELP x\nregolith_sidecar_disk_offloads_total 12\n\
            regolith_sidecar_disk_read_bytes{disk=\"/a\"} 4096\n\
            regolith_sidecar_disk_read_bytes{disk=\"/ab\"} 7\n";
        assert_eq!(
            metric_value(text, "regolith_sidecar_disk_offloads_total"),
            Some(12.0)
        );
        assert_eq!(
            metric_value(text, "regolith_sidecar_disk_read_bytes{disk=\"/a\"}"),
            Some(4096.0)
        );
        assert_eq!(metric_value(text, "regolith_sidecar_disk_read"), None);
    }

    #[test]
    fn rings_hold_a_few_objects_of_every_size() {
        assert_eq!(ring_of(16 << 20, 2 << 30), 4);
        assert_eq!(ring_of(256 << 10, 2 << 30), 64);
        assert_eq!(ring_of(4 << 10, 2 << 30), 64);
        // A small pool: a sixteenth of it per row, at least one object.
        assert_eq!(ring_of(16 << 20, 128 << 20), 1);
        assert_eq!(ring_of(256 << 10, 128 << 20), 32);
    }
}
