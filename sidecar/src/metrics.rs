//! Prometheus metrics of the sidecar (names in docs/sidecar.md). Gauges mirroring state and the
//! per-NIC counters of the transport are refreshed when `/metrics` is scraped.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::transport::{TransferEvent, TransferObserver};

pub struct Metrics {
    pub registry: Registry,
    pub ops: IntCounterVec,
    pub op_errors: IntCounterVec,
    pub op_seconds: HistogramVec,
    pub transfer_seconds: HistogramVec,
    pub transfer_bytes: IntCounterVec,
    pub nic_bytes_in: IntGaugeVec,
    pub nic_bytes_out: IntGaugeVec,
    pub nic_retries: IntGaugeVec,
    pub nic_failed_conns: IntGaugeVec,
    pub data_plane_refusals: IntGaugeVec,
    pub rdma_enabled: IntGauge,
    pub rdma_bytes: IntGaugeVec,
    pub rdma_ops: IntGaugeVec,
    pub rdma_errors: IntGaugeVec,
    pub rdma_connections: IntGaugeVec,
    pub rdma_fallbacks: IntGauge,
    pub rdma_refused: IntGauge,
    pub checksum_mismatches: IntCounter,
    pub clients: IntGauge,
    pub segment_bytes: IntGauge,
    pub segment_used_bytes: IntGauge,
    pub generation: IntGauge,
    pub metad_term: IntGauge,
    pub heartbeat_failures: IntCounter,
    pub remounts: IntCounter,
    pub put_bytes: IntCounter,
    pub get_bytes: IntCounter,
    pub uds_bad_frames: IntCounter,
    pub connections_refused: IntCounterVec,
    pub index_objects: IntGauge,
    pub index_bytes: IntGauge,
    pub index_applied_index: IntGauge,
    pub index_lag_entries: IntGauge,
    pub index_lag_ms: IntGauge,
    pub index_synced: IntGauge,
    pub index_resyncs: IntCounter,
    pub index_reconnects: IntCounter,
    pub index_answers: IntCounterVec,
    pub index_stale_reads: IntCounterVec,
    pub accesses_dropped: IntCounter,
    pub disk_offloads: IntCounter,
    pub disk_promotions: IntCounter,
    pub disk_healthy: IntGaugeVec,
    pub disk_capacity_bytes: IntGaugeVec,
    pub disk_used_bytes: IntGaugeVec,
    pub disk_allocated_bytes: IntGaugeVec,
    pub disk_objects: IntGaugeVec,
    pub disk_read_bytes: IntGaugeVec,
    pub disk_reads: IntGaugeVec,
    pub disk_read_micros: IntGaugeVec,
    pub disk_write_bytes: IntGaugeVec,
    pub disk_writes: IntGaugeVec,
    pub disk_write_micros: IntGaugeVec,
    pub disk_errors: IntGaugeVec,
    pub disk_corrupt_records: IntGaugeVec,
    pub disk_evicted: IntGaugeVec,
    pub disk_compacted: IntGaugeVec,
    pub disk_lost: IntGaugeVec,
}

// Metric names and help texts are constants of this file: a failure to build or register
// one is a bug caught by every test that starts a sidecar, never input from a peer.
#[allow(clippy::expect_used)]
fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl Metrics {
    #[allow(clippy::expect_used)] // constant names and options, as `reg` says
    pub fn new() -> Arc<Self> {
        let r = Registry::new();
        let lat = vec![
            0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
            0.25, 0.5, 1.0, 5.0,
        ];
        let cv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntCounterVec::new(Opts::new(format!("regolith_sidecar_{name}"), help), labels)
                    .expect("valid"),
            )
        };
        let gv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntGaugeVec::new(Opts::new(format!("regolith_sidecar_{name}"), help), labels)
                    .expect("valid"),
            )
        };
        let g = |name: &str, help: &str| {
            reg(
                &r,
                IntGauge::new(format!("regolith_sidecar_{name}"), help).expect("valid"),
            )
        };
        let c = |name: &str, help: &str| {
            reg(
                &r,
                IntCounter::new(format!("regolith_sidecar_{name}"), help).expect("valid"),
            )
        };
        Arc::new(Self {
            ops: cv("ops_total", "Client requests by operation", &["op"]),
            op_errors: cv(
                "op_errors_total",
                "Client request items that failed, by operation and code",
                &["op", "code"],
            ),
            op_seconds: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new("regolith_sidecar_op_seconds", "Client request latency")
                        .buckets(lat.clone()),
                    &["op"],
                )
                .expect("valid"),
            ),
            transfer_seconds: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "regolith_sidecar_transfer_seconds",
                        "Data-plane transfer latency (one replica, all slices)",
                    )
                    .buckets(lat),
                    &["kind"],
                )
                .expect("valid"),
            ),
            transfer_bytes: cv(
                "transfer_bytes_total",
                "Data-plane bytes moved by this node's transfers",
                &["kind"],
            ),
            nic_bytes_in: gv(
                "nic_bytes_in",
                "Data-plane bytes received per local NIC",
                &["nic"],
            ),
            nic_bytes_out: gv(
                "nic_bytes_out",
                "Data-plane bytes sent per local NIC",
                &["nic"],
            ),
            nic_retries: gv(
                "nic_slice_retries",
                "Slices retried on another NIC pair, per local NIC",
                &["nic"],
            ),
            nic_failed_conns: gv(
                "nic_failed_connections",
                "Data-plane connections that failed, per local NIC",
                &["nic"],
            ),
            data_plane_refusals: gv(
                "data_plane_refusals",
                "Data-plane connections and requests this node's server refused, by reason (busy, evicted_pending, bad_grant)",
                &["reason"],
            ),
            rdma_enabled: g(
                "rdma_enabled",
                "1 when this node moves slices over RDMA where the peer can (ports open), 0 when it speaks TCP only",
            ),
            rdma_bytes: gv(
                "rdma_bytes",
                "Bytes moved over RDMA per port (device:port): read = RDMA READs issued, write = RDMA WRITEs issued, commit = peers' writes copied from staging into the segment",
                &["device", "op"],
            ),
            rdma_ops: gv(
                "rdma_ops",
                "Slices moved over RDMA per port, by op (read, write, commit)",
                &["device", "op"],
            ),
            rdma_errors: gv(
                "rdma_errors",
                "RDMA work requests or connection set-ups that failed, per port",
                &["device"],
            ),
            rdma_connections: gv(
                "rdma_connections",
                "Data-plane connections upgraded to RDMA on each port (as client or server)",
                &["device"],
            ),
            rdma_fallbacks: g(
                "rdma_fallbacks",
                "Connections that stayed on TCP because the peer could not upgrade (auto mode)",
            ),
            rdma_refused: g(
                "rdma_refused_upgrades",
                "RDMA upgrades this node refused as a server (no port on the peer's link layer, no staging room, bad offer)",
            ),
            checksum_mismatches: c(
                "checksum_mismatches_total",
                "Reads whose bytes failed the object checksum (served as misses)",
            ),
            clients: g("clients", "Connected local clients"),
            segment_bytes: g("segment_bytes", "Size of this node's segment"),
            segment_used_bytes: g(
                "segment_used_bytes",
                "Bytes of the segment holding objects (from metad)",
            ),
            generation: g("segment_generation", "Mounted generation of the segment"),
            metad_term: g("metad_term", "Highest metad term seen"),
            heartbeat_failures: c("heartbeat_failures_total", "Heartbeats that got no answer"),
            remounts: c(
                "remounts_total",
                "Times the segment was mounted again (declared dead or replaced)",
            ),
            put_bytes: c(
                "put_bytes_total",
                "Bytes of objects put through this sidecar",
            ),
            get_bytes: c(
                "get_bytes_total",
                "Bytes of objects read through this sidecar",
            ),
            uds_bad_frames: c(
                "uds_bad_requests_total",
                "UDS requests refused as malformed or unknown",
            ),
            connections_refused: cv(
                "connections_refused_total",
                "Connections closed at once because their listener had its most open (or, on \
                 the data plane, before authentication), by listener",
                &["listener"],
            ),
            disk_healthy: gv("disk_healthy", "1 while the disk is in service, 0 once it failed (or could not be opened)", &["disk"]),
            disk_capacity_bytes: gv("disk_capacity_bytes", "What the disk may hold (its SIZE, or free space less a margin)", &["disk"]),
            disk_used_bytes: gv("disk_used_bytes", "Bytes of live records on the disk", &["disk"]),
            disk_allocated_bytes: gv("disk_allocated_bytes", "Bytes of bucket files created on the disk", &["disk"]),
            disk_objects: gv("disk_objects", "Objects held on the disk", &["disk"]),
            disk_read_bytes: gv("disk_read_bytes", "Value bytes read from the disk", &["disk"]),
            disk_reads: gv("disk_reads", "Records read from the disk", &["disk"]),
            disk_read_micros: gv("disk_read_micros", "Time spent reading records (µs; divide by reads for the mean)", &["disk"]),
            disk_write_bytes: gv("disk_write_bytes", "Bytes written to the disk (records with headers and padding)", &["disk"]),
            disk_writes: gv("disk_writes", "Records written to the disk", &["disk"]),
            disk_write_micros: gv("disk_write_micros", "Time spent writing batches, fdatasync included (µs)", &["disk"]),
            disk_errors: gv("disk_errors", "I/O errors (the first one takes the disk out)", &["disk"]),
            disk_corrupt_records: gv("disk_corrupt_records", "Records that failed their checksum or header check, read as misses and dropped", &["disk"]),
            disk_evicted: gv("disk_evicted", "Records dropped by the disk's own eviction (least recently used bucket)", &["disk"]),
            disk_compacted: gv("disk_compacted", "Records moved by compaction", &["disk"]),
            disk_lost: gv("disk_lost", "Objects dropped because their disk failed", &["disk"]),
            disk_offloads: c("disk_offloads_total", "Objects this node moved from its memory to its disk tier (committed)"),
            disk_promotions: c("disk_promotions_total", "Disk-only objects this node copied back into its memory on a hit (before metad commits them)"),
            index_objects: g("index_objects", "Objects in this node's index"),
            index_bytes: g(
                "index_bytes",
                "Heap bytes this node's index holds (capacity)",
            ),
            index_applied_index: g(
                "index_applied_index",
                "metad log index this node's index is complete up to",
            ),
            index_lag_entries: g(
                "index_lag_entries",
                "Log entries the index is behind the leader's last applied index",
            ),
            index_lag_ms: g(
                "index_lag_ms",
                "How long the index has been behind the leader (0 when caught up)",
            ),
            index_synced: g(
                "index_synced",
                "1 while the index is current and answers exists and gets; 0 falls back to metad",
            ),
            index_resyncs: c(
                "index_resyncs_total",
                "Full snapshots of the index received from metad",
            ),
            index_reconnects: c(
                "index_reconnects_total",
                "Watch streams (re)opened, resumed or resynced",
            ),
            index_answers: cv(
                "index_answers_total",
                "Keys answered from the index (source=index) or by metad (source=metad), by op",
                &["op", "source"],
            ),
            index_stale_reads: cv(
                "index_stale_reads_total",
                "Indexed placements that did not verify (reused or gone) and were retried through metad",
                &["where"],
            ),
            accesses_dropped: c(
                "index_accesses_dropped_total",
                "Index reads not reported to metad because a heartbeat's list was full",
            ),
            registry: r,
        })
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    pub fn observe_op(&self, op: &str, took: Duration) {
        self.ops.with_label_values(&[op]).inc();
        self.op_seconds
            .with_label_values(&[op])
            .observe(took.as_secs_f64());
    }
}

/// Feeds transfer events of the data plane into the histograms.
pub struct Observer(pub Arc<Metrics>);

impl TransferObserver for Observer {
    fn transfer_done(&self, ev: &TransferEvent) {
        let kind = format!("{:?}", ev.kind).to_lowercase();
        self.0
            .transfer_seconds
            .with_label_values(&[&kind])
            .observe(ev.elapsed.as_secs_f64());
        if ev.ok {
            self.0
                .transfer_bytes
                .with_label_values(&[&kind])
                .inc_by(ev.bytes);
        }
    }
}
