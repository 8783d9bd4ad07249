//! The verbs calls (`sideway`, which loads rdma-core with `dlopen` at run time: a binary built
//! with the feature starts on a machine without it and finds no device).
//!
//! * [`probe`] — devices and ports, never panicking (sideway panics on values it does not
//!   know; a probe that panics is a probe that failed).
//! * [`Engine`] — the node's open ports: one protection domain, completion queue and polling
//!   thread per port; the segment's registration (remote READ only) per port.
//! * [`Completions`] — a port's polling thread hands each work completion to the task waiting
//!   for it; the thread spins briefly while work is outstanding, then backs off to short
//!   sleeps, and parks on a condition variable when nothing is outstanding (no busy spin when
//!   idle).
//! * [`Qp`] — one reliable-connection queue pair, taken from RESET to RTS with the other end's
//!   address, and its one-sided READ / WRITE.
//! * [`Buffer`] — page-aligned memory registered on one port (bounce buffers, staging windows).
//!
//! Not exercised on the machines this was written on (no RDMA device, no Soft-RoCE):
//! `docs/rdma.md` says how to run `sidecar/tests/rdma.rs` where there is one.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use memmap2::MmapMut;
use parking_lot::{Condvar, Mutex};
use regolith_proto::rdma::{LinkLayer, PortAddr};
use sideway::ibverbs::address::{AddressHandleAttribute, GidType};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use super::select::{PortProbe, Probe};

/// An error with its sources ("failed to get device list: Operation not supported"): sideway's
/// errors say what failed and keep the OS error as their source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// `f` of the error's [`chain`].
fn why<E: std::error::Error>(e: &E, f: impl FnOnce(String) -> String) -> String {
    f(chain(e))
}

/// Runs a verbs call that may panic inside sideway on a value it does not know.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{what}: the verbs library reported a value sideway does not know"
        )),
    }
}

fn link_layer(l: sideway::ibverbs::device_context::LinkLayer) -> LinkLayer {
    match l {
        sideway::ibverbs::device_context::LinkLayer::InfiniBand => LinkLayer::InfiniBand,
        // Unspecified is what older drivers report for InfiniBand HCAs.
        sideway::ibverbs::device_context::LinkLayer::Unspecified => LinkLayer::InfiniBand,
        sideway::ibverbs::device_context::LinkLayer::Ethernet => LinkLayer::Ethernet,
    }
}

/// Every port of every device, active or not.
pub fn probe() -> Probe {
    let r = guarded("probe RDMA devices", || {
        let list = DeviceList::new().map_err(|e| why(&e, |e| format!("listing devices: {e}")))?;
        let mut out = Vec::new();
        for dev in list.iter() {
            let name = dev.name();
            let ctx = match dev.open() {
                Ok(c) => c,
                Err(e) => {
                    warn!(device = %name, "cannot open RDMA device: {}", chain(&e));
                    continue;
                }
            };
            let ports = ctx
                .query_device()
                .map(|a| a.phys_port_cnt())
                .map_err(|e| why(&e, |e| format!("querying {name}: {e}")))?;
            for port in 1..=ports {
                let Ok(attr) = ctx.query_port(port) else {
                    continue;
                };
                out.push(PortProbe {
                    device: name.clone(),
                    port,
                    active: attr.port_state() == PortState::Active,
                    link_layer: link_layer(attr.link_layer()),
                });
            }
        }
        Ok(out)
    });
    match r {
        Ok(p) => Probe::Ports(p),
        Err(e) => Probe::Failed(e),
    }
}

fn mtu_number(m: Mtu) -> u8 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

fn mtu_of(n: u8) -> Mtu {
    match n {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// How a completion ended: `Err` carries the work completion's status.
type Completion = Result<(), String>;

/// The waiters of one port's completion queue.
pub struct Completions {
    waiters: Mutex<HashMap<u64, oneshot::Sender<Completion>>>,
    outstanding: AtomicUsize,
    next_id: AtomicU64,
    idle: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Completions {
    fn new() -> Self {
        Self {
            waiters: Mutex::new(HashMap::new()),
            outstanding: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            idle: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// A work-request id and the receiver its completion will be sent on.
    fn expect(&self) -> (u64, oneshot::Receiver<Completion>) {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, tx);
        if self.outstanding.fetch_add(1, Relaxed) == 0 {
            let _g = self.idle.lock();
            self.wake.notify_one();
        }
        (id, rx)
    }

    /// Forgets a request that was never posted or whose waiter gave up.
    fn forget(&self, id: u64) {
        if self.waiters.lock().remove(&id).is_some() {
            self.outstanding.fetch_sub(1, Relaxed);
        }
    }

    fn complete(&self, id: u64, r: Completion) {
        if let Some(tx) = self.waiters.lock().remove(&id) {
            self.outstanding.fetch_sub(1, Relaxed);
            let _ = tx.send(r);
        }
    }
}

/// Polls one completion queue until `done.stop`: spins for a few microseconds after work,
/// then yields, then sleeps 50 µs at a time; parks when no request is outstanding.
fn poll_loop(cq: Arc<BasicCompletionQueue>, done: Arc<Completions>, name: String) {
    const SPIN: u32 = 2_000;
    const YIELD: u32 = 4_000;
    let mut empty = 0u32;
    while !done.stop.load(Relaxed) {
        if done.outstanding.load(Relaxed) == 0 {
            let mut g = done.idle.lock();
            if done.outstanding.load(Relaxed) == 0 && !done.stop.load(Relaxed) {
                done.wake.wait_for(&mut g, Duration::from_millis(100));
            }
            continue;
        }
        let polled = guarded("poll completion queue", || match cq.start_poll() {
            Ok(poller) => {
                let mut n = 0;
                for wc in poller {
                    n += 1;
                    let status = wc.status();
                    let r = if status == 0 {
                        Ok(())
                    } else {
                        Err(format!(
                            "work completion status {status} (vendor error {})",
                            wc.vendor_err()
                        ))
                    };
                    done.complete(wc.wr_id(), r);
                }
                Ok(n)
            }
            Err(sideway::ibverbs::completion::PollCompletionQueueError::CompletionQueueEmpty) => {
                Ok(0)
            }
            Err(e) => Err(e.to_string()),
        });
        match polled {
            Ok(0) => {
                empty = empty.saturating_add(1);
                if empty < SPIN {
                    std::hint::spin_loop();
                } else if empty < YIELD {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Ok(_) => empty = 0,
            Err(e) => {
                warn!(port = %name, "polling RDMA completions failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    debug!(port = %name, "RDMA completion poller stopped");
}

/// One open port.
pub struct Port {
    pub addr: PortAddr,
    /// RDMA READs in flight per queue pair, within the device's limits.
    read_depth: u8,
    /// Held open as long as the port is.
    _ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    cq: Arc<BasicCompletionQueue>,
    done: Arc<Completions>,
    poller: Mutex<Option<JoinHandle<()>>>,
    /// The segment's registration on this port (remote READ only), once attached.
    segment: Mutex<Option<Arc<MemoryRegion>>>,
}

impl Port {
    fn open(probe: &PortProbe) -> Result<Arc<Port>, String> {
        guarded("open RDMA port", || {
            let list =
                DeviceList::new().map_err(|e| why(&e, |e| format!("listing devices: {e}")))?;
            let dev = list
                .iter()
                .find(|d| d.name() == probe.device)
                .ok_or_else(|| format!("device {} is gone", probe.device))?;
            let ctx = dev
                .open()
                .map_err(|e| why(&e, |e| format!("opening {}: {e}", probe.device)))?;
            let attr = ctx.query_port(probe.port).map_err(|e| {
                why(&e, |e| {
                    format!("querying {}:{}: {e}", probe.device, probe.port)
                })
            })?;
            let (gid_index, gid) = pick_gid(&ctx, probe)?;
            let dev = ctx
                .query_device()
                .map_err(|e| why(&e, |e| format!("querying {}: {e}", probe.device)))?;
            // RDMA READs in flight per queue pair: ours, bounded by what the device takes as
            // initiator and as responder.
            let read_depth = [
                READ_DEPTH as i32,
                dev.max_qp_rd_atom(),
                dev.max_qp_init_rd_atom(),
            ]
            .into_iter()
            .min()
            .unwrap_or(1)
            .clamp(1, i32::from(READ_DEPTH)) as u8;
            let pd = ctx.alloc_pd().map_err(|e| {
                why(&e, |e| {
                    format!("protection domain on {}: {e}", probe.device)
                })
            })?;
            let mut cqb = ctx.create_cq_builder();
            cqb.setup_cqe(4096);
            let cq = cqb
                .build()
                .map_err(|e| why(&e, |e| format!("completion queue on {}: {e}", probe.device)))?;
            let addr = PortAddr {
                device: probe.device.clone(),
                port: probe.port,
                link_layer: probe.link_layer,
                mtu: mtu_number(attr.active_mtu()),
                gid_index,
                lid: attr.lid(),
                gid,
            };
            let done = Arc::new(Completions::new());
            let name = format!("{}:{}", probe.device, probe.port);
            let poller = {
                let (cq, done, thread_name) = (cq.clone(), done.clone(), name.clone());
                std::thread::Builder::new()
                    .name(format!("rdma-cq-{name}"))
                    .spawn(move || poll_loop(cq, done, thread_name))
                    .map_err(|e| format!("completion thread for {name}: {e}"))?
            };
            info!(port = %name, lid = addr.lid, gid_index, mtu = addr.mtu, "RDMA port open");
            Ok(Arc::new(Port {
                addr,
                read_depth,
                _ctx: ctx,
                pd,
                cq,
                done,
                poller: Mutex::new(Some(poller)),
                segment: Mutex::new(None),
            }))
        })
    }

    pub fn name(&self) -> String {
        format!("{}:{}", self.addr.device, self.addr.port)
    }

    /// Registers `[ptr, ptr + len)` (the segment mapping) for remote READ on this port.
    ///
    /// # Safety
    /// The mapping must stay mapped until [`Port::detach_segment`] or the port is dropped.
    pub unsafe fn attach_segment(&self, ptr: *mut u8, len: usize) -> Result<(), String> {
        let mr = guarded("register segment", || {
            // SAFETY: the caller keeps the mapping alive for the registration's life.
            unsafe {
                self.pd.reg_mr(
                    ptr as usize,
                    len,
                    AccessFlags::LocalWrite | AccessFlags::RemoteRead,
                )
            }
            .map_err(|e| {
                format!(
                    "registering the segment ({len} bytes) on {}: {}",
                    self.name(),
                    chain(&e)
                )
            })
        })?;
        *self.segment.lock() = Some(mr);
        Ok(())
    }

    pub fn detach_segment(&self) {
        self.segment.lock().take();
    }

    /// The segment's registration: (address, length, rkey).
    pub fn segment(&self) -> Option<(u64, u64, u32)> {
        self.segment
            .lock()
            .as_ref()
            .map(|mr| (mr.get_ptr() as u64, mr.region_len() as u64, mr.rkey()))
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.done.stop.store(true, Relaxed);
        {
            let _g = self.done.idle.lock();
            self.done.wake.notify_all();
        }
        if let Some(h) = self.poller.lock().take() {
            let _ = h.join();
        }
    }
}

/// The GID a port sends from: on RoCE the first RoCE v2 entry with an IPv4-mapped address
/// (routable, what `show_gids` lists first for an IPv4 interface), else the first RoCE v2,
/// else any non-zero; on InfiniBand index 0.
fn pick_gid(ctx: &Arc<DeviceContext>, probe: &PortProbe) -> Result<(u8, [u8; 16]), String> {
    if probe.link_layer == LinkLayer::InfiniBand {
        let gid = ctx.query_gid(probe.port, 0).map_err(|e| {
            why(&e, |e| {
                format!("GID 0 of {}:{}: {e}", probe.device, probe.port)
            })
        })?;
        return Ok((0, gid.raw));
    }
    let table = ctx
        .query_gid_table()
        .map_err(|e| why(&e, |e| format!("GID table of {}: {e}", probe.device)))?;
    let on_port: Vec<_> = table
        .iter()
        .filter(|g| g.port_num() == u32::from(probe.port) && !g.gid().is_zero())
        .collect();
    let v4_mapped = |g: &[u8; 16]| g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff;
    let pick = on_port
        .iter()
        .find(|g| g.gid_type() == GidType::RoceV2 && v4_mapped(&g.gid().raw))
        .or_else(|| on_port.iter().find(|g| g.gid_type() == GidType::RoceV2))
        .or_else(|| on_port.first())
        .ok_or_else(|| format!("no GID on {}:{}", probe.device, probe.port))?;
    let index = u8::try_from(pick.gid_index())
        .map_err(|_| format!("GID index {} does not fit a byte", pick.gid_index()))?;
    Ok((index, pick.gid().raw))
}

/// Page-aligned anonymous memory registered on one port.
pub struct Buffer {
    // Dropped first: the registration before the memory it names.
    mr: Arc<MemoryRegion>,
    map: MmapMut,
}

impl Buffer {
    pub fn new(port: &Port, len: usize, remote_write: bool) -> Result<Buffer, String> {
        let mut map = MmapMut::map_anon(len).map_err(|e| format!("mapping {len} bytes: {e}"))?;
        let access = if remote_write {
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite
        } else {
            AccessFlags::LocalWrite
        };
        let ptr = map.as_mut_ptr() as usize;
        let mr = guarded("register buffer", || {
            // SAFETY: the mapping lives in `self` and is dropped after the registration.
            unsafe { port.pd.reg_mr(ptr, len, access) }.map_err(|e| {
                why(&e, |e| {
                    format!("registering {len} bytes on {}: {e}", port.name())
                })
            })
        })?;
        Ok(Buffer { mr, map })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }
}

/// One-sided operations.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Read,
    Write,
}

/// One one-sided transfer: `len` bytes between local memory `local` (registered, `lkey`) and
/// the peer's `remote` (`rkey`).
#[derive(Clone, Copy, Debug)]
pub struct Transfer {
    pub op: Op,
    pub lkey: u32,
    pub local: u64,
    pub len: u32,
    pub rkey: u32,
    pub remote: u64,
}

/// A reliable-connection queue pair on one port.
pub struct Qp {
    qp: Mutex<BasicQueuePair>,
    pub port: Arc<Port>,
    pub psn: u32,
}

const MAX_WR: u32 = 64;
/// RDMA READs in flight per queue pair, both directions, at most (one slice at a time per
/// connection needs one; the rest is room for a future pipelined connection).
const READ_DEPTH: u8 = 16;

impl Qp {
    /// A queue pair in RESET; [`Qp::connect`] takes it to RTS.
    pub fn new(port: &Arc<Port>) -> Result<Qp, String> {
        guarded("create queue pair", || {
            let cq = GenericCompletionQueue::from(port.cq.clone());
            let mut b = port.pd.create_qp_builder();
            b.setup_send_cq(cq.clone())
                .setup_recv_cq(cq)
                .setup_max_send_wr(MAX_WR)
                .setup_max_recv_wr(1)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1);
            let qp = b
                .build()
                .map_err(|e| why(&e, |e| format!("queue pair on {}: {e}", port.name())))?;
            Ok(Qp {
                qp: Mutex::new(qp),
                port: port.clone(),
                psn: rand::random::<u32>() & regolith_proto::rdma::MAX_QPN,
            })
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qp.lock().qp_number()
    }

    pub fn is_ready(&self) -> bool {
        self.qp.lock().state() == QueuePairState::ReadyToSend
    }

    /// INIT → RTR → RTS towards the queue pair `qpn`/`psn` at `remote`.
    pub fn connect(&self, remote: &PortAddr, qpn: u32, psn: u32) -> Result<(), String> {
        let local = &self.port.addr;
        if remote.link_layer != local.link_layer {
            return Err(format!(
                "link layers differ: {:?} here, {:?} at {}",
                local.link_layer, remote.link_layer, remote.device
            ));
        }
        guarded("connect queue pair", || {
            let mut qp = self.qp.lock();
            let mut a = QueuePairAttribute::new();
            a.setup_state(QueuePairState::Init)
                .setup_pkey_index(0)
                .setup_port(local.port)
                .setup_access_flags(
                    AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
                );
            qp.modify(&a)
                .map_err(|e| why(&e, |e| format!("to INIT: {e}")))?;

            let mut a = QueuePairAttribute::new();
            a.setup_state(QueuePairState::ReadyToReceive)
                .setup_path_mtu(mtu_of(local.mtu.min(remote.mtu)))
                .setup_dest_qp_num(qpn)
                .setup_rq_psn(psn)
                .setup_max_dest_read_atomic(self.port.read_depth)
                .setup_min_rnr_timer(12);
            let mut ah = AddressHandleAttribute::new();
            ah.setup_port(local.port)
                .setup_service_level(0)
                .setup_dest_lid(remote.lid);
            if local.link_layer == LinkLayer::Ethernet || remote.gid != [0; 16] {
                ah.setup_grh_src_gid_index(local.gid_index)
                    .setup_grh_dest_gid(&sideway::ibverbs::address::Gid { raw: remote.gid })
                    .setup_grh_hop_limit(64);
            }
            a.setup_address_vector(&ah);
            qp.modify(&a)
                .map_err(|e| why(&e, |e| format!("to RTR: {e}")))?;

            let mut a = QueuePairAttribute::new();
            a.setup_state(QueuePairState::ReadyToSend)
                .setup_sq_psn(self.psn)
                .setup_timeout(14)
                .setup_retry_cnt(7)
                .setup_rnr_retry(7)
                .setup_max_read_atomic(self.port.read_depth);
            qp.modify(&a)
                .map_err(|e| why(&e, |e| format!("to RTS: {e}")))?;
            Ok(())
        })
    }

    /// Posts `t` signalled and waits for its completion at most `within`.
    pub async fn run(&self, t: Transfer, within: Duration) -> Result<(), String> {
        let Transfer {
            op,
            lkey,
            local,
            len,
            rkey,
            remote,
        } = t;
        let done = &self.port.done;
        let (id, rx) = done.expect();
        let posted = guarded("post work request", || {
            let mut qp = self.qp.lock();
            let mut g = qp.start_post_send();
            let wr = g.construct_wr(id, WorkRequestFlags::Signaled);
            let h = match op {
                Op::Read => wr.setup_read(rkey, remote),
                Op::Write => wr.setup_write(rkey, remote),
            };
            // SAFETY: `local` is inside a registration the caller holds until the completion
            // (or until it drops the queue pair, which stops the transfer).
            unsafe { h.setup_sge(lkey, local, len) };
            g.post()
                .map_err(|e| why(&e, |e| format!("posting {op:?}: {e}")))
        });
        if let Err(e) = posted {
            done.forget(id);
            return Err(e);
        }
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("completion poller stopped".into()),
            Err(_) => {
                done.forget(id);
                Err(format!("{op:?} of {len} bytes timed out after {within:?}"))
            }
        }
    }
}

/// The node's open RDMA ports.
pub struct Engine {
    pub ports: Vec<Arc<Port>>,
}

impl Engine {
    pub fn open(ports: &[PortProbe]) -> Result<Engine, String> {
        let mut open = Vec::new();
        for p in ports {
            match Port::open(p) {
                Ok(port) => open.push(port),
                Err(e) => warn!(device = %p.device, port = p.port, "RDMA port not used: {e}"),
            }
        }
        if open.is_empty() {
            return Err("no RDMA port could be opened".into());
        }
        Ok(Engine { ports: open })
    }
}
