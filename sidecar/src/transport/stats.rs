//! Data-plane counters, per local NIC address, as plain atomics for the Prometheus exporter,
//! and the transfer-latency hook.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use regolith_proto::dataplane::Kind;

/// Counters of one local NIC address (client side: the address connections are bound to;
/// server side: the address a listener accepted on).
#[derive(Debug, Default)]
pub struct NicCounters {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Slices completed over this NIC (sent or received by the client, served by the server).
    pub slices: AtomicU64,
    /// Slices that failed on a connection of this NIC and were retried elsewhere.
    pub retries: AtomicU64,
    /// Connections that failed to dial, failed their handshake, or broke.
    pub failed_conns: AtomicU64,
}

impl NicCounters {
    pub fn add_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Relaxed);
    }

    pub fn add_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Relaxed);
    }
}

/// A point-in-time copy of one NIC's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicSnapshot {
    pub addr: IpAddr,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub slices: u64,
    pub retries: u64,
    pub failed_conns: u64,
}

/// One finished transfer, for latency histograms.
#[derive(Clone, Copy, Debug)]
pub struct TransferEvent {
    pub kind: Kind,
    pub node: u64,
    pub bytes: u64,
    pub slices: usize,
    pub retries: u32,
    pub elapsed: Duration,
    pub ok: bool,
}

/// Called once per transfer (success or failure); must be cheap and must not block.
pub trait TransferObserver: Send + Sync {
    fn transfer_done(&self, event: &TransferEvent);
}

/// All data-plane counters of a sidecar (client and server share one).
#[derive(Default)]
pub struct TransportStats {
    nics: RwLock<Vec<(IpAddr, Arc<NicCounters>)>>,
    pub transfers: AtomicU64,
    pub failed_transfers: AtomicU64,
    /// Server side: authenticated peers refused because `max_connections` were open.
    pub refused_busy: AtomicU64,
    /// Server side: connections closed before their handshake to make room for newer ones
    /// (more than `max_pending` unauthenticated connections at once).
    pub evicted_pending: AtomicU64,
    /// Server side: requests refused for a grant that does not verify (design §4, issue 14
    /// finding 7).
    pub bad_grants: AtomicU64,
    /// Server side: connections whose TLS handshake failed (no certificate of the cluster's
    /// CA, or not TLS at all).
    pub refused_tls: AtomicU64,
    observer: Option<Arc<dyn TransferObserver>>,
}

impl std::fmt::Debug for TransportStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportStats")
            .field("nics", &self.snapshot())
            .finish_non_exhaustive()
    }
}

/// The key of connections not bound to a local address.
pub const UNBOUND: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

impl TransportStats {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn with_observer(observer: Arc<dyn TransferObserver>) -> Arc<Self> {
        Arc::new(Self {
            observer: Some(observer),
            ..Self::default()
        })
    }

    /// The counters of `addr` (`None`: unbound), created on first use.
    pub fn nic(&self, addr: Option<IpAddr>) -> Arc<NicCounters> {
        let addr = addr.unwrap_or(UNBOUND);
        if let Some((_, c)) = self.nics.read().iter().find(|(a, _)| *a == addr) {
            return c.clone();
        }
        let mut w = self.nics.write();
        if let Some((_, c)) = w.iter().find(|(a, _)| *a == addr) {
            return c.clone();
        }
        let c = Arc::new(NicCounters::default());
        w.push((addr, c.clone()));
        c
    }

    pub fn snapshot(&self) -> Vec<NicSnapshot> {
        self.nics
            .read()
            .iter()
            .map(|(addr, c)| NicSnapshot {
                addr: *addr,
                bytes_in: c.bytes_in.load(Relaxed),
                bytes_out: c.bytes_out.load(Relaxed),
                slices: c.slices.load(Relaxed),
                retries: c.retries.load(Relaxed),
                failed_conns: c.failed_conns.load(Relaxed),
            })
            .collect()
    }

    /// The snapshot of one address, zeroes if it never carried anything.
    pub fn nic_snapshot(&self, addr: IpAddr) -> NicSnapshot {
        self.snapshot()
            .into_iter()
            .find(|s| s.addr == addr)
            .unwrap_or(NicSnapshot {
                addr,
                bytes_in: 0,
                bytes_out: 0,
                slices: 0,
                retries: 0,
                failed_conns: 0,
            })
    }

    pub(crate) fn transfer_done(&self, event: &TransferEvent) {
        self.transfers.fetch_add(1, Relaxed);
        if !event.ok {
            self.failed_transfers.fetch_add(1, Relaxed);
        }
        if let Some(o) = &self.observer {
            o.transfer_done(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn counters_are_per_address() {
        let s = TransportStats::new();
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        s.nic(Some(a)).add_out(10);
        s.nic(Some(a)).add_in(3);
        s.nic(None).add_out(1);
        let snap = s.nic_snapshot(a);
        assert_eq!((snap.bytes_out, snap.bytes_in), (10, 3));
        assert_eq!(s.nic_snapshot(UNBOUND).bytes_out, 1);
        assert_eq!(s.snapshot().len(), 2);
    }

    #[test]
    fn observer_sees_transfers() {
        struct Rec(Mutex<Vec<u64>>);
        impl TransferObserver for Rec {
            fn transfer_done(&self, e: &TransferEvent) {
                self.0.lock().unwrap().push(e.bytes);
            }
        }
        let rec = Arc::new(Rec(Mutex::new(vec![])));
        let s = TransportStats::with_observer(rec.clone());
        s.transfer_done(&TransferEvent {
            kind: Kind::Read,
            node: 1,
            bytes: 42,
            slices: 1,
            retries: 0,
            elapsed: Duration::from_millis(1),
            ok: false,
        });
        assert_eq!(*rec.0.lock().unwrap(), vec![42]);
        assert_eq!(s.failed_transfers.load(Relaxed), 1);
    }
}
