//! The client side of the data plane: a connection pool per peer node and the driver that runs
//! one transfer's slices in parallel across every NIC pair.
//!
//! All slices of a transfer run as futures inside the caller's task, each owning its connection
//! and the disjoint part of the caller's buffers it reads or fills. That keeps the borrow of the
//! caller's memory sound without `unsafe`: when `write`/`read` returns, or is dropped, no I/O
//! into that memory can still be running. (Spawned per-connection tasks would use more cores for
//! one huge transfer, but could outlive a cancelled caller and write into memory it reused;
//! concurrent transfers run on their own tasks and spread over cores anyway.)
//!
//! Why one file over 600 lines: the pool and the driver share the check-out/return rules of a
//! connection (which pair, when it is dropped, when a slice moves to another pair), and the
//! driver's soundness argument above covers both.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use regolith_proto::checksum::{chunk_count, CHUNK};
use regolith_proto::dataplane::{Kind, MAX_SLICE_LEN};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use super::plan::{nic_pairs, pick_pair, plan_slices, PairHealth, Schedule, Slice};
use super::stats::{NicCounters, TransferEvent, TransportStats};
use super::{
    Connection, NicPair, PeerAddrs, RemoteRange, SliceError, SliceSpec, Transport, Version,
};
use crate::error::{Error, Result};

/// Striping settings.
#[derive(Clone, Debug)]
pub struct StripeConfig {
    /// Local NIC addresses to bind connections to; empty lets the kernel choose.
    pub local_nics: Vec<std::net::IpAddr>,
    /// Connections per (local NIC, remote NIC) pair that one transfer stripes over.
    pub conns_per_nic_pair: usize,
    /// Idle connections kept per pair between transfers.
    pub max_idle_per_nic_pair: usize,
    /// Slice size; a multiple of the 64 KiB checksum chunk, at most 64 MiB.
    pub slice_size: u32,
    /// Whole-transfer deadline.
    pub transfer_timeout: Duration,
    /// Re-dial back-off of a failing pair: `base * 2^(n-2)` after n consecutive failures.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Consecutive failures after which a transfer stops using a pair.
    pub max_pair_failures: u32,
}

impl Default for StripeConfig {
    fn default() -> Self {
        Self {
            local_nics: Vec::new(),
            conns_per_nic_pair: 2,
            max_idle_per_nic_pair: 8,
            slice_size: 1 << 20,
            transfer_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            max_pair_failures: 3,
        }
    }
}

impl StripeConfig {
    pub fn validate(&self) -> Result<()> {
        if self.slice_size == 0
            || self.slice_size as usize % CHUNK != 0
            || self.slice_size > MAX_SLICE_LEN
        {
            return Err(Error::Config(format!(
                "slice size {} must be a positive multiple of {CHUNK} and at most {MAX_SLICE_LEN}",
                self.slice_size
            )));
        }
        if self.conns_per_nic_pair == 0 {
            return Err(Error::Config(
                "conns_per_nic_pair must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// What a finished transfer did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferReport {
    pub bytes: u64,
    pub slices: usize,
    /// Slices re-sent after their connection failed.
    pub retries: u32,
    pub elapsed: Duration,
}

struct PeerPool<C> {
    addrs: Vec<SocketAddr>,
    pairs: Vec<NicPair>,
    idle: Vec<Vec<C>>,
    health: Vec<PairHealth>,
    /// One permit per connection that may be busy towards this peer at once (the pool's
    /// capacity): concurrent transfers queue for a lane instead of each dialing its own
    /// connection, which a batch of 64 small gets would otherwise do (a dial and handshake per
    /// item, and the extra connections dropped again at check-in).
    lanes: Arc<Semaphore>,
}

/// The caller memory one slice works on.
enum Bufs<'a> {
    Write(&'a [u8], &'a mut [u64]),
    Read(&'a mut [u8], &'a mut [u64]),
}

enum Event<'a, C> {
    Dialed {
        pair: usize,
        result: Result<C>,
    },
    Sliced {
        pair: usize,
        slice: usize,
        conn: C,
        result: std::result::Result<(), SliceError>,
        bufs: Bufs<'a>,
    },
}

/// Everything about one transfer the driver needs.
struct Job<'p> {
    kind: Kind,
    peer: &'p PeerAddrs,
    range: RemoteRange,
    version: Version,
    slices: Vec<Slice>,
}

/// Per-transfer state of the NIC pairs.
struct PairState {
    pairs: Vec<NicPair>,
    nics: Vec<Arc<NicCounters>>,
    lanes: Vec<usize>,
    failures: Vec<u32>,
    given_up: Vec<bool>,
    /// The pair this transfer starts from (rotated per transfer).
    first: usize,
}

/// The data-plane client: a pool of connections to every peer, and striped transfers.
pub struct DataClient<T: Transport> {
    transport: T,
    cfg: StripeConfig,
    stats: Arc<TransportStats>,
    pools: Mutex<HashMap<u64, PeerPool<T::Conn>>>,
    /// Rotates the NIC pair each transfer starts on (check-out and dials).
    rotation: AtomicUsize,
}

impl<T: Transport> DataClient<T> {
    pub fn new(transport: T, cfg: StripeConfig, stats: Arc<TransportStats>) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            transport,
            cfg,
            stats,
            pools: Mutex::new(HashMap::new()),
            rotation: AtomicUsize::new(0),
        })
    }

    pub fn stats(&self) -> &Arc<TransportStats> {
        &self.stats
    }

    pub fn config(&self) -> &StripeConfig {
        &self.cfg
    }

    /// Writes `src` to `dst` on `peer`, slice by slice in parallel. `chunk_hashes` (one entry
    /// per 64 KiB chunk of `src`) receives the per-chunk hashes of the bytes sent, seeded with
    /// `version`; [`regolith_proto::checksum::combine`] turns them into the object checksum.
    pub async fn write(
        &self,
        peer: &PeerAddrs,
        dst: RemoteRange,
        version: Version,
        src: &[u8],
        chunk_hashes: &mut [u64],
    ) -> Result<TransferReport> {
        check_args(dst, src.len(), chunk_hashes.len())?;
        let slices = plan_slices(dst.len, self.cfg.slice_size);
        let mut bufs = Vec::with_capacity(slices.len());
        let (mut data, mut hashes) = (src, chunk_hashes);
        for s in &slices {
            let (d, rest) = data.split_at(s.len as usize);
            let (h, hrest) = std::mem::take(&mut hashes).split_at_mut(s.chunks);
            bufs.push(Some(Bufs::Write(d, h)));
            (data, hashes) = (rest, hrest);
        }
        self.run(Kind::Write, peer, dst, version, slices, bufs)
            .await
    }

    /// Reads `src` on `peer` straight into `dst`, slice by slice in parallel; `chunk_hashes`
    /// receives the hash of each 64 KiB chunk as it arrived, so the caller can verify the
    /// object checksum with [`regolith_proto::checksum::combine`] without another pass.
    pub async fn read(
        &self,
        peer: &PeerAddrs,
        src: RemoteRange,
        version: Version,
        dst: &mut [u8],
        chunk_hashes: &mut [u64],
    ) -> Result<TransferReport> {
        check_args(src, dst.len(), chunk_hashes.len())?;
        let slices = plan_slices(src.len, self.cfg.slice_size);
        let mut bufs = Vec::with_capacity(slices.len());
        let (mut data, mut hashes) = (dst, chunk_hashes);
        for s in &slices {
            let (d, rest) = std::mem::take(&mut data).split_at_mut(s.len as usize);
            let (h, hrest) = std::mem::take(&mut hashes).split_at_mut(s.chunks);
            bufs.push(Some(Bufs::Read(d, h)));
            (data, hashes) = (rest, hrest);
        }
        self.run(Kind::Read, peer, src, version, slices, bufs).await
    }

    /// Dials `conns_per_nic_pair` connections on every pair of `peer` ahead of the first
    /// transfer; returns how many are now pooled.
    pub async fn connect_all(&self, peer: &PeerAddrs) -> usize {
        let (pairs, _) = self.pool_pairs(peer);
        let dials: FuturesUnordered<_> = (0..self.cfg.conns_per_nic_pair)
            .flat_map(|_| pairs.iter().enumerate())
            .map(|(i, p)| async move { (i, self.transport.connect(*p, peer.node_id).await) })
            .collect();
        let done: Vec<_> = dials.collect().await;
        let mut ok = Vec::new();
        for (i, r) in done {
            match r {
                Ok(c) => ok.push((i, c)),
                Err(e) => {
                    self.stats
                        .nic(pairs[i].local)
                        .failed_conns
                        .fetch_add(1, Relaxed);
                    warn!(node = peer.node_id, pair = %pairs[i], "dial failed: {e}");
                }
            }
        }
        let n = ok.len();
        self.checkin(peer.node_id, ok);
        n
    }

    /// Drops the pooled connections of `node` (it left, or its addresses changed).
    pub fn forget_peer(&self, node: u64) {
        self.pools.lock().remove(&node);
    }

    async fn run<'a>(
        &'a self,
        kind: Kind,
        peer: &'a PeerAddrs,
        range: RemoteRange,
        version: Version,
        slices: Vec<Slice>,
        mut bufs: Vec<Option<Bufs<'a>>>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        let n = slices.len();
        let job = Job {
            kind,
            peer,
            range,
            version,
            slices,
        };
        let r = if n == 0 {
            Ok(0)
        } else {
            match tokio::time::timeout(self.cfg.transfer_timeout, self.drive(&job, &mut bufs)).await
            {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    node: peer.node_id,
                    kind,
                    generation: range.generation,
                    offset: range.offset,
                    len: range.len,
                    ms: self.cfg.transfer_timeout.as_millis() as u64,
                }),
            }
        };
        let elapsed = start.elapsed();
        self.stats.transfer_done(&TransferEvent {
            kind,
            node: peer.node_id,
            bytes: range.len,
            slices: n,
            retries: *r.as_ref().unwrap_or(&0),
            elapsed,
            ok: r.is_ok(),
        });
        r.map(|retries| TransferReport {
            bytes: range.len,
            slices: n,
            retries,
            elapsed,
        })
    }

    /// The event loop of one transfer: feed idle connections with pending slices, dial more
    /// connections while slices wait, and react to each finished dial or slice.
    async fn drive<'a>(&'a self, job: &Job<'a>, bufs: &mut [Option<Bufs<'a>>]) -> Result<u32> {
        let node = job.peer.node_id;
        let (pairs, lane_permits) = self.pool_pairs(job.peer);
        let want = job
            .slices
            .len()
            .min(self.cfg.conns_per_nic_pair * pairs.len());
        let _permits = acquire_lanes(lane_permits, want).await;
        let target = _permits.len().max(1);
        let max_attempts = (pairs.len() as u32 * self.cfg.max_pair_failures).max(2) + 1;
        let mut sched = Schedule::new(job.slices.len(), max_attempts);
        let mut ps = PairState {
            nics: pairs.iter().map(|p| self.stats.nic(p.local)).collect(),
            lanes: vec![0; pairs.len()],
            failures: vec![0; pairs.len()],
            given_up: vec![false; pairs.len()],
            first: self.rotation.fetch_add(1, Relaxed),
            pairs,
        };
        let mut idle = self.checkout(node, &mut ps.lanes, target, ps.first);
        let mut inflight: FuturesUnordered<BoxFuture<'a, Event<'a, T::Conn>>> =
            FuturesUnordered::new();
        let mut last_err = String::from("no connection attempted");

        let result = loop {
            while sched.has_pending() && !idle.is_empty() {
                let (Some(i), Some((pair, conn))) = (sched.next_slice(), idle.pop()) else {
                    break;
                };
                // A pending slice always owns its buffers: they are taken when it is sent and
                // given back before it is queued again.
                match bufs[i].take() {
                    Some(b) => inflight.push(self.slice_op(job, pair, i, conn, b)),
                    None => idle.push((pair, conn)),
                }
            }
            if sched.is_done() {
                break Ok(sched.retries());
            }
            self.dial_more(job, &sched, &mut ps, target, &mut inflight);
            let Some(ev) = inflight.next().await else {
                break Err(self.no_path(job, &ps, &last_err));
            };
            match ev {
                Event::Dialed {
                    pair,
                    result: Ok(conn),
                } => idle.push((pair, conn)),
                Event::Dialed {
                    pair,
                    result: Err(e),
                } => {
                    ps.lanes[pair] -= 1;
                    last_err = e.to_string();
                    if matches!(e, Error::Handshake { .. }) {
                        // A refused handshake (token, version, node id) will not change on retry.
                        ps.failures[pair] = self.cfg.max_pair_failures.saturating_sub(1);
                    }
                    self.pair_failed(node, &mut ps, pair, &last_err);
                }
                Event::Sliced {
                    pair,
                    slice,
                    conn,
                    result: Ok(()),
                    ..
                } => {
                    sched.complete(slice);
                    ps.failures[pair] = 0;
                    ps.nics[pair].slices.fetch_add(1, Relaxed);
                    self.pair_ok(node, pair);
                    idle.push((pair, conn));
                }
                Event::Sliced {
                    pair,
                    conn,
                    result: Err(SliceError::Refused { status, peer_term }),
                    ..
                } => {
                    idle.push((pair, conn));
                    break Err(Error::Refused {
                        peer: ps.pairs[pair].remote,
                        kind: job.kind,
                        generation: job.range.generation,
                        offset: job.range.offset,
                        len: job.range.len,
                        status,
                        peer_term,
                    });
                }
                Event::Sliced {
                    pair,
                    slice,
                    conn,
                    result: Err(SliceError::Connection(e)),
                    bufs: b,
                } => {
                    drop(conn);
                    ps.lanes[pair] -= 1;
                    bufs[slice] = Some(b);
                    ps.nics[pair].retries.fetch_add(1, Relaxed);
                    last_err = format!("{}: {e}", ps.pairs[pair]);
                    debug!(node, slice, pair = %ps.pairs[pair], "slice failed, retrying: {e}");
                    self.pair_failed(node, &mut ps, pair, &last_err);
                    if sched.failed(slice).is_err() {
                        break Err(self.no_path(job, &ps, &last_err));
                    }
                }
            }
        };
        // Connections that finished cleanly go back to the pool; those still busy (only when
        // the transfer failed) are dropped with `inflight`.
        self.checkin(node, idle);
        result
    }

    /// Starts dials until the transfer has `target` lanes, while slices are waiting.
    fn dial_more<'a>(
        &'a self,
        job: &Job<'a>,
        sched: &Schedule,
        ps: &mut PairState,
        target: usize,
        inflight: &mut FuturesUnordered<BoxFuture<'a, Event<'a, T::Conn>>>,
    ) {
        if !sched.has_pending() {
            return;
        }
        let health = self.health(job.peer.node_id, ps.pairs.len());
        let now = Instant::now();
        while ps.lanes.iter().sum::<usize>() < target {
            let desperate = inflight.is_empty();
            let Some(pair) = pick_pair(&health, &ps.lanes, &ps.given_up, now, desperate, ps.first)
            else {
                return;
            };
            ps.lanes[pair] += 1;
            let np = ps.pairs[pair];
            let node = job.peer.node_id;
            inflight.push(Box::pin(async move {
                Event::Dialed {
                    pair,
                    result: self.transport.connect(np, node).await,
                }
            }));
            if desperate {
                // One probe at a time when every pair is backed off.
                return;
            }
        }
    }

    fn slice_op<'a>(
        &'a self,
        job: &Job<'a>,
        pair: usize,
        slice: usize,
        mut conn: T::Conn,
        mut bufs: Bufs<'a>,
    ) -> BoxFuture<'a, Event<'a, T::Conn>> {
        let s = job.slices[slice];
        let spec = SliceSpec {
            generation: job.range.generation,
            offset: job.range.offset + s.start,
            len: s.len,
            version: job.version,
            grant: job.range.grant,
        };
        Box::pin(async move {
            let result = match &mut bufs {
                Bufs::Write(src, h) => conn.write_slice(spec, src, h).await,
                Bufs::Read(dst, h) => conn.read_slice(spec, dst, h).await,
            };
            Event::Sliced {
                pair,
                slice,
                conn,
                result,
                bufs,
            }
        })
    }

    fn pair_failed(&self, node: u64, ps: &mut PairState, pair: usize, err: &str) {
        ps.nics[pair].failed_conns.fetch_add(1, Relaxed);
        ps.failures[pair] += 1;
        if ps.failures[pair] >= self.cfg.max_pair_failures && !ps.given_up[pair] {
            ps.given_up[pair] = true;
            warn!(node, pair = %ps.pairs[pair], "giving up on NIC pair for this transfer: {err}");
        }
        let now = Instant::now();
        if let Some(pool) = self.pools.lock().get_mut(&node) {
            if let Some(h) = pool.health.get_mut(pair) {
                h.on_failure(now, self.cfg.backoff_base, self.cfg.backoff_max);
            }
        }
    }

    fn pair_ok(&self, node: u64, pair: usize) {
        if let Some(pool) = self.pools.lock().get_mut(&node) {
            if let Some(h) = pool.health.get_mut(pair) {
                h.on_success();
            }
        }
    }

    fn no_path(&self, job: &Job<'_>, ps: &PairState, last: &str) -> Error {
        Error::NoPath {
            node: job.peer.node_id,
            kind: job.kind,
            generation: job.range.generation,
            offset: job.range.offset,
            len: job.range.len,
            pairs: ps
                .pairs
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            last: last.to_string(),
        }
    }

    fn health(&self, node: u64, n: usize) -> Vec<PairHealth> {
        match self.pools.lock().get(&node) {
            Some(p) if p.health.len() == n => p.health.clone(),
            _ => vec![PairHealth::default(); n],
        }
    }

    /// The peer's NIC pairs and lane permits, (re)building its pool when its addresses changed.
    fn pool_pairs(&self, peer: &PeerAddrs) -> (Vec<NicPair>, Arc<Semaphore>) {
        let mut pools = self.pools.lock();
        let pool = pools
            .entry(peer.node_id)
            .or_insert_with(|| new_pool(&self.cfg, peer));
        if pool.addrs != peer.addrs {
            *pool = new_pool(&self.cfg, peer);
        }
        (pool.pairs.clone(), pool.lanes.clone())
    }

    /// Takes pooled connections for up to `target` lanes, spread over pairs round-robin from
    /// pair `first`.
    fn checkout(
        &self,
        node: u64,
        lanes: &mut [usize],
        target: usize,
        first: usize,
    ) -> Vec<(usize, T::Conn)> {
        let mut out = Vec::new();
        let mut pools = self.pools.lock();
        let Some(pool) = pools.get_mut(&node) else {
            return out;
        };
        // The pool may have been rebuilt for new addresses since `lanes` was sized.
        let pairs = pool.idle.len().min(lanes.len());
        let n = pairs.max(1);
        for _ in 0..self.cfg.conns_per_nic_pair {
            for k in 0..pairs {
                let pair = (first + k) % n;
                let idle = &mut pool.idle[pair];
                if out.len() >= target {
                    return out;
                }
                while let Some(mut c) = idle.pop() {
                    if c.is_reusable() {
                        lanes[pair] += 1;
                        out.push((pair, c));
                        break;
                    }
                }
            }
        }
        out
    }

    fn checkin(&self, node: u64, conns: Vec<(usize, T::Conn)>) {
        let mut pools = self.pools.lock();
        let Some(pool) = pools.get_mut(&node) else {
            return;
        };
        for (pair, c) in conns {
            // The pool may have been rebuilt for new addresses meanwhile.
            if pool.pairs.get(pair) == Some(&c.pair())
                && pool.idle[pair].len() < self.cfg.max_idle_per_nic_pair
            {
                pool.idle[pair].push(c);
            }
        }
    }
}

fn new_pool<C>(cfg: &StripeConfig, peer: &PeerAddrs) -> PeerPool<C> {
    let pairs = nic_pairs(&cfg.local_nics, &peer.addrs);
    let per_pair = cfg.max_idle_per_nic_pair.max(cfg.conns_per_nic_pair);
    PeerPool {
        addrs: peer.addrs.clone(),
        idle: pairs.iter().map(|_| Vec::new()).collect(),
        health: vec![PairHealth::default(); pairs.len()],
        lanes: Arc::new(Semaphore::new((per_pair * pairs.len()).max(1))),
        pairs,
    }
}

/// Waits for one lane towards the peer, then takes up to `want` in all without waiting more.
/// (The semaphore is never closed; if it were, the transfer would run with one lane unbounded.)
async fn acquire_lanes(lanes: Arc<Semaphore>, want: usize) -> Vec<OwnedSemaphorePermit> {
    let Ok(first) = lanes.clone().acquire_owned().await else {
        return Vec::new();
    };
    let mut held = vec![first];
    while held.len() < want.max(1) {
        match lanes.clone().try_acquire_owned() {
            Ok(p) => held.push(p),
            Err(_) => break,
        }
    }
    held
}

fn check_args(range: RemoteRange, buf_len: usize, hashes_len: usize) -> Result<()> {
    if buf_len as u64 != range.len {
        return Err(Error::InvalidArgument(format!(
            "buffer of {buf_len} bytes for a transfer of {} bytes at offset {} of generation {}",
            range.len, range.offset, range.generation
        )));
    }
    if range.offset.checked_add(range.len).is_none() {
        return Err(Error::InvalidArgument(format!(
            "range at offset {} of {} bytes overflows",
            range.offset, range.len
        )));
    }
    let want = chunk_count(range.len);
    if hashes_len != want {
        return Err(Error::InvalidArgument(format!(
            "{hashes_len} chunk hashes for {} bytes ({want} chunks)",
            range.len
        )));
    }
    Ok(())
}
