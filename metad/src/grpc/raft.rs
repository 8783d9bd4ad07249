//! The `Raft` gRPC service: hands peers' messages to the local openraft instance.
//!
//! Every message is checked before openraft sees it (issue 14, findings 1 and 2):
//! * **Terms and log positions are sane.** openraft computes `term + 1` when it campaigns and
//!   unwraps the result of adopting that vote: one `Vote` with term 2^64-1, once persisted,
//!   panics the replica at its next election timeout and on every restart. So a message whose
//!   vote term is above the local term plus [`TERM_LEAP`] (a real candidate's term grows by one
//!   per election) or above [`CEILING`], a log id above [`CEILING`], or a log id whose term is
//!   above the message's own vote term (no real leader or candidate holds one) is refused with
//!   `INVALID_ARGUMENT`.
//! * **The sender is a member.** The sender (the vote's `voted_for`) must appear in this
//!   replica's effective membership, in any of its joint configs or among its nodes (voters and
//!   learners); otherwise `PERMISSION_DENIED`. A replica whose membership is still empty (a
//!   fresh member waiting to be added, or before bootstrap completes) accepts any sender, or it
//!   could never join; a member being added is already in the leader's membership, and the
//!   leader in its. Likewise a replica missing from its own membership (one being added that
//!   installed a snapshot older than its addition, whose membership names the members before
//!   it): its membership is stale, and refusing the leader would keep it so.
//!
//! Both are checks on what a sender claims. Authentication is the peer credential
//! (`--peer-token-file`, checked by `regolith_proto::auth::PeerCheck` before this service
//! runs): with it, only replicas can send Raft messages at all; without it, every cluster-token
//! holder can, and these checks are what is left.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::Vote;
use regolith_proto::raft::raft_server::Raft as RaftRpc;
use regolith_proto::raft::{RaftMessage, TimeoutNowReply, TimeoutNowRequest};
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::network::{decode, encode};
use crate::raft_types::{LogId, NodeId, Raft, TypeConfig};
use crate::transfer::timeout_now_refusal;

/// How far above the local term a peer's term may be: a real candidate's term grows by one per
/// election, so 2^40 elections (thousands of years of election timeouts) never come from a
/// real peer, however long it was cut off; a tighter bound would lock out a member that
/// campaigned alone through a long partition (its replies' higher vote would then keep
/// deposing the leader).
pub const TERM_LEAP: u64 = 1 << 40;

/// No term or log index above this is sane (2^62: no cluster gets there by elections or
/// appends), whatever the local term.
pub const CEILING: u64 = 1 << 62;

pub struct RaftService {
    pub raft: Raft,
    pub metrics: Arc<Metrics>,
    /// Fires when this replica is asked to stop: it then campaigns for no one's hand-over.
    stopping: regolith_proto::shutdown::Shutdown,
    /// Rate limit of the refusal warnings: the second of the last one, and how many were
    /// left out since.
    last_warn_s: AtomicU64,
    suppressed: AtomicU64,
}

fn reply<T: serde::Serialize>(v: &T) -> Result<Response<RaftMessage>, Status> {
    encode(v)
        .map(|payload| Response::new(RaftMessage { payload }))
        .map_err(|e| Status::internal(e.to_string()))
}

/// Why a message was refused: the metric's `reason` label and the gRPC status.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    TermOutOfRange(String),
    LogIdOutOfRange(String),
    NoSender(String),
    NotAMember(String),
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TermOutOfRange(_) => "term_out_of_range",
            Refusal::LogIdOutOfRange(_) => "log_id_out_of_range",
            Refusal::NoSender(_) => "no_sender",
            Refusal::NotAMember(_) => "not_a_member",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Refusal::TermOutOfRange(m)
            | Refusal::LogIdOutOfRange(m)
            | Refusal::NoSender(m)
            | Refusal::NotAMember(m) => m,
        }
    }

    fn status(&self) -> Status {
        match self {
            Refusal::NotAMember(m) | Refusal::NoSender(m) => Status::permission_denied(m.clone()),
            Refusal::TermOutOfRange(m) | Refusal::LogIdOutOfRange(m) => {
                Status::invalid_argument(m.clone())
            }
        }
    }
}

/// What a replica knows of itself when it checks a message: its id, its term (the larger of
/// `current_term` and its vote's term), and its membership: every id in its nodes and joint
/// configs, `None` while it has none.
pub struct Local {
    pub id: NodeId,
    pub term: u64,
    pub members: Option<std::collections::BTreeSet<NodeId>>,
}

impl Local {
    pub fn of(raft: &Raft) -> Self {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let mut members: std::collections::BTreeSet<NodeId> =
            membership.nodes().map(|(id, _)| *id).collect();
        for c in membership.get_joint_config() {
            members.extend(c.iter().copied());
        }
        Local {
            id: m.id,
            term: m.current_term.max(m.vote.leader_id().term),
            members: (!members.is_empty()).then_some(members),
        }
    }
}

/// Checks a message's vote and the log ids it carries (see the module doc).
pub fn check(
    local: &Local,
    rpc: &str,
    vote: &Vote<NodeId>,
    log_ids: impl IntoIterator<Item = Option<LogId>>,
) -> Result<(), Refusal> {
    let term = vote.leader_id().term;
    let sender = vote.leader_id().voted_for();
    let who = match sender {
        Some(s) => format!("node {s}"),
        None => "a sender naming no node".to_string(),
    };
    let me = local.id;
    let bound = local.term.saturating_add(TERM_LEAP).min(CEILING);
    if term > bound {
        return Err(Refusal::TermOutOfRange(format!(
            "metad {me}: {rpc} from {who} refused: term {term} is beyond this replica's term {} \
             by more than {TERM_LEAP} (or above {CEILING})",
            local.term
        )));
    }
    for l in log_ids.into_iter().flatten() {
        let (lt, li) = (l.leader_id.term, l.index);
        if lt > term || li > CEILING {
            return Err(Refusal::LogIdOutOfRange(format!(
                "metad {me}: {rpc} from {who} refused: log id {lt}-{li} is above the message's \
                 term {term} (or its index above {CEILING})"
            )));
        }
    }
    let Some(members) = &local.members else {
        return Ok(()); // not yet a member of anything: whoever adds us speaks first
    };
    if !members.contains(&me) {
        // A membership without this replica predates it: a member being added that restored
        // a snapshot older than its own addition (seen with a million objects, where the
        // snapshot takes seconds) must hear the leader that adds it, as a fresh one does.
        return Ok(());
    }
    let Some(sender) = sender else {
        return Err(Refusal::NoSender(format!(
            "metad {me}: {rpc} at term {term} refused: the vote names no sender"
        )));
    };
    if !members.contains(&sender) {
        return Err(Refusal::NotAMember(format!(
            "metad {me}: {rpc} at term {term} from node {sender} refused: node {sender} is not \
             in this replica's membership {members:?}"
        )));
    }
    Ok(())
}

impl RaftService {
    pub fn new(raft: Raft, metrics: Arc<Metrics>) -> Self {
        Self {
            raft,
            metrics,
            stopping: regolith_proto::shutdown::Shutdown::never(),
            last_warn_s: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Refuses `TimeoutNow` once `stopping` fires (SIGTERM received).
    pub fn with_stopping(mut self, stopping: regolith_proto::shutdown::Shutdown) -> Self {
        self.stopping = stopping;
        self
    }

    fn admit(
        &self,
        rpc: &'static str,
        vote: &Vote<NodeId>,
        log_ids: impl IntoIterator<Item = Option<LogId>>,
    ) -> Result<(), Status> {
        let local = Local::of(&self.raft);
        let Err(refusal) = check(&local, rpc, vote, log_ids) else {
            return Ok(());
        };
        self.metrics
            .raft_rejected
            .with_label_values(&[rpc, refusal.reason()])
            .inc();
        // At most one warning a second; the others are counted in the next one.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let last = self.last_warn_s.load(Ordering::Relaxed);
        if now != last
            && self
                .last_warn_s
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::warn!(
                rpc,
                reason = refusal.reason(),
                suppressed,
                "{}",
                refusal.message()
            );
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        Err(refusal.status())
    }
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        let ids = [rpc.prev_log_id, rpc.leader_commit]
            .into_iter()
            .chain(rpc.entries.iter().map(|e| Some(e.log_id)));
        self.admit("append_entries", &rpc.vote, ids)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc: VoteRequest<NodeId> =
            decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        self.admit("vote", &rpc.vote, [rpc.last_log_id])?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> =
            decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        self.admit(
            "install_snapshot",
            &rpc.vote,
            [rpc.meta.last_log_id, *rpc.meta.last_membership.log_id()],
        )?;
        reply(&self.raft.install_snapshot(rpc).await)
    }

    /// A leader handing over asks this replica to campaign now (`crate::transfer`).
    async fn timeout_now(
        &self,
        req: Request<TimeoutNowRequest>,
    ) -> Result<Response<TimeoutNowReply>, Status> {
        let req = req.into_inner();
        let refusal = if self.stopping.is_shutdown() {
            Some("this replica is stopping".to_string())
        } else {
            let m = self.raft.metrics();
            let m = m.borrow();
            let voter = m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == m.id);
            timeout_now_refusal(
                &req,
                m.state,
                m.current_term,
                m.current_leader,
                m.last_log_index.unwrap_or(0),
                voter,
            )
        };
        if let Some(reason) = refusal {
            tracing::info!(leader = req.leader_id, term = req.term, %reason, "TimeoutNow refused");
            return Ok(Response::new(TimeoutNowReply {
                accepted: false,
                reason,
            }));
        }
        tracing::info!(
            leader = req.leader_id,
            term = req.term,
            "TimeoutNow: the leader hands over; campaigning now"
        );
        self.raft
            .trigger()
            .elect()
            .await
            .map_err(|e| Status::unavailable(format!("raft stopped: {e}")))?;
        Ok(Response::new(TimeoutNowReply {
            accepted: true,
            reason: String::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn lid(term: u64, index: u64) -> Option<LogId> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    #[test]
    fn terms_beyond_the_leap_or_the_ceiling_and_log_ids_above_the_term_are_refused() {
        let local = Local {
            id: 1,
            term: 7,
            members: None,
        };
        let ok =
            |term: u64, ids: Vec<Option<LogId>>| check(&local, "vote", &Vote::new(term, 2), ids);
        assert_eq!(ok(0, vec![None]), Ok(()));
        assert_eq!(ok(8, vec![lid(7, 100)]), Ok(()));
        assert_eq!(ok(7 + TERM_LEAP, vec![lid(7 + TERM_LEAP, 1)]), Ok(()));
        let e = ok(8 + TERM_LEAP, vec![]).unwrap_err();
        assert_eq!(e.reason(), "term_out_of_range");
        assert!(e.message().contains(&(8 + TERM_LEAP).to_string()), "{e:?}");
        assert!(
            e.message().contains("node 2") && e.message().contains("metad 1"),
            "{e:?}"
        );
        assert_eq!(
            ok(u64::MAX, vec![]).unwrap_err().reason(),
            "term_out_of_range"
        );
        assert_eq!(
            ok(8, vec![lid(9, 1)]).unwrap_err().reason(),
            "log_id_out_of_range"
        );
        assert_eq!(
            ok(8, vec![lid(8, u64::MAX)]).unwrap_err().reason(),
            "log_id_out_of_range"
        );
        // A local term near the top does not lift the ceiling.
        let high = Local {
            id: 1,
            term: u64::MAX - 1,
            members: None,
        };
        let e = check(&high, "vote", &Vote::new(u64::MAX, 2), [None]).unwrap_err();
        assert_eq!(e.reason(), "term_out_of_range");
    }

    #[test]
    fn senders_outside_a_known_membership_are_refused_and_an_empty_one_accepts_all() {
        let members = Local {
            id: 1,
            term: 3,
            members: Some([1, 2, 3, 4].into_iter().collect()),
        };
        assert_eq!(check(&members, "vote", &Vote::new(4, 2), [None]), Ok(()));
        assert_eq!(check(&members, "vote", &Vote::new(4, 4), [None]), Ok(()));
        let e = check(&members, "vote", &Vote::new(4, 99), [None]).unwrap_err();
        assert_eq!(e.reason(), "not_a_member");
        assert!(
            e.message().contains("node 99") && e.message().contains("metad 1"),
            "{e:?}"
        );
        let e = check(&members, "append_entries", &Vote::default(), [None]).unwrap_err();
        assert_eq!(e.reason(), "no_sender");
        // A replica being added that restored an older snapshot: its membership predates it.
        let stale = Local {
            id: 10,
            term: 75,
            members: Some([1, 5, 7].into_iter().collect()),
        };
        assert_eq!(
            check(
                &stale,
                "append_entries",
                &Vote::new_committed(75, 8),
                [None]
            ),
            Ok(())
        );
        // The term checks still apply to it.
        let e = check(&stale, "vote", &Vote::new(u64::MAX, 8), [None]).unwrap_err();
        assert_eq!(e.reason(), "term_out_of_range");
        let fresh = Local {
            id: 5,
            term: 0,
            members: None,
        };
        assert_eq!(
            check(&fresh, "append_entries", &Vote::new_committed(3, 1), [None]),
            Ok(())
        );
        // The term check still applies to a fresh replica.
        let e = check(&fresh, "vote", &Vote::new(u64::MAX, 99), [None]).unwrap_err();
        assert_eq!(e.reason(), "term_out_of_range");
    }
}
