//! The checker: finds lost or wrong data, split leadership and missing recovery in a recorded
//! history (design section 3, invariants 3, 4 and 6; Raft's one leader per term).
//!
//! Every check is of the form "no valid order of these operations exists", judged from the
//! operations' real-time intervals only, so a finding is never a false alarm caused by
//! concurrency: an operation that completed is known to have taken effect between its invoke
//! and complete times; an indeterminate one anywhere after its invoke, or never; a failed one
//! never. Objects are immutable and every put writes a value of its own, so a value names the
//! one put that wrote it.
//!
//! * (a) [`AnomalyKind::LostAcknowledgedPut`] — after a put was acknowledged, a read, exists or
//!   remove found the key absent, with no remove that could have come between. Excused (and
//!   counted) when every replica of the object sat on a segment generation that went away
//!   (declared dead or replaced), or when placement is unknown and metad counted drops or
//!   evictions; [`AnomalyKind::LossesExceedCounters`] when more were excused than metad counted.
//! * (b) [`AnomalyKind::WrongRead`] — a get returned bytes that are no value of this key, the
//!   value of a put that failed, a value not yet invoked, or a value other than the one
//!   acknowledged with no remove between; [`AnomalyKind::ReadAfterRemove`] — the value of a put
//!   that completed before a remove that completed before the get began;
//!   [`AnomalyKind::DoubleAcknowledgedPut`] — two puts of one key both acknowledged with no
//!   remove that could separate them (a second put must answer already-exists).
//!   Where the sidecars answer from their object index ([`CheckInput::read_staleness`]), a get
//!   through one node may still return the value a remove or a later put made through
//!   *another* node replaced, for at most the index's staleness bound after that operation
//!   completed: such reads are not anomalies but counted ([`Report::stale_reads`]). Reads
//!   through the node that made the change, and every observation of absence, stay strict
//!   (read-your-writes; an index never answers "absent" itself).
//!   With metad's change feed recorded ([`crate::feed`]: the sidecar workload, where objects
//!   move to disks after their put), excuses come from it instead: a loss is excused only when
//!   the feed shows metad dropped that object (a listing of the key, of the put's size, ended)
//!   after the put began and before the observation ended (the first guarantee of the feed
//!   that covers the observation's end bounds it); the object's last placement says why: on a
//!   disk (a failed disk, the disk's own eviction), on segments that went away, or in memory
//!   (evicted). Where the feed resynced across that span, or never covered the observation,
//!   the rules above apply.
//! * [`AnomalyKind::DiskObjectsLost`] — after a warm restart of a sidecar
//!   (`sidecar-restart-warm`), more of the objects metad listed on that node's disks at the
//!   kill lost their disk replica (feed) than the restarted sidecar's disks counted as dropped
//!   (their own eviction, damaged records, a failed disk) plus metad's dead-node drops meanwhile.
//! * (e) [`AnomalyKind::OverlappingExtents`] — two acknowledged objects whose extents share a
//!   byte of one segment while neither could have been removed (invariant 2), when the client
//!   knows placements and metad evicted nothing.
//! * (f) [`AnomalyKind::PrematureDeath`] — a leader declared a node dead less than a node TTL
//!   after it acknowledged that node's heartbeat (in the same term): objects lost so are not
//!   excused by a fault, they are metad's doing.
//! * (c) [`AnomalyKind::TwoLeadersInTerm`] — from the `/status` samples: two nodes claimed (or
//!   were named) leader of the same term.
//! * (d) [`AnomalyKind::NoRecovery`] — after a fault healed, no put and get both succeeded
//!   within the limit (10 s).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use crate::history::{
    EventKind, FeedObject, Op, OpKind, OpResult, Recorded, ReplicaLoc, Reply, ResultClass,
};

/// A fault as it was run: injected, healed, and the end of its window (the next injection or
/// the end of the run). Operations invoked in `[injected_us, end_us)` are attributed to it.
#[derive(Clone, Debug)]
pub struct FaultWindow {
    pub name: String,
    /// The fault's kind, without its parameters (`packet-loss` for `packet-loss-30%`): the
    /// per-kind summary groups by it.
    pub kind: String,
    pub detail: String,
    pub injected_us: u64,
    pub healed_us: u64,
    pub end_us: u64,
}

/// Counters read from metad at the end of the run (max over every sample).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub evicted_objects: u64,
    pub dead_node_dropped_objects: u64,
}

/// "Node `leader` is the leader of `term`", as seen in one `/status` sample of `reporter`.
#[derive(Clone, Debug)]
pub struct LeaderClaim {
    pub at_us: u64,
    pub reporter: u64,
    pub term: u64,
    pub leader: u64,
    /// The reporter said it is leader itself (else it named `leader` as its leader).
    pub self_report: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AnomalyKind {
    LostAcknowledgedPut,
    WrongRead,
    ReadAfterRemove,
    DoubleAcknowledgedPut,
    OverlappingExtents,
    PrematureDeath,
    LossesExceedCounters,
    TwoLeadersInTerm,
    NoRecovery,
    DiskObjectsLost,
}

#[derive(Clone, Debug)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub key: Option<String>,
    /// When the offending observation began (attributes the anomaly to a fault window).
    pub at_us: u64,
    pub message: String,
    /// Ids of the operations involved.
    pub ops: Vec<usize>,
}

/// What to check.
pub struct CheckInput<'a> {
    pub recorded: &'a Recorded,
    pub claims: &'a [LeaderClaim],
    pub windows: &'a [FaultWindow],
    pub counters: Counters,
    /// Check (d)'s limit.
    pub recovery_limit: Duration,
    /// metad's node TTL, for check (f); `None` skips it.
    pub node_ttl: Option<Duration>,
    /// How stale a read through another node than the change's may be (the sidecars' object
    /// index); `None`: every read is held to linearizability.
    pub read_staleness: Option<Duration>,
    /// The size of the value of `(key, write id)`, when the workload derives it: matches a
    /// put to the object the feed listed (any object of the key is taken otherwise).
    pub value_len: Option<ValueLen<'a>>,
}

/// The size of the value a put of `(key, write id)` wrote.
pub type ValueLen<'a> = &'a dyn Fn(&str, u64) -> u64;

/// The staleness bound of the sidecar's object index (its `STALE_AFTER`, 2 s, measured from
/// the leader's lease confirmation) plus a margin for the clock conversions between the
/// leader's Unix time, the sidecar's monotonic clock and this recorder's.
pub const INDEX_READ_STALENESS: Duration = Duration::from_millis(2500);

/// The node (sidecar host) a client process runs on: processes are numbered
/// `(host + 1) * 100 + client` (see `workload::run`).
pub fn node_of(process: u32) -> u32 {
    process / 100
}

/// One row of the summary table.
#[derive(Clone, Debug)]
pub struct Row {
    pub fault: String,
    /// The fault's kind ([`FaultWindow::kind`]); the no-fault rows' kind is their name.
    pub kind: String,
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub indeterminate: usize,
    pub anomalies: usize,
    /// `None`: not applicable (no heal) or never recovered (then an anomaly says so).
    pub recovery: Option<Duration>,
}

/// One row of the per-kind summary: every step of one fault kind together.
#[derive(Clone, Debug)]
pub struct KindRow {
    pub kind: String,
    /// How many times the fault was injected.
    pub steps: usize,
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub indeterminate: usize,
    pub anomalies: usize,
    /// The slowest recovery measured after one of its heals.
    pub worst_recovery: Option<Duration>,
}

/// The checker's findings.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub anomalies: Vec<Anomaly>,
    /// Acknowledged puts found lost but excused by a segment drop or eviction.
    pub excused_losses: usize,
    /// Of those, by the cause the feed shows (empty without a feed).
    pub excused_by_cause: BTreeMap<&'static str, usize>,
    /// One line per warm restart checked (objects held on disk, dropped since, counted).
    pub warm_restarts: Vec<String>,
    /// Indeterminate puts, and how many of them a later get showed did take effect (the
    /// metad-only workload's commits answered NOT_LEADER or timed out).
    pub indeterminate_puts: usize,
    pub indeterminate_puts_seen: usize,
    pub indeterminate_seen_examples: Vec<String>,
    /// Gets the store answered as a miss because the bytes failed their checksum (no bytes
    /// were returned: never an anomaly, but counted).
    pub corrupt_misses: usize,
    /// Gets that returned a value replaced through another node shortly before, within
    /// [`CheckInput::read_staleness`] (the object index's bound): not anomalies, counted.
    pub stale_reads: usize,
    pub counters: Counters,
    /// Terms seen in the samples, and how many samples claimed a leader.
    pub terms_seen: usize,
    pub claims: usize,
    /// Every operation of each key involved in an anomaly, in invoke order.
    pub key_histories: BTreeMap<String, Vec<Op>>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.anomalies.is_empty()
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<26} {:>7} {:>7} {:>7} {:>7} {:>9} {:>10}",
            "fault", "ops", "ok", "failed", "indet.", "anomalies", "recovery"
        );
        let _ = writeln!(s, "{}", "-".repeat(80));
        for r in &self.rows {
            let rec = match r.recovery {
                Some(d) => format!("{:.2}s", d.as_secs_f64()),
                None => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<26} {:>7} {:>7} {:>7} {:>7} {:>9} {:>10}",
                r.fault, r.ops, r.ok, r.failed, r.indeterminate, r.anomalies, rec
            );
        }
        let total = |f: fn(&Row) -> usize| self.rows.iter().map(f).sum::<usize>();
        let _ = writeln!(s, "{}", "-".repeat(80));
        let _ = writeln!(
            s,
            "{:<26} {:>7} {:>7} {:>7} {:>7} {:>9}",
            "total",
            total(|r| r.ops),
            total(|r| r.ok),
            total(|r| r.failed),
            total(|r| r.indeterminate),
            self.anomalies.len()
        );
        let _ = writeln!(
            s,
            "leader claims: {} samples over {} terms; metad counters: evicted {}, \
             dead-node dropped {}; excused losses {}; indeterminate puts {} (later read: {}); \
             checksum-mismatch misses {}; stale reads within the index's bound {}",
            self.claims,
            self.terms_seen,
            self.counters.evicted_objects,
            self.counters.dead_node_dropped_objects,
            self.excused_losses,
            self.indeterminate_puts,
            self.indeterminate_puts_seen,
            self.corrupt_misses,
            self.stale_reads
        );
        if !self.excused_by_cause.is_empty() {
            let causes: Vec<String> = self
                .excused_by_cause
                .iter()
                .map(|(c, n)| format!("{c} {n}"))
                .collect();
            let _ = writeln!(s, "excused losses by cause (feed): {}", causes.join(", "));
        }
        for w in &self.warm_restarts {
            let _ = writeln!(s, "warm restart: {w}");
        }
        for e in &self.indeterminate_seen_examples {
            let _ = writeln!(s, "  indeterminate put that took effect: {e}");
        }
        s
    }

    /// The rows grouped by fault kind, in order of first appearance (the no-fault rows last).
    pub fn by_kind(&self) -> Vec<KindRow> {
        let mut out: Vec<KindRow> = Vec::new();
        let (faults, quiet): (Vec<&Row>, Vec<&Row>) = self
            .rows
            .iter()
            .partition(|r| !r.fault.starts_with("(no fault"));
        for r in faults.into_iter().chain(quiet) {
            let i = match out.iter().position(|k| k.kind == r.kind) {
                Some(i) => i,
                None => {
                    out.push(KindRow {
                        kind: r.kind.clone(),
                        steps: 0,
                        ops: 0,
                        ok: 0,
                        failed: 0,
                        indeterminate: 0,
                        anomalies: 0,
                        worst_recovery: None,
                    });
                    out.len() - 1
                }
            };
            let k = &mut out[i];
            k.steps += 1;
            k.ops += r.ops;
            k.ok += r.ok;
            k.failed += r.failed;
            k.indeterminate += r.indeterminate;
            k.anomalies += r.anomalies;
            k.worst_recovery = k.worst_recovery.max(r.recovery);
        }
        out
    }

    /// The per-kind summary table (the long profile injects each kind many times).
    pub fn kind_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<26} {:>5} {:>7} {:>7} {:>7} {:>7} {:>9} {:>10}",
            "fault kind", "runs", "ops", "ok", "failed", "indet.", "anomalies", "worst rec."
        );
        let _ = writeln!(s, "{}", "-".repeat(86));
        for k in self.by_kind() {
            let rec = match k.worst_recovery {
                Some(d) => format!("{:.2}s", d.as_secs_f64()),
                None => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<26} {:>5} {:>7} {:>7} {:>7} {:>7} {:>9} {:>10}",
                k.kind, k.steps, k.ops, k.ok, k.failed, k.indeterminate, k.anomalies, rec
            );
        }
        s
    }

    /// Every anomaly with the full history of the key involved.
    pub fn details(&self) -> String {
        const MAX_LINES: usize = 400;
        let mut s = String::new();
        for (i, a) in self.anomalies.iter().enumerate() {
            let _ = writeln!(
                s,
                "anomaly {}: {:?} at {:.3}s{}: {}",
                i + 1,
                a.kind,
                a.at_us as f64 / 1e6,
                a.key
                    .as_ref()
                    .map(|k| format!(" key {k}"))
                    .unwrap_or_default(),
                a.message
            );
        }
        for (key, ops) in &self.key_histories {
            let _ = writeln!(
                s,
                "---- history of key {key} ({} operations) ----",
                ops.len()
            );
            for op in ops.iter().take(MAX_LINES) {
                let _ = writeln!(s, "{op}");
            }
            if ops.len() > MAX_LINES {
                let _ = writeln!(s, "... {} more", ops.len() - MAX_LINES);
            }
        }
        s
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.table())?;
        // A kind injected more than once (the long profile): the per-kind summary too.
        let kinds = self.by_kind();
        if kinds.iter().any(|k| k.steps > 1) {
            writeln!(f)?;
            f.write_str(&self.kind_table())?;
        }
        if !self.anomalies.is_empty() {
            f.write_str(&self.details())?;
        }
        Ok(())
    }
}

/// Runs every check.
pub fn check(input: &CheckInput<'_>) -> Report {
    let ops = &input.recorded.ops;
    let gone = gone_generations(input.recorded);
    let by_write: HashMap<u64, &Op> = ops
        .iter()
        .filter_map(|o| o.write_id().map(|w| (w, o)))
        .collect();
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let feed = FeedView::of(input.recorded);
    let ctx = DataCtx {
        gone: &gone,
        by_write: &by_write,
        counters: input.counters,
        staleness_us: input.read_staleness.map_or(0, |d| d.as_micros() as u64),
        stale: RefCell::new(BTreeSet::new()),
        feed: feed.as_ref(),
        value_len: input.value_len,
        causes: RefCell::new(BTreeMap::new()),
        disk_failures: disk_failures(input.recorded),
    };
    let mut anomalies = Vec::new();
    let mut excused = BTreeSet::new();
    for (key, key_ops) in &by_key {
        check_key(&ctx, key, key_ops, &mut anomalies, &mut excused);
    }
    let warm_restarts = match &feed {
        Some(f) => check_warm_restarts(input.recorded, f, &by_key, &mut anomalies),
        None => Vec::new(),
    };
    if input.counters.evicted_objects == 0 {
        check_overlaps(ops, &by_key, &mut anomalies);
    }
    if let Some(ttl) = input.node_ttl {
        check_deaths(input.recorded, ttl, &mut anomalies);
    }
    let budget = input.counters.evicted_objects + input.counters.dead_node_dropped_objects;
    if excused.len() as u64 > budget {
        anomalies.push(Anomaly {
            kind: AnomalyKind::LossesExceedCounters,
            key: None,
            at_us: 0,
            message: format!(
                "{} acknowledged puts were lost on dropped segments, but metad counted only \
                 {} evicted + {} dead-node dropped objects",
                excused.len(),
                input.counters.evicted_objects,
                input.counters.dead_node_dropped_objects
            ),
            ops: excused.iter().copied().collect(),
        });
    }
    let (terms_seen, claims) = check_leaders(input.claims, &mut anomalies);
    let recoveries = check_recovery(ops, input.windows, input.recovery_limit, &mut anomalies);
    anomalies.sort_by_key(|a| (a.at_us, a.kind));
    let key_histories = histories_of(&anomalies, &by_key);
    let rows = table_rows(ops, input.windows, &anomalies, &recoveries);
    let (seen_count, seen_examples) = indeterminate_seen(ops, &by_write);
    let stale_reads = ctx.stale.borrow().len();
    let excused_by_cause = causes_of(&ctx, &excused);
    Report {
        rows,
        anomalies,
        excused_losses: excused.len(),
        excused_by_cause,
        warm_restarts,
        indeterminate_puts: ops
            .iter()
            .filter(|o| o.write_id().is_some() && o.result.class() == ResultClass::Indeterminate)
            .count(),
        indeterminate_puts_seen: seen_count,
        indeterminate_seen_examples: seen_examples,
        corrupt_misses: ops
            .iter()
            .filter(|o| matches!(o.result, OpResult::Ok(Reply::CorruptMiss { .. })))
            .count(),
        stale_reads,
        counters: input.counters,
        terms_seen,
        claims,
        key_histories,
    }
}

// ---------------------------------------------------------------------------- data checks

struct DataCtx<'a> {
    gone: &'a BTreeSet<ReplicaLoc>,
    by_write: &'a HashMap<u64, &'a Op>,
    counters: Counters,
    /// [`CheckInput::read_staleness`] in µs (0: none allowed).
    staleness_us: u64,
    /// Reads excused as stale (ids).
    stale: RefCell<BTreeSet<usize>>,
    /// metad's change feed, when it was recorded.
    feed: Option<&'a FeedView>,
    value_len: Option<ValueLen<'a>>,
    /// Why each excused put was excused (put id → cause), for the report.
    causes: RefCell<BTreeMap<usize, &'static str>>,
    /// When each `disk-fail` fault was injected.
    disk_failures: Vec<u64>,
}

/// How long after a disk failed its node may still be telling metad (the drop is reported
/// at once, but a report can wait for metad, and a hand-over heals the fault meanwhile).
const DISK_LOSS_REPORT_US: u64 = 10_000_000;

/// Replica places as the report names them, space-separated.
fn places(locs: &[ReplicaLoc]) -> String {
    locs.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `disk-fail` faults' injection times.
fn disk_failures(rec: &Recorded) -> Vec<u64> {
    rec.events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::FaultInjected { fault, .. } if fault.starts_with("disk-fail") => {
                Some(e.at_us)
            }
            _ => None,
        })
        .collect()
}

/// How many excused losses each cause accounts for.
fn causes_of(ctx: &DataCtx<'_>, excused: &BTreeSet<usize>) -> BTreeMap<&'static str, usize> {
    let causes = ctx.causes.borrow();
    let mut out = BTreeMap::new();
    if ctx.feed.is_none() {
        return out;
    }
    for id in excused {
        *out.entry(causes.get(id).copied().unwrap_or("other"))
            .or_insert(0) += 1;
    }
    out
}

/// Margin added to an observation's end before a feed guarantee counts as covering it (the
/// guarantee is Unix milliseconds, converted to the recorder's clock): a later cover only
/// counts more of the feed as before the observation, never less.
const FEED_COVER_MARGIN_US: u64 = 20_000;

/// One listing change of the feed: the object listed with `now` replicas, or unlisted
/// (`now: None`) from `last`.
struct Listing {
    at_us: u64,
    object: FeedObject,
    now: Option<Vec<ReplicaLoc>>,
    last: Vec<ReplicaLoc>,
}

/// The change feed as recorded ([`crate::feed`]): listings per key, guarantees, resyncs.
pub struct FeedView {
    /// Per key, in the order recorded.
    by_key: HashMap<String, Vec<Listing>>,
    /// (recorded at, as of), both non-decreasing.
    current: Vec<(u64, u64)>,
    /// (began, ended) of each resync.
    resyncs: Vec<(u64, u64)>,
}

impl FeedView {
    /// The feed of a recording; `None` when none was recorded (no guarantee ever came).
    pub fn of(rec: &Recorded) -> Option<Self> {
        let mut v = FeedView {
            by_key: HashMap::new(),
            current: Vec::new(),
            resyncs: Vec::new(),
        };
        for e in &rec.events {
            match &e.kind {
                EventKind::Listed { object, replicas } => v.list(Listing {
                    at_us: e.at_us,
                    object: object.clone(),
                    now: Some(replicas.clone()),
                    last: replicas.clone(),
                }),
                EventKind::Unlisted { object, last } => v.list(Listing {
                    at_us: e.at_us,
                    object: object.clone(),
                    now: None,
                    last: last.clone(),
                }),
                EventKind::FeedCurrent { as_of_us } => {
                    let prev = v.current.last().map_or(0, |c| c.1);
                    v.current.push((e.at_us, (*as_of_us).max(prev)));
                }
                EventKind::FeedResynced { from_us } => v.resyncs.push((*from_us, e.at_us)),
                _ => {}
            }
        }
        (!v.current.is_empty()).then_some(v)
    }

    fn list(&mut self, l: Listing) {
        self.by_key.entry(l.object.key.clone()).or_default().push(l);
    }

    /// When the feed was known to hold every change acknowledged before `t_us`: the time the
    /// first guarantee as late as that was recorded.
    fn cover(&self, t_us: u64) -> Option<u64> {
        let want = t_us.saturating_add(FEED_COVER_MARGIN_US);
        let i = self.current.partition_point(|c| c.1 < want);
        self.current.get(i).map(|c| c.0)
    }

    /// A listing of `key` (of `size`, when given) that ended in `[lo, hi]`: its last replicas.
    fn unlisted_within(
        &self,
        key: &str,
        size: Option<u64>,
        lo: u64,
        hi: u64,
    ) -> Option<&Vec<ReplicaLoc>> {
        self.by_key.get(key)?.iter().find_map(|l| {
            let sized = size.is_none_or(|s| s == l.object.size);
            (l.now.is_none() && l.at_us >= lo && l.at_us <= hi && sized).then_some(&l.last)
        })
    }

    fn resync_within(&self, lo: u64, hi: u64) -> bool {
        self.resyncs.iter().any(|&(a, b)| b >= lo && a <= hi)
    }
}

impl DataCtx<'_> {
    /// Whether `read` may be stale with respect to `change`: made through another node, and
    /// begun within the staleness bound of `change`'s completion. Records it when so.
    fn stale_within_bound(&self, read: &Op, change: &Op) -> bool {
        let stale = self.within_bound(read, change);
        if stale {
            self.stale.borrow_mut().insert(read.id);
        }
        stale
    }

    /// [`Self::stale_within_bound`] without recording.
    fn within_bound(&self, read: &Op, change: &Op) -> bool {
        self.staleness_us > 0
            && node_of(read.process) != node_of(change.process)
            && read.invoke_us < change.complete_us.saturating_add(self.staleness_us)
    }

    /// Why a loss of this acknowledged put, found by an observation that ended at `by_us`,
    /// is excused, if it is (recording the cause for the report).
    fn excuse(&self, put: &Op, by_us: u64) -> Option<String> {
        let (cause, why) = match self.feed {
            Some(feed) => self.feed_excuse(feed, put, by_us)?,
            None => ("other", self.recorded_excuse(put)?),
        };
        self.causes.borrow_mut().insert(put.id, cause);
        Some(why)
    }

    /// The feed's verdict: metad dropped the object between the put's start and the cover of
    /// `by_us`, and why (its last placement); where the feed cannot tell (a resync across the
    /// span, no guarantee covering it) the recorded rules decide.
    fn feed_excuse(&self, feed: &FeedView, put: &Op, by_us: u64) -> Option<(&'static str, String)> {
        let size = match (self.value_len, put.write_id()) {
            (Some(len), Some(w)) => Some(len(&put.key, w)),
            _ => None,
        };
        let Some(hi) = feed.cover(by_us) else {
            return Some(("feed gap", self.recorded_excuse(put)?));
        };
        if let Some(last) = feed.unlisted_within(&put.key, size, put.invoke_us, hi) {
            let at = places(last);
            return Some(if !last.is_empty() && last.iter().all(|r| r.is_disk()) {
                (
                    "dropped from a disk",
                    format!("metad dropped it from disk [{at}]"),
                )
            } else if !last.is_empty() && last.iter().all(|r| self.gone.contains(r)) {
                (
                    "segment gone",
                    format!("metad dropped it with its segment [{at}]"),
                )
            } else {
                (
                    "evicted or dropped",
                    format!("metad dropped it from [{at}]"),
                )
            });
        }
        if feed.resync_within(put.invoke_us, hi) {
            return Some(("feed gap", self.recorded_excuse(put)?));
        }
        self.failed_disk_excuse(feed, put, size, by_us)
    }

    /// A disk failed shortly before the observation, and metad dropped the object from a disk
    /// soon after it: the bytes were gone with the disk when the observation missed them,
    /// before metad heard of it (what metad dropped, it dropped after the failure).
    fn failed_disk_excuse(
        &self,
        feed: &FeedView,
        put: &Op,
        size: Option<u64>,
        by_us: u64,
    ) -> Option<(&'static str, String)> {
        let failed_at = self
            .disk_failures
            .iter()
            .copied()
            .filter(|&t| t <= by_us && by_us <= t + 2 * DISK_LOSS_REPORT_US)
            .max()?;
        let hi = feed.cover(by_us + DISK_LOSS_REPORT_US).unwrap_or(u64::MAX);
        let last = feed.unlisted_within(&put.key, size, put.invoke_us.max(failed_at), hi)?;
        (!last.is_empty() && last.iter().all(|r| r.is_disk())).then(|| {
            (
                "dropped from a failed disk",
                format!(
                    "a disk failed at {:.3}s and metad then dropped it from disk [{}]",
                    failed_at as f64 / 1e6,
                    places(last)
                ),
            )
        })
    }

    /// The recorded rules: metad evicted something, or every replica's segment went away.
    fn recorded_excuse(&self, put: &Op) -> Option<String> {
        if self.counters.evicted_objects > 0 {
            return Some(format!(
                "metad evicted {} objects",
                self.counters.evicted_objects
            ));
        }
        let OpResult::Ok(Reply::Stored { replicas, .. }) = &put.result else {
            return None;
        };
        if replicas.is_empty() {
            return (self.counters.dead_node_dropped_objects > 0).then(|| {
                format!(
                    "placement unknown and metad dropped {} objects with dead nodes",
                    self.counters.dead_node_dropped_objects
                )
            });
        }
        replicas
            .iter()
            .all(|r| self.gone.contains(r))
            .then(|| format!("every replica's segment went away: {replicas:?}"))
    }
}

fn gone_generations(rec: &Recorded) -> BTreeSet<ReplicaLoc> {
    rec.events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::GenerationGone { loc, .. } => Some(*loc),
            _ => None,
        })
        .collect()
}

/// The window `[start, end]` in which a remove may have taken effect, for removes that may
/// have removed something (acknowledged "removed", or indeterminate: from invoke on).
fn possible_removes(ops: &[&Op]) -> Vec<(u64, u64)> {
    ops.iter()
        .filter(|o| o.kind == OpKind::Remove)
        .filter_map(|o| match &o.result {
            OpResult::Ok(Reply::Removed(true)) => Some((o.invoke_us, o.complete_us)),
            OpResult::Indeterminate(_) => Some((o.invoke_us, u64::MAX)),
            _ => None,
        })
        .collect()
}

/// Whether some remove could have taken effect at a time in `[lo, hi]`.
fn remove_possible_within(removes: &[(u64, u64)], lo: u64, hi: u64) -> bool {
    removes.iter().any(|&(s, e)| e >= lo && s <= hi)
}

fn is_acked_put(op: &Op) -> bool {
    matches!(op.kind, OpKind::Put { .. }) && matches!(op.result, OpResult::Ok(Reply::Stored { .. }))
}

/// What an operation saw of the key, when it saw something definite.
enum Seen {
    Absent,
    Value(u64),
}

fn seen(op: &Op) -> Option<Seen> {
    match (&op.kind, &op.result) {
        (OpKind::Get, OpResult::Ok(Reply::NotFound)) => Some(Seen::Absent),
        (OpKind::Get, OpResult::Ok(Reply::Found { write_id })) => Some(Seen::Value(*write_id)),
        (OpKind::Exists, OpResult::Ok(Reply::Exists(false))) => Some(Seen::Absent),
        (OpKind::Remove, OpResult::Ok(Reply::Removed(false))) => Some(Seen::Absent),
        _ => None,
    }
}

fn check_key(
    ctx: &DataCtx<'_>,
    key: &str,
    ops: &[&Op],
    anomalies: &mut Vec<Anomaly>,
    excused: &mut BTreeSet<usize>,
) {
    let removes = possible_removes(ops);
    check_lost_puts(ctx, key, ops, &removes, anomalies, excused);
    check_reads(ctx, key, ops, &removes, anomalies);
    check_double_puts(ctx, key, ops, &removes, anomalies);
}

/// (a): an acknowledged put, then a definite observation of something else.
fn check_lost_puts(
    ctx: &DataCtx<'_>,
    key: &str,
    ops: &[&Op],
    removes: &[(u64, u64)],
    anomalies: &mut Vec<Anomaly>,
    excused: &mut BTreeSet<usize>,
) {
    for put in ops.iter().filter(|o| is_acked_put(o)) {
        let Some(w) = put.write_id() else { continue };
        let later = ops.iter().filter(|o| o.invoke_us > put.complete_us);
        for obs in later {
            let (kind, what) = match seen(obs) {
                Some(Seen::Absent) => (AnomalyKind::LostAcknowledgedPut, "found the key absent"),
                Some(Seen::Value(v)) if v != w => (
                    AnomalyKind::WrongRead,
                    "read another value with no remove between",
                ),
                _ => continue,
            };
            if remove_possible_within(removes, put.invoke_us, obs.complete_us) {
                continue;
            }
            if kind == AnomalyKind::WrongRead && ctx.stale_within_bound(obs, put) {
                continue;
            }
            if let Some(why) = ctx.excuse(put, obs.complete_us) {
                tracing::debug!(key, put = put.id, %why, "loss excused");
                excused.insert(put.id);
                break;
            }
            anomalies.push(Anomaly {
                kind,
                key: Some(key.to_string()),
                at_us: obs.invoke_us,
                message: format!(
                    "put w{w} (op #{}) was acknowledged at {:.3}s; op #{} {what} at {:.3}s",
                    put.id,
                    put.complete_us as f64 / 1e6,
                    obs.id,
                    obs.invoke_us as f64 / 1e6
                ),
                ops: vec![put.id, obs.id],
            });
            break;
        }
    }
}

/// (b): every value a get returned must be the value of a put of this key that may have
/// taken effect before the get ended, and not one a completed remove took away.
fn check_reads(
    ctx: &DataCtx<'_>,
    key: &str,
    ops: &[&Op],
    removes: &[(u64, u64)],
    anomalies: &mut Vec<Anomaly>,
) {
    let acked_removes: Vec<&&Op> = ops
        .iter()
        .filter(|o| matches!(o.result, OpResult::Ok(Reply::Removed(true))))
        .collect();
    let _ = removes;
    for get in ops.iter().filter(|o| o.kind == OpKind::Get) {
        let mut flag = |kind, message: String, mut involved: Vec<usize>| {
            involved.insert(0, get.id);
            anomalies.push(Anomaly {
                kind,
                key: Some(key.to_string()),
                at_us: get.invoke_us,
                message,
                ops: involved,
            });
        };
        let w = match &get.result {
            OpResult::Ok(Reply::Found { write_id }) => *write_id,
            OpResult::Ok(Reply::Corrupt { detail }) => {
                flag(
                    AnomalyKind::WrongRead,
                    format!(
                        "get #{} returned bytes of no write of this key: {detail}",
                        get.id
                    ),
                    vec![],
                );
                continue;
            }
            _ => continue,
        };
        let Some(put) = ctx.by_write.get(&w) else {
            flag(
                AnomalyKind::WrongRead,
                format!("get #{} returned write w{w}, which no client made", get.id),
                vec![],
            );
            continue;
        };
        if put.key != key {
            flag(
                AnomalyKind::WrongRead,
                format!(
                    "get #{} returned the value of key {} (w{w}, op #{})",
                    get.id, put.key, put.id
                ),
                vec![put.id],
            );
            continue;
        }
        match &put.result {
            OpResult::Fail(e) => {
                flag(
                    AnomalyKind::WrongRead,
                    format!(
                        "get #{} returned w{w}, whose put #{} failed: {e}",
                        get.id, put.id
                    ),
                    vec![put.id],
                );
                continue;
            }
            OpResult::Ok(Reply::AlreadyExists) => {
                flag(
                    AnomalyKind::WrongRead,
                    format!(
                        "get #{} returned w{w}, whose put #{} was answered already-exists",
                        get.id, put.id
                    ),
                    vec![put.id],
                );
                continue;
            }
            _ => {}
        }
        if put.invoke_us > get.complete_us {
            flag(
                AnomalyKind::WrongRead,
                format!(
                    "get #{} returned w{w} before its put #{} was invoked",
                    get.id, put.id
                ),
                vec![put.id],
            );
            continue;
        }
        if !is_acked_put(put) {
            continue;
        }
        let removed_before: Vec<&Op> = acked_removes
            .iter()
            .map(|r| **r)
            .filter(|r| r.invoke_us > put.complete_us && r.complete_us < get.invoke_us)
            .collect();
        let strict = removed_before.iter().find(|r| !ctx.within_bound(get, r));
        if strict.is_none() {
            if let Some(rm) = removed_before.first() {
                ctx.stale_within_bound(get, rm);
            }
        }
        if let Some(rm) = strict {
            flag(
                AnomalyKind::ReadAfterRemove,
                format!(
                    "get #{} returned w{w} (put #{} done at {:.3}s) after remove #{} removed \
                     the key at {:.3}s..{:.3}s",
                    get.id,
                    put.id,
                    put.complete_us as f64 / 1e6,
                    rm.id,
                    rm.invoke_us as f64 / 1e6,
                    rm.complete_us as f64 / 1e6
                ),
                vec![put.id, rm.id],
            );
        }
    }
}

/// (b): two acknowledged puts of one key need a remove (or an excused drop) between them.
fn check_double_puts(
    ctx: &DataCtx<'_>,
    key: &str,
    ops: &[&Op],
    removes: &[(u64, u64)],
    anomalies: &mut Vec<Anomaly>,
) {
    // Bounded so a pathological history cannot make the checker quadratic in a long run.
    const MAX_PUTS: usize = 2000;
    let acked: Vec<&&Op> = ops
        .iter()
        .filter(|o| is_acked_put(o))
        .take(MAX_PUTS)
        .collect();
    for (i, a) in acked.iter().enumerate() {
        for b in &acked[i + 1..] {
            let lo = a.invoke_us.min(b.invoke_us);
            let hi = a.complete_us.max(b.complete_us);
            if remove_possible_within(removes, lo, hi) {
                continue;
            }
            let (first, second) = if a.complete_us <= b.complete_us {
                (a, b)
            } else {
                (b, a)
            };
            if ctx.excuse(first, second.complete_us).is_some() {
                continue;
            }
            anomalies.push(Anomaly {
                kind: AnomalyKind::DoubleAcknowledgedPut,
                key: Some(key.to_string()),
                at_us: second.invoke_us,
                message: format!(
                    "puts #{} (w{}) and #{} (w{}) were both acknowledged with no remove \
                     between: an existing key must answer already-exists",
                    first.id,
                    first.write_id().unwrap_or(0),
                    second.id,
                    second.write_id().unwrap_or(0)
                ),
                ops: vec![first.id, second.id],
            });
        }
    }
}

/// The warm-restart rule: of the objects metad listed on a node's disks when its sidecar was
/// killed ([`EventKind::DiskHeld`], recorded as the restart begins), those whose disk replica
/// the feed shows gone after the restart began and by its end ([`EventKind::WarmRestarted`], recorded once the feed was current) — with
/// no client remove of the key that could have come between — may not outnumber the drops the
/// restarted sidecar's disks counted (plus metad's dead-node drops meanwhile). A restart that
/// forgot records it had made durable shows as drops nobody counted. Returns a line per
/// restart for the report.
fn check_warm_restarts(
    rec: &Recorded,
    feed: &FeedView,
    by_key: &BTreeMap<&str, Vec<&Op>>,
    anomalies: &mut Vec<Anomaly>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut held: HashMap<u64, (u64, &str, &[FeedObject])> = HashMap::new();
    for e in &rec.events {
        match &e.kind {
            EventKind::DiskHeld {
                host,
                node,
                objects,
            } => {
                held.insert(*node, (e.at_us, host.as_str(), objects.as_slice()));
            }
            EventKind::WarmRestarted {
                node,
                drops_counted,
                ..
            } => {
                let Some((restart_us, host, objects)) = held.remove(node) else {
                    continue;
                };
                let lost: Vec<&FeedObject> = objects
                    .iter()
                    .filter(|o| {
                        disk_replica_gone(feed, o, *node, restart_us, e.at_us).is_some_and(|t| {
                            let removes = by_key
                                .get(o.key.as_str())
                                .map(|ops| possible_removes(ops))
                                .unwrap_or_default();
                            !remove_possible_within(&removes, restart_us, t)
                        })
                    })
                    .collect();
                let line = format!(
                    "{host} (node {node}): {} objects on its disks at the kill, {} lost their \
                     disk replica by {:.3}s, {drops_counted} drops counted",
                    objects.len(),
                    lost.len(),
                    e.at_us as f64 / 1e6
                );
                if lost.len() as u64 > *drops_counted {
                    let keys: Vec<String> = lost
                        .iter()
                        .map(|o| format!("{}@{}.{}", o.key, o.version.0, o.version.1))
                        .collect();
                    anomalies.push(Anomaly {
                        kind: AnomalyKind::DiskObjectsLost,
                        key: lost.first().map(|o| o.key.clone()),
                        at_us: restart_us,
                        message: format!(
                            "warm restart of {host} (node {node}) at {:.3}s: {} objects metad \
                             listed on its disks lost their disk replica, but its disks counted \
                             only {drops_counted} drops: {}",
                            restart_us as f64 / 1e6,
                            lost.len(),
                            keys.join(", ")
                        ),
                        ops: vec![],
                    });
                }
                lines.push(line);
            }
            _ => {}
        }
    }
    lines
}

/// When the feed showed `o`'s replica on a disk of `node` gone (unlisted, or listed with no
/// disk replica there) within `(from, to]`.
fn disk_replica_gone(
    feed: &FeedView,
    o: &FeedObject,
    node: u64,
    from: u64,
    to: u64,
) -> Option<u64> {
    feed.by_key.get(&o.key)?.iter().find_map(|l| {
        if l.at_us <= from || l.at_us > to || l.object.version != o.version {
            return None;
        }
        let kept = l
            .now
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r.node == node && r.is_disk()));
        (!kept).then_some(l.at_us)
    })
}

/// Indeterminate puts whose value some get returned: how many, and a few of their reasons.
fn indeterminate_seen(ops: &[Op], by_write: &HashMap<u64, &Op>) -> (usize, Vec<String>) {
    let seen: BTreeSet<u64> = ops
        .iter()
        .filter_map(|o| match o.result {
            OpResult::Ok(Reply::Found { write_id }) => Some(write_id),
            _ => None,
        })
        .collect();
    let puts: Vec<&&Op> = seen
        .iter()
        .filter_map(|w| by_write.get(w))
        .filter(|p| p.result.class() == ResultClass::Indeterminate)
        .collect();
    let examples = puts
        .iter()
        .take(3)
        .map(|p| match &p.result {
            OpResult::Indeterminate(why) => format!("put #{}: {why}", p.id),
            _ => String::new(),
        })
        .collect();
    (puts.len(), examples)
}

// ---------------------------------------------------------------------------- liveness

/// (f): no node declared dead within a node TTL of a heartbeat the same leader acknowledged.
fn check_deaths(rec: &Recorded, ttl: Duration, anomalies: &mut Vec<Anomaly>) {
    // The leader's clock and ours are the same machine's; its checks only run later, never
    // earlier, than the TTL: a small margin absorbs rounding.
    let limit = (ttl.as_micros() as u64).saturating_sub(100_000);
    for e in &rec.events {
        let EventKind::GenerationGone {
            loc,
            why,
            heard_at_us: Some(heard),
        } = &e.kind
        else {
            continue;
        };
        let silent = e.at_us.saturating_sub(*heard);
        if silent < limit {
            anomalies.push(Anomaly {
                kind: AnomalyKind::PrematureDeath,
                key: None,
                at_us: e.at_us,
                message: format!(
                    "segment n{}g{} declared dead {:.3}s after a heartbeat the same leader \
                     acknowledged (node TTL {:.1}s): {why}",
                    loc.node,
                    loc.generation,
                    silent as f64 / 1e6,
                    ttl.as_secs_f64()
                ),
                ops: vec![],
            });
        }
    }
}

// ---------------------------------------------------------------------------- extents

/// One replica's extent of an acknowledged put.
struct Placed<'a> {
    loc: ReplicaLoc,
    start: u64,
    end: u64,
    op: &'a Op,
}

/// (e): extents of two objects that were both alive at one time never overlap.
fn check_overlaps(ops: &[Op], by_key: &BTreeMap<&str, Vec<&Op>>, anomalies: &mut Vec<Anomaly>) {
    let removes: HashMap<&str, Vec<(u64, u64)>> = by_key
        .iter()
        .map(|(k, ops)| (*k, possible_removes(ops)))
        .collect();
    let mut placed: Vec<Placed<'_>> = Vec::new();
    for op in ops.iter().filter(|o| is_acked_put(o)) {
        let OpResult::Ok(Reply::Stored { replicas, extents }) = &op.result else {
            continue;
        };
        for (loc, exts) in replicas.iter().zip(extents) {
            for e in exts.iter().filter(|e| e.len > 0) {
                placed.push(Placed {
                    loc: *loc,
                    start: e.offset,
                    end: e.offset.saturating_add(e.len),
                    op,
                });
            }
        }
    }
    placed.sort_by_key(|p| (p.loc, p.start));
    let mut reported = BTreeSet::new();
    for (i, a) in placed.iter().enumerate() {
        for b in placed[i + 1..]
            .iter()
            .take_while(|b| b.loc == a.loc && b.start < a.end)
        {
            if a.op.id == b.op.id || !reported.insert((a.op.id.min(b.op.id), a.op.id.max(b.op.id)))
            {
                continue;
            }
            // Both alive at the later commit unless one of them may have been removed since
            // its own put began.
            let hi = a.op.complete_us.max(b.op.complete_us);
            let removable = |p: &Placed<'_>| {
                removes
                    .get(p.op.key.as_str())
                    .is_some_and(|r| remove_possible_within(r, p.op.invoke_us, hi))
            };
            if removable(a) || removable(b) {
                continue;
            }
            let later = if a.op.complete_us >= b.op.complete_us {
                a.op
            } else {
                b.op
            };
            anomalies.push(Anomaly {
                kind: AnomalyKind::OverlappingExtents,
                key: Some(later.key.clone()),
                at_us: later.invoke_us,
                message: format!(
                    "segment n{}g{}: put #{} ({} bytes {}..{}) and put #{} ({} bytes {}..{}) \
                     share bytes while both objects were live",
                    a.loc.node,
                    a.loc.generation,
                    a.op.id,
                    a.op.key,
                    a.start,
                    a.end,
                    b.op.id,
                    b.op.key,
                    b.start,
                    b.end
                ),
                ops: vec![a.op.id, b.op.id],
            });
        }
    }
}

// ---------------------------------------------------------------------------- leaders

/// (c): at most one leader per term. Returns (terms seen, claims).
fn check_leaders(claims: &[LeaderClaim], anomalies: &mut Vec<Anomaly>) -> (usize, usize) {
    let mut by_term: BTreeMap<u64, BTreeMap<u64, &LeaderClaim>> = BTreeMap::new();
    for c in claims {
        by_term
            .entry(c.term)
            .or_default()
            .entry(c.leader)
            .or_insert(c);
    }
    for (term, leaders) in &by_term {
        if leaders.len() < 2 {
            continue;
        }
        let who: Vec<String> = leaders
            .values()
            .map(|c| {
                let how = if c.self_report {
                    "self-reported".to_string()
                } else {
                    format!("named by {}", c.reporter)
                };
                format!("{} ({how} at {:.3}s)", c.leader, c.at_us as f64 / 1e6)
            })
            .collect();
        anomalies.push(Anomaly {
            kind: AnomalyKind::TwoLeadersInTerm,
            key: None,
            at_us: leaders.values().map(|c| c.at_us).max().unwrap_or(0),
            message: format!("term {term} had leaders {}", who.join(", ")),
            ops: vec![],
        });
    }
    (by_term.len(), claims.len())
}

// ---------------------------------------------------------------------------- recovery

fn put_succeeded(op: &Op) -> bool {
    matches!(op.kind, OpKind::Put { .. })
        && matches!(
            op.result,
            OpResult::Ok(Reply::Stored { .. }) | OpResult::Ok(Reply::AlreadyExists)
        )
}

fn get_succeeded(op: &Op) -> bool {
    op.kind == OpKind::Get
        && matches!(
            op.result,
            OpResult::Ok(Reply::Found { .. }) | OpResult::Ok(Reply::NotFound)
        )
}

/// How long after `healed_us` both a put and a get invoked after it succeeded; `None` if
/// one never did.
pub fn recovery_after(ops: &[Op], healed_us: u64) -> Option<Duration> {
    let first = |pred: fn(&Op) -> bool| {
        ops.iter()
            .filter(|o| o.invoke_us >= healed_us && pred(o))
            .map(|o| o.complete_us)
            .min()
    };
    let put = first(put_succeeded)?;
    let get = first(get_succeeded)?;
    Some(Duration::from_micros(
        put.max(get).saturating_sub(healed_us),
    ))
}

/// (d): recovery of every window.
fn check_recovery(
    ops: &[Op],
    windows: &[FaultWindow],
    limit: Duration,
    anomalies: &mut Vec<Anomaly>,
) -> Vec<Option<Duration>> {
    windows
        .iter()
        .map(|w| {
            let rec = recovery_after(ops, w.healed_us);
            let late = match rec {
                Some(d) if d <= limit => None,
                Some(d) => Some(format!(
                    "first put and get succeeded {:.2}s after",
                    d.as_secs_f64()
                )),
                None => Some("puts or gets never succeeded again".to_string()),
            };
            if let Some(why) = late {
                anomalies.push(Anomaly {
                    kind: AnomalyKind::NoRecovery,
                    key: None,
                    at_us: w.healed_us,
                    message: format!(
                        "fault {} ({}) healed at {:.3}s: {why} (limit {:.0}s)",
                        w.name,
                        w.detail,
                        w.healed_us as f64 / 1e6,
                        limit.as_secs_f64()
                    ),
                    ops: vec![],
                });
            }
            rec
        })
        .collect()
}

// ---------------------------------------------------------------------------- report

fn histories_of(
    anomalies: &[Anomaly],
    by_key: &BTreeMap<&str, Vec<&Op>>,
) -> BTreeMap<String, Vec<Op>> {
    let mut out = BTreeMap::new();
    for key in anomalies.iter().filter_map(|a| a.key.as_deref()) {
        if let Some(ops) = by_key.get(key) {
            let mut ops: Vec<Op> = ops.iter().map(|o| (*o).clone()).collect();
            ops.sort_by_key(|o| (o.invoke_us, o.id));
            out.insert(key.to_string(), ops);
        }
    }
    out
}

fn table_rows(
    ops: &[Op],
    windows: &[FaultWindow],
    anomalies: &[Anomaly],
    recoveries: &[Option<Duration>],
) -> Vec<Row> {
    type Span = (String, String, u64, u64, Option<Duration>);
    let quiet = |name: &str, start, end| -> Span { (name.into(), name.into(), start, end, None) };
    let mut spans: Vec<Span> = Vec::new();
    let first = windows.first().map(|w| w.injected_us).unwrap_or(u64::MAX);
    spans.push(quiet("(no fault: warm-up)", 0, first));
    for (w, rec) in windows.iter().zip(recoveries) {
        spans.push((
            w.name.clone(),
            w.kind.clone(),
            w.injected_us,
            w.end_us,
            *rec,
        ));
    }
    if let Some(last) = windows.last() {
        spans.push(quiet("(no fault: final reads)", last.end_us, u64::MAX));
    }
    spans
        .into_iter()
        .map(|(fault, kind, start, end, recovery)| {
            let in_span: Vec<&Op> = ops
                .iter()
                .filter(|o| o.invoke_us >= start && o.invoke_us < end)
                .collect();
            let count = |c: ResultClass| in_span.iter().filter(|o| o.result.class() == c).count();
            Row {
                fault,
                kind,
                ops: in_span.len(),
                ok: count(ResultClass::Ok),
                failed: count(ResultClass::Fail),
                indeterminate: count(ResultClass::Indeterminate),
                anomalies: anomalies
                    .iter()
                    .filter(|a| a.at_us >= start && a.at_us < end)
                    .count(),
                recovery,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Event;

    /// Builds histories by hand: times in milliseconds.
    #[derive(Default)]
    struct H {
        rec: Recorded,
        staleness: Option<Duration>,
    }

    impl H {
        fn op(
            &mut self,
            p: u32,
            key: &str,
            kind: OpKind,
            t: (u64, u64),
            result: OpResult,
        ) -> usize {
            let id = self.rec.ops.len();
            self.rec.ops.push(Op {
                id,
                process: p,
                key: key.into(),
                kind,
                invoke_us: t.0 * 1000,
                complete_us: t.1 * 1000,
                result,
            });
            id
        }
        fn put(&mut self, p: u32, key: &str, w: u64, t: (u64, u64), result: OpResult) -> usize {
            self.op(
                p,
                key,
                OpKind::Put {
                    write_id: w,
                    replicas: 1,
                },
                t,
                result,
            )
        }
        fn stored(node: u64) -> OpResult {
            OpResult::Ok(Reply::Stored {
                replicas: vec![ReplicaLoc {
                    node,
                    generation: 1,
                }],

                extents: vec![],
            })
        }
        fn get(&mut self, p: u32, key: &str, t: (u64, u64), result: OpResult) -> usize {
            self.op(p, key, OpKind::Get, t, result)
        }
        fn found(w: u64) -> OpResult {
            OpResult::Ok(Reply::Found { write_id: w })
        }
        fn check(&self) -> Report {
            self.check_with(&[], Counters::default())
        }
        fn check_with(&self, claims: &[LeaderClaim], counters: Counters) -> Report {
            check(&CheckInput {
                recorded: &self.rec,
                claims,
                windows: &[],
                counters,
                recovery_limit: Duration::from_secs(10),
                node_ttl: Some(Duration::from_secs(4)),
                read_staleness: self.staleness,
                value_len: None,
            })
        }
    }

    fn kinds(r: &Report) -> Vec<AnomalyKind> {
        r.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn lost_acknowledged_put_is_caught_with_the_key_history() {
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.get(2, "k", (20, 30), H::found(1));
        h.get(2, "k", (40, 50), OpResult::Ok(Reply::NotFound));
        h.get(2, "other", (40, 50), OpResult::Ok(Reply::NotFound));
        let r = h.check();
        assert_eq!(kinds(&r), vec![AnomalyKind::LostAcknowledgedPut]);
        assert_eq!(r.anomalies[0].key.as_deref(), Some("k"));
        assert_eq!(r.key_histories["k"].len(), 3);
        assert!(r.details().contains("history of key k"), "{}", r.details());
        // exists(false) and remove answering not-found are losses too.
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.op(
            2,
            "k",
            OpKind::Exists,
            (20, 30),
            OpResult::Ok(Reply::Exists(false)),
        );
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::LostAcknowledgedPut]);
    }

    #[test]
    fn wrong_reads_are_caught() {
        // The value of another key.
        let mut h = H::default();
        h.put(1, "a", 1, (0, 10), H::stored(1));
        h.put(1, "b", 2, (0, 10), H::stored(1));
        h.get(2, "b", (20, 30), H::found(1));
        let r = h.check();
        assert!(kinds(&r).contains(&AnomalyKind::WrongRead), "{r}");
        // Bytes that decode to nothing.
        let mut h = H::default();
        h.get(
            2,
            "a",
            (20, 30),
            OpResult::Ok(Reply::Corrupt {
                detail: "bad magic".into(),
            }),
        );
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::WrongRead]);
        // The value of a put that failed definitely.
        let mut h = H::default();
        h.put(1, "a", 1, (0, 10), OpResult::Fail("conflict".into()));
        h.get(2, "a", (20, 30), H::found(1));
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::WrongRead]);
        // A value that changed without a remove (the second put must have answered
        // already-exists; it was indeterminate, so only the read gives it away).
        let mut h = H::default();
        h.put(1, "a", 1, (0, 10), H::stored(1));
        h.put(
            2,
            "a",
            2,
            (5, 15),
            OpResult::Indeterminate("timeout".into()),
        );
        h.get(3, "a", (20, 30), H::found(2));
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::WrongRead]);
        // A read from the future.
        let mut h = H::default();
        h.get(3, "a", (0, 5), H::found(7));
        h.put(1, "a", 7, (10, 20), H::stored(1));
        assert!(kinds(&h.check()).contains(&AnomalyKind::WrongRead));
    }

    #[test]
    fn a_checksum_mismatch_miss_is_counted_but_no_anomaly_nor_absence() {
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.get(
            2,
            "k",
            (20, 30),
            OpResult::Ok(Reply::CorruptMiss {
                detail: "checksum failed on every replica".into(),
            }),
        );
        h.get(2, "k", (40, 50), H::found(1));
        let r = h.check();
        assert!(r.passed(), "{r}");
        assert_eq!(r.corrupt_misses, 1);
        assert!(r.table().contains("checksum-mismatch misses 1"));
        // Returned bytes that are no value are always an anomaly, even on a gone segment.
        h.rec.events.push(Event {
            at_us: 15_000,
            kind: EventKind::GenerationGone {
                loc: ReplicaLoc {
                    node: 1,
                    generation: 1,
                },
                why: "kill -9".into(),
                heard_at_us: None,
            },
        });
        h.get(
            2,
            "k",
            (60, 70),
            OpResult::Ok(Reply::Corrupt {
                detail: "differs from byte 9000 on".into(),
            }),
        );
        let counted = Counters {
            evicted_objects: 0,
            dead_node_dropped_objects: 1,
        };
        assert_eq!(
            kinds(&h.check_with(&[], counted)),
            vec![AnomalyKind::WrongRead]
        );
    }

    /// A remove through node 1 (process 101), then a get through `reader` at `t`.
    fn read_after_remove(reader: u32, t: (u64, u64)) -> H {
        let mut h = H {
            staleness: Some(INDEX_READ_STALENESS),
            ..H::default()
        };
        h.put(101, "k", 1, (0, 10), H::stored(1));
        h.op(
            101,
            "k",
            OpKind::Remove,
            (20, 30),
            OpResult::Ok(Reply::Removed(true)),
        );
        h.get(reader, "k", t, H::found(1));
        h
    }

    #[test]
    fn a_stale_index_read_through_another_node_is_counted_within_the_bound() {
        let r = read_after_remove(201, (40, 50)).check();
        assert!(r.passed(), "{r}");
        assert_eq!(r.stale_reads, 1);
        // The same history without the index's allowance is an anomaly.
        let mut strict = read_after_remove(201, (40, 50));
        strict.staleness = None;
        assert_eq!(kinds(&strict.check()), vec![AnomalyKind::ReadAfterRemove]);
    }

    #[test]
    fn a_stale_read_through_the_changing_node_or_past_the_bound_is_caught() {
        // Read-your-writes: the node that removed the key never serves it again.
        let same_node = read_after_remove(102, (40, 50)).check();
        assert_eq!(kinds(&same_node), vec![AnomalyKind::ReadAfterRemove]);
        assert_eq!(same_node.stale_reads, 0);
        // Past the bound (2.5 s after the remove completed) another node is strict too.
        let late = read_after_remove(201, (2600, 2610)).check();
        assert_eq!(kinds(&late), vec![AnomalyKind::ReadAfterRemove]);
        assert_eq!(late.stale_reads, 0);
    }

    #[test]
    fn an_old_value_read_through_another_node_after_a_replacing_put_is_stale_not_wrong() {
        let mut h = read_after_remove(201, (60, 70));
        h.rec.ops.pop();
        h.put(101, "k", 2, (40, 50), H::stored(1));
        h.get(201, "k", (60, 70), H::found(1));
        let r = h.check();
        assert!(r.passed(), "{r}");
        assert_eq!(r.stale_reads, 1);
        // An absence is never an index's answer: a miss after an acknowledged put stays a loss.
        h.get(301, "k", (80, 90), OpResult::Ok(Reply::NotFound));
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::LostAcknowledgedPut]);
    }

    #[test]
    fn read_after_completed_remove_is_caught() {
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.op(
            1,
            "k",
            OpKind::Remove,
            (20, 30),
            OpResult::Ok(Reply::Removed(true)),
        );
        h.get(2, "k", (40, 50), H::found(1));
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::ReadAfterRemove]);
        // Concurrent with the remove it is fine.
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.op(
            1,
            "k",
            OpKind::Remove,
            (20, 30),
            OpResult::Ok(Reply::Removed(true)),
        );
        h.get(2, "k", (25, 50), H::found(1));
        assert!(h.check().passed());
    }

    #[test]
    fn second_acknowledged_put_without_remove_is_caught() {
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(1));
        h.put(2, "k", 2, (20, 30), H::stored(2));
        assert_eq!(kinds(&h.check()), vec![AnomalyKind::DoubleAcknowledgedPut]);
        // With a remove between (even an indeterminate one) it is fine.
        h.op(
            3,
            "k",
            OpKind::Remove,
            (12, 14),
            OpResult::Indeterminate("timeout".into()),
        );
        assert!(h.check().passed());
    }

    #[test]
    fn clean_concurrent_history_with_indeterminate_puts_passes() {
        let mut h = H::default();
        // Overlapping put and gets: a get may see the value or not.
        h.put(1, "k", 1, (0, 100), H::stored(1));
        h.get(2, "k", (10, 20), OpResult::Ok(Reply::NotFound));
        h.get(3, "k", (50, 60), H::found(1));
        h.get(2, "k", (150, 160), H::found(1));
        // A concurrent second put answered already-exists.
        h.put(3, "k", 2, (5, 30), OpResult::Ok(Reply::AlreadyExists));
        // An indeterminate put that did happen, and one that did not.
        h.put(
            1,
            "j",
            3,
            (0, 10),
            OpResult::Indeterminate("lost reply".into()),
        );
        h.get(2, "j", (20, 30), H::found(3));
        h.put(
            1,
            "i",
            4,
            (0, 10),
            OpResult::Indeterminate("lost reply".into()),
        );
        h.get(2, "i", (20, 30), OpResult::Ok(Reply::NotFound));
        // Remove, then a fresh put, then reads of the new value only.
        h.op(
            1,
            "k",
            OpKind::Remove,
            (200, 210),
            OpResult::Ok(Reply::Removed(true)),
        );
        h.get(2, "k", (220, 230), OpResult::Ok(Reply::NotFound));
        h.put(3, "k", 5, (240, 250), H::stored(2));
        h.get(2, "k", (260, 270), H::found(5));
        h.op(
            2,
            "k",
            OpKind::Exists,
            (260, 270),
            OpResult::Ok(Reply::Exists(true)),
        );
        // Failed operations say nothing.
        h.get(2, "k", (280, 290), OpResult::Fail("unavailable".into()));
        h.put(2, "k", 6, (280, 290), OpResult::Fail("no leader".into()));
        let r = h.check();
        assert!(r.passed(), "{r}");
    }

    #[test]
    fn loss_on_a_gone_segment_is_excused_but_counted() {
        let mut h = H::default();
        h.put(1, "k", 1, (0, 10), H::stored(4));
        h.get(2, "k", (40, 50), OpResult::Ok(Reply::NotFound));
        h.rec.events.push(Event {
            at_us: 30_000,
            kind: EventKind::GenerationGone {
                loc: ReplicaLoc {
                    node: 4,
                    generation: 1,
                },
                why: "declared dead".into(),
                heard_at_us: None,
            },
        });
        let counted = Counters {
            evicted_objects: 0,
            dead_node_dropped_objects: 1,
        };
        let r = h.check_with(&[], counted);
        assert!(r.passed(), "{r}");
        assert_eq!(r.excused_losses, 1);
        // metad must have counted it.
        let r = h.check();
        assert_eq!(kinds(&r), vec![AnomalyKind::LossesExceedCounters]);
    }

    // ------------------------------------------------------------ the change feed

    fn ev(h: &mut H, at_ms: u64, kind: EventKind) {
        h.rec.events.push(Event {
            at_us: at_ms * 1000,
            kind,
        });
        h.rec.events.sort_by_key(|e| e.at_us);
    }

    fn obj(key: &str, id: u64, size: u64) -> FeedObject {
        FeedObject {
            key: key.into(),
            version: (1, id),
            size,
        }
    }

    fn disk(node: u64) -> ReplicaLoc {
        ReplicaLoc {
            node,
            generation: regolith_proto::disk_tier::disk_generation(0),
        }
    }

    /// The feed is current every 10 ms from 0 to 200 ms.
    fn feed_current(h: &mut H) {
        for t in (0..=200).step_by(10) {
            ev(h, t, EventKind::FeedCurrent { as_of_us: t * 1000 });
        }
    }

    fn check_sized(h: &H, counters: Counters) -> Report {
        let len = |_: &str, w: u64| 100 * w;
        check(&CheckInput {
            recorded: &h.rec,
            claims: &[],
            windows: &[],
            counters,
            recovery_limit: Duration::from_secs(10),
            node_ttl: None,
            read_staleness: None,
            value_len: Some(&len),
        })
    }

    /// Put w1 of "k" (100 bytes) on node 1's memory at 0..10 ms, moved to node 1's disk at
    /// 20 ms, absent for a get at 60..70 ms.
    fn offloaded_then_absent() -> H {
        let mut h = H::default();
        feed_current(&mut h);
        h.put(1, "k", 1, (0, 10), H::stored(1));
        ev(
            &mut h,
            9,
            EventKind::Listed {
                object: obj("k", 1, 100),
                replicas: vec![ReplicaLoc {
                    node: 1,
                    generation: 1,
                }],
            },
        );
        ev(
            &mut h,
            20,
            EventKind::Listed {
                object: obj("k", 1, 100),
                replicas: vec![disk(1)],
            },
        );
        h.get(2, "k", (60, 70), OpResult::Ok(Reply::NotFound));
        h
    }

    const EVICTED_1: Counters = Counters {
        evicted_objects: 1,
        dead_node_dropped_objects: 0,
    };

    #[test]
    fn a_loss_with_a_failed_disk_is_excused_when_the_feed_shows_the_drop() {
        let mut h = offloaded_then_absent();
        ev(
            &mut h,
            50,
            EventKind::Unlisted {
                object: obj("k", 1, 100),
                last: vec![disk(1)],
            },
        );
        let r = check_sized(&h, EVICTED_1);
        assert!(r.passed(), "{r}");
        assert_eq!(r.excused_losses, 1);
        assert_eq!(
            r.excused_by_cause.get("dropped from a disk"),
            Some(&1),
            "{r}"
        );
        assert!(r.table().contains("dropped from a disk 1"), "{}", r.table());
        // Counted by metad, or it is an anomaly.
        let r = check_sized(&h, Counters::default());
        assert_eq!(kinds(&r), vec![AnomalyKind::LossesExceedCounters]);
    }

    /// A disk failed, a get then missed the object on it, and metad dropped it from the disk
    /// only after the get (it heard of the failure later): excused, but only with the failure.
    #[test]
    fn a_miss_after_a_disk_failed_is_excused_by_a_drop_that_came_after_it() {
        let mut h = offloaded_then_absent();
        ev(
            &mut h,
            130,
            EventKind::Unlisted {
                object: obj("k", 1, 100),
                last: vec![disk(1)],
            },
        );
        let r = check_sized(&h, EVICTED_1);
        assert_eq!(
            kinds(&r),
            vec![AnomalyKind::LostAcknowledgedPut],
            "no disk failed"
        );
        ev(
            &mut h,
            55,
            EventKind::FaultInjected {
                fault: "disk-fail-s1".into(),
                detail: "directory removed".into(),
            },
        );
        let r = check_sized(&h, EVICTED_1);
        assert!(r.passed(), "{r}");
        assert_eq!(
            r.excused_by_cause.get("dropped from a failed disk"),
            Some(&1),
            "{r}"
        );
    }

    #[test]
    fn with_the_feed_an_eviction_elsewhere_excuses_no_loss() {
        // metad evicted something, but the feed never unlisted this object: a lost put.
        let h = offloaded_then_absent();
        let r = check_sized(&h, EVICTED_1);
        assert_eq!(kinds(&r), vec![AnomalyKind::LostAcknowledgedPut], "{r}");
        // Another object of the key (another size) dropped, or this one dropped only after
        // the get: still lost.
        for (at, size) in [(50, 7), (150, 100)] {
            let mut h = offloaded_then_absent();
            ev(
                &mut h,
                at,
                EventKind::Unlisted {
                    object: obj("k", 1, size),
                    last: vec![disk(1)],
                },
            );
            let r = check_sized(&h, EVICTED_1);
            assert_eq!(kinds(&r), vec![AnomalyKind::LostAcknowledgedPut], "{r}");
        }
    }

    #[test]
    fn an_unlisting_the_feed_delivered_late_but_covered_by_its_guarantee_excuses() {
        // The feed's guarantee for the get's end (70 ms) only came at 150 ms: a drop
        // recorded at 120 ms was applied before the get read.
        let mut h = offloaded_then_absent();
        h.rec
            .events
            .retain(|e| !matches!(e.kind, EventKind::FeedCurrent { .. }));
        ev(&mut h, 5, EventKind::FeedCurrent { as_of_us: 5_000 });
        ev(
            &mut h,
            120,
            EventKind::Unlisted {
                object: obj("k", 1, 100),
                last: vec![disk(1)],
            },
        );
        ev(&mut h, 150, EventKind::FeedCurrent { as_of_us: 140_000 });
        let r = check_sized(&h, EVICTED_1);
        assert!(r.passed(), "{r}");
    }

    #[test]
    fn across_a_feed_resync_the_recorded_rules_decide() {
        let mut h = offloaded_then_absent();
        ev(&mut h, 40, EventKind::FeedResynced { from_us: 30_000 });
        let r = check_sized(&h, EVICTED_1);
        assert!(r.passed(), "{r}");
        assert_eq!(r.excused_by_cause.get("feed gap"), Some(&1));
        let r = check_sized(&h, Counters::default());
        assert_eq!(kinds(&r), vec![AnomalyKind::LostAcknowledgedPut], "{r}");
    }

    /// Node 1's sidecar killed at 30 ms holding a and b on its disk, restarted and reconciled
    /// by 100 ms; the feed shows b's disk replica dropped at 80 ms.
    fn warm_restart(counted: u64) -> H {
        let mut h = H::default();
        feed_current(&mut h);
        for (key, id) in [("a", 1), ("b", 2)] {
            ev(
                &mut h,
                5,
                EventKind::Listed {
                    object: obj(key, id, 100),
                    replicas: vec![disk(1)],
                },
            );
        }
        ev(
            &mut h,
            30,
            EventKind::DiskHeld {
                host: "s1".into(),
                node: 1,
                objects: vec![obj("a", 1, 100), obj("b", 2, 100)],
            },
        );
        ev(
            &mut h,
            80,
            EventKind::Unlisted {
                object: obj("b", 2, 100),
                last: vec![disk(1)],
            },
        );
        ev(
            &mut h,
            100,
            EventKind::WarmRestarted {
                host: "s1".into(),
                node: 1,
                drops_counted: counted,
            },
        );
        h
    }

    #[test]
    fn a_drop_metad_applied_before_the_restart_is_not_the_restarts_doing() {
        // The killed process's own eviction, reported just before its death and committed
        // after it, lands before the restart begins (DiskHeld at 30): no anomaly, no count.
        let mut h = warm_restart(0);
        h.rec
            .events
            .retain(|e| !matches!(e.kind, EventKind::Unlisted { .. }));
        ev(
            &mut h,
            20,
            EventKind::Unlisted {
                object: obj("b", 2, 100),
                last: vec![disk(1)],
            },
        );
        let r = check_sized(&h, EVICTED_1);
        assert!(r.anomalies.is_empty(), "{r}");
    }

    #[test]
    fn disk_objects_a_warm_restart_forgot_are_caught() {
        let r = check_sized(&warm_restart(0), EVICTED_1);
        assert_eq!(kinds(&r), vec![AnomalyKind::DiskObjectsLost], "{r}");
        assert!(r.anomalies[0].message.contains("b@1.2"), "{r}");
        assert_eq!(r.warm_restarts.len(), 1);
        // The disk counted the drop (its eviction, a damaged record): fine.
        let r = check_sized(&warm_restart(1), EVICTED_1);
        assert!(r.passed(), "{r}");
        assert!(
            r.table()
                .contains("2 objects on its disks at the kill, 1 lost"),
            "{r}"
        );
        // A client removed b meanwhile: not a loss of the restart.
        let mut h = warm_restart(0);
        h.op(
            2,
            "b",
            OpKind::Remove,
            (40, 50),
            OpResult::Ok(Reply::Removed(true)),
        );
        let r = check_sized(&h, EVICTED_1);
        assert!(r.passed(), "{r}");
        // A replica dropped later than the restart's end is the disk's ordinary life.
        let mut h = warm_restart(0);
        for e in h.rec.events.iter_mut() {
            if matches!(e.kind, EventKind::Unlisted { .. }) {
                e.at_us = 150_000;
            }
        }
        h.rec.events.sort_by_key(|e| e.at_us);
        assert!(check_sized(&h, EVICTED_1).passed());
    }

    #[test]
    fn overlapping_extents_of_live_objects_are_caught() {
        let placed = |offset| {
            OpResult::Ok(Reply::Stored {
                replicas: vec![ReplicaLoc {
                    node: 1,
                    generation: 1,
                }],
                extents: vec![vec![crate::history::Extent { offset, len: 100 }]],
            })
        };
        let mut h = H::default();
        h.put(1, "a", 1, (0, 10), placed(0));
        h.put(2, "b", 2, (20, 30), placed(50));
        h.put(2, "c", 3, (20, 30), placed(150));
        let r = h.check();
        assert_eq!(kinds(&r), vec![AnomalyKind::OverlappingExtents], "{r}");
        assert!(r.anomalies[0].message.contains("0..100"));
        // Reuse after a remove is fine.
        h.op(
            3,
            "a",
            OpKind::Remove,
            (12, 15),
            OpResult::Ok(Reply::Removed(true)),
        );
        assert!(h.check().passed());
    }

    #[test]
    fn premature_death_is_caught() {
        let gone = |at_us, heard| Event {
            at_us,
            kind: EventKind::GenerationGone {
                loc: ReplicaLoc {
                    node: 1,
                    generation: 1,
                },
                why: "remount".into(),
                heard_at_us: heard,
            },
        };
        let mut h = H::default();
        h.rec.events.push(gone(5_000_000, Some(4_000_000)));
        h.rec.events.push(gone(9_000_000, Some(4_000_000)));
        h.rec.events.push(gone(9_000_000, None));
        let r = h.check();
        assert_eq!(kinds(&r), vec![AnomalyKind::PrematureDeath], "{r}");
        assert!(r.anomalies[0].message.contains("1.000s"));
    }

    #[test]
    fn two_leaders_in_one_term_are_caught() {
        let claim = |reporter, term, leader, self_report| LeaderClaim {
            at_us: 1000,
            reporter,
            term,
            leader,
            self_report,
        };
        let h = H::default();
        let ok = [
            claim(1, 3, 1, true),
            claim(2, 3, 1, false),
            claim(2, 4, 2, true),
        ];
        assert!(h.check_with(&ok, Counters::default()).passed());
        let split = [claim(1, 3, 1, true), claim(2, 3, 2, true)];
        let r = h.check_with(&split, Counters::default());
        assert_eq!(kinds(&r), vec![AnomalyKind::TwoLeadersInTerm]);
        assert!(r.anomalies[0].message.contains("term 3"));
    }

    #[test]
    fn recovery_is_measured_and_missing_recovery_caught() {
        let mut h = H::default();
        h.put(1, "k", 1, (1000, 1010), OpResult::Fail("down".into()));
        h.put(1, "k", 2, (1500, 1600), H::stored(1));
        h.get(1, "k", (1700, 1800), H::found(2));
        h.put(2, "j", 3, (2100, 2200), H::stored(1));
        h.get(2, "j", (2300, 2400), H::found(3));
        let windows = [
            FaultWindow {
                name: "kill".into(),
                kind: "kill".into(),
                detail: "leader 1".into(),
                injected_us: 500_000,
                healed_us: 1_000_000,
                end_us: 2_000_000,
            },
            FaultWindow {
                name: "kill".into(),
                kind: "kill".into(),
                detail: "leader 2".into(),
                injected_us: 2_000_000,
                healed_us: 2_050_000,
                end_us: 2_500_000,
            },
        ];
        let report = |limit| {
            check(&CheckInput {
                recorded: &h.rec,
                claims: &[],
                windows: &windows,
                counters: Counters::default(),
                recovery_limit: limit,
                node_ttl: None,
                read_staleness: None,
                value_len: None,
            })
        };
        let r = report(Duration::from_secs(10));
        assert!(r.passed(), "{r}");
        assert_eq!(r.rows[1].recovery, Some(Duration::from_millis(800)));
        assert_eq!(r.rows[1].ops, 3);
        assert_eq!(r.rows[1].failed, 1);
        assert!(r.table().contains("kill"));
        assert_eq!(r.rows[2].recovery, Some(Duration::from_millis(350)));
        // Both kills in one row of the per-kind summary, with the slower recovery.
        let by_kind = r.by_kind();
        assert_eq!(by_kind[0].kind, "kill");
        assert_eq!(by_kind[0].steps, 2);
        assert_eq!(by_kind[0].ops, 5);
        assert_eq!(by_kind[0].worst_recovery, Some(Duration::from_millis(800)));
        assert!(r.to_string().contains("fault kind"), "{r}");
        let r = report(Duration::from_millis(500));
        assert_eq!(kinds(&r), vec![AnomalyKind::NoRecovery]);
    }
}
