//! The running sidecar: identity, the segment's life with metad (mount, heartbeats, remount,
//! drain, unmount). What it does for its local clients is in [`crate::ops`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::grant::{NodeKey, KEY_LEN};
use regolith_proto::metad as mpb;
use regolith_proto::shutdown::Shutdown;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::ops::Store;
use crate::state_file::{self, NodeState};
use crate::tracker::Tracker;
use crate::transport::TransportStats;

/// Heartbeat period (and the cap of the retry back-off).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

pub struct Sidecar {
    pub settings: Settings,
    /// What the local clients' operations work on (segment, reservations in flight, data
    /// plane, metad behind its trait).
    pub store: Arc<Store>,
    /// The segment's life with metad: mount, usage, drain, unmount.
    pub metad: MetadClient,
    /// Short attempts: a heartbeat that waits long on a dead leader misses the node TTL.
    pub hb_client: MetadClient,
    pub transport_stats: Arc<TransportStats>,
    /// The RDMA side of the data plane (TCP only when the node has none).
    pub rdma: Arc<crate::transport::rdma::RdmaNode>,
    pub metrics: Arc<Metrics>,
    pub instance_id: u64,
    pub data_addrs: Vec<String>,
    pub segment_used: AtomicU64,
    /// (term, leader id) from the last heartbeat reply.
    pub leader: Mutex<(u64, u64)>,
    pub clients: AtomicU64,
    pub next_conn: AtomicU64,
    pub shutting_down: AtomicBool,
    /// The segment was drained and unmounted gracefully: stays so until restart.
    pub retired: AtomicBool,
    /// metad no longer knows this node's segment generation (declared dead, or replaced)
    /// and the new one is not mounted yet: what the old one held is gone from the cluster.
    pub generation_lost: AtomicBool,
    /// The data-plane server (none on a consumer-only node); taken at shutdown and while a
    /// hand-over to a successor process is under way.
    pub server: Mutex<Option<crate::transport::tcp::TcpServer>>,
    /// Held by every heartbeat of the loop; a hand-over holds it from its state snapshot on,
    /// so that no heartbeat reports (or changes) what the successor was handed.
    pub hb_gate: Arc<tokio::sync::Mutex<()>>,
    /// The node's disk tier (`--disk`; empty: DRAM only).
    pub disks: Arc<crate::disk::Tier>,
    /// Offload orders from heartbeat replies, for [`crate::offload::run`].
    pub offload_tx: tokio::sync::mpsc::UnboundedSender<crate::offload::Orders>,
}

pub fn metad_clients(settings: &Settings) -> Result<(MetadClient, MetadClient)> {
    let mut cfg = ClientConfig::new(settings.metad.clone());
    cfg.token = settings.token.clone();
    cfg.tls = settings.tls.clone();
    let main = MetadClient::new(cfg.clone()).map_err(Error::metad)?;
    cfg.request_timeout = Duration::from_millis(800);
    cfg.connect_timeout = Duration::from_millis(500);
    cfg.retry_deadline = Duration::from_millis(900);
    let hb = MetadClient::new(cfg).map_err(Error::metad)?;
    Ok((main, hb))
}

/// What a mount gave this node.
pub struct Mounted {
    pub node_id: u64,
    pub generation: u64,
    pub term: u64,
    /// The key this generation checks data-plane grants with; `None` when metad signs none.
    pub grant_key: Option<NodeKey>,
}

impl Mounted {
    fn from_reply(r: mpb::MountSegmentResponse) -> Result<Self> {
        let grant_key = if r.grant_key.is_empty() {
            None
        } else {
            Some(NodeKey::from_bytes(&r.grant_key).ok_or_else(|| {
                Error::Metad(format!(
                    "mount answered a grant key of {} bytes (expected {KEY_LEN})",
                    r.grant_key.len()
                ))
            })?)
        };
        Ok(Self {
            node_id: r.node_id,
            generation: r.generation,
            term: r.term,
            grant_key,
        })
    }

    /// Points `tracker` at this generation: the key first, so that no slice of the new
    /// generation is checked with the old one.
    pub fn apply_to(&self, tracker: &Tracker) {
        if self.grant_key.is_none() {
            tracing::warn!("metad signs no data-plane grants (it has no cluster token and no peer credential): this node serves any slice a token holder asks for");
        }
        tracker.set_grant_key(self.node_id, self.grant_key.clone());
        tracker.set_generation(self.generation);
        tracker.observe_term(self.term);
    }
}

/// Mounts the segment. Retries until metad answers (a refusal of the request itself is final).
pub async fn mount(
    metad: &MetadClient,
    settings: &Settings,
    node_id_hint: u64,
    capacity: u64,
    data_addrs: &[String],
) -> Result<Mounted> {
    let req = mpb::MountSegmentRequest {
        node_name: settings.node_name.clone(),
        node_id: node_id_hint,
        capacity,
        data_addrs: data_addrs.to_vec(),
    };
    let mut delay = Duration::from_millis(100);
    loop {
        match metad.mount(req.clone()).await {
            Ok(r) => return Mounted::from_reply(r),
            Err(e)
                if matches!(
                    e.code(),
                    Some(tonic::Code::InvalidArgument | tonic::Code::Unauthenticated)
                ) =>
            {
                return Err(Error::Metad(format!("mount refused: {e}")));
            }
            Err(e) => {
                tracing::warn!(error = %e, "mount failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(HEARTBEAT);
            }
        }
    }
}

/// Loads or creates the node's identity file; returns the node id hint for the mount.
pub fn identity_hint(settings: &Settings) -> Result<u64> {
    Ok(state_file::load(&settings.state_dir, &settings.node_name)?
        .map(|s| s.node_id)
        .unwrap_or(0))
}

pub fn save_identity(settings: &Settings, node_id: u64) -> Result<()> {
    state_file::save(
        &settings.state_dir,
        &NodeState {
            node_name: settings.node_name.clone(),
            node_id,
        },
    )
}

impl Sidecar {
    pub fn node_id(&self) -> u64 {
        self.store.node_id()
    }

    /// One heartbeat; returns whether it was answered.
    pub async fn heartbeat_once(self: &Arc<Self>) -> bool {
        let (disk_capacity, disk_used, _) = crate::disk::tier::totals(&self.disks);
        let req = mpb::HeartbeatRequest {
            node_id: self.node_id(),
            generation: self.store.tracker.generation(),
            highest_term_seen: self.store.tracker.highest_term(),
            in_flight: self
                .store
                .tracker
                .in_flight()
                .into_iter()
                .map(|(version, extents)| mpb::InFlight {
                    version: Some(version),
                    extents,
                })
                .collect(),
            released: self.store.tracker.released(),
            used_bytes: self.segment_used.load(Ordering::Relaxed),
            accessed: self.store.index.take_accesses(),
            disks: self.disks.numbered().count() as u32,
            disk_capacity,
            disk_used,
            disk_max_object: crate::disk::tier::max_object(&self.disks),
        };
        let reply = match self.hb_client.heartbeat(req).await {
            Ok((r, _)) => r,
            Err(e) => {
                self.metrics.heartbeat_failures.inc();
                tracing::debug!(error = %e, "heartbeat failed");
                return false;
            }
        };
        self.store.tracker.observe_term(reply.term);
        self.metrics
            .metad_term
            .set(self.store.tracker.highest_term() as i64);
        *self.leader.lock() = (reply.term, reply.leader_id);
        if reply.unmounted {
            if !self.retired.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    generation = self.store.tracker.generation(),
                    "this segment was drained and unmounted: it takes no more data; local clients are served as by a consumer-only node until restart"
                );
            }
            return true;
        }
        if reply.remount {
            self.remount().await;
            return true;
        }
        let orders = crate::offload::Orders {
            offload: reply.offload,
            promote: reply.promote,
        };
        if !orders.is_empty() {
            let _ = self.offload_tx.send(orders);
        }
        let released = self.store.tracker.quarantined(&reply.quarantined);
        if !released.is_empty() {
            tracing::debug!(
                count = released.len(),
                "quarantined reservations fenced; releasing"
            );
        }
        true
    }

    /// metad no longer knows our generation (declared dead, or replaced): mount a new one.
    /// Everything the old generation held is gone from metad's view.
    async fn remount(self: &Arc<Self>) {
        tracing::warn!(
            generation = self.store.tracker.generation(),
            "metad does not know this segment generation: mounting a new one"
        );
        self.generation_lost.store(true, Ordering::Release);
        match mount(
            &self.metad,
            &self.settings,
            self.node_id(),
            self.store.segment.len(),
            &self.data_addrs,
        )
        .await
        {
            Ok(m) => {
                self.store.set_node_id(m.node_id);
                m.apply_to(&self.store.tracker);
                self.metrics.generation.set(m.generation as i64);
                self.metrics.remounts.inc();
                self.generation_lost.store(false, Ordering::Release);
                tracing::info!(
                    node = m.node_id,
                    generation = m.generation,
                    "segment mounted again"
                );
            }
            Err(e) => tracing::error!(error = %e, "remount failed"),
        }
    }

    /// Heartbeats every second until shutdown (retry back-off capped at 1 s); refreshes the
    /// segment's usage from metad now and then.
    pub async fn heartbeat_loop(self: Arc<Self>, shutdown: Shutdown) {
        let mut last_usage = Instant::now() - Duration::from_secs(60);
        let mut delay = HEARTBEAT;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait() => return,
            }
            let _gate = tokio::select! {
                g = self.hb_gate.lock() => g,
                _ = shutdown.wait() => return,
            };
            if shutdown.is_shutdown() {
                return;
            }
            let ok = self.heartbeat_once().await;
            delay = if ok {
                HEARTBEAT
            } else {
                Duration::from_millis(200)
            };
            if ok && last_usage.elapsed() > Duration::from_secs(5) {
                last_usage = Instant::now();
                self.refresh_usage().await;
            }
        }
    }

    async fn refresh_usage(&self) {
        if let Ok(segs) = self.metad.list_segments().await {
            if let Some(s) = segs.iter().find(|s| {
                s.node_id == self.node_id() && s.generation == self.store.tracker.generation()
            }) {
                self.segment_used.store(s.used, Ordering::Relaxed);
                self.metrics.segment_used_bytes.set(s.used as i64);
            }
        }
    }

    /// Drain (when asked) and unmount gracefully.
    pub async fn leave(&self) {
        if self.settings.drain_on_exit && !self.store.segment.is_empty() {
            tracing::info!(timeout = ?self.settings.drain_timeout, "draining before exit");
            match self
                .metad
                .drain(
                    &self.settings.node_name,
                    self.settings.drain_timeout.as_millis() as u64,
                )
                .await
            {
                Ok(_) => {
                    let end = Instant::now() + self.settings.drain_timeout;
                    while Instant::now() < end {
                        let segs = self.metad.list_segments().await.unwrap_or_default();
                        match segs.iter().find(|s| s.node_id == self.node_id()) {
                            Some(s) if s.objects > 0 => {
                                tokio::time::sleep(Duration::from_millis(500)).await
                            }
                            _ => break,
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "drain request failed"),
            }
        }
        let req = mpb::UnmountSegmentRequest {
            node_id: self.node_id(),
            generation: self.store.tracker.generation(),
        };
        match tokio::time::timeout(Duration::from_secs(5), self.metad.unmount(req)).await {
            Ok(Ok(r)) => tracing::info!(dropped = r.dropped_objects, "segment unmounted"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "unmount failed (metad will declare the node dead)")
            }
            Err(_) => tracing::warn!("unmount timed out (metad will declare the node dead)"),
        }
    }
}
