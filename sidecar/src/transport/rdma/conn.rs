//! Upgraded connections: the client's [`RdmaConnection`] (reads and writes of slices) and the
//! server's [`Server`] / [`Session`] (the queue pair and staging window of each upgraded
//! connection).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use regolith_proto::checksum::{chunk_hash, CHUNK};
use regolith_proto::dataplane::Status;
use regolith_proto::rdma::{Accept, Offer};

use super::select::{port_for, server_port, PeerAnswer};
use super::verbs::{Buffer, Op, Qp, Transfer};
use super::window::{StagingWindow, WindowBudget};
use super::{refused, Accepted, PortCounters, RdmaNode, RdmaServer, RdmaSession};
use crate::transport::tcp::TcpConnection;
use crate::transport::{Connection, NicPair, SliceError, SliceSpec};

/// Upgrades `tcp` (past its handshake) with the `stripe`-th port pairing. On failure, the TCP
/// connection comes back when it is still usable (the peer answered UNSUPPORTED).
pub(super) async fn upgrade(
    node: &Arc<RdmaNode>,
    mut tcp: TcpConnection,
    stripe: u32,
) -> (Result<RdmaConnection, PeerAnswer>, Option<TcpConnection>) {
    let Some(engine) = node.engine.as_ref() else {
        return (Err(PeerAnswer::Unsupported), Some(tcp));
    };
    let Some(k) = port_for(stripe, engine.ports.len()) else {
        return (Err(PeerAnswer::Unsupported), Some(tcp));
    };
    let port = engine.ports[k].clone();
    let counters = node.stats.port(&port.name());
    let local = Qp::new(&port).and_then(|qp| {
        let bounce = Buffer::new(&port, node.cfg.max_slice as usize, false)?;
        Ok((qp, bounce))
    });
    let (qp, bounce) = match local {
        Ok(x) => x,
        Err(e) => {
            counters.errors.fetch_add(1, Relaxed);
            return (Err(PeerAnswer::Failed(e)), Some(tcp));
        }
    };
    let offer = Offer {
        port: port.addr.clone(),
        qpn: qp.qpn(),
        psn: qp.psn,
        stripe,
        max_slice: node.cfg.max_slice,
    };
    let bytes = match offer.encode() {
        Ok(b) => b,
        Err(e) => return (Err(PeerAnswer::Failed(e.to_string())), Some(tcp)),
    };
    let answer = match tcp.rdma_connect(&bytes).await {
        Err(e) => return (Err(PeerAnswer::Failed(format!("{e:?}"))), None),
        Ok(Err(Status::Unsupported)) => return (Err(PeerAnswer::Unsupported), Some(tcp)),
        Ok(Err(Status::BadRequest)) => return (Err(PeerAnswer::OldPeer), None),
        Ok(Err(s)) => return (Err(PeerAnswer::Failed(format!("answered {s}"))), None),
        Ok(Ok(body)) => body,
    };
    let accept = match Accept::decode(&answer) {
        Ok(a) => a,
        Err(e) => return (Err(PeerAnswer::Failed(format!("its answer: {e}"))), None),
    };
    if accept.win_len < node.cfg.max_slice {
        // A slice would not fit the window: the peer's session is open, so close the
        // connection with it rather than keep a connection whose writes would be refused.
        return (
            Err(PeerAnswer::Failed(format!(
                "staging window of {} bytes is smaller than a slice of {}",
                accept.win_len, node.cfg.max_slice
            ))),
            None,
        );
    }
    if let Err(e) = qp.connect(&accept.port, accept.qpn, accept.psn) {
        counters.errors.fetch_add(1, Relaxed);
        return (Err(PeerAnswer::Failed(e)), None);
    }
    counters.connections.fetch_add(1, Relaxed);
    let io_timeout = tcp.io_timeout();
    (
        Ok(RdmaConnection {
            qp,
            bounce,
            ctrl: tcp,
            remote: accept,
            counters,
            io_timeout,
        }),
        None,
    )
}

/// A client connection upgraded to RDMA. Fields drop in order: the queue pair goes before the
/// bounce buffer it may still be transferring into.
pub struct RdmaConnection {
    qp: Qp,
    bounce: Buffer,
    ctrl: TcpConnection,
    remote: Accept,
    counters: Arc<PortCounters>,
    io_timeout: Duration,
}

fn check(spec: &SliceSpec, buf: usize, hashes: usize, room: usize) -> Result<(), SliceError> {
    let refuse = |status| {
        Err(SliceError::Refused {
            status,
            peer_term: 0,
        })
    };
    if buf != spec.len as usize || hashes != (spec.len as usize).div_ceil(CHUNK) {
        return refuse(Status::BadRequest);
    }
    if buf > room {
        return refuse(Status::TooLarge);
    }
    Ok(())
}

impl RdmaConnection {
    /// The segment generation the peer registered: an older one in the slice is refused as
    /// TCP would; a newer one means the peer re-mounted since, and this connection's
    /// registration is stale (drop it, dial again).
    fn check_generation(&self, spec: &SliceSpec) -> Result<(), SliceError> {
        use std::cmp::Ordering::*;
        match spec.generation.cmp(&self.remote.generation) {
            Equal => Ok(()),
            Less => Err(SliceError::Refused {
                status: Status::BadGeneration,
                peer_term: 0,
            }),
            Greater => Err(SliceError::Connection(format!(
                "peer registered generation {}, slice names {}",
                self.remote.generation, spec.generation
            ))),
        }
    }

    /// One READ or WRITE of `len` bytes between the bounce buffer and the peer's `remote`.
    async fn one_sided(&self, op: Op, len: u32, rkey: u32, remote: u64) -> Result<(), SliceError> {
        let t = Transfer {
            op,
            lkey: self.bounce.lkey(),
            local: self.bounce.addr(),
            len,
            rkey,
            remote,
        };
        self.qp
            .run(t, self.io_timeout)
            .await
            .map_err(|e| self.failed(e))
    }

    fn failed(&self, e: String) -> SliceError {
        self.counters.errors.fetch_add(1, Relaxed);
        SliceError::Connection(format!("RDMA on {}: {e}", self.qp.port.name()))
    }
}

impl Connection for RdmaConnection {
    fn pair(&self) -> NicPair {
        self.ctrl.pair()
    }

    fn is_reusable(&mut self) -> bool {
        self.qp.is_ready() && self.ctrl.is_reusable()
    }

    async fn read_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        dst: &'a mut [u8],
        hashes: &'a mut [u64],
    ) -> Result<(), SliceError> {
        check(&spec, dst.len(), hashes.len(), self.bounce.len())?;
        self.check_generation(&spec)?;
        if !self.remote.covers(spec.offset, spec.len.into()) {
            return Err(SliceError::Refused {
                status: Status::OutOfRange,
                peer_term: 0,
            });
        }
        if spec.len > 0 {
            let remote = self.remote.seg_addr + spec.offset;
            self.one_sided(Op::Read, spec.len, self.remote.seg_rkey, remote)
                .await?;
        }
        // SAFETY: the READ completed, and nothing else writes the bounce buffer: it is this
        // connection's, registered for local access only.
        let src = unsafe { std::slice::from_raw_parts(self.bounce.as_ptr(), dst.len()) };
        let seed = spec.version.seed();
        // One pass: copy each chunk out and hash it while it is in cache.
        for ((d, s), h) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)).zip(hashes) {
            d.copy_from_slice(s);
            *h = chunk_hash(seed, d);
        }
        self.counters.reads.fetch_add(1, Relaxed);
        self.counters
            .read_bytes
            .fetch_add(u64::from(spec.len), Relaxed);
        Ok(())
    }

    async fn write_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        src: &'a [u8],
        hashes: &'a mut [u64],
    ) -> Result<(), SliceError> {
        let room = self.bounce.len().min(self.remote.win_len as usize);
        check(&spec, src.len(), hashes.len(), room)?;
        let seed = spec.version.seed();
        // SAFETY: the bounce buffer is this connection's and no transfer uses it now (one
        // slice at a time, and the previous one completed).
        let dst = unsafe { std::slice::from_raw_parts_mut(self.bounce.as_mut_ptr(), src.len()) };
        for ((d, s), h) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)).zip(hashes) {
            d.copy_from_slice(s);
            *h = chunk_hash(seed, s);
        }
        if spec.len > 0 {
            self.one_sided(
                Op::Write,
                spec.len,
                self.remote.win_rkey,
                self.remote.win_addr,
            )
            .await?;
        }
        self.ctrl.rdma_commit(spec).await?;
        self.counters.writes.fetch_add(1, Relaxed);
        self.counters
            .write_bytes
            .fetch_add(u64::from(spec.len), Relaxed);
        Ok(())
    }
}

/// The server side of upgrades.
pub(super) struct Server {
    pub node: Arc<RdmaNode>,
}

impl RdmaServer for Server {
    fn accept(&self, offer: &Offer, generation: u64) -> Result<Accepted, Status> {
        let node = &self.node;
        let Some(engine) = node.engine.as_ref() else {
            return Err(Status::Unsupported);
        };
        let layers: Vec<_> = engine.ports.iter().map(|p| p.addr.link_layer).collect();
        let Some(k) = server_port(offer.stripe, &layers, offer.port.link_layer) else {
            refused(&node.stats, "no port on the peer's link layer");
            return Err(Status::Unsupported);
        };
        let port = engine.ports[k].clone();
        let counters = node.stats.port(&port.name());
        let Some((seg_addr, seg_len, seg_rkey)) = port.segment() else {
            refused(&node.stats, "the segment is not registered");
            return Err(Status::Unsupported);
        };
        let Some(win_len) = node.budget.lock().reserve(offer.max_slice) else {
            refused(
                &node.stats,
                "no room for another staging window (--rdma-staging-bytes)",
            );
            return Err(Status::Unsupported);
        };
        let budget = node.budget.clone();
        let release = |e: String| {
            budget.lock().release(win_len);
            counters.errors.fetch_add(1, Relaxed);
            refused(&node.stats, &e);
            Status::Unsupported
        };
        let window = Buffer::new(&port, win_len as usize, true).map_err(release)?;
        let qp = Qp::new(&port).map_err(release)?;
        qp.connect(&offer.port, offer.qpn, offer.psn)
            .map_err(release)?;
        let accept = Accept {
            port: port.addr.clone(),
            qpn: qp.qpn(),
            psn: qp.psn,
            generation,
            seg_addr,
            seg_len,
            seg_rkey,
            win_addr: window.addr(),
            win_len,
            win_rkey: window.rkey(),
        };
        counters.connections.fetch_add(1, Relaxed);
        Ok(Accepted {
            accept,
            session: Box::new(Session {
                _qp: qp,
                window,
                state: StagingWindow::new(win_len),
                budget: node.budget.clone(),
                counters,
            }),
        })
    }
}

/// One upgraded connection at the server. Dropped with its TCP connection: the queue pair is
/// destroyed first, then the window's registration (its rkey dies with it), then the memory.
struct Session {
    /// Held until the connection ends; dropped first.
    _qp: Qp,
    window: Buffer,
    state: StagingWindow,
    budget: Arc<Mutex<WindowBudget>>,
    counters: Arc<PortCounters>,
}

impl RdmaSession for Session {
    fn begin(&mut self, req_id: u64, len: u32) -> Result<*const u8, Status> {
        self.state.begin(req_id, len)?;
        Ok(self.window.as_ptr())
    }

    fn finish(&mut self, req_id: u64) {
        let _ = self.state.finish(req_id);
    }

    fn counters(&self) -> &PortCounters {
        &self.counters
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.state.retire() {
            self.budget.lock().release(self.state.len());
        }
    }
}
