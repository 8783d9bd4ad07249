//! A running metad replica: storage, Raft, the core, the group-commit proposer, the read gate,
//! the periodic leader work, the gRPC and HTTP listeners, and clean shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use parking_lot::Mutex;
use regolith_proto::auth::{TokenCheck, TokenInterceptor};
use regolith_proto::metad::metad_server::MetadServer;
use regolith_proto::raft::raft_server::RaftServer;
use regolith_raft_log::{StorageConfig, StorageStats};
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

use crate::args::Settings;
use crate::clock::Clock;
use crate::command::Command;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::gate::Gate;
use crate::grpc::metad::MetadService;
use crate::grpc::raft::RaftService;
use crate::metrics::Metrics;
use crate::network::Network;
use crate::proposer::Proposer;
use crate::raft_types::Raft;
use crate::sm::MetadSm;

/// How long a call waits for this leader to become ready before answering UNAVAILABLE.
const READY_WAIT: Duration = Duration::from_secs(3);
/// Period of the leader's housekeeping (expiries, liveness, eviction).
const TICK: Duration = Duration::from_millis(100);
/// Period of the one-line summary log.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// The sockets a replica serves on. They are bound first thing in [`Node::start`], before
/// storage opens or Raft runs: a port already taken fails the start before this replica votes
/// or bootstraps a cluster, and none of its own outgoing connections (Raft's, to its peers) can
/// be handed one of its ports by the kernel in between.
pub struct Listeners {
    grpc: tokio::net::TcpListener,
    metrics: tokio::net::TcpListener,
    kv: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(settings: &Settings) -> Result<Self> {
        let grpc = tokio::net::TcpListener::bind(settings.listen)
            .await
            .map_err(|e| Error::Io {
                what: format!("gRPC listen {}", settings.listen),
                source: e,
            })?;
        let metrics = crate::http::bind(settings.metrics_addr, "metrics").await?;
        let kv = match settings.http_metadata_addr {
            Some(addr) => Some(crate::http::bind(addr, "http metadata").await?),
            None => None,
        };
        Ok(Self { grpc, metrics, kv })
    }
}

/// Shared state of one replica, handed to the services.
pub struct Node {
    pub id: u64,
    pub settings: Settings,
    pub raft: Raft,
    pub core: Arc<Mutex<Core>>,
    pub proposer: Proposer,
    pub gate: Gate,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    pub storage: Arc<StorageStats>,
    /// Taken by [`Node::serve`].
    listeners: Mutex<Option<Listeners>>,
}

impl Node {
    /// Opens storage and starts Raft (bootstrapping when asked and the data dir is empty).
    pub async fn start(settings: Settings) -> Result<Arc<Node>> {
        let listeners = Listeners::bind(&settings).await?;
        let dir = settings.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io {
            what: format!("data dir {}", dir.display()),
            source: e,
        })?;
        let storage_err = |e: regolith_raft_log::Error| Error::Storage {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let had_state = regolith_raft_log::has_state(&dir).map_err(storage_err)?;
        let clock = Clock::default();
        let core = Arc::new(Mutex::new(Core::new(settings.cache.clone())));
        let storage_cfg = StorageConfig {
            sled_cache_bytes: settings.sled_cache_bytes,
            max_read_bytes: settings.raft_max_message_bytes as u64 / 2,
            ..Default::default()
        };
        let (log, sm) = regolith_raft_log::open(
            &dir,
            &storage_cfg,
            MetadSm {
                core: core.clone(),
                clock,
            },
        )
        .map_err(storage_err)?;
        let storage = log.stats();
        let raft_cfg = openraft::Config {
            cluster_name: "regolith".into(),
            heartbeat_interval: settings.heartbeat_interval.as_millis() as u64,
            election_timeout_min: settings.election_timeout_min.as_millis() as u64,
            election_timeout_max: settings.election_timeout_max.as_millis() as u64,
            install_snapshot_timeout: 60_000,
            max_payload_entries: 4096,
            replication_lag_threshold: settings.snapshot_logs * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.snapshot_logs),
            snapshot_max_chunk_size: (settings.raft_max_message_bytes / 2) as u64,
            max_in_snapshot_log_to_keep: 128,
            ..Default::default()
        }
        .validate()
        .map_err(|e| Error::Config(format!("raft settings: {e}")))?;
        let network = Network {
            interceptor: TokenInterceptor::new(settings.token.as_deref())
                .map_err(|e| Error::Config(e.to_string()))?,
            max_message_bytes: settings.raft_max_message_bytes,
            connect_timeout: Duration::from_secs(1),
        };
        let raft = Raft::new(settings.id, Arc::new(raft_cfg), network, log, sm)
            .await
            .map_err(|e| Error::Raft(format!("starting raft: {e}")))?;
        if settings.bootstrap && !had_state {
            let members: BTreeMap<u64, BasicNode> = settings
                .peers
                .iter()
                .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
                .collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(peers = ?settings.peers, "cluster bootstrapped"),
                Err(e) => tracing::info!(error = %e, "bootstrap skipped"),
            }
        } else if settings.bootstrap {
            tracing::info!(dir = %dir.display(), "data dir has state: --bootstrap ignored");
        } else if !had_state {
            tracing::info!("empty member without --bootstrap: waiting to be added to a cluster");
        }
        let metrics = Arc::new(Metrics::new());
        let lease = settings.election_timeout_min;
        let gate = Gate::start(
            raft.clone(),
            core.clone(),
            clock,
            lease,
            settings.heartbeat_interval,
            READY_WAIT,
        );
        let proposer = Proposer::start(raft.clone(), metrics.clone(), settings.max_entry_bytes, 4);
        Ok(Arc::new(Node {
            id: settings.id,
            settings,
            raft,
            core,
            proposer,
            gate,
            metrics,
            clock,
            storage,
            listeners: Mutex::new(Some(listeners)),
        }))
    }

    /// Serves until `shutdown` fires, then stops Raft and flushes storage.
    pub async fn serve(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        let check = TokenCheck::new(self.settings.token.clone());
        let max = self.settings.raft_max_message_bytes + 64 * 1024;
        let metad = MetadServer::new(MetadService { node: self.clone() })
            .max_decoding_message_size(regolith_proto::client::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(regolith_proto::client::MAX_MESSAGE_BYTES);
        let raft = RaftServer::new(RaftService {
            raft: self.raft.clone(),
        })
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
        // The token is checked before a request body is read.
        let metad = InterceptedService::new(metad, check.clone());
        let raft = InterceptedService::new(raft, check);
        let Some(listeners) = self.listeners.lock().take() else {
            return Err(Error::Config("this replica is already serving".into()));
        };
        let listener = listeners.grpc;
        tracing::info!(addr = %self.settings.listen, id = self.id, "gRPC listening");
        // tonic sets TCP_NODELAY only on sockets it accepts itself; these are ours. Without it,
        // Nagle's algorithm and delayed ACKs add ~40 ms to any reply larger than one segment.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| {
                s.inspect(|s| {
                    if let Err(e) = s.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY");
                    }
                })
            },
        );
        let mut sd = shutdown.clone();
        let grpc = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(metad)
            .add_service(raft)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = sd.wait_for(|s| *s).await;
            });
        let http = crate::http::serve_metrics(self.clone(), listeners.metrics, shutdown.clone());
        let kv = listeners
            .kv
            .map(|l| crate::http::serve_metadata_kv(self.clone(), l, shutdown.clone()));
        tokio::spawn(self.clone().housekeeping(shutdown.clone()));
        tokio::spawn(self.clone().summary_log(shutdown.clone()));
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "gRPC server failed");
        }
        let _ = shutdown.wait_for(|s| *s).await;
        tracing::info!("shutting down: stopping raft");
        let _ = http.await;
        if let Some(kv) = kv {
            let _ = kv.await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// The leader's periodic work: expiries, lease holds, liveness, drains, TTLs, eviction.
    async fn housekeeping(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut snapshot_mark = self.storage.appended_bytes();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            self.snapshot_if_log_grew(&mut snapshot_mark).await;
            let lease_ok = self.gate.lease_ok();
            let now = self.clock.now();
            let cmds: Vec<Command> = {
                let mut core = self.core.lock();
                match core.leader_parts() {
                    Some((l, sm)) => l.tick(sm, now, lease_ok),
                    None => continue,
                }
            };
            if cmds.is_empty() {
                continue;
            }
            let proposer = self.proposer.clone();
            tokio::spawn(async move {
                for r in proposer.propose_all(cmds).await {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "housekeeping proposal failed (will retry)");
                    }
                }
            });
        }
    }

    /// Every replica snapshots (and so purges) its own log once `--snapshot-bytes` were appended
    /// since the last time, whatever the entry count.
    async fn snapshot_if_log_grew(&self, mark: &mut u64) {
        let appended = self.storage.appended_bytes();
        if appended.saturating_sub(*mark) < self.settings.snapshot_bytes {
            return;
        }
        *mark = appended;
        tracing::info!(
            appended,
            "log grew past --snapshot-bytes: building a snapshot"
        );
        if let Err(e) = self.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "could not trigger a snapshot");
        }
    }

    async fn summary_log(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(SUMMARY_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let obs = self.gate.observed();
            let core = self.core.lock();
            let sm = core.sm();
            let (res, quarantined) = core
                .leader()
                .map(|l| (l.reservations().len(), l.reservations().quarantined()))
                .unwrap_or((0, 0));
            tracing::info!(
                "Storage: {} / {} | Keys: {} | Segments: {} | Role: {:?} term {} leader {:?} | Applied: {} | Reservations: {} ({} quarantined) | Evicted: {} | Dead-node drops: {}",
                regolith_proto::units::format_size(sm.bytes_used()),
                regolith_proto::units::format_size(sm.bytes_total()),
                sm.key_count(),
                sm.segments().count(),
                obs.state,
                obs.term,
                obs.leader,
                obs.applied_index,
                res,
                quarantined,
                sm.counters().evicted_objects,
                sm.counters().dead_node_dropped_objects,
            );
        }
    }

    /// Refreshes the gauges that mirror state (called on each scrape).
    pub fn refresh_metrics(&self) {
        let obs = self.gate.observed();
        let m = &self.metrics;
        m.role.set(match obs.state {
            openraft::ServerState::Follower => 0,
            openraft::ServerState::Candidate => 1,
            openraft::ServerState::Leader => 2,
            openraft::ServerState::Learner => 3,
            openraft::ServerState::Shutdown => 4,
        });
        m.term.set(obs.term as i64);
        m.leader_id.set(obs.leader.unwrap_or(0) as i64);
        m.applied_index.set(obs.applied_index as i64);
        m.last_log_index.set(obs.last_log_index as i64);
        m.committed_index.set(self.storage.committed_index() as i64);
        m.fsyncs.set(self.storage.fsyncs() as i64);
        m.appended_entries
            .set(self.storage.appended_entries() as i64);
        m.snapshots_built.set(self.storage.snapshot_builds() as i64);
        m.snapshot_bytes
            .set(self.storage.last_snapshot_bytes() as i64);
        let core = self.core.lock();
        let sm = core.sm();
        m.keys.set(sm.key_count() as i64);
        m.bytes_used.set(sm.bytes_used() as i64);
        m.bytes_total.set(sm.bytes_total() as i64);
        m.hard_pinned_bytes.set(sm.hard_pinned_bytes() as i64);
        m.segments.set(sm.segments().count() as i64);
        m.evicted_objects.set(sm.counters().evicted_objects as i64);
        m.dead_node_dropped_objects
            .set(sm.counters().dead_node_dropped_objects as i64);
        m.expired_objects.set(sm.counters().expired_objects as i64);
        let (r, q, l) = core
            .leader()
            .map(|l| {
                (
                    l.reservations().len(),
                    l.reservations().quarantined(),
                    l.leases().len(),
                )
            })
            .unwrap_or((0, 0, 0));
        m.reservations.set(r as i64);
        m.quarantined.set(q as i64);
        m.leases.set(l as i64);
    }

    /// Current members: (id, address, voter).
    pub fn members(&self) -> Vec<(u64, String, bool)> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let voters: std::collections::BTreeSet<u64> = m.membership().voter_ids().collect();
        m.membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone(), voters.contains(id)))
            .collect()
    }
}
