//! The Raft network between metad replicas: openraft messages as bincode in the `Raft` gRPC
//! service (`proto/raft.proto`), each payload led by a one-byte format version.
//!
//! AppendEntries are capped by bytes: when the entries openraft hands over serialize to more
//! than the cap, only the prefix that fits is sent and a success is reported to openraft as
//! `PartialSuccess`, so it sends the rest next.
//!
//! A new leader does not know how much of its log a follower holds: openraft 0.9 probes from the
//! middle of the unpurged log *with the entries*, so a follower that holds all of it (the usual
//! case after a failover) was sent half a snapshot's worth of log again before the new leader's
//! first entry could commit (~0.5 s at a million objects, growing with the state). Each peer's
//! vote answer names its last log id ([`PeerLogs`]); when an AppendEntries carries that entry
//! (same index, same term: by Raft's log matching the follower then holds every entry before
//! it), an empty AppendEntries whose previous entry is that one asks the follower first. Its
//! success is reported to openraft as `PartialSuccess` up to that entry (or `Success` when it
//! was the last one sent); a refusal sends the original request. Only the follower's answer
//! counts, never what the vote said, so a stale vote answer costs one round trip, not safety.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Entry, LogId};
use parking_lot::Mutex;
use regolith_proto::auth::PeerInterceptor;
use regolith_proto::raft::raft_client::RaftClient;
use regolith_proto::raft::RaftMessage;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::elect::Outlogged;
use crate::raft_types::{NodeId, TypeConfig};

/// Format version of Raft payloads.
pub const PAYLOAD_VERSION: u8 = 1;

/// Room for the request's own fields beside its entries.
const OVERHEAD: usize = 4096;

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, bincode::Error> {
    let mut out = Vec::with_capacity(64);
    out.push(PAYLOAD_VERSION);
    bincode::serialize_into(&mut out, v)?;
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    match b.split_first() {
        Some((&PAYLOAD_VERSION, rest)) => {
            bincode::deserialize(rest).map_err(|e| format!("undecodable Raft payload: {e}"))
        }
        Some((v, _)) => Err(format!(
            "Raft payload format {v} not supported (this build speaks {PAYLOAD_VERSION})"
        )),
        None => Err("empty Raft payload".into()),
    }
}

#[derive(Clone)]
pub struct Network {
    pub interceptor: PeerInterceptor,
    pub max_message_bytes: usize,
    /// Bytes of entries one AppendEntries carries (at least one entry). openraft gives an
    /// AppendEntries one heartbeat interval, retrying the same range when it runs out: a
    /// range of many MiB that cannot be sent and fsynced in that time never commits and
    /// starves heartbeats into elections (a flood of 512 KiB metadata-KV writes did that).
    pub append_budget_bytes: usize,
    pub connect_timeout: Duration,
    /// Told when a peer refuses this replica's vote for holding a longer log.
    pub outlogged: Outlogged,
    /// Mutual TLS to the peers, when the replica serves TLS.
    pub tls: Option<regolith_proto::tls::Tls>,
    /// The peers' last log ids from their vote answers, and what was sent.
    pub logs: PeerLogs,
}

/// Each peer's last log id as its latest vote answer gave it, and counts of what this replica's
/// AppendEntries carried; shared by the clients of the Raft core and of its replication streams.
#[derive(Clone, Default)]
pub struct PeerLogs {
    last: Arc<Mutex<HashMap<NodeId, LogId<NodeId>>>>,
    stats: Arc<SendStats>,
}

/// Totals since start, for the metrics.
#[derive(Debug, Default)]
pub struct SendStats {
    /// Entries carried by AppendEntries this replica sent.
    pub entries_sent: AtomicU64,
    /// Probes a follower answered holding the entry asked about...
    pub probes_matched: AtomicU64,
    /// ...and those it refused (the original request was sent after them).
    pub probes_refused: AtomicU64,
}

impl PeerLogs {
    fn saw(&self, peer: NodeId, last: LogId<NodeId>) {
        self.last.lock().insert(peer, last);
    }

    fn forget(&self, peer: NodeId) {
        self.last.lock().remove(&peer);
    }

    fn last_of(&self, peer: NodeId) -> Option<LogId<NodeId>> {
        self.last.lock().get(&peer).copied()
    }

    pub fn stats(&self) -> &SendStats {
        &self.stats
    }
}

/// The entry of `entries` (contiguous, ascending) that a follower whose last log id is `known`
/// holds with everything before it: `known` itself when it is among them with the same term, or
/// the last entry when `known` lies at or past it (the probe then asks about that one). None
/// when the follower holds none of them or its entry at that index is of another term.
fn probe_point(
    known: Option<LogId<NodeId>>,
    entries: &[Entry<TypeConfig>],
) -> Option<LogId<NodeId>> {
    let known = known?;
    let first = entries.first()?.log_id.index;
    let last = entries.last()?.log_id;
    if known.index < first {
        return None;
    }
    if known.index >= last.index {
        return Some(last);
    }
    let at = usize::try_from(known.index - first).ok()?;
    let e = entries.get(at)?;
    (e.log_id == known).then_some(known)
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let client = Endpoint::from_shared(format!("http://{}", node.addr))
            .ok()
            .map(|ep| {
                let ep = ep.connect_timeout(self.connect_timeout).tcp_nodelay(true);
                let ch = regolith_proto::tls::channel(ep, self.tls.as_ref());
                RaftClient::with_interceptor(ch, self.interceptor.clone())
                    .max_decoding_message_size(self.max_message_bytes + OVERHEAD)
                    .max_encoding_message_size(self.max_message_bytes + OVERHEAD)
            });
        Peer {
            target,
            addr: node.addr.clone(),
            client,
            max_bytes: self.append_budget_bytes.min(self.max_message_bytes),
            outlogged: self.outlogged.clone(),
            logs: self.logs.clone(),
        }
    }
}

pub struct Peer {
    target: NodeId,
    addr: String,
    client: Option<RaftClient<InterceptedService<Channel, PeerInterceptor>>>,
    max_bytes: usize,
    outlogged: Outlogged,
    logs: PeerLogs,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        which: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other(format!("bad peer address {:?}", self.addr)),
            )));
        };
        let payload = encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let msg = RaftMessage { payload };
        let fut = async {
            match which {
                Rpc::Append => client.append_entries(msg).await,
                Rpc::Vote => client.vote(msg).await,
                Rpc::Snapshot => client.install_snapshot(msg).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{which:?} to {} timed out after {ttl:?}", self.addr),
                    ),
                )))
            }
            Ok(Err(status)) => return Err(status_error(&self.addr, status)),
            Ok(Ok(r)) => r.into_inner(),
        };
        let res: Result<Resp, RaftError<NodeId, E>> = decode(&reply.payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Copy, Clone, Debug)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

fn status_error<E: std::error::Error>(addr: &str, s: tonic::Status) -> RpcErr<E> {
    let io = std::io::Error::other(format!("{addr}: {:?}: {}", s.code(), s.message()));
    match s.code() {
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled
        | tonic::Code::Unknown => RPCError::Unreachable(Unreachable::new(&io)),
        _ => RPCError::Network(NetworkError::new(&io)),
    }
}

/// How many leading entries fit in `max_bytes` (at least one).
fn entries_that_fit(req: &AppendEntriesRequest<TypeConfig>, max_bytes: usize) -> usize {
    let mut total = OVERHEAD;
    for (i, e) in req.entries.iter().enumerate() {
        total += bincode::serialized_size(e).unwrap_or(u64::MAX) as usize;
        if total > max_bytes {
            return i.max(1);
        }
    }
    req.entries.len()
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let last_sent = rpc.entries.last().map(|e| e.log_id);
        if let Some(held) = probe_point(self.logs.last_of(self.target), &rpc.entries) {
            let probe = AppendEntriesRequest::<TypeConfig> {
                vote: rpc.vote,
                prev_log_id: Some(held),
                leader_commit: rpc.leader_commit,
                entries: Vec::new(),
            };
            let resp: AppendEntriesResponse<NodeId> =
                self.call(Rpc::Append, &probe, option.hard_ttl()).await?;
            match resp {
                AppendEntriesResponse::Success => {
                    self.logs
                        .stats
                        .probes_matched
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(if Some(held) == last_sent {
                        AppendEntriesResponse::Success
                    } else {
                        AppendEntriesResponse::PartialSuccess(Some(held))
                    });
                }
                AppendEntriesResponse::HigherVote(v) => {
                    return Ok(AppendEntriesResponse::HigherVote(v))
                }
                _ => {
                    self.logs
                        .stats
                        .probes_refused
                        .fetch_add(1, Ordering::Relaxed);
                    self.logs.forget(self.target);
                }
            }
        }
        let fit = entries_that_fit(&rpc, self.max_bytes);
        let truncated = fit < rpc.entries.len();
        if truncated {
            rpc.entries.truncate(fit);
        }
        let last = rpc.entries.last().map(|e| e.log_id);
        let sent = rpc.entries.len() as u64;
        let resp: AppendEntriesResponse<NodeId> =
            self.call(Rpc::Append, &rpc, option.hard_ttl()).await?;
        self.logs
            .stats
            .entries_sent
            .fetch_add(sent, Ordering::Relaxed);
        Ok(match resp {
            AppendEntriesResponse::Success if truncated => {
                AppendEntriesResponse::PartialSuccess(last)
            }
            other => other,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(Rpc::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let resp: VoteResponse<NodeId> = self.call(Rpc::Vote, &rpc, option.hard_ttl()).await?;
        if let Some(last) = resp.last_log_id {
            self.logs.saw(self.target, last);
        }
        if !resp.vote_granted && resp.last_log_id > rpc.last_log_id {
            self.outlogged.saw(rpc.vote.leader_id().term);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Batch, Command};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    fn append_of(values: &[usize]) -> AppendEntriesRequest<TypeConfig> {
        let entries = values
            .iter()
            .enumerate()
            .map(|(i, len)| Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), i as u64 + 1),
                payload: EntryPayload::Normal(Batch(vec![Command::MetaPut {
                    key: format!("k{i}"),
                    value: vec![7; *len],
                }])),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries,
        }
    }

    #[test]
    fn an_append_carries_entries_up_to_its_budget_and_always_one() {
        // Eight 512 KiB metadata writes, as a flood of them queues at a follower.
        let req = append_of(&[512 << 10; 8]);
        assert_eq!(entries_that_fit(&req, 1 << 20), 1);
        assert_eq!(entries_that_fit(&req, 2 << 20), 3);
        assert_eq!(entries_that_fit(&req, 16 << 20), 8);
        // An entry above the budget still goes, alone.
        assert_eq!(entries_that_fit(&append_of(&[2 << 20, 10]), 1 << 20), 1);
        assert_eq!(entries_that_fit(&append_of(&[10, 10, 10]), 1 << 20), 3);
    }

    fn log(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// Entries `first..=last`, of term 2 up to `term2_to` and term 3 after it.
    fn entries(first: u64, last: u64, term2_to: u64) -> Vec<Entry<TypeConfig>> {
        (first..=last)
            .map(|i| Entry {
                log_id: log(if i <= term2_to { 2 } else { 3 }, i),
                payload: EntryPayload::Blank,
            })
            .collect()
    }

    #[test]
    fn a_probe_asks_about_the_entry_the_followers_vote_named_when_the_leader_sent_the_same() {
        let sent = entries(101, 200, 190);
        // The follower voted holding 2-150: it has 101..=150 as sent.
        assert_eq!(probe_point(Some(log(2, 150)), &sent), Some(log(2, 150)));
        // At or past the last entry sent: ask about the last one.
        assert_eq!(probe_point(Some(log(3, 200)), &sent), Some(log(3, 200)));
        assert_eq!(probe_point(Some(log(2, 250)), &sent), Some(log(3, 200)));
        // Its entry at 195 is of term 2 where the leader's is of term 3: it diverges there.
        assert_eq!(probe_point(Some(log(2, 195)), &sent), None);
        // It holds nothing of what is sent, or nothing is known, or nothing is sent.
        assert_eq!(probe_point(Some(log(2, 100)), &sent), None);
        assert_eq!(probe_point(None, &sent), None);
        assert_eq!(probe_point(Some(log(2, 150)), &[]), None);
    }
}
