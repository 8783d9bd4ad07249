//! Leadership hand-over: a leader gives its office to another voter without the cluster going
//! through an election timeout (a rolling upgrade, `regolith metad transfer-leader`, SIGTERM to
//! a leader).
//!
//! openraft 0.9 has no leader transfer of its own, and its followers refuse every vote request
//! while their leader lease (`election_timeout_max` since the leader's last message) holds. The
//! leader itself holds no such lease once it has led for longer than that: it grants a vote to
//! a candidate of a later term whose log is at least as long as its own, and steps down. So:
//!
//! 1. the leader waits until it has led for longer than the lease;
//! 2. it stops serving reads on its quorum lease (the replica it chose is about to win an
//!    election it votes in) and makes new reservations wait; once the puts under way have
//!    committed (or after half the time allowed, at most 2 s), it holds every write
//!    ([`crate::proposer::Hold`]): the reservations then wait for the hand-over to end and go to
//!    the new leader, and no put loses its reservation to the change;
//! 3. it waits until the target has acknowledged its whole log;
//! 4. it sends the target `TimeoutNow` (`proto/raft.proto`); the target, still following this
//!    leader in this term with the whole log, campaigns at once (`Trigger::elect`);
//! 5. the leader grants the vote, and with three voters that vote is the target's majority; the
//!    leader has handed over once it sees another replica lead a later term.
//!
//! With five voters the target also needs a follower whose lease has expired, which happens an
//! election timeout after the old leader's last heartbeat: the hand-over then takes about as
//! long as an election, but no more, and the leader it yields to is the one it chose. Whatever
//! fails, safety is Raft's: a hand-over only decides who campaigns and when.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::ServerState;
use regolith_proto::auth::PeerInterceptor;
use regolith_proto::raft::raft_client::RaftClient;
use regolith_proto::raft::{TimeoutNowReply, TimeoutNowRequest};
use tonic::transport::Endpoint;

use crate::error::{Error, Result};
use crate::gate::Observed;
use crate::ops::Ops;
use crate::raft_types::NodeId;

/// How long a hand-over may hold writes when the caller gives no limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to a peer's `Raft` service with the replica's own credentials (token, TLS).
#[derive(Clone)]
pub struct Dialer {
    pub interceptor: PeerInterceptor,
    pub tls: Option<regolith_proto::tls::Tls>,
    pub connect_timeout: Duration,
}

impl Dialer {
    async fn timeout_now(
        &self,
        addr: &str,
        req: TimeoutNowRequest,
        ttl: Duration,
    ) -> std::result::Result<TimeoutNowReply, String> {
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let ch = regolith_proto::tls::channel(ep, self.tls.as_ref());
        let mut client = RaftClient::with_interceptor(ch, self.interceptor.clone());
        match tokio::time::timeout(ttl, client.timeout_now(req)).await {
            Err(_) => Err(format!("TimeoutNow to {addr}: no answer within {ttl:?}")),
            Ok(Err(s)) => Err(format!(
                "TimeoutNow to {addr}: {:?}: {}",
                s.code(),
                s.message()
            )),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }
}

/// A hand-over that took place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub from: NodeId,
    pub to: NodeId,
    /// The new leader's term.
    pub term: u64,
    /// From the hold on writes to the new leader seen.
    pub took: Duration,
}

/// The voter to hand over to: `wanted` when given (a voter other than `me`), else the voter
/// other than `me` that has acknowledged the most of the log (the lowest id among equals).
/// `matched`: each follower's acknowledged last log index (absent: nothing acknowledged yet).
pub fn pick_target(
    me: NodeId,
    voters: &BTreeSet<NodeId>,
    matched: &BTreeMap<NodeId, u64>,
    wanted: Option<NodeId>,
) -> std::result::Result<NodeId, String> {
    if let Some(to) = wanted {
        return if to == me {
            Err(format!("node {me} already leads"))
        } else if voters.contains(&to) {
            Ok(to)
        } else {
            Err(format!("node {to} is not a voter (voters: {voters:?})"))
        };
    }
    voters
        .iter()
        .copied()
        .filter(|&v| v != me)
        .max_by_key(|v| (matched.get(v).copied(), std::cmp::Reverse(*v)))
        .ok_or_else(|| format!("node {me} is the only voter: no one to hand over to"))
}

/// Why a replica refuses a `TimeoutNow` (None: it campaigns). `term`, `leader`, `last_log_index`
/// and `voter` are the replica's own view.
pub fn timeout_now_refusal(
    req: &TimeoutNowRequest,
    state: ServerState,
    term: u64,
    leader: Option<NodeId>,
    last_log_index: u64,
    voter: bool,
) -> Option<String> {
    if !voter {
        return Some("not a voter".into());
    }
    if state != ServerState::Follower {
        return Some(format!("{state:?}, not a follower"));
    }
    if term != req.term || leader != Some(req.leader_id) {
        return Some(format!(
            "follows {leader:?} in term {term}, not node {} in term {}",
            req.leader_id, req.term
        ));
    }
    if last_log_index < req.last_log_index {
        return Some(format!(
            "log ends at {last_log_index}, before the leader's {}",
            req.last_log_index
        ));
    }
    None
}

/// Hands this leader's office to `to` (or the most caught-up voter) within `timeout`.
pub async fn transfer(ops: &Ops, to: Option<NodeId>, timeout: Duration) -> Result<Transferred> {
    let deadline = Instant::now() + timeout;
    let me = ops.id;
    // One at a time (a SIGTERM during a `transfer-leader`): the hold and the gate's flag are
    // this replica's, not each hand-over's.
    let _one = tokio::time::timeout(timeout, ops.transferring.lock())
        .await
        .map_err(|_| Error::Precondition("another hand-over is under way".into()))?;
    let obs = ops.leader().await?;
    let term = obs.term;
    let (voters, addrs) = {
        let m = ops.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let addrs: BTreeMap<NodeId, String> = membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        (voters, addrs)
    };
    let target = pick_target(me, &voters, &matched(ops), to).map_err(Error::Precondition)?;
    let addr = addrs
        .get(&target)
        .cloned()
        .ok_or_else(|| Error::NoSuch(format!("voter {target} has no address")))?;

    // (1) This leader's vote must be grantable: openraft refuses while its own term is younger
    // than the lease.
    if let Some(since) = obs.leader_since {
        let ready_at = since + ops.vote_lease + Duration::from_millis(20);
        if ready_at > deadline {
            return Err(Error::Precondition(format!(
                "node {me} became leader {:?} ago; it can hand over {:?} after that",
                since.elapsed(),
                ops.vote_lease
            )));
        }
        tokio::time::sleep_until(ready_at.into()).await;
    }

    // (2) New reservations wait and reads confirm with a quorum round until this ends; puts
    // under way may commit for a while (their reservations die with this leader's term);
    // then every write waits.
    let started = Instant::now();
    ops.gate.set_handing_over(true);
    let _lease_back = LeaseBack(ops);
    let settled = settle_reservations(ops, started + (timeout / 2).min(QUIESCE_MAX)).await;
    if settled > 0 {
        tracing::info!(
            open = settled,
            "handing over with reservations still open: their puts fail and retry"
        );
    }
    let _hold = ops.proposer.hold();
    let outcome = hand_over(ops, target, &addr, term, deadline).await;
    match outcome {
        Ok(new_term) => {
            let t = Transferred {
                from: me,
                to: target,
                term: new_term,
                took: started.elapsed(),
            };
            tracing::info!(from = me, to = target, term = new_term, took = ?t.took, "leadership handed over");
            ops.metrics
                .leader_transfers
                .with_label_values(&["ok"])
                .inc();
            Ok(t)
        }
        Err(e) => {
            tracing::warn!(to = target, error = %e, "leadership hand-over failed");
            ops.metrics
                .leader_transfers
                .with_label_values(&["failed"])
                .inc();
            Err(e)
        }
    }
}

/// The longest a hand-over waits for open reservations to be committed or aborted.
const QUIESCE_MAX: Duration = Duration::from_secs(2);

/// Waits until this leader holds no open reservation (quarantined ones do not count) or until
/// `until`; returns how many are still open.
async fn settle_reservations(ops: &Ops, until: Instant) -> usize {
    loop {
        let open = ops.core.lock().leader().map_or(0, |l| {
            let r = l.reservations();
            r.len() - r.quarantined()
        });
        if open == 0 || Instant::now() >= until {
            return open;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Turns lease reads back on when the hand-over ends, however it ends.
struct LeaseBack<'a>(&'a Ops);

impl Drop for LeaseBack<'_> {
    fn drop(&mut self) {
        self.0.gate.set_handing_over(false);
    }
}

/// Each follower's acknowledged last log index, by openraft's replication metrics.
fn matched(ops: &Ops) -> BTreeMap<NodeId, u64> {
    let m = ops.raft.metrics();
    let m = m.borrow();
    m.replication
        .as_ref()
        .map(|r| {
            r.iter()
                .filter_map(|(id, l)| l.map(|l| (*id, l.index)))
                .collect()
        })
        .unwrap_or_default()
}

/// Steps (3) to (5): returns the new leader's term.
async fn hand_over(
    ops: &Ops,
    target: NodeId,
    addr: &str,
    term: u64,
    deadline: Instant,
) -> Result<u64> {
    let me = ops.id;
    let last = caught_up(ops, target, term, deadline).await?;
    let left = deadline.saturating_duration_since(Instant::now());
    let req = TimeoutNowRequest {
        leader_id: me,
        term,
        last_log_index: last,
    };
    let reply = ops
        .peers
        .timeout_now(addr, req, left.max(Duration::from_millis(100)))
        .await
        .map_err(Error::Precondition)?;
    if !reply.accepted {
        return Err(Error::Precondition(format!(
            "node {target} would not campaign: {}",
            reply.reason
        )));
    }
    let new_leader = |o: &Observed| o.term > term && o.leader.is_some_and(|l| l != me);
    let left = deadline.saturating_duration_since(Instant::now());
    ops.gate
        .wait_for(left, |o| new_leader(o) || o.state != ServerState::Leader)
        .await;
    // Once this replica has stepped down (it voted in the target's term), the target wins or
    // an election follows: a target that stopped meanwhile (a whole cluster stopping) must not
    // hold this one up for the rest of the time allowed.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .min(ops.vote_lease);
    let (obs, led) = ops.gate.wait_for(left, new_leader).await;
    if led {
        Ok(obs.term)
    } else {
        Err(Error::Precondition(format!(
            "node {target} campaigned but no new leader was seen within the time allowed \
             (now term {}, {:?}, leader {:?})",
            obs.term, obs.state, obs.leader
        )))
    }
}

/// Waits until `target` has acknowledged this leader's whole log; returns its last index.
async fn caught_up(ops: &Ops, target: NodeId, term: u64, deadline: Instant) -> Result<u64> {
    let mut rx = ops.raft.metrics();
    loop {
        let (state, now_term, last, acked) = {
            let m = rx.borrow_and_update();
            let acked = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&target).copied().flatten())
                .map(|l| l.index);
            (
                m.state,
                m.current_term,
                m.last_log_index.unwrap_or(0),
                acked,
            )
        };
        if state != ServerState::Leader || now_term != term {
            return Err(Error::Precondition(format!(
                "node {} stopped leading term {term} during the hand-over",
                ops.id
            )));
        }
        if acked == Some(last) {
            return Ok(last);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let changed = tokio::time::timeout(left, rx.changed()).await;
        if !matches!(changed, Ok(Ok(()))) {
            return Err(Error::Precondition(format!(
                "node {target} did not catch up with the log in time (it holds {acked:?} of {last})"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_most_caught_up_other_voter_is_picked_unless_one_is_named() {
        let voters = set(&[1, 2, 3]);
        let matched: BTreeMap<u64, u64> = [(2, 40), (3, 41)].into();
        assert_eq!(pick_target(1, &voters, &matched, None), Ok(3));
        // Equal logs: the lowest id; nothing acknowledged counts least.
        let matched: BTreeMap<u64, u64> = [(2, 41), (3, 41)].into();
        assert_eq!(pick_target(1, &voters, &matched, None), Ok(2));
        let matched: BTreeMap<u64, u64> = [(3, 1)].into();
        assert_eq!(pick_target(1, &voters, &matched, None), Ok(3));
        // A learner (4) is never picked; a named voter is, however far behind.
        let matched: BTreeMap<u64, u64> = [(2, 1), (3, 2), (4, 99)].into();
        assert_eq!(pick_target(1, &voters, &matched, None), Ok(3));
        assert_eq!(pick_target(1, &voters, &matched, Some(2)), Ok(2));
        assert!(pick_target(1, &voters, &matched, Some(4))
            .unwrap_err()
            .contains("not a voter"));
        assert!(pick_target(1, &voters, &matched, Some(1))
            .unwrap_err()
            .contains("already leads"));
        assert!(pick_target(1, &set(&[1]), &BTreeMap::new(), None)
            .unwrap_err()
            .contains("only voter"));
    }

    #[test]
    fn a_follower_campaigns_only_for_its_own_leader_in_its_term_with_the_whole_log() {
        let req = TimeoutNowRequest {
            leader_id: 1,
            term: 7,
            last_log_index: 100,
        };
        let f = ServerState::Follower;
        assert_eq!(timeout_now_refusal(&req, f, 7, Some(1), 100, true), None);
        assert_eq!(timeout_now_refusal(&req, f, 7, Some(1), 101, true), None);
        let refused = |state, term, leader, last, voter| {
            timeout_now_refusal(&req, state, term, leader, last, voter).is_some()
        };
        assert!(refused(f, 7, Some(1), 99, true), "a shorter log");
        assert!(refused(f, 8, Some(1), 100, true), "another term");
        assert!(refused(f, 7, Some(2), 100, true), "another leader");
        assert!(refused(f, 7, None, 100, true), "no leader");
        assert!(refused(ServerState::Candidate, 7, Some(1), 100, true));
        assert!(refused(ServerState::Leader, 7, Some(1), 100, true));
        assert!(refused(f, 7, Some(1), 100, false), "a learner");
    }
}
