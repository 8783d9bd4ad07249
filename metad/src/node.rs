//! A running metad replica: storage, Raft, the core, the group-commit proposer, the read gate
//! (together the [`Ops`] the services call), the periodic leader work and the summary log.
//! The listeners and the servers on them are `run.rs`'s.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use parking_lot::Mutex;
use regolith_proto::auth::PeerInterceptor;
use regolith_proto::shutdown::Shutdown;
use regolith_raft_log::{StorageConfig, StorageStats};

use crate::args::Settings;
use crate::clock::Clock;
use crate::command::Command;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::network::Network;
use crate::ops::Ops;
use crate::proposer::Proposer;
use crate::raft_types::Raft;
use crate::sm::MetadSm;

/// How long a call waits for this leader to become ready before answering UNAVAILABLE.
const READY_WAIT: Duration = Duration::from_secs(3);
/// Period of the leader's housekeeping (expiries, liveness, eviction).
const TICK: Duration = Duration::from_millis(100);
/// Period of the one-line summary log.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// A stopping replica builds a last snapshot only past this many entries since its last one.
const STOP_SNAPSHOT_MIN_ENTRIES: u64 = 1024;

/// Shared state of one replica.
pub struct Node {
    pub settings: Settings,
    /// Raft, the core and the gates: what the services call.
    pub ops: Arc<Ops>,
    pub storage: Arc<StorageStats>,
    /// What this replica's AppendEntries carried (the network's counts).
    pub replication: crate::network::PeerLogs,
}

impl Node {
    /// Opens storage and starts Raft (bootstrapping when asked and the data dir is empty).
    /// The caller binds its listeners before (`run::Listeners`).
    pub async fn start(settings: Settings) -> Result<Arc<Node>> {
        let dir = settings.data_dir.clone();
        let widened = regolith_proto::daemon::private_dir(&dir).map_err(|e| Error::Io {
            what: format!("data dir {} (create, mode 0700)", dir.display()),
            source: e,
        })?;
        if widened {
            tracing::warn!(dir = %dir.display(), "data dir was readable by others: now 0700");
        }
        let storage_err = |e: regolith_raft_log::Error| Error::Storage {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        crate::restore::check_markers(&dir)?;
        let had_state = regolith_raft_log::has_state(&dir).map_err(storage_err)?;
        let clock = Clock::default();
        let core = Arc::new(Mutex::new(Core::new(settings.cache.clone())));
        let (applied_tx, applied) = tokio::sync::watch::channel(0u64);
        let storage_cfg = StorageConfig {
            sled_cache_bytes: settings.sled_cache_bytes,
            log_cache_bytes: settings.log_cache_bytes,
            max_read_bytes: settings.raft_max_message_bytes as u64 / 2,
            ..Default::default()
        };
        let prepared = crate::restore::prepare(&settings, &storage_cfg, had_state).await?;
        let (log, sm) = regolith_raft_log::open(
            &dir,
            &storage_cfg,
            MetadSm {
                core: core.clone(),
                clock,
                applied: applied_tx,
            },
        )
        .map_err(storage_err)?;
        // A leader that stopped comes back as a follower, and the next leader is elected in a
        // new term: the leader's memory (reservation versions above all) restarts empty, and
        // within one term its names must stay unique.
        if let Some(term) = regolith_raft_log::no_restored_leader(&log, settings.id)
            .await
            .map_err(storage_err)?
        {
            tracing::info!(
                term,
                "led term {term} when it stopped: starts as a follower, the next leader is elected in a new term"
            );
        }
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
        let outlogged = crate::elect::Outlogged::default();
        let replication = crate::network::PeerLogs::default();
        let interceptor =
            PeerInterceptor::new(settings.token.as_deref(), settings.peer_token.as_deref())
                .map_err(|e| Error::Config(e.to_string()))?;
        let peers = crate::transfer::Dialer {
            interceptor: interceptor.clone(),
            tls: settings.tls.clone(),
            connect_timeout: Duration::from_secs(1),
        };
        let network = Network {
            interceptor,
            max_message_bytes: settings.raft_max_message_bytes,
            append_budget_bytes: settings.max_entry_bytes,
            connect_timeout: Duration::from_secs(1),
            outlogged: outlogged.clone(),
            tls: settings.tls.clone(),
            logs: replication.clone(),
        };
        let raft = Raft::new(settings.id, Arc::new(raft_cfg), network, log, sm)
            .await
            .map_err(|e| Error::Raft(format!("starting raft: {e}")))?;
        if prepared == crate::restore::Prepared::Restored {
            tracing::info!(peers = ?settings.peers, "cluster created from the snapshot file: no bootstrap entry");
        } else if settings.bootstrap && !had_state {
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
        crate::elect::start(
            raft.clone(),
            outlogged,
            settings.election_timeout_min,
            settings.election_timeout_max,
        );
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
        let ops = Arc::new(Ops {
            id: settings.id,
            cache: settings.cache.clone(),
            raft,
            core,
            proposer,
            gate,
            metrics,
            clock,
            applied,
            max_entry_bytes: settings.max_entry_bytes,
            spool_dir: settings.data_dir.clone(),
            saving: tokio::sync::Mutex::new(()),
            peers,
            vote_lease: settings.election_timeout_max,
            transferring: tokio::sync::Mutex::new(()),
        });
        Ok(Arc::new(Node {
            settings,
            ops,
            storage,
            replication,
        }))
    }

    /// Starts the background work: the leader's housekeeping and the summary log.
    pub fn spawn_background(self: &Arc<Self>, shutdown: &Shutdown) {
        tokio::spawn(self.clone().housekeeping(shutdown.clone()));
        tokio::spawn(self.clone().summary_log(shutdown.clone()));
    }

    /// On a graceful stop: a snapshot of what was applied since the last one, so that the next
    /// start loads it rather than replaying that log (at ten million objects the replay of a
    /// snapshot's worth of log took longer than the load). Waits at most
    /// `--stop-snapshot-timeout`; a build cut short by the exit is removed at the next start.
    pub async fn snapshot_before_stopping(&self) {
        let timeout = self.settings.stop_snapshot_timeout;
        let m = self.ops.raft.metrics().borrow().clone();
        let applied = m.last_applied.map_or(0, |l| l.index);
        let snapshot = m.snapshot.map_or(0, |l| l.index);
        // A few entries are cheaper to replay than a snapshot is to build.
        if timeout.is_zero() || applied.saturating_sub(snapshot) <= STOP_SNAPSHOT_MIN_ENTRIES {
            return;
        }
        tracing::info!(
            applied,
            snapshot,
            ?timeout,
            "stopping: building a last snapshot"
        );
        let started = std::time::Instant::now();
        if let Err(e) = self.ops.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "stopping: could not trigger a last snapshot");
            return;
        }
        let mut metrics = self.ops.raft.metrics();
        let built = tokio::time::timeout(
            timeout,
            metrics.wait_for(|m| m.snapshot.is_some_and(|l| l.index >= applied)),
        )
        .await;
        match built {
            Ok(Ok(_)) => {
                tracing::info!(elapsed = ?started.elapsed(), "stopping: last snapshot built")
            }
            _ => tracing::warn!(
                ?timeout,
                "stopping: the last snapshot did not finish in time (the next start replays the log)"
            ),
        }
    }

    /// Stops Raft (its storage is flushed).
    pub async fn stop(&self) {
        if let Err(e) = self.ops.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }

    /// The leader's periodic work: expiries, lease holds, liveness, drains, TTLs, eviction.
    async fn housekeeping(self: Arc<Self>, shutdown: Shutdown) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut snapshot_mark = self.storage.appended_bytes();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait() => return,
            }
            self.snapshot_if_log_grew(&mut snapshot_mark).await;
            let lease_ok = self.ops.gate.lease_ok();
            let now = self.ops.clock.now();
            let cmds: Vec<Command> = {
                let mut core = self.ops.core.lock();
                match core.leader_parts() {
                    Some((l, sm)) => l.tick(sm, now, lease_ok),
                    None => continue,
                }
            };
            if cmds.is_empty() {
                continue;
            }
            let proposer = self.ops.proposer.clone();
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
    /// since the last time, whatever the entry count, or once as many bytes as the last
    /// snapshot holds, when that is more: a snapshot costs its size, so the log may grow by
    /// that much between two (finding 4: a 193 MB snapshot was rebuilt every 16 MiB).
    async fn snapshot_if_log_grew(&self, mark: &mut u64) {
        let appended = self.storage.appended_bytes();
        let threshold = self
            .settings
            .snapshot_bytes
            .max(self.storage.last_snapshot_bytes());
        if appended.saturating_sub(*mark) < threshold {
            return;
        }
        *mark = appended;
        tracing::info!(
            appended,
            "log grew past --snapshot-bytes: building a snapshot"
        );
        if let Err(e) = self.ops.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "could not trigger a snapshot");
        }
    }

    async fn summary_log(self: Arc<Self>, shutdown: Shutdown) {
        let mut tick = tokio::time::interval(SUMMARY_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait() => return,
            }
            let st = self.ops.stats();
            let (obs, s) = (&st.raft, &st.store);
            tracing::info!(
                "Storage: {} / {} | Keys: {} | Segments: {} | Role: {:?} term {} leader {:?} | Applied: {} | Reservations: {} ({} quarantined) | Evicted: {} | Dead-node drops: {}",
                regolith_proto::units::format_size(s.bytes_used),
                regolith_proto::units::format_size(s.bytes_total),
                s.keys,
                s.segments,
                obs.state,
                obs.term,
                obs.leader,
                obs.applied_index,
                s.reservations,
                s.quarantined,
                s.evicted_objects,
                s.dead_node_dropped_objects,
            );
        }
    }

    /// Refreshes the gauges that mirror state (called on each scrape).
    pub fn refresh_metrics(&self) {
        let st = self.ops.stats();
        let (obs, s) = (&st.raft, &st.store);
        let m = &self.ops.metrics;
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
        let sent = self.replication.stats();
        catch_up(
            &m.raft_entries_sent,
            sent.entries_sent.load(Ordering::Relaxed),
        );
        for (result, n) in [
            ("matched", &sent.probes_matched),
            ("refused", &sent.probes_refused),
        ] {
            catch_up(
                &m.raft_append_probes.with_label_values(&[result]),
                n.load(Ordering::Relaxed),
            );
        }
        m.appended_entries
            .set(self.storage.appended_entries() as i64);
        m.snapshots_built.set(self.storage.snapshot_builds() as i64);
        m.snapshots_installed
            .set(self.storage.snapshot_installs() as i64);
        if let Some(tls) = &self.settings.tls {
            m.tls_reloads.set(tls.reloads() as i64);
            m.tls_reload_failures.set(tls.reload_failures() as i64);
        }
        m.snapshot_bytes
            .set(self.storage.last_snapshot_bytes() as i64);
        m.keys.set(s.keys as i64);
        m.bytes_used.set(s.bytes_used as i64);
        m.bytes_total.set(s.bytes_total as i64);
        m.hard_pinned_bytes.set(s.hard_pinned_bytes as i64);
        m.segments.set(s.segments as i64);
        m.evicted_objects.set(s.evicted_objects as i64);
        m.dead_node_dropped_objects
            .set(s.dead_node_dropped_objects as i64);
        m.expired_objects.set(s.expired_objects as i64);
        m.reservations.set(s.reservations as i64);
        m.quarantined.set(s.quarantined as i64);
        m.leases.set(s.leases as i64);
        if let Some((allocated, resident)) = crate::metrics::heap_stats() {
            m.heap_allocated.set(allocated as i64);
            m.heap_resident.set(resident as i64);
        }
    }
}

/// Raises a counter to a total kept elsewhere (totals only grow).
fn catch_up(c: &prometheus::IntCounter, total: u64) {
    c.inc_by(total.saturating_sub(c.get()));
}
