//! The data plane (design §7): moving slices of objects between sidecars, striped over every
//! NIC pair of the two nodes.
//!
//! * [`Transport`] / [`Connection`] — what a transport provides: dial a NIC pair (handshake
//!   included), then write or read one slice on a connection. TCP ([`tcp`]) always; RDMA
//!   ([`rdma`]) upgrades a TCP connection where both ends can.
//! * [`plan`] — sans-I/O: slicing, NIC pair order, back-off, per-transfer retry bookkeeping.
//! * [`stripe`] — [`stripe::DataClient`]: the connection pool per peer and the driver that runs
//!   a transfer's slices in parallel over all pairs, retrying a failed connection's slices on
//!   other pairs.
//! * [`rdma`] — the RDMA upgrade of a connection (feature `rdma`; `docs/rdma.md`) and
//!   [`rdma::NodeTransport`], the transport a sidecar dials with.
//! * [`admission`] — the server's admission check ([`admission::Admission`]).
//! * [`stats`] — per-NIC counters and the transfer-latency hook.
//! * [`stream`] — a connection's bytes: TCP in clear or mutual TLS.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};

use regolith_proto::dataplane::Status;
pub use regolith_proto::grant::Grant;

use crate::error::Result;

pub mod admission;
pub mod plan;
pub mod rdma;
pub mod stats;
pub mod stream;
pub mod stripe;
pub mod tcp;

pub use admission::{Admission, BasicAdmission, GrantCheck, WriteGuard, WriteSlice};
pub use stats::{NicCounters, NicSnapshot, TransferEvent, TransferObserver, TransportStats};
pub use stripe::{DataClient, StripeConfig, TransferReport};

/// A local NIC address (`None`: let the kernel choose) and a remote data-plane listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NicPair {
    pub local: Option<IpAddr>,
    pub remote: SocketAddr,
}

impl std::fmt::Display for NicPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.local {
            Some(l) => write!(f, "{l}->{}", self.remote),
            None => write!(f, "*->{}", self.remote),
        }
    }
}

/// A peer sidecar: its node id (checked in the handshake) and one listener per NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAddrs {
    pub node_id: u64,
    pub addrs: Vec<SocketAddr>,
}

/// A byte range of a peer's segment, inside one extent the leader granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRange {
    pub generation: u64,
    pub offset: u64,
    pub len: u64,
    /// The leader's grant of the extent the range lies in ([`Grant::default`] without one).
    pub grant: Grant,
}

/// An object version: the reservation `(term, id)` that wrote it (`common.proto`; its
/// checksum seed is [`Version::seed`]).
pub use regolith_proto::common::Version;

/// One slice as a connection sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub generation: u64,
    /// Segment offset of the slice.
    pub offset: u64,
    pub len: u32,
    pub version: Version,
    /// The grant of the transfer's extent (every slice of a transfer lies in it).
    pub grant: Grant,
}

/// How a slice failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceError {
    /// The connection broke, timed out or misbehaved: drop it and retry the slice elsewhere.
    Connection(String),
    /// The peer refused the slice; another connection would get the same answer. The
    /// connection itself is still usable.
    Refused { status: Status, peer_term: u64 },
}

/// A transport: dials NIC pairs.
pub trait Transport: Send + Sync + 'static {
    type Conn: Connection;

    /// Connects `pair.local` to `pair.remote` and completes the handshake, checking that the
    /// peer is node `peer_node`.
    fn connect(
        &self,
        pair: NicPair,
        peer_node: u64,
    ) -> impl Future<Output = Result<Self::Conn>> + Send;
}

/// One established connection, carrying one slice at a time.
pub trait Connection: Send + 'static {
    fn pair(&self) -> NicPair;

    /// Whether an idle pooled connection still looks alive (no syscall beyond a peek).
    fn is_reusable(&mut self) -> bool;

    /// Writes `src` (`spec.len` bytes) to the peer. `hashes` gets one checksum chunk hash per
    /// 64 KiB of `src`, computed right before each chunk is sent, while it is cache-hot.
    fn write_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        src: &'a [u8],
        hashes: &'a mut [u64],
    ) -> impl Future<Output = Result<(), SliceError>> + Send + 'a;

    /// Reads `spec.len` bytes straight into `dst`, hashing each 64 KiB chunk into `hashes`
    /// right after it arrives. On error `dst` holds garbage.
    fn read_slice<'a>(
        &'a mut self,
        spec: SliceSpec,
        dst: &'a mut [u8],
        hashes: &'a mut [u64],
    ) -> impl Future<Output = Result<(), SliceError>> + Send + 'a;
}
