//! Prometheus metrics of one metad replica (names in docs/metad.md). Gauges that mirror the
//! state are refreshed when `/metrics` is scraped.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub role: IntGauge,
    pub term: IntGauge,
    pub leader_id: IntGauge,
    pub applied_index: IntGauge,
    pub committed_index: IntGauge,
    pub last_log_index: IntGauge,
    pub commit_latency: Histogram,
    pub entry_commands: Histogram,
    pub keys: IntGauge,
    pub bytes_used: IntGauge,
    pub bytes_total: IntGauge,
    pub hard_pinned_bytes: IntGauge,
    pub segments: IntGauge,
    pub evicted_objects: IntGauge,
    pub dead_node_dropped_objects: IntGauge,
    pub expired_objects: IntGauge,
    pub reservations: IntGauge,
    pub quarantined: IntGauge,
    pub leases: IntGauge,
    pub rpc_requests: IntCounterVec,
    pub rpc_failures: IntCounterVec,
    pub read_fallbacks: IntCounterVec,
    pub raft_rejected: IntCounterVec,
    pub connections_refused: IntCounterVec,
    /// Leadership hand-overs this replica led, by result (`ok`, `failed`).
    pub leader_transfers: IntCounterVec,
    pub fsyncs: IntGauge,
    pub raft_entries_sent: IntCounter,
    pub raft_append_probes: IntCounterVec,
    pub appended_entries: IntGauge,
    pub snapshots_built: IntGauge,
    pub snapshots_installed: IntGauge,
    pub snapshot_bytes: IntGauge,
    pub watch_streams: IntGauge,
    pub watch_resyncs: IntCounter,
    pub requests_past_deadline: IntCounter,
    pub accesses_reported: IntCounter,
    pub tls_handshake_failures: IntCounter,
    pub tls_reloads: IntGauge,
    pub tls_reload_failures: IntGauge,
    pub heap_allocated: IntGauge,
    pub heap_resident: IntGauge,
}

/// Set by the `regolith-metad` binary, whose global allocator is jemalloc: only then do
/// jemalloc's statistics describe the process's heap (a test harness links jemalloc without
/// allocating from it).
static HEAP_IS_JEMALLOC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Declares that the process allocates from jemalloc (called by `main` before anything else).
pub fn heap_is_jemalloc() {
    HEAP_IS_JEMALLOC.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// jemalloc's bytes allocated and bytes resident, when the process allocates from it.
pub fn heap_stats() -> Option<(u64, u64)> {
    use tikv_jemalloc_ctl::{epoch, stats};
    if !HEAP_IS_JEMALLOC.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    // The statistics are a snapshot refreshed by advancing the epoch.
    epoch::advance().ok()?;
    Some((
        stats::allocated::read().ok()? as u64,
        stats::resident::read().ok()? as u64,
    ))
}

// Metric names and options are constants of this file: a failure to build or register one is
// a bug every test that starts a replica catches, never input from a peer.
#[allow(clippy::expect_used)]
fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(format!("regolith_metad_{name}"), help).expect("valid metric name");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

#[allow(clippy::expect_used)] // constant names, as `gauge` says
fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(format!("regolith_metad_{name}"), help).expect("valid metric name");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl Metrics {
    #[allow(clippy::expect_used)] // constant names and options, as `gauge` says
    pub fn new() -> Self {
        let r = Registry::new();
        let buckets = vec![
            0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.012, 0.016, 0.025, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5,
        ];
        let commit_latency = Histogram::with_opts(
            HistogramOpts::new(
                "regolith_metad_commit_latency_seconds",
                "Time from proposing an entry to its apply on the leader",
            )
            .buckets(buckets),
        )
        .expect("valid histogram");
        r.register(Box::new(commit_latency.clone()))
            .expect("unique metric");
        let entry_commands = Histogram::with_opts(
            HistogramOpts::new(
                "regolith_metad_entry_commands",
                "Commands coalesced into one Raft entry",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0, 4096.0,
            ]),
        )
        .expect("valid histogram");
        r.register(Box::new(entry_commands.clone()))
            .expect("unique metric");
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(format!("regolith_metad_{name}"), help), labels)
                .expect("valid");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let m = Self {
            role: gauge(
                &r,
                "role",
                "0 follower, 1 candidate, 2 leader, 3 learner, 4 shutting down",
            ),
            term: gauge(&r, "term", "Current Raft term"),
            leader_id: gauge(&r, "leader_id", "Numeric id of the known leader (0: none)"),
            applied_index: gauge(&r, "applied_index", "Index of the last applied entry"),
            committed_index: gauge(
                &r,
                "committed_index",
                "Index of the last entry known committed",
            ),
            last_log_index: gauge(&r, "last_log_index", "Index of the last entry in the log"),
            commit_latency,
            entry_commands,
            keys: gauge(&r, "keys", "Objects in the store"),
            bytes_used: gauge(
                &r,
                "bytes_used",
                "Bytes of committed replicas over all segments",
            ),
            bytes_total: gauge(&r, "bytes_total", "Capacity of all mounted segments"),
            hard_pinned_bytes: gauge(
                &r,
                "hard_pinned_bytes",
                "Bytes of hard-pinned objects (all replicas)",
            ),
            segments: gauge(&r, "segments", "Mounted segments"),
            evicted_objects: gauge(
                &r,
                "evicted_objects",
                "Objects evicted since the cluster was created",
            ),
            dead_node_dropped_objects: gauge(
                &r,
                "dead_node_dropped_objects",
                "Objects that lost their last replica with a node declared dead or remounted",
            ),
            expired_objects: gauge(&r, "expired_objects", "Objects removed by their TTL"),
            reservations: gauge(
                &r,
                "reservations",
                "Reservations held by this leader (live and quarantined)",
            ),
            quarantined: gauge(
                &r,
                "quarantined_reservations",
                "Quarantined reservations awaiting release",
            ),
            leases: gauge(&r, "read_leases", "Read leases this leader holds"),
            rpc_requests: counter_vec("rpc_requests_total", "gRPC requests by method", &["rpc"]),
            rpc_failures: counter_vec(
                "rpc_failures_total",
                "gRPC requests that failed, by method and code",
                &["rpc", "code"],
            ),
            read_fallbacks: counter_vec(
                "read_fallbacks_total",
                "Reads that could not use the quorum lease, by what they did instead",
                &["kind"],
            ),
            raft_rejected: counter_vec(
                "raft_rejected_messages_total",
                "Raft messages refused before openraft saw them, by RPC and reason",
                &["rpc", "reason"],
            ),
            connections_refused: counter_vec(
                "connections_refused_total",
                "Connections closed at once because their listener had its most open, by listener",
                &["listener"],
            ),
            leader_transfers: counter_vec(
                "leader_transfers_total",
                "Leadership hand-overs this replica led (transfer-leader, SIGTERM), by result",
                &["result"],
            ),
            fsyncs: gauge(&r, "storage_fsyncs", "fsyncs of the Raft log"),
            raft_entries_sent: counter(
                &r,
                "raft_entries_sent_total",
                "Log entries carried by the AppendEntries this replica sent as leader",
            ),
            raft_append_probes: counter_vec(
                "raft_append_probes_total",
                "Empty AppendEntries asking a follower whether it holds the entry its vote answer named, by answer (matched: the entries up to it were not sent again)",
                &["result"],
            ),
            appended_entries: gauge(
                &r,
                "storage_appended_entries",
                "Entries appended to the Raft log",
            ),
            snapshots_built: gauge(&r, "snapshots_built", "Snapshots built"),
            snapshots_installed: gauge(
                &r,
                "snapshots_installed",
                "Snapshots received from a leader and installed",
            ),
            snapshot_bytes: gauge(&r, "snapshot_bytes", "Size of the last snapshot"),
            watch_streams: gauge(&r, "watch_streams", "Watch streams this replica serves"),
            watch_resyncs: counter(
                &r,
                "watch_resyncs_total",
                "Full snapshots sent to watchers (new, or too far behind the feed)",
            ),
            requests_past_deadline: counter(
                &r,
                "requests_past_deadline_total",
                "Requests (or commands of a request) not acted on because the client's deadline had passed",
            ),
            accesses_reported: counter(
                &r,
                "accesses_reported_total",
                "Object reads sidecars served from their index and reported with heartbeats",
            ),
            tls_handshake_failures: counter(
                &r,
                "tls_handshake_failures_total",
                "gRPC connections closed because their TLS handshake failed or timed out",
            ),
            tls_reloads: gauge(
                &r,
                "tls_reloads",
                "Certificate rotations loaded since start",
            ),
            tls_reload_failures: gauge(
                &r,
                "tls_reload_failures",
                "Certificate rotations that did not load (the previous certificates stayed)",
            ),
            heap_allocated: gauge(
                &r,
                "heap_allocated_bytes",
                "Heap bytes in use by the process (jemalloc's count; 0 without jemalloc)",
            ),
            heap_resident: gauge(
                &r,
                "heap_resident_bytes",
                "Heap bytes resident, free-but-kept pages included (jemalloc's count)",
            ),
            registry: r,
        };
        // At zero from the start: a dashboard or an alert on a hand-over's result needs the
        // series before the first one.
        for result in ["ok", "failed"] {
            m.leader_transfers.with_label_values(&[result]);
        }
        m
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
