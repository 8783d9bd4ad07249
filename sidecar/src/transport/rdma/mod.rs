//! The RDMA data plane (`docs/rdma.md`): one-sided READs and WRITEs between sidecars over
//! reliable-connection queue pairs, with the TCP data plane as the control path and the
//! fallback.
//!
//! * [`select`] — sans-I/O: `--transport auto|tcp|rdma`, which ports a node uses, what a
//!   connection does when its peer cannot (fall back, logged once per peer, or refuse).
//! * [`window`] — sans-I/O: the staging windows that carry writes (the segment is never
//!   registered for remote writes), their memory budget and life.
//! * `verbs` (feature `rdma`) — devices, ports, registrations, queue pairs and the completion
//!   threads, on `sideway`.
//! * [`NodeTransport`] / [`NodeConn`] — the [`Transport`] a sidecar dials with: a TCP
//!   connection and its handshake, then the upgrade (`RDMA_CONNECT`) where both ends can;
//!   the plan and striping of [`super::stripe`] are the same for both.
//! * [`RdmaServer`] / [`RdmaSession`] — what the TCP server asks of the RDMA side when a peer
//!   upgrades a connection and commits a slice.
//!
//! How a slice moves: a read is one RDMA READ from the holder's segment registration into the
//! connection's registered bounce buffer, then one pass that copies it out to the caller and
//! hashes each 64 KiB chunk while it is hot; a write is one pass that copies the caller's bytes
//! into the bounce buffer and hashes them, one RDMA WRITE into the connection's staging window
//! at the holder, and an `RDMA_COMMIT` over TCP that the holder admits like any write before
//! it copies the window into the segment.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use regolith_proto::dataplane::Status;
use regolith_proto::rdma::{Accept, Offer};
use tracing::info;

use super::tcp::{TcpConnection, TcpTransport};
use super::{Connection, NicPair, SliceError, SliceSpec, Transport};
use crate::error::{Error, Result};
use crate::segment::Segment;

pub mod select;
#[cfg(feature = "rdma")]
pub mod verbs;
pub mod window;

#[cfg(feature = "rdma")]
use select::PeerOutcome;
pub use select::TransportMode;
use select::{LocalChoice, OncePerPeer, Probe};

/// The open ports of a node built with the feature; nothing without it.
#[cfg(feature = "rdma")]
type Engine = Arc<verbs::Engine>;
#[cfg(not(feature = "rdma"))]
type Engine = std::convert::Infallible;

/// RDMA settings of a sidecar.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    pub mode: TransportMode,
    /// `--rdma-device`, in order; empty: every device with an active port.
    pub devices: Vec<String>,
    /// Memory all staging windows take together (`--rdma-staging-bytes`).
    pub staging_bytes: u64,
    /// Largest slice moved over RDMA (the striping's slice size).
    pub max_slice: u32,
    /// Mutual TLS is configured: `auto` then keeps to TCP ([`select::choose_local`]).
    pub tls: bool,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            mode: TransportMode::Auto,
            devices: Vec::new(),
            staging_bytes: 256 << 20,
            max_slice: 4 << 20,
            tls: false,
        }
    }
}

/// Counters of one RDMA port (`regolith_sidecar_rdma_*{device}`).
#[derive(Debug, Default)]
pub struct PortCounters {
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    /// Peers' writes this node copied from a staging window into its segment (as holder).
    pub commit_bytes: AtomicU64,
    pub commits: AtomicU64,
    pub errors: AtomicU64,
    /// Connections upgraded on this port (either end).
    pub connections: AtomicU64,
}

/// RDMA counters of the node.
#[derive(Debug, Default)]
pub struct RdmaStats {
    ports: Mutex<Vec<(String, Arc<PortCounters>)>>,
    /// Connections that stayed (or went back to) TCP because the peer could not upgrade.
    pub fallbacks: AtomicU64,
    /// Upgrades this node refused as a server (no port, no staging room, bad offer).
    pub refused: AtomicU64,
    /// Whether the node uses RDMA at all (1) or TCP only (0), for the gauge.
    pub enabled: AtomicU64,
}

impl RdmaStats {
    pub fn port(&self, name: &str) -> Arc<PortCounters> {
        let mut ports = self.ports.lock();
        if let Some((_, c)) = ports.iter().find(|(n, _)| n == name) {
            return c.clone();
        }
        let c = Arc::new(PortCounters::default());
        ports.push((name.to_owned(), c.clone()));
        c
    }

    /// Every port's counters, by port name (`device:port`).
    pub fn snapshot(&self) -> Vec<(String, Arc<PortCounters>)> {
        self.ports.lock().clone()
    }
}

/// The server side of an upgrade, as the TCP server sees it.
pub trait RdmaServer: Send + Sync + 'static {
    /// Accepts `offer` for a connection of this node's segment at `generation`: the answer to
    /// send and the connection's session, or the status to refuse with.
    fn accept(&self, offer: &Offer, generation: u64) -> std::result::Result<Accepted, Status>;
}

/// An accepted upgrade.
pub struct Accepted {
    pub accept: Accept,
    pub session: Box<dyn RdmaSession>,
}

/// One upgraded connection at the server: its queue pair and staging window, released when
/// dropped (the connection ended).
pub trait RdmaSession: Send {
    /// A commit of `len` bytes: the start of the window holding them, or the status to refuse
    /// with. The bytes stay put until [`RdmaSession::finish`].
    fn begin(&mut self, req_id: u64, len: u32) -> std::result::Result<*const u8, Status>;
    fn finish(&mut self, req_id: u64);
    /// Counts a committed slice.
    fn counters(&self) -> &PortCounters;
}

/// The node's RDMA side: nothing (TCP only) or its open ports.
pub struct RdmaNode {
    pub cfg: RdmaConfig,
    pub stats: Arc<RdmaStats>,
    #[cfg(feature = "rdma")]
    engine: Option<Arc<verbs::Engine>>,
    #[cfg(feature = "rdma")]
    budget: Arc<Mutex<window::WindowBudget>>,
    /// Why the node is TCP only, when it is.
    pub tcp_reason: Option<String>,
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    logged: OncePerPeer,
}

impl std::fmt::Debug for RdmaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaNode")
            .field("mode", &self.cfg.mode)
            .field("ports", &self.port_names())
            .field("tcp_reason", &self.tcp_reason)
            .finish()
    }
}

impl RdmaNode {
    /// Probes and opens the node's ports per `cfg`; `Err` only under `--transport rdma`
    /// without a usable port.
    pub fn start(cfg: RdmaConfig) -> Result<Arc<RdmaNode>> {
        let probe = if cfg.mode == TransportMode::Tcp {
            Probe::Ports(Vec::new())
        } else {
            probe()
        };
        let choice =
            select::choose_local(cfg.mode, &cfg.devices, cfg.tls, probe).map_err(Error::Config)?;
        Self::from_choice(cfg, choice)
    }

    /// A TCP-only node (tests, and callers without RDMA settings).
    pub fn tcp_only() -> Arc<RdmaNode> {
        let cfg = RdmaConfig {
            mode: TransportMode::Tcp,
            ..RdmaConfig::default()
        };
        Arc::new(Self::assemble(cfg, Some("--transport tcp".into()), None))
    }

    fn from_choice(cfg: RdmaConfig, choice: LocalChoice) -> Result<Arc<RdmaNode>> {
        #[cfg(feature = "rdma")]
        let (engine, tcp_reason) = if choice.ports.is_empty() {
            (None, choice.tcp_reason)
        } else {
            match verbs::Engine::open(&choice.ports) {
                Ok(e) => (Some(Arc::new(e)), None),
                Err(e) if cfg.mode == TransportMode::Rdma => {
                    return Err(Error::Config(format!("--transport rdma: {e}")))
                }
                Err(e) => (None, Some(e)),
            }
        };
        #[cfg(not(feature = "rdma"))]
        let (engine, tcp_reason) = match choice.tcp_reason {
            Some(r) => (None, Some(r)),
            None => (
                None,
                Some("this sidecar was built without the `rdma` feature".to_owned()),
            ),
        };
        let node = Self::assemble(cfg, tcp_reason, engine);
        match &node.tcp_reason {
            Some(why) if node.cfg.mode == TransportMode::Auto => {
                info!(transport = "tcp", "data plane over TCP only: {why}")
            }
            Some(_) => {}
            None => {
                info!(transport = "rdma", ports = ?node.port_names(), "data plane over RDMA where peers can, TCP elsewhere")
            }
        }
        Ok(Arc::new(node))
    }

    fn assemble(cfg: RdmaConfig, tcp_reason: Option<String>, engine: Option<Engine>) -> RdmaNode {
        let node = RdmaNode {
            #[cfg(feature = "rdma")]
            // A window holds the largest slice of whichever peer upgrades (their slice sizes
            // may differ from this node's); the budget bounds the sum.
            budget: Arc::new(Mutex::new(window::WindowBudget::new(
                cfg.staging_bytes,
                regolith_proto::dataplane::MAX_SLICE_LEN,
            ))),
            #[cfg(feature = "rdma")]
            engine,
            cfg,
            stats: Arc::new(RdmaStats::default()),
            tcp_reason,
            logged: OncePerPeer::default(),
        };
        #[cfg(not(feature = "rdma"))]
        let _: Option<Engine> = engine;
        node.stats.enabled.store(u64::from(node.is_rdma()), Relaxed);
        for p in node.port_names() {
            node.stats.port(&p);
        }
        node
    }

    /// Whether the node moves slices over RDMA at all.
    pub fn is_rdma(&self) -> bool {
        #[cfg(feature = "rdma")]
        {
            self.engine.is_some()
        }
        #[cfg(not(feature = "rdma"))]
        {
            false
        }
    }

    /// The open ports, `device:port`.
    pub fn port_names(&self) -> Vec<String> {
        #[cfg(feature = "rdma")]
        if let Some(e) = &self.engine {
            return e.ports.iter().map(|p| p.name()).collect();
        }
        Vec::new()
    }

    /// Registers the segment on every port (remote READ only), so that peers can read it.
    pub fn attach_segment(&self, segment: &Segment) -> Result<()> {
        #[cfg(feature = "rdma")]
        if let Some(e) = &self.engine {
            let r = segment.range(0, segment.len())?;
            for p in &e.ports {
                // SAFETY: the segment outlives the node's server (both live as long as the
                // sidecar's run), and the registration is dropped with the port.
                unsafe { p.attach_segment(r.as_ptr(), r.len()) }.map_err(Error::Config)?;
            }
        }
        let _ = segment;
        Ok(())
    }

    /// The server hook, when the node has RDMA ports.
    pub fn server(self: &Arc<Self>) -> Option<Arc<dyn RdmaServer>> {
        #[cfg(feature = "rdma")]
        if self.engine.is_some() {
            return Some(Arc::new(conn::Server { node: self.clone() }) as Arc<dyn RdmaServer>);
        }
        None
    }

    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    fn fallback(&self, node: u64, reason: &str) {
        self.stats.fallbacks.fetch_add(1, Relaxed);
        if self.logged.first(node, reason) {
            info!(peer = node, "data plane to this peer over TCP: {reason}");
        }
    }
}

/// The probe of this build: the devices, or that the feature is not built.
pub fn probe() -> Probe {
    #[cfg(feature = "rdma")]
    {
        verbs::probe()
    }
    #[cfg(not(feature = "rdma"))]
    {
        Probe::NotBuilt
    }
}

/// The transport a sidecar dials with: TCP, upgraded to RDMA where both ends can.
pub struct NodeTransport {
    tcp: TcpTransport,
    rdma: Arc<RdmaNode>,
    /// Connections dialled, per peer: the stripe index of the next upgrade.
    stripes: Mutex<std::collections::HashMap<u64, u32>>,
}

impl NodeTransport {
    pub fn new(tcp: TcpTransport, rdma: Arc<RdmaNode>) -> Self {
        Self {
            tcp,
            rdma,
            stripes: Mutex::new(Default::default()),
        }
    }

    pub fn tcp_only(tcp: TcpTransport) -> Self {
        Self::new(tcp, RdmaNode::tcp_only())
    }

    pub fn rdma(&self) -> &Arc<RdmaNode> {
        &self.rdma
    }

    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    fn next_stripe(&self, node: u64) -> u32 {
        let mut stripes = self.stripes.lock();
        let next = stripes.entry(node).or_default();
        let stripe = *next;
        *next = next.wrapping_add(1);
        stripe
    }
}

/// A connection of either transport.
pub enum NodeConn {
    Tcp(TcpConnection),
    #[cfg(feature = "rdma")]
    Rdma(Box<conn::RdmaConnection>),
}

impl NodeConn {
    pub fn is_rdma(&self) -> bool {
        !matches!(self, NodeConn::Tcp(_))
    }
}

impl Transport for NodeTransport {
    type Conn = NodeConn;

    async fn connect(&self, pair: NicPair, peer_node: u64) -> Result<NodeConn> {
        let tcp = self.tcp.connect(pair, peer_node).await?;
        if !self.rdma.is_rdma() {
            return Ok(NodeConn::Tcp(tcp));
        }
        #[cfg(feature = "rdma")]
        {
            let stripe = self.next_stripe(peer_node);
            let (answer, tcp) = conn::upgrade(&self.rdma, tcp, stripe).await;
            let tcp = match answer {
                Ok(c) => return Ok(NodeConn::Rdma(Box::new(c))),
                Err(a) => match select::peer_outcome(self.rdma.cfg.mode, peer_node, a) {
                    PeerOutcome::Rdma => unreachable!("only an accepted upgrade is RDMA"),
                    PeerOutcome::Refuse(why) => {
                        return Err(Error::Handshake {
                            peer: pair.remote,
                            reason: why,
                        })
                    }
                    PeerOutcome::Tcp { reason } => {
                        self.rdma.fallback(peer_node, &reason);
                        // The upgrade gives the connection back only while it is in step.
                        match tcp {
                            Some(t) => t,
                            None => self.tcp.connect(pair, peer_node).await?,
                        }
                    }
                },
            };
            Ok(NodeConn::Tcp(tcp))
        }
        #[cfg(not(feature = "rdma"))]
        Ok(NodeConn::Tcp(tcp))
    }
}

impl Connection for NodeConn {
    fn pair(&self) -> NicPair {
        match self {
            NodeConn::Tcp(c) => c.pair(),
            #[cfg(feature = "rdma")]
            NodeConn::Rdma(c) => c.pair(),
        }
    }

    fn is_reusable(&mut self) -> bool {
        match self {
            NodeConn::Tcp(c) => c.is_reusable(),
            #[cfg(feature = "rdma")]
            NodeConn::Rdma(c) => c.is_reusable(),
        }
    }

    async fn write_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        src: &'a [u8],
        hashes: &'a mut [u64],
    ) -> std::result::Result<(), SliceError> {
        match self {
            NodeConn::Tcp(c) => c.write_slice(spec, src, hashes).await,
            #[cfg(feature = "rdma")]
            NodeConn::Rdma(c) => c.write_slice(spec, src, hashes).await,
        }
    }

    async fn read_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        dst: &'a mut [u8],
        hashes: &'a mut [u64],
    ) -> std::result::Result<(), SliceError> {
        match self {
            NodeConn::Tcp(c) => c.read_slice(spec, dst, hashes).await,
            #[cfg(feature = "rdma")]
            NodeConn::Rdma(c) => c.read_slice(spec, dst, hashes).await,
        }
    }
}

/// Counts a refused upgrade at the server; a flood of them must stay cheap, so the reason is
/// logged at debug level and the counter says how many.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
fn refused(stats: &RdmaStats, why: &str) {
    stats.refused.fetch_add(1, Relaxed);
    tracing::debug!("refused an RDMA upgrade: {why}");
}

#[cfg(feature = "rdma")]
mod conn;
