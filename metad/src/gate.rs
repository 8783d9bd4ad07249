//! When this replica may serve reads from its applied state (design §5), and the leadership
//! transitions of the core.
//!
//! Reads are served with no log write and no quorum round only while (a) this node is leader,
//! (b) the time since a quorum last acknowledged it, measured at read time — openraft's
//! `millis_since_quorum_ack` plus the time since that metrics snapshot was observed — is below
//! `leader_lease - heartbeat_interval`, and (c) it has applied its own term's first entry.
//! Otherwise a read waits a bounded time or falls back to `ensure_linearizable()`; it never
//! answers "not found" because the node is not ready.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{RaftMetrics, ServerState};
use parking_lot::Mutex;
use regolith_proto::leader::LeaderHint;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::core::Core;
use crate::raft_types::{NodeId, Raft};

/// What a metrics snapshot said, and when it was observed.
#[derive(Clone, Debug)]
pub struct Observed {
    pub at: Instant,
    pub state: ServerState,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub leader_addr: Option<String>,
    pub quorum_ack_ms: Option<u64>,
    pub applied_term: Option<u64>,
    pub applied_index: u64,
    pub last_log_index: u64,
    /// The last log index when this process first saw itself leader of `term`: everything up to
    /// it must be applied before the leader serves (see [`Observed::ready_leader`]).
    pub ready_floor: u64,
    /// When this process first saw itself leader of `term` (None when not leader).
    pub leader_since: Option<Instant>,
}

impl Observed {
    fn of(m: &RaftMetrics<NodeId, openraft::BasicNode>) -> Self {
        let leader_addr = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        Self {
            at: Instant::now(),
            state: m.state,
            term: m.current_term,
            leader: m.current_leader,
            leader_addr,
            quorum_ack_ms: m.millis_since_quorum_ack,
            applied_term: m.last_applied.map(|l| l.committed_leader_id().term),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            last_log_index: m.last_log_index.unwrap_or(0),
            ready_floor: u64::MAX,
            leader_since: None,
        }
    }

    /// A leader that has applied its own term's first entry and everything its log held when it
    /// took office. The second condition matters for a leader openraft restores at start-up (its
    /// vote was committed for itself before a restart): it keeps its old term, its saved commit
    /// index may be behind entries that were committed and acknowledged before the restart, and
    /// it appends no new first entry. Serving before those are applied could miss an
    /// acknowledged write, and building the shadow allocator before could double-allocate.
    pub fn ready_leader(&self) -> bool {
        self.state == ServerState::Leader
            && self.applied_term == Some(self.term)
            && self.applied_index >= self.ready_floor
    }

    pub fn hint(&self) -> Option<LeaderHint> {
        Some(LeaderHint {
            id: self.leader?,
            addr: self.leader_addr.clone()?,
        })
    }
}

/// Why a read or leader-only call cannot be served here now.
#[derive(Debug)]
pub enum NotServing {
    NotLeader(Option<LeaderHint>),
    /// Leader, but not yet ready (first entry not applied, or the lease could not be confirmed).
    NotReady(String),
}

#[derive(Clone)]
pub struct Gate {
    raft: Raft,
    rx: watch::Receiver<Observed>,
    lease: Duration,
    margin: Duration,
    wait: Duration,
    /// Set while this leader hands its office over ([`crate::transfer`]): the replica it
    /// chose is about to win an election this leader votes in, so no read may rest on the
    /// quorum lease until the hand-over has ended.
    handing_over: Arc<watch::Sender<bool>>,
}

impl Gate {
    /// Starts watching openraft's metrics; builds or drops the core's leader state as
    /// leadership comes and goes.
    pub fn start(
        raft: Raft,
        core: Arc<Mutex<Core>>,
        clock: Clock,
        lease: Duration,
        heartbeat: Duration,
        wait: Duration,
    ) -> Self {
        let mut metrics = raft.metrics();
        let first = Observed::of(&metrics.borrow());
        let (tx, rx) = watch::channel(first);
        tokio::spawn(async move {
            // (term, last log index, when) this process first saw itself leader of that term.
            let mut floor: Option<(u64, u64, Instant)> = None;
            loop {
                let mut obs = Observed::of(&metrics.borrow_and_update());
                if obs.state == ServerState::Leader {
                    if floor.is_none_or(|(t, _, _)| t != obs.term) {
                        floor = Some((obs.term, obs.last_log_index, Instant::now()));
                    }
                    obs.ready_floor = floor.map(|(_, f, _)| f).unwrap_or(u64::MAX);
                    obs.leader_since = floor.map(|(_, _, at)| at);
                }
                sync_leadership(&core, &obs, clock);
                if tx.send(obs).is_err() {
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
        Self {
            raft,
            rx,
            lease,
            margin: heartbeat,
            wait,
            handing_over: Arc::new(watch::channel(false).0),
        }
    }

    /// Starts (`true`) or ends a leadership hand-over: while it lasts, no read rests on the
    /// quorum lease and new reservations wait ([`Gate::hand_over_ended`]).
    pub fn set_handing_over(&self, on: bool) {
        self.handing_over.send_replace(on);
    }

    pub fn handing_over(&self) -> bool {
        *self.handing_over.borrow()
    }

    /// Returns once no hand-over is under way (a hand-over is bounded by its timeout).
    pub async fn hand_over_ended(&self) {
        let mut rx = self.handing_over.subscribe();
        let _ = rx.wait_for(|on| !*on).await;
    }

    /// Waits up to `wait` for an observation that `pred` accepts; returns the last one seen and
    /// whether it did.
    pub async fn wait_for(
        &self,
        wait: Duration,
        mut pred: impl FnMut(&Observed) -> bool,
    ) -> (Observed, bool) {
        let deadline = Instant::now() + wait;
        let mut rx = self.rx.clone();
        loop {
            let obs = rx.borrow_and_update().clone();
            if pred(&obs) {
                return (obs, true);
            }
            if !wait_change(&mut rx, deadline).await {
                return (obs, false);
            }
        }
    }

    fn lease_budget(&self) -> Option<Duration> {
        (!self.handing_over()).then(|| self.lease.saturating_sub(self.margin))
    }

    pub fn observed(&self) -> Observed {
        self.rx.borrow().clone()
    }

    /// Whether the quorum lease holds right now (design §5 (b)).
    pub fn lease_ok(&self) -> bool {
        self.lease_budget()
            .is_some_and(|budget| lease_holds(&self.rx.borrow(), budget))
    }

    /// Leader-only calls that do not read state (reserve, commit, proposals): this node must be
    /// leader; waits a bounded time for it to become ready.
    pub async fn require_leader(&self) -> Result<Observed, NotServing> {
        let deadline = Instant::now() + self.wait;
        let mut rx = self.rx.clone();
        loop {
            let obs = rx.borrow_and_update().clone();
            if obs.state != ServerState::Leader && obs.state != ServerState::Candidate {
                return Err(NotServing::NotLeader(obs.hint()));
            }
            if obs.ready_leader() {
                return Ok(obs);
            }
            if !wait_change(&mut rx, deadline).await {
                return Err(NotServing::NotReady(format!(
                    "leader of term {} has not applied its first entry",
                    obs.term
                )));
            }
        }
    }

    /// Reads of the applied state: leader, ready, and within the quorum lease — else confirm
    /// leadership with a quorum round (`ensure_linearizable`). Returns how it was confirmed.
    pub async fn read(&self) -> Result<ReadPath, NotServing> {
        let obs = self.require_leader().await?;
        if self
            .lease_budget()
            .is_some_and(|budget| lease_holds(&obs, budget))
        {
            return Ok(ReadPath::Lease);
        }
        match tokio::time::timeout(self.wait, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(ReadPath::Quorum),
            Ok(Err(e)) => match e.forward_to_leader() {
                Some(f) => Err(NotServing::NotLeader(
                    f.leader_id
                        .zip(f.leader_node.as_ref().map(|n| n.addr.clone()))
                        .map(|(id, addr)| LeaderHint { id, addr }),
                )),
                None => Err(NotServing::NotReady(format!(
                    "leadership not confirmed: {e}"
                ))),
            },
            Err(_) => Err(NotServing::NotReady(format!(
                "leadership not confirmed within {:?}",
                self.wait
            ))),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReadPath {
    Lease,
    Quorum,
}

fn lease_holds(obs: &Observed, budget: Duration) -> bool {
    match obs.quorum_ack_ms {
        Some(ms) if obs.ready_leader() => Duration::from_millis(ms) + obs.at.elapsed() < budget,
        _ => false,
    }
}

async fn wait_change(rx: &mut watch::Receiver<Observed>, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    matches!(tokio::time::timeout(left, rx.changed()).await, Ok(Ok(())))
}

fn sync_leadership(core: &Mutex<Core>, obs: &Observed, clock: Clock) {
    let mut core = core.lock();
    if obs.ready_leader() {
        core.become_leader(obs.term, clock.now());
    } else if core
        .leader()
        .is_some_and(|l| l.term != obs.term || obs.state != ServerState::Leader)
    {
        core.step_down();
    }
}
