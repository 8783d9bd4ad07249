//! The `Metad` gRPC service (`proto/metad.proto`): a translation layer between the wire and
//! [`crate::ops`]. Every call is answered by the leader; followers answer `NOT_LEADER` with the
//! leader's address.

use std::collections::BTreeSet;
use std::sync::Arc;

use openraft::{BasicNode, ChangeMembers};
use regolith_proto::leader::not_leader;
use regolith_proto::metad as pb;
use regolith_proto::metad::metad_server::Metad;
use tonic::{Request, Response, Status};

use crate::command::{Command, Outcome};
use crate::config::{
    LIST_KEYS_DEFAULT, LIST_KEYS_MAX, MAX_ADDR_LEN, MAX_DATA_ADDRS, MAX_HEARTBEAT_LIST,
    MAX_NODE_NAME, MAX_SEGMENT_BYTES,
};
use crate::error::Error;
use crate::grpc::convert;
use crate::ops::Ops;
use crate::types::{SegmentId, SegmentState, UnmountReason};

pub struct MetadService {
    pub ops: Arc<Ops>,
}

type Reply<T> = Result<Response<T>, Status>;

/// The gRPC status of an error that ends a whole call.
fn status(e: Error) -> Status {
    match e {
        Error::NotLeader { leader } => not_leader(
            leader
                .map(|(id, addr)| regolith_proto::leader::LeaderHint { id, addr })
                .as_ref(),
        ),
        Error::InvalidArgument(m) => Status::invalid_argument(m),
        Error::NotFound { .. } => Status::not_found(e.to_string()),
        Error::NotReady(_) | Error::NoLeaderState | Error::Raft(_) => {
            Status::unavailable(e.to_string())
        }
        other => Status::internal(other.to_string()),
    }
}

impl MetadService {
    fn count(&self, rpc: &'static str) {
        self.ops
            .metrics
            .rpc_requests
            .with_label_values(&[rpc])
            .inc();
    }

    fn failed<T>(&self, rpc: &'static str, r: Reply<T>) -> Reply<T> {
        if let Err(s) = &r {
            self.ops
                .metrics
                .rpc_failures
                .with_label_values(&[rpc, &format!("{:?}", s.code())])
                .inc();
        }
        r
    }

    async fn leader(&self) -> Result<(), Status> {
        self.ops.leader().await.map(|_| ()).map_err(status)
    }

    async fn read(&self) -> Result<(), Status> {
        self.ops.read().await.map_err(status)
    }

    async fn propose(&self, cmd: Command) -> Result<Outcome, Status> {
        self.ops.propose(cmd).await.map_err(status)
    }

    fn check_keys(&self, keys: &[String]) -> Result<(), Status> {
        self.ops.check_keys(keys).map_err(status)
    }

    async fn reserve_items(
        &self,
        items: &[pb::ReserveRequest],
    ) -> Result<Vec<pb::ReserveResponse>, Status> {
        let reqs: Vec<_> = items.iter().map(convert::put_request).collect();
        let out = self.ops.reserve(&reqs).await.map_err(status)?;
        Ok(out
            .iter()
            .map(|r| convert::reserve_response(r, self.ops.id))
            .collect())
    }

    async fn commit_items(
        &self,
        items: &[pb::CommitRequest],
    ) -> Result<Vec<pb::CommitResponse>, Status> {
        let items: Vec<_> = items.iter().map(convert::commit_item).collect();
        let out = self.ops.commit(&items).await.map_err(status)?;
        Ok(out
            .iter()
            .map(|c| pb::CommitResponse {
                status: Some(convert::committed(c)),
            })
            .collect())
    }

    fn placements(
        &self,
        keys: &[String],
        requester: u64,
    ) -> Result<Vec<pb::ObjectPlacement>, Status> {
        let now = self.ops.clock.now();
        let mut core = self.ops.core.lock();
        let Some((l, sm)) = core.leader_parts() else {
            return Err(status(Error::NoLeaderState));
        };
        Ok(l.get(sm, keys, requester, now)
            .iter()
            .zip(keys)
            .map(|(p, k)| match p {
                Some(p) => convert::placement(p),
                None => convert::not_found(k),
            })
            .collect())
    }

    fn members_reply(&self) -> pb::MembersResponse {
        convert::members(&self.ops.members())
    }
}

fn validate_mount(r: &pb::MountSegmentRequest) -> Result<(), Status> {
    if r.node_name.is_empty()
        || r.node_name.len() > MAX_NODE_NAME
        || r.node_name.chars().any(|c| c.is_control())
    {
        return Err(Status::invalid_argument(format!(
            "node name {:?} must be 1..={MAX_NODE_NAME} printable characters",
            r.node_name
        )));
    }
    if r.capacity > MAX_SEGMENT_BYTES {
        return Err(Status::invalid_argument(format!(
            "segment of {} bytes for {:?} is implausibly large",
            r.capacity, r.node_name
        )));
    }
    if r.data_addrs.len() > MAX_DATA_ADDRS {
        return Err(Status::invalid_argument(format!(
            "more than {MAX_DATA_ADDRS} data-plane addresses"
        )));
    }
    for a in &r.data_addrs {
        if a.len() > MAX_ADDR_LEN || !a.contains(':') {
            return Err(Status::invalid_argument(format!(
                "data-plane address {a:?} must be HOST:PORT"
            )));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl Metad for MetadService {
    async fn mount_segment(
        &self,
        req: Request<pb::MountSegmentRequest>,
    ) -> Reply<pb::MountSegmentResponse> {
        self.count("mount_segment");
        let r = async {
            let r = req.into_inner();
            validate_mount(&r)?;
            self.leader().await?;
            let cmd = Command::MountSegment {
                node_name: r.node_name.clone(),
                node_id_hint: r.node_id,
                capacity: r.capacity,
                data_addrs: r.data_addrs,
                now_ms: self.ops.clock.now().wall_ms,
            };
            match self.propose(cmd).await? {
                Outcome::Mounted { node_id, generation, dropped } => {
                    tracing::info!(node = %r.node_name, node_id, generation, capacity = r.capacity, dropped, "segment mounted");
                    Ok(Response::new(pb::MountSegmentResponse { node_id, generation, term: self.ops.gate.observed().term }))
                }
                other => Err(Status::internal(format!("mount answered {other:?}"))),
            }
        }
        .await;
        self.failed("mount_segment", r)
    }

    async fn unmount_segment(
        &self,
        req: Request<pb::UnmountSegmentRequest>,
    ) -> Reply<pb::UnmountSegmentResponse> {
        self.count("unmount_segment");
        let r = async {
            let r = req.into_inner();
            self.leader().await?;
            let segment = SegmentId {
                node: r.node_id,
                generation: r.generation,
            };
            match self
                .propose(Command::UnmountSegment {
                    segment,
                    reason: UnmountReason::Graceful,
                })
                .await?
            {
                Outcome::Unmounted { dropped } => Ok(Response::new(pb::UnmountSegmentResponse {
                    dropped_objects: dropped,
                })),
                Outcome::Ignored(_) => Ok(Response::new(pb::UnmountSegmentResponse {
                    dropped_objects: 0,
                })),
                other => Err(Status::internal(format!("unmount answered {other:?}"))),
            }
        }
        .await;
        self.failed("unmount_segment", r)
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Reply<pb::HeartbeatResponse> {
        self.count("heartbeat");
        let r = async {
            let r = req.into_inner();
            if r.in_flight.len() > MAX_HEARTBEAT_LIST || r.released.len() > MAX_HEARTBEAT_LIST {
                return Err(Status::invalid_argument("heartbeat lists too long"));
            }
            let obs = self.ops.leader().await.map_err(status)?;
            let hb = convert::heartbeat(&r);
            let now = self.ops.clock.now();
            let reply = {
                let mut core = self.ops.core.lock();
                let Some((l, sm)) = core.leader_parts() else {
                    return Err(status(Error::NoLeaderState));
                };
                l.heartbeat(sm, &hb, now)
            };
            Ok(Response::new(pb::HeartbeatResponse {
                term: obs.term,
                leader_id: self.ops.id,
                remount: reply.remount,
                unmounted: reply.unmounted,
                quarantined: reply
                    .quarantined
                    .into_iter()
                    .map(convert::version)
                    .collect(),
                draining: reply.draining,
            }))
        }
        .await;
        self.failed("heartbeat", r)
    }

    async fn reserve(&self, req: Request<pb::ReserveRequest>) -> Reply<pb::ReserveResponse> {
        self.count("reserve");
        let r = async {
            let item = req.into_inner();
            let mut out = self.reserve_items(std::slice::from_ref(&item)).await?;
            Ok(Response::new(out.pop().unwrap_or_default()))
        }
        .await;
        self.failed("reserve", r)
    }

    async fn batch_reserve(
        &self,
        req: Request<pb::BatchReserveRequest>,
    ) -> Reply<pb::BatchReserveResponse> {
        self.count("batch_reserve");
        let r = async {
            let items = req.into_inner().items;
            Ok(Response::new(pb::BatchReserveResponse {
                items: self.reserve_items(&items).await?,
            }))
        }
        .await;
        self.failed("batch_reserve", r)
    }

    async fn commit(&self, req: Request<pb::CommitRequest>) -> Reply<pb::CommitResponse> {
        self.count("commit");
        let r = async {
            let item = req.into_inner();
            let mut out = self.commit_items(std::slice::from_ref(&item)).await?;
            Ok(Response::new(out.pop().unwrap_or_default()))
        }
        .await;
        self.failed("commit", r)
    }

    async fn batch_commit(
        &self,
        req: Request<pb::BatchCommitRequest>,
    ) -> Reply<pb::BatchCommitResponse> {
        self.count("batch_commit");
        let r = async {
            let items = req.into_inner().items;
            Ok(Response::new(pb::BatchCommitResponse {
                items: self.commit_items(&items).await?,
            }))
        }
        .await;
        self.failed("batch_commit", r)
    }

    async fn abort(&self, req: Request<pb::AbortRequest>) -> Reply<pb::AbortResponse> {
        self.count("abort");
        let r = async {
            let versions: Vec<_> = req
                .into_inner()
                .versions
                .iter()
                .map(|v| crate::types::Version {
                    term: v.term,
                    id: v.id,
                })
                .collect();
            self.ops.abort(&versions).await.map_err(status)?;
            Ok(Response::new(pb::AbortResponse {}))
        }
        .await;
        self.failed("abort", r)
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Reply<pb::ObjectPlacement> {
        self.count("get");
        let r = async {
            let r = req.into_inner();
            if r.keys.len() != 1 {
                return Err(Status::invalid_argument(format!(
                    "Get takes one key, got {}; use BatchGet",
                    r.keys.len()
                )));
            }
            self.check_keys(&r.keys)?;
            self.read().await?;
            let mut p = self.placements(&r.keys, r.requester_node_id)?;
            Ok(Response::new(p.pop().unwrap_or_default()))
        }
        .await;
        self.failed("get", r)
    }

    async fn batch_get(&self, req: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        self.count("batch_get");
        let r = async {
            let r = req.into_inner();
            self.check_keys(&r.keys)?;
            self.read().await?;
            Ok(Response::new(pb::GetResponse {
                items: self.placements(&r.keys, r.requester_node_id)?,
            }))
        }
        .await;
        self.failed("batch_get", r)
    }

    async fn exists(&self, req: Request<pb::ExistsRequest>) -> Reply<pb::ExistsResponse> {
        self.count("exists");
        let r = async {
            let r = req.into_inner();
            self.check_keys(&r.keys)?;
            self.read().await?;
            let core = self.ops.core.lock();
            Ok(Response::new(pb::ExistsResponse {
                exists: r.keys.iter().map(|k| core.sm().contains(k)).collect(),
            }))
        }
        .await;
        self.failed("exists", r)
    }

    async fn batch_exists(&self, req: Request<pb::ExistsRequest>) -> Reply<pb::ExistsResponse> {
        self.exists(req).await
    }

    async fn remove(&self, req: Request<pb::RemoveRequest>) -> Reply<pb::RemoveResponse> {
        self.count("remove");
        let r = async {
            let keys = req.into_inner().keys;
            self.check_keys(&keys)?;
            self.leader().await?;
            match self.propose(Command::Remove { keys }).await? {
                Outcome::Removed(found) => Ok(Response::new(pb::RemoveResponse {
                    codes: found
                        .into_iter()
                        .map(|f| {
                            if f {
                                pb::Code::Ok as i32
                            } else {
                                pb::Code::NotFound as i32
                            }
                        })
                        .collect(),
                })),
                other => Err(Status::internal(format!("remove answered {other:?}"))),
            }
        }
        .await;
        self.failed("remove", r)
    }

    async fn remove_all(
        &self,
        _req: Request<pb::RemoveAllRequest>,
    ) -> Reply<pb::RemoveAllResponse> {
        self.count("remove_all");
        let r = async {
            self.leader().await?;
            match self.propose(Command::RemoveAll).await? {
                Outcome::RemovedAll(n) => Ok(Response::new(pb::RemoveAllResponse { removed: n })),
                other => Err(Status::internal(format!("remove_all answered {other:?}"))),
            }
        }
        .await;
        self.failed("remove_all", r)
    }

    async fn stats(&self, _req: Request<pb::StatsRequest>) -> Reply<pb::StatsResponse> {
        self.count("stats");
        let r = async {
            self.read().await?;
            Ok(Response::new(convert::stats(&self.ops.stats())))
        }
        .await;
        self.failed("stats", r)
    }

    async fn list_segments(
        &self,
        _req: Request<pb::ListSegmentsRequest>,
    ) -> Reply<pb::ListSegmentsResponse> {
        self.count("list_segments");
        let r = async {
            self.read().await?;
            let now = self.ops.clock.now();
            let core = self.ops.core.lock();
            let Some(l) = core.leader() else {
                return Err(status(Error::NoLeaderState));
            };
            let ttl = l.config().node_ttl_ms;
            let segments = core
                .sm()
                .segments()
                .map(|s| {
                    let silence = l.silence_ms(&s.id, now);
                    pb::SegmentInfo {
                        node_id: s.id.node,
                        node_name: s.name.clone(),
                        generation: s.id.generation,
                        capacity: s.capacity,
                        used: s.used,
                        data_addrs: s.data_addrs.clone(),
                        state: match s.state {
                            SegmentState::Active => pb::SegmentState::SegmentActive as i32,
                            SegmentState::Draining { .. } => {
                                pb::SegmentState::SegmentDraining as i32
                            }
                        },
                        last_heartbeat_ms_ago: silence,
                        alive: silence <= ttl,
                        objects: s.objects,
                    }
                })
                .collect();
            Ok(Response::new(pb::ListSegmentsResponse { segments }))
        }
        .await;
        self.failed("list_segments", r)
    }

    async fn list_keys(&self, req: Request<pb::ListKeysRequest>) -> Reply<pb::ListKeysResponse> {
        self.count("list_keys");
        let r = async {
            let r = req.into_inner();
            let max = self.ops.cache.max_key_len;
            if r.prefix.len() > max || r.start_after.len() > max {
                return Err(Status::invalid_argument(format!(
                    "prefix or start_after longer than {max} bytes"
                )));
            }
            let limit = match r.limit {
                0 => LIST_KEYS_DEFAULT,
                n => (n as usize).min(LIST_KEYS_MAX),
            };
            self.read().await?;
            let core = self.ops.core.lock();
            let page = core.sm().list_keys(&r.prefix, &r.start_after, limit + 1);
            let more = page.len() > limit;
            let keys: Vec<pb::KeyInfo> = page
                .into_iter()
                .take(limit)
                .map(|(k, o)| pb::KeyInfo {
                    key: k.to_string(),
                    size: o.size,
                    replicas: o.replicas.count() as u32,
                    pin: match o.pin {
                        crate::types::Pin::None => pb::PinKind::PinNone as i32,
                        crate::types::Pin::Soft { .. } => pb::PinKind::PinSoft as i32,
                        crate::types::Pin::Hard => pb::PinKind::PinHard as i32,
                    },
                })
                .collect();
            let next = if more {
                keys.last().map(|k| k.key.clone()).unwrap_or_default()
            } else {
                String::new()
            };
            Ok(Response::new(pb::ListKeysResponse {
                keys,
                next_start_after: next,
            }))
        }
        .await;
        self.failed("list_keys", r)
    }

    async fn add_member(&self, req: Request<pb::AddMemberRequest>) -> Reply<pb::MembersResponse> {
        self.count("add_member");
        let r = async {
            let r = req.into_inner();
            if r.id == 0 {
                return Err(Status::invalid_argument("member ids start at 1"));
            }
            regolith_proto::client::parse_addrs(&r.addr)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            self.leader().await?;
            let raft = &self.ops.raft;
            tracing::info!(id = r.id, addr = %r.addr, "adding member: learner first");
            raft.add_learner(
                r.id,
                BasicNode {
                    addr: r.addr.clone(),
                },
                true,
            )
            .await
            .map_err(|e| raft_change_error("add learner", e))?;
            let voters: BTreeSet<u64> = [r.id].into();
            raft.change_membership(ChangeMembers::AddVoterIds(voters), false)
                .await
                .map_err(|e| raft_change_error("promote to voter", e))?;
            tracing::info!(id = r.id, "member is a voter");
            Ok(Response::new(self.members_reply()))
        }
        .await;
        self.failed("add_member", r)
    }

    async fn remove_member(
        &self,
        req: Request<pb::RemoveMemberRequest>,
    ) -> Reply<pb::MembersResponse> {
        self.count("remove_member");
        let r = async {
            let id = req.into_inner().id;
            self.leader().await?;
            let members = self.ops.members();
            if !members.iter().any(|m| m.id == id) {
                return Err(Status::not_found(format!(
                    "member {id} is not in the cluster"
                )));
            }
            let voters: BTreeSet<u64> = [id].into();
            let raft = &self.ops.raft;
            let is_voter = members.iter().any(|m| m.id == id && m.voter);
            let change = if is_voter {
                ChangeMembers::RemoveVoters(voters)
            } else {
                ChangeMembers::RemoveNodes(voters)
            };
            raft.change_membership(change, false)
                .await
                .map_err(|e| raft_change_error("remove member", e))?;
            tracing::info!(id, "member removed");
            Ok(Response::new(self.members_reply()))
        }
        .await;
        self.failed("remove_member", r)
    }

    async fn drain(&self, req: Request<pb::DrainRequest>) -> Reply<pb::DrainResponse> {
        self.count("drain");
        let r = async {
            let r = req.into_inner();
            self.leader().await?;
            let (segment, objects, timeout) = {
                let core = self.ops.core.lock();
                let sm = core.sm();
                let node = sm
                    .node_by_name(&r.node_name)
                    .ok_or_else(|| Status::not_found(format!("no node named {:?}", r.node_name)))?;
                let seg = sm.node_segment(node).ok_or_else(|| {
                    Status::not_found(format!("node {:?} has no mounted segment", r.node_name))
                })?;
                (
                    seg.id,
                    seg.objects,
                    if r.timeout_ms == 0 {
                        core.config().drain_timeout_ms
                    } else {
                        r.timeout_ms
                    },
                )
            };
            let deadline_ms = self.ops.clock.now().wall_ms + timeout;
            match self
                .propose(Command::DrainSegment {
                    segment,
                    deadline_ms,
                })
                .await?
            {
                Outcome::DrainSet => {
                    tracing::info!(node = %r.node_name, %segment, timeout_ms = timeout, "draining");
                    Ok(Response::new(pb::DrainResponse {
                        node_id: segment.node,
                        objects,
                    }))
                }
                other => Err(Status::failed_precondition(format!(
                    "drain answered {other:?}"
                ))),
            }
        }
        .await;
        self.failed("drain", r)
    }

    async fn meta_get(&self, req: Request<pb::MetaGetRequest>) -> Reply<pb::MetaGetResponse> {
        self.count("meta_get");
        let r = async {
            let key = req.into_inner().key;
            let value = self.ops.meta_get(&key).await.map_err(status)?;
            Ok(Response::new(pb::MetaGetResponse {
                found: value.is_some(),
                value: value.unwrap_or_default(),
            }))
        }
        .await;
        self.failed("meta_get", r)
    }

    async fn meta_put(&self, req: Request<pb::MetaPutRequest>) -> Reply<pb::MetaResponse> {
        self.count("meta_put");
        let r = async {
            let r = req.into_inner();
            let existed = self.ops.meta_put(r.key, r.value).await.map_err(status)?;
            Ok(Response::new(pb::MetaResponse { existed }))
        }
        .await;
        self.failed("meta_put", r)
    }

    async fn meta_delete(&self, req: Request<pb::MetaDeleteRequest>) -> Reply<pb::MetaResponse> {
        self.count("meta_delete");
        let r = async {
            let key = req.into_inner().key;
            let existed = self.ops.meta_delete(key).await.map_err(status)?;
            Ok(Response::new(pb::MetaResponse { existed }))
        }
        .await;
        self.failed("meta_delete", r)
    }
}

fn raft_change_error<E: std::fmt::Display>(
    what: &str,
    e: openraft::error::RaftError<u64, E>,
) -> Status {
    use openraft::error::RaftError;
    match &e {
        RaftError::APIError(_) => Status::failed_precondition(format!("{what}: {e}")),
        RaftError::Fatal(_) => Status::unavailable(format!("{what}: {e}")),
    }
}
