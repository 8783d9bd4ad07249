//! `regolith bench`: the benchmark matrix against a running cluster (docs/benchmarks.md).
//!
//! Modes `local` (the object lives in this node's segment) and `remote` (on another node: the
//! bytes cross the data plane); sizes 4 KiB … 32 MiB; ops put, get, put_from, get_into,
//! batch_put_from, batch_get_into, exists, batch_exists. Per cell: ops/s, GB/s (10^9 bytes),
//! p50, p99, errors. Every get is verified byte-exact, outside the timed window; a put whose
//! placement is not where the mode says counts as an error. The machine's ceilings (memcpy of
//! 16 MiB into non-cache-resident memory, one-stream loopback TCP, and one-stream loopback
//! mutual TLS with the data plane's rustls configuration) are measured in the same run; against
//! a cluster whose data plane runs TLS (`regolith up --tls`), remote rows are compared with the
//! TLS ceiling.
//!
//! When the cluster's sidecars have disks ([`disk`]), disk-tier rows follow: gets of objects
//! only on a disk (local and remote) beside the disk's own sequential read ceiling, and the
//! offload rate under eviction pressure beside its write ceiling, measured in the same run.
//! With `--json` stdout carries one JSON object and nothing else.

pub mod disk;
pub mod disk_ceiling;
pub mod hit_ratio;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_client::{AsyncClient, ClientConfig, Dest, ReplicateConfig, ShmBuffer, Source};
use serde::Serialize;

use crate::args::BenchArgs;
use crate::ctx::Ctx;
use crate::error::{Error, Result};

pub const SIZES: [u64; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 32 << 20];
pub const OPS: [Op; 8] = [
    Op::Put,
    Op::Get,
    Op::PutFrom,
    Op::GetInto,
    Op::BatchPutFrom,
    Op::BatchGetInto,
    Op::Exists,
    Op::BatchExists,
];

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    PutFrom,
    GetInto,
    BatchPutFrom,
    BatchGetInto,
    Exists,
    BatchExists,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::PutFrom => "put_from",
            Op::GetInto => "get_into",
            Op::BatchPutFrom => "batch_put_from",
            Op::BatchGetInto => "batch_get_into",
            Op::Exists => "exists",
            Op::BatchExists => "batch_exists",
        }
    }

    fn is_put(self) -> bool {
        matches!(self, Op::Put | Op::PutFrom | Op::BatchPutFrom)
    }

    /// Items per call.
    pub fn batch(self, size: u64) -> usize {
        match self {
            Op::BatchPutFrom | Op::BatchGetInto if size >= 16 << 20 => 4,
            Op::BatchPutFrom | Op::BatchGetInto | Op::BatchExists => 64,
            _ => 1,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Local,
    Remote,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Remote => "remote",
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub mode: &'static str,
    pub size: u64,
    pub op: &'static str,
    pub batch: usize,
    pub ops_per_s: f64,
    pub gbps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

#[derive(Serialize, Clone, Debug)]
pub struct Ceilings {
    pub memcpy_gbps: f64,
    pub tcp_gbps: f64,
    /// Round trip of 32 bytes between two threads over loopback TCP, p50: the floor under any
    /// request/reply latency on this machine (it moves with how idle the cores are).
    pub tcp_rtt_us: f64,
    /// One mutual-TLS stream over loopback (rustls, the data plane's configuration): the
    /// ceiling of a TLS data plane, and beside `tcp_gbps` what encryption costs here.
    pub tls_gbps: f64,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub ceilings: Ceilings,
    /// The sidecar's data plane runs over TLS (remote rows are then measured against
    /// `tls_gbps`).
    pub data_plane_tls: bool,
    pub results: Vec<Row>,
    /// The disk-tier rows and ceilings: present when the cluster has disks (and the filter
    /// keeps some of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<disk::DiskReport>,
}

// ---------------------------------------------------------------------- ceilings

/// Single-thread memcpy of 16 MiB into memory that is not cache-resident (rotating over
/// destinations much larger than any cache), the median of 3 rounds.
pub fn memcpy_ceiling() -> f64 {
    const N: usize = 16 << 20;
    const DSTS: usize = 8;
    let src = vec![0x5Au8; N];
    let mut dsts: Vec<Vec<u8>> = (0..DSTS).map(|i| vec![i as u8; N]).collect();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        for d in dsts.iter_mut() {
            d.copy_from_slice(&src);
            std::hint::black_box(&d[..]);
        }
        rounds.push((N * DSTS) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    median(&mut rounds)
}

/// One TCP stream over loopback between two threads with plain sockets, the median of 3.
pub fn tcp_ceiling() -> Result<f64> {
    const TOTAL: usize = 512 << 20;
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let rx = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut s, _) = l.accept()?;
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < TOTAL {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            s.write_all(b"k")?;
            Ok(())
        });
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let buf = vec![1u8; 1 << 20];
        let start = Instant::now();
        for _ in 0..TOTAL / buf.len() {
            s.write_all(&buf)?;
        }
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack)?;
        rounds.push(TOTAL as f64 / start.elapsed().as_secs_f64() / 1e9);
        rx.join()
            .map_err(|_| Error::Failed("TCP ceiling receiver panicked".into()))??;
    }
    Ok(median(&mut rounds))
}

/// p50 of 2000 round trips of 32 bytes between two threads over loopback TCP (plain sockets,
/// `TCP_NODELAY`).
pub fn tcp_rtt() -> Result<f64> {
    const ROUNDS: usize = 2000;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 32];
        for _ in 0..ROUNDS {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = [7u8; 32];
    let mut lat = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        lat.push(t.elapsed());
    }
    echo.join()
        .map_err(|_| Error::Failed("TCP round-trip echo thread panicked".into()))??;
    lat.sort();
    Ok(percentile(&lat, 0.5))
}

/// One mutual-TLS stream over loopback between two tasks, with the data plane's rustls
/// configuration (certificates of a throwaway CA), the median of 3.
pub async fn tls_ceiling() -> Result<f64> {
    use regolith_proto::tls::{Protocol, TlsArgs};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const TOTAL: usize = 256 << 20;
    let dir = std::env::temp_dir().join(format!("regolith-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let made = regolith_proto::pki::make_cluster(&dir, &["bench"], &["127.0.0.1".into()]);
    let tls = made.and_then(|files| {
        TlsArgs {
            tls_ca: Some(files[0].ca.clone()),
            tls_cert: Some(files[0].cert.clone()),
            tls_key: Some(files[0].key.clone()),
            ..TlsArgs::default()
        }
        .load(true)
    });
    let _ = std::fs::remove_dir_all(&dir);
    let tls = tls
        .map_err(|e| Error::Failed(format!("TLS ceiling: {e}")))?
        .ok_or_else(|| Error::Failed("TLS ceiling: no configuration".into()))?;
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let server = tls.clone();
        let rx = tokio::spawn(async move {
            let (tcp, _) = l.accept().await?;
            let mut s = server.accept(Protocol::Data, tcp).await?;
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < TOTAL {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            s.write_all(b"k").await?;
            s.flush().await
        });
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut s = tls.connect(Protocol::Data, "127.0.0.1", tcp).await?;
        let buf = vec![1u8; 1 << 20];
        let start = Instant::now();
        for _ in 0..TOTAL / buf.len() {
            s.write_all(&buf).await?;
        }
        s.flush().await?;
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).await?;
        rounds.push(TOTAL as f64 / start.elapsed().as_secs_f64() / 1e9);
        rx.await
            .map_err(|_| Error::Failed("TLS ceiling receiver failed".into()))??;
    }
    Ok(median(&mut rounds))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

// ---------------------------------------------------------------------- values

/// The bytes of bench key `k`: derived from the key, so a get can be checked byte-exact.
pub fn value_of(k: u64, size: u64) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; size as usize];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    v
}

// ---------------------------------------------------------------------- one cell

struct Cell {
    mode: Mode,
    size: u64,
    op: Op,
}

/// What one client measured.
#[derive(Default)]
struct Tally {
    items: u64,
    errors: u64,
    lat: Vec<Duration>,
    /// Time with calls in flight: what the rates are computed over.
    timed: Duration,
}

struct Env {
    node: String,
    others: Vec<String>,
    duration: Duration,
    depth: usize,
    /// Flip one byte of the expected value (a test of the bench's own verification).
    corrupt: bool,
    run: u64,
}

fn config(env: &Env, mode: Mode) -> ReplicateConfig {
    match mode {
        Mode::Local => ReplicateConfig {
            prefer_local: true,
            preferred_segments: vec![env.node.clone()],
            ..Default::default()
        },
        Mode::Remote => ReplicateConfig {
            preferred_segments: env.others.clone(),
            ..Default::default()
        },
    }
}

fn key(env: &Env, c: &Cell, client: usize, i: u64) -> String {
    format!(
        "bench/{}/{}/{}/{}/c{client}/{i}",
        env.run,
        c.mode.name(),
        c.size,
        c.op.name()
    )
}

/// Bytes of values one client keeps alive in a cell, at most (beyond the calls in flight).
const RING_BYTES: u64 = 128 << 20;

/// The ring of keys one client cycles through: enough for every call in flight, but never more
/// than [`RING_BYTES`] of values, so a 32 MiB cell neither fills the segments nor the client's memory.
/// Keys repeat within a batch when the ring is shorter than the batch (harmless for reads).
fn ring_len(depth: usize, batch: usize, size: u64) -> u64 {
    let wanted = (depth * batch * 2) as u64;
    let by_memory = (RING_BYTES / size.max(1)).max(4);
    wanted.clamp(4, by_memory)
}

/// Whether a put landed where the mode says.
fn placed_right(mode: Mode, info: &regolith_client::PutInfo) -> bool {
    match mode {
        Mode::Local => info.replicas.iter().all(|r| r.local),
        Mode::Remote => info.replicas.iter().all(|r| !r.local),
    }
}

async fn run_client(
    client: AsyncClient,
    env: Arc<Env>,
    cell: Arc<Cell>,
    idx: usize,
) -> Result<Tally> {
    let c = &*cell;
    let cfg = config(&env, c.mode);
    let batch = c.op.batch(c.size);
    let ring = ring_len(env.depth, batch, c.size);
    let values: Vec<Vec<u8>> = (0..ring)
        .map(|i| value_of(i * 7919 + idx as u64, c.size))
        .collect();
    let mut t = Tally::default();
    // Registered buffers: put_from sources and get_into destinations, one per item in flight.
    let slots = env.depth * batch;
    let shm: Vec<ShmBuffer> = if matches!(
        c.op,
        Op::PutFrom | Op::BatchPutFrom | Op::GetInto | Op::BatchGetInto
    ) {
        let mut v = Vec::with_capacity(slots);
        for _ in 0..slots {
            v.push(client.alloc_buffer(c.size as usize).await?);
        }
        v
    } else {
        Vec::new()
    };
    // Gets and exists read a ring put beforehand.
    if !c.op.is_put() {
        let keys: Vec<String> = (0..ring).map(|i| key(&env, c, idx, i)).collect();
        for (k, v) in keys.iter().zip(&values) {
            match client.put(k, v, &cfg).await {
                Ok(info) if placed_right(c.mode, &info) => {}
                Ok(_) => t.errors += 1,
                Err(_) => t.errors += 1,
            }
        }
    }
    // Rounds of `depth` calls: sources written (untimed), the calls run concurrently (timed,
    // from the first issued to the last answered), then every result verified (untimed). The
    // clock only stops while nothing is in flight, so pipelined rows are never flattered by
    // transfers that progressed while the bench was verifying.
    let deadline = Instant::now() + env.duration;
    let mut next: u64 = 0;
    let mut live: std::collections::VecDeque<String> = Default::default();
    let mut scratch = Vec::new();
    while Instant::now() < deadline {
        let plans: Vec<Plan> = (0..env.depth)
            .map(|slot| {
                let p = plan(&env, c, idx, next, batch, ring, slot);
                next += batch as u64;
                p
            })
            .collect();
        let ready: Vec<bool> = plans
            .iter()
            .map(|p| prepare(c, p, &values, &shm, batch))
            .collect();
        let round = Instant::now();
        let calls: Vec<_> = plans
            .iter()
            .zip(&ready)
            .filter(|(_, ok)| **ok)
            .map(|(p, _)| timed_call(&client, c, &cfg, p, &values, &shm, batch))
            .collect();
        let outcomes = futures::future::join_all(calls).await;
        t.timed += round.elapsed();
        t.errors += ready.iter().filter(|ok| !**ok).count() as u64 * batch as u64;
        for (p, (took, outcome)) in plans.iter().filter(|p| ready[p.slot]).zip(outcomes) {
            t.lat.push(took);
            match verify(&env, c, p, &values, &shm, batch, outcome, &mut scratch) {
                Ok(n) => t.items += n,
                Err(_) => t.errors += batch as u64,
            }
            if c.op.is_put() {
                live.extend(p.keys.iter().cloned());
            }
        }
        // The ring turns: remove what was put, so the segments never fill.
        if live.len() as u64 >= ring {
            let old: Vec<String> = live.drain(..).collect();
            let refs: Vec<&str> = old.iter().map(|s| s.as_str()).collect();
            let _ = client.batch_remove(&refs).await;
        }
    }
    // Clean up this cell's keys (not timed).
    let mut keys: Vec<String> = live.into_iter().collect();
    if !c.op.is_put() {
        keys.extend((0..ring).map(|i| key(&env, c, idx, i)));
    }
    for chunk in keys.chunks(512) {
        let refs: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();
        let _ = client.batch_remove(&refs).await;
    }
    for b in &shm {
        let _ = client.free_buffer(b).await;
    }
    Ok(t)
}

/// One call of a round: its keys, the ring values they carry, and its registered-buffer slot.
struct Plan {
    slot: usize,
    keys: Vec<String>,
    vals: Vec<usize>,
}

fn plan(env: &Env, c: &Cell, idx: usize, first: u64, batch: usize, ring: u64, slot: usize) -> Plan {
    let keys = (0..batch as u64)
        .map(|j| {
            if c.op.is_put() {
                key(env, c, idx, first + j)
            } else {
                key(env, c, idx, (first + j) % ring)
            }
        })
        .collect();
    let vals = (0..batch as u64)
        .map(|j| ((first + j) % ring) as usize)
        .collect();
    Plan { slot, keys, vals }
}

/// Writes the sources of a put_from call into its registered buffers (before the timed part).
fn prepare(c: &Cell, p: &Plan, values: &[Vec<u8>], shm: &[ShmBuffer], batch: usize) -> bool {
    if !matches!(c.op, Op::PutFrom | Op::BatchPutFrom) {
        return true;
    }
    p.vals
        .iter()
        .enumerate()
        .all(|(j, v)| shm[p.slot * batch + j].write(0, &values[*v]).is_ok())
}

/// The timed part of one call: its latency and what it returned (got bytes for `get`).
async fn timed_call(
    client: &AsyncClient,
    c: &Cell,
    cfg: &ReplicateConfig,
    p: &Plan,
    values: &[Vec<u8>],
    shm: &[ShmBuffer],
    batch: usize,
) -> (Duration, Result<Vec<Option<Vec<u8>>>>) {
    let keys = &p.keys;
    let vals: Vec<&Vec<u8>> = p.vals.iter().map(|v| &values[*v]).collect();
    let slot = p.slot;
    let shm_slot = |j: usize| &shm[slot * batch + j];
    let start = Instant::now();
    let outcome: Result<Vec<Option<Vec<u8>>>> = match c.op {
        Op::Put => client
            .put(&keys[0], vals[0], cfg)
            .await
            .map_err(Error::from)
            .and_then(|i| check_place(c.mode, &i))
            .map(|_| vec![None]),
        Op::PutFrom => client
            .put_from(
                &keys[0],
                Source::Shm {
                    buf: shm_slot(0),
                    offset: 0,
                    len: c.size as usize,
                },
                cfg,
            )
            .await
            .map_err(Error::from)
            .and_then(|i| check_place(c.mode, &i))
            .map(|_| vec![None]),
        Op::BatchPutFrom => {
            let items: Vec<(&str, Source)> = keys
                .iter()
                .enumerate()
                .map(|(j, k)| {
                    (
                        k.as_str(),
                        Source::Shm {
                            buf: shm_slot(j),
                            offset: 0,
                            len: c.size as usize,
                        },
                    )
                })
                .collect();
            let res = client.batch_put_from(&items, cfg).await;
            res.into_iter()
                .map(|r| {
                    r.map_err(Error::from)
                        .and_then(|i| check_place(c.mode, &i))
                        .map(|_| None)
                })
                .collect()
        }
        Op::Get => client
            .get(&keys[0])
            .await
            .map(|v| vec![Some(v)])
            .map_err(Error::from),
        Op::GetInto => client
            .get_into(
                &keys[0],
                Dest::Shm {
                    buf: shm_slot(0),
                    offset: 0,
                    len: c.size as usize,
                },
            )
            .await
            .map(|_| vec![None])
            .map_err(Error::from),
        Op::BatchGetInto => {
            let items: Vec<(&str, Dest)> = keys
                .iter()
                .enumerate()
                .map(|(j, k)| {
                    (
                        k.as_str(),
                        Dest::Shm {
                            buf: shm_slot(j),
                            offset: 0,
                            len: c.size as usize,
                        },
                    )
                })
                .collect();
            client
                .batch_get_into(items)
                .await
                .into_iter()
                .map(|r| r.map(|_| None).map_err(Error::from))
                .collect()
        }
        Op::Exists => client
            .exists(&keys[0])
            .await
            .map_err(Error::from)
            .and_then(|e| {
                if e {
                    Ok(vec![None])
                } else {
                    Err(Error::Failed("missing".into()))
                }
            }),
        Op::BatchExists => {
            let refs: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
            client
                .batch_exists(&refs)
                .await
                .map_err(Error::from)
                .and_then(|e| {
                    if e.iter().all(|x| *x) {
                        Ok(vec![None; e.len()])
                    } else {
                        Err(Error::Failed("missing".into()))
                    }
                })
        }
    };
    (start.elapsed(), outcome)
}

/// Checks one call's result after the timed part: every byte read against the value that was
/// put, every put's placement; returns the items that were right.
#[allow(clippy::too_many_arguments)]
fn verify(
    env: &Env,
    c: &Cell,
    p: &Plan,
    values: &[Vec<u8>],
    shm: &[ShmBuffer],
    batch: usize,
    outcome: Result<Vec<Option<Vec<u8>>>>,
    scratch: &mut Vec<u8>,
) -> Result<u64> {
    let vals: Vec<&Vec<u8>> = p.vals.iter().map(|v| &values[*v]).collect();
    let shm_slot = |j: usize| &shm[p.slot * batch + j];
    outcome.and_then(|got| {
        let mut ok = 0u64;
        for (j, g) in got.iter().enumerate() {
            let expected = vals[j];
            let bytes_ok = match (c.op, g) {
                (Op::Get, Some(v)) => same(v, expected, env.corrupt),
                (Op::GetInto | Op::BatchGetInto, _) => {
                    scratch.resize(c.size as usize, 0);
                    shm_slot(j).read(0, scratch).is_ok() && same(scratch, expected, env.corrupt)
                }
                _ => true,
            };
            if bytes_ok {
                ok += 1;
            }
        }
        if ok as usize == got.len() {
            Ok(ok)
        } else {
            Err(Error::Failed(format!(
                "{} of {} items had wrong bytes",
                got.len() as u64 - ok,
                got.len()
            )))
        }
    })
}

fn same(got: &[u8], expected: &[u8], corrupt: bool) -> bool {
    if corrupt && !expected.is_empty() {
        let mut e = expected.to_vec();
        e[expected.len() / 2] ^= 0xFF;
        return got == e.as_slice();
    }
    got == expected
}

fn check_place(mode: Mode, info: &regolith_client::PutInfo) -> Result<()> {
    if placed_right(mode, info) {
        Ok(())
    } else {
        Err(Error::Failed(format!(
            "a {} put landed on {:?}",
            mode.name(),
            info.replicas
        )))
    }
}

async fn run_cell(clients: &[AsyncClient], env: Arc<Env>, cell: Cell) -> Row {
    let cell = Arc::new(cell);
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, c)| tokio::spawn(run_client(c, env.clone(), cell.clone(), i)))
        .collect();
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await.ok().and_then(|r| r.ok()));
    }
    row_of(&cell, tallies)
}

/// A row from what each client measured (None: a client that failed, one error).
fn row_of(cell: &Cell, tallies: Vec<Option<Tally>>) -> Row {
    let mut lat = Vec::new();
    let (mut items_per_s, mut errors) = (0.0, 0u64);
    for t in tallies {
        match t {
            Some(t) => {
                let timed = t.timed.max(Duration::from_micros(1));
                items_per_s += t.items as f64 / timed.as_secs_f64();
                errors += t.errors;
                lat.extend(t.lat);
            }
            None => errors += 1,
        }
    }
    lat.sort();
    Row {
        mode: cell.mode.name(),
        size: cell.size,
        op: cell.op.name(),
        batch: cell.op.batch(cell.size),
        ops_per_s: items_per_s,
        gbps: if matches!(cell.op, Op::Exists | Op::BatchExists) {
            0.0
        } else {
            items_per_s * cell.size as f64 / 1e9
        },
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        errors,
    }
}

/// Whether a memory row passes `--filter` (`mode/size/op` with any part omitted, e.g.
/// `remote/16MiB/get_into`; several, separated by commas, pass a row matching any). The part
/// `memory` names the memory rows, `disk` the disk-tier rows.
pub fn matches_filter(filter: Option<&str>, mode: Mode, size: u64, op: Op) -> bool {
    matches_parts(filter, |part| {
        part == "memory" || part == mode.name() || part == op.name() || is_size(part, size)
    })
}

/// Whether a disk-tier get row (`get_into` of a disk-only object) passes `--filter`.
pub fn matches_disk_filter(filter: Option<&str>, mode: Mode, size: u64) -> bool {
    matches_parts(filter, |part| {
        part == "disk" || part == mode.name() || part == Op::GetInto.name() || is_size(part, size)
    })
}

/// Whether the offload row passes `--filter` (named `disk` or `offload`).
pub fn matches_offload_filter(filter: Option<&str>) -> bool {
    matches_parts(filter, |part| part == "disk" || part == "offload")
}

fn is_size(part: &str, size: u64) -> bool {
    regolith_proto::units::parse_size(part).is_ok_and(|s| s == size)
}

fn matches_parts(filter: Option<&str>, mut accepts: impl FnMut(&str) -> bool) -> bool {
    let Some(f) = filter else { return true };
    f.split(',')
        .any(|one| one.split('/').all(|part| part.is_empty() || accepts(part)))
}

/// The disk rows the filter keeps.
fn wanted_disk_rows(filter: Option<&str>) -> disk::Wanted {
    disk::Wanted {
        cells: [Mode::Local, Mode::Remote]
            .into_iter()
            .flat_map(|m| disk::DISK_SIZES.into_iter().map(move |s| (m, s)))
            .filter(|(m, s)| matches_disk_filter(filter, *m, *s))
            .collect(),
        offload: matches_offload_filter(filter),
    }
}

fn human(size: u64) -> String {
    if size >= 1 << 20 {
        format!("{}MiB", size >> 20)
    } else {
        format!("{}KiB", size >> 10)
    }
}

pub fn run(ctx: &Ctx, a: &BenchArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if a.hit_ratio {
        return run_hit_ratio(ctx, a, &rt);
    }
    let socket = ctx.socket();
    eprintln!("measuring the machine's ceilings...");
    let memcpy = memcpy_ceiling();
    let tcp = tcp_ceiling()?;
    let rtt = tcp_rtt()?;
    let tls = rt.block_on(tls_ceiling())?;
    eprintln!("  memcpy {memcpy:.2} GB/s, loopback TCP {tcp:.2} GB/s, TCP round trip {rtt:.1} us, loopback TLS {tls:.2} GB/s");
    let wanted = wanted_disk_rows(a.filter.as_deref());
    let node_disks = if wanted.is_empty() {
        Vec::new()
    } else {
        let addrs = crate::tiers::status_addrs(ctx, &a.sidecar_metrics)?;
        disk::node_disks(&crate::tiers::fetch_statuses(&addrs))
    };
    let report = rt.block_on(async {
        let mut clients = Vec::new();
        for i in 0..a.clients.max(1) {
            let mut cfg = ClientConfig::new(&socket);
            cfg.name = format!("bench-{i}");
            clients.push(AsyncClient::connect(cfg).await?);
        }
        let node = clients[0].node_name().await?;
        let data_plane_tls = clients[0].stats().await.map(|s| s.tls).unwrap_or(false);
        let segs = clients[0].list_segments().await?;
        let others: Vec<String> = segs
            .iter()
            .filter(|s| !s.local && s.capacity > 0 && s.alive)
            .map(|s| s.node_name.clone())
            .collect();
        let local_segment = segs.iter().any(|s| s.local && s.capacity > 0);
        let env = Arc::new(Env {
            node,
            others,
            duration: a.duration,
            depth: a.depth.max(1) as usize,
            corrupt: a.corrupt_for_test,
            run: rand::random::<u32>() as u64,
        });
        let cells: Vec<(Mode, u64, Op)> = [Mode::Local, Mode::Remote]
            .into_iter()
            .flat_map(|m| {
                SIZES
                    .into_iter()
                    .flat_map(move |s| OPS.into_iter().map(move |o| (m, s, o)))
            })
            .filter(|(m, s, o)| matches_filter(a.filter.as_deref(), *m, *s, *o))
            .collect();
        let mut rows = Vec::new();
        let stop = Arc::new(AtomicBool::new(false));
        for (i, (mode, size, op)) in cells.iter().copied().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            eprint!(
                "\r\x1b[2K[{}/{}] {} {} {}",
                i + 1,
                cells.len(),
                mode.name(),
                human(size),
                op.name()
            );
            let _ = std::io::stderr().flush();
            let runnable = match mode {
                Mode::Local => local_segment,
                Mode::Remote => !env.others.is_empty(),
            };
            let row = if runnable {
                run_cell(&clients, env.clone(), Cell { mode, size, op }).await
            } else {
                // No place for this mode: the row is reported, as errors.
                Row {
                    mode: mode.name(),
                    size,
                    op: op.name(),
                    batch: op.batch(size),
                    ops_per_s: 0.0,
                    gbps: 0.0,
                    p50_us: 0.0,
                    p99_us: 0.0,
                    errors: 1,
                }
            };
            rows.push(row);
        }
        eprintln!();
        let disk = if node_disks.is_empty() || wanted.is_empty() || stop.load(Ordering::Relaxed) {
            None
        } else {
            let metad = ctx.metad_async()?;
            let disks = disk::Disks::of(&node_disks, &env.node);
            let net = if data_plane_tls { tls } else { tcp };
            Some(disk::run(&clients, env.clone(), &metad, &disks, &wanted, net).await?)
        };
        Ok::<_, Error>(Report {
            ceilings: Ceilings {
                memcpy_gbps: memcpy,
                tcp_gbps: tcp,
                tcp_rtt_us: rtt,
                tls_gbps: tls,
            },
            data_plane_tls,
            results: rows,
            disk,
        })
    })?;
    print_table(&report);
    if let Some(d) = &report.disk {
        disk::print_table(d);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| Error::Failed(e.to_string()))?
        );
    }
    let errors: u64 = report.results.iter().map(|r| r.errors).sum::<u64>()
        + report.disk.as_ref().map_or(0, disk::errors);
    if errors > 0 {
        return Err(Error::Failed(format!(
            "{errors} errors in the benchmark (see the table)"
        )));
    }
    Ok(())
}

/// `--hit-ratio`: the trace against the cluster, beside the ideal LRU (no ceilings: a ratio of
/// hit ratios).
fn run_hit_ratio(ctx: &Ctx, a: &BenchArgs, rt: &tokio::runtime::Runtime) -> Result<()> {
    let finite_above = |x: f64, min: f64| x.is_finite() && x >= min;
    if !finite_above(a.working_set, f64::MIN_POSITIVE) || !finite_above(a.zipf, 0.0) {
        return Err(Error::usage(
            "--working-set must be above 0 and --zipf at least 0",
        ));
    }
    let addrs = crate::tiers::status_addrs(ctx, &a.sidecar_metrics)?;
    let statuses = crate::tiers::fetch_statuses(&addrs);
    let disk_bytes: u64 = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .flat_map(|s| s.disks.iter().filter(|d| d.healthy))
        .map(|d| d.capacity_bytes)
        .sum();
    let disks = disk::node_disks(&statuses);
    let disk_reads = || -> u64 {
        disks
            .iter()
            .map(|d| {
                disk::sidecar_metric(
                    d.status,
                    &disk::disk_series("regolith_sidecar_disk_reads", d),
                ) as u64
            })
            .sum()
    };
    let params = hit_ratio::Params {
        working_set: a.working_set,
        object_size: a.object_size,
        accesses: a.accesses,
        zipf: a.zipf,
        seed: a.seed,
        depth: a.depth.max(1) as usize,
    };
    let report = rt.block_on(async {
        let mut cfg = ClientConfig::new(ctx.socket());
        cfg.name = "bench-hit-ratio".into();
        let client = AsyncClient::connect(cfg).await?;
        hit_ratio::run(&client, &params, disk_bytes, disk_reads).await
    })?;
    hit_ratio::print(&report);
    if a.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            hit_ratio: &'a hit_ratio::HitRatioReport,
        }
        let doc = Doc { hit_ratio: &report };
        println!(
            "{}",
            serde_json::to_string(&doc).map_err(|e| Error::Failed(e.to_string()))?
        );
    }
    if report.errors > 0 {
        return Err(Error::Failed(format!(
            "{} reads failed and {} returned wrong bytes",
            report.failed, report.wrong
        )));
    }
    Ok(())
}

fn print_table(r: &Report) {
    let c = &r.ceilings;
    eprintln!("ceilings: memcpy {:.2} GB/s (16 MiB, not cache-resident), loopback TCP {:.2} GB/s (one stream), TCP round trip p50 {:.1} us, loopback TLS {:.2} GB/s (one stream, {:.2} of TCP)", c.memcpy_gbps, c.tcp_gbps, c.tcp_rtt_us, c.tls_gbps, c.tls_gbps / c.tcp_gbps);
    let remote_ceiling = if r.data_plane_tls {
        eprintln!("data plane: mutual TLS (remote rows' ratio is to the loopback TLS ceiling)");
        c.tls_gbps
    } else {
        c.tcp_gbps
    };
    eprintln!(
        "{:<7} {:>6} {:<15} {:>5} {:>12} {:>8} {:>7} {:>10} {:>10} {:>6}",
        "mode", "size", "op", "batch", "ops/s", "GB/s", "ratio", "p50 us", "p99 us", "errors"
    );
    for row in &r.results {
        let ceiling = if row.mode == "local" {
            c.memcpy_gbps
        } else {
            remote_ceiling
        };
        let ratio = if row.gbps > 0.0 {
            format!("{:.2}", row.gbps / ceiling)
        } else {
            "-".into()
        };
        eprintln!(
            "{:<7} {:>6} {:<15} {:>5} {:>12.0} {:>8.2} {:>7} {:>10.1} {:>10.1} {:>6}",
            row.mode,
            human(row.size),
            row.op,
            row.batch,
            row.ops_per_s,
            row.gbps,
            ratio,
            row.p50_us,
            row.p99_us,
            row.errors
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_parts_and_alternatives() {
        let m = |f: &str, mode, size, op| matches_filter(Some(f), mode, size, op);
        assert!(matches_filter(None, Mode::Remote, 4096, Op::Get));
        assert!(m(
            "remote/16MiB/get_into",
            Mode::Remote,
            16 << 20,
            Op::GetInto
        ));
        assert!(!m(
            "remote/16MiB/get_into",
            Mode::Local,
            16 << 20,
            Op::GetInto
        ));
        assert!(!m(
            "remote/16MiB/get_into",
            Mode::Remote,
            32 << 20,
            Op::GetInto
        ));
        assert!(m("/4KiB/", Mode::Local, 4096, Op::Exists));
        assert!(m("local", Mode::Local, 1 << 20, Op::Put));
        assert!(m("exists,remote/1MiB", Mode::Remote, 1 << 20, Op::Put));
        assert!(m("exists,remote/1MiB", Mode::Local, 4096, Op::Exists));
        assert!(!m("exists,remote/1MiB", Mode::Local, 1 << 20, Op::Put));
        // Tiers: `memory` keeps the memory rows only, `disk` the disk rows only.
        assert!(m("memory/4KiB", Mode::Local, 4096, Op::Get));
        assert!(!m("disk", Mode::Local, 4096, Op::Get));
        let d = |f: &str, mode, size| matches_disk_filter(Some(f), mode, size);
        assert!(d("disk", Mode::Remote, 16 << 20));
        assert!(d("local/16MiB/get_into", Mode::Local, 16 << 20));
        assert!(!d("memory", Mode::Local, 16 << 20));
        assert!(!d("local/get", Mode::Local, 16 << 20));
        assert!(!d("disk/remote", Mode::Local, 16 << 20));
        assert!(matches_offload_filter(Some("offload")));
        assert!(matches_offload_filter(Some("local/4KiB,disk")));
        assert!(!matches_offload_filter(Some("local")));
        assert!(matches_offload_filter(None));
        let w = wanted_disk_rows(Some("disk/16MiB"));
        assert_eq!(w.cells, [(Mode::Local, 16 << 20), (Mode::Remote, 16 << 20)]);
        assert!(!w.offload);
        assert!(wanted_disk_rows(Some("remote/64KiB/get")).is_empty());
    }

    #[test]
    fn the_ring_holds_every_call_in_flight_within_its_memory_cap() {
        assert_eq!(ring_len(1, 1, 4096), 4);
        assert_eq!(ring_len(4, 64, 4096), 512);
        // 32 MiB values: 128 MiB at most, however deep the pipeline.
        assert_eq!(ring_len(4, 4, 32 << 20), 4);
        assert_eq!(ring_len(1, 4, 16 << 20), 8);
    }
}
