//! The `Metad` gRPC service (`proto/metad.proto`): a translation layer between the wire and
//! [`crate::ops`], which does the work. Every call is answered by the leader; followers answer
//! `NOT_LEADER` with the leader's address. Here: wire ↔ domain conversion (with
//! [`convert`]), the mapping of [`Error`] to a gRPC status, and the per-RPC metrics.

use std::future::Future;
use std::sync::Arc;

use regolith_proto::leader::{not_leader, LeaderHint};
use regolith_proto::metad as pb;
use regolith_proto::metad::metad_server::Metad;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::grpc::convert;
use crate::grpc::grants::Grants;
use crate::ops::segments::{check_heartbeat_lists, Mount};
use crate::ops::Ops;
use crate::types::{SegmentId, Version};

pub struct MetadService {
    pub ops: Arc<Ops>,
    /// Signs the replicas handed out and gives each mount its key (finding 7).
    pub grants: Grants,
    /// Ends the `Watch` streams at shutdown (the server's graceful stop waits for them).
    pub shutdown: regolith_proto::shutdown::Shutdown,
    /// A node's mount, heartbeats and unmount need a client certificate naming the node
    /// (`--tls-node-identity`).
    pub node_identity: bool,
}

impl MetadService {
    /// With `--tls-node-identity`: the request came with a client certificate that names
    /// `node` (a DNS name of its subject alternative names), else PERMISSION_DENIED. A node
    /// this replica never saw mount (`None`) has nothing to protect yet.
    fn check_node_identity<T>(&self, req: &Request<T>, node: Option<&str>) -> Result<()> {
        let (true, Some(node)) = (self.node_identity, node) else {
            return Ok(());
        };
        let cert = req
            .extensions()
            .get::<regolith_proto::tls::PeerInfo>()
            .and_then(|p| p.cert.clone());
        match cert {
            Some(c) if regolith_proto::tls::cert_names(&c, node) => Ok(()),
            Some(_) => Err(Error::PermissionDenied(format!(
                "the client certificate does not name node {node:?} (--tls-node-identity)"
            ))),
            None => Err(Error::PermissionDenied(format!(
                "calls for node {node:?} need a client certificate naming it (--tls-node-identity)"
            ))),
        }
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The gRPC status of an error that ends a whole call.
fn status(e: Error) -> Status {
    match e {
        Error::NotLeader { leader } => {
            not_leader(leader.map(|(id, addr)| LeaderHint { id, addr }).as_ref())
        }
        Error::InvalidArgument(m) => Status::invalid_argument(m),
        Error::NotFound { .. } => Status::not_found(e.to_string()),
        Error::NoSuch(m) => Status::not_found(m),
        Error::Precondition(m) => Status::failed_precondition(m),
        Error::PermissionDenied(m) => Status::permission_denied(m),
        Error::MetaQuota(_) => Status::resource_exhausted(e.to_string()),
        Error::DeadlinePassed { .. } => Status::deadline_exceeded(e.to_string()),
        Error::NotReady(_)
        | Error::SegmentsNotReady { .. }
        | Error::NoLeaderState
        | Error::Raft(_)
        | Error::Unavailable(_) => Status::unavailable(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

impl MetadService {
    /// Runs one RPC: counts it, maps its error, counts a failure by code.
    async fn call<T>(&self, rpc: &'static str, f: impl Future<Output = Result<T>>) -> Reply<T> {
        let m = &self.ops.metrics;
        m.rpc_requests.with_label_values(&[rpc]).inc();
        let r = f.await.map(Response::new).map_err(status);
        if let Err(s) = &r {
            m.rpc_failures
                .with_label_values(&[rpc, &format!("{:?}", s.code())])
                .inc();
        }
        r
    }

    async fn reserve_items(
        &self,
        items: &[pb::ReserveRequest],
    ) -> Result<Vec<pb::ReserveResponse>> {
        let reqs: Vec<_> = items.iter().map(convert::put_request).collect();
        let out = self.ops.reserve(&reqs).await?;
        Ok(out
            .iter()
            .map(|r| convert::reserve_response(r, self.ops.id, &self.grants))
            .collect())
    }

    async fn commit_items(&self, items: &[pb::CommitRequest]) -> Result<Vec<pb::CommitResponse>> {
        let items: Vec<_> = items.iter().map(convert::commit_item).collect();
        let out = self.ops.commit(&items).await?;
        Ok(out
            .iter()
            .map(|c| pb::CommitResponse {
                status: Some(convert::committed(c)),
            })
            .collect())
    }

    async fn placements(
        &self,
        keys: &[String],
        requester: u64,
    ) -> Result<Vec<pb::ObjectPlacement>> {
        let found = self.ops.get(keys, requester).await?;
        Ok(found
            .iter()
            .zip(keys)
            .map(|(p, k)| match p {
                Some(p) => convert::placement(p, &self.grants),
                None => convert::not_found(k),
            })
            .collect())
    }
}

#[tonic::async_trait]
impl Metad for MetadService {
    type WatchStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::WatchMessage, Status>> + Send + 'static>,
    >;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        use tokio_stream::StreamExt;
        self.ops
            .metrics
            .rpc_requests
            .with_label_values(&["watch"])
            .inc();
        let r = req.into_inner();
        // Fails fast on a follower, before a stream is opened.
        self.ops.leader().await.map_err(status)?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let (ops, shutdown) = (self.ops.clone(), self.shutdown.clone());
        let grants = self.grants.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = ops.watch(r.after_index, r.node_id, tx) => {}
                _ = shutdown.wait() => {}
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |m| {
            m.map(|m| convert::watch_message(&m, &grants))
                .map_err(status)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    type SaveSnapshotStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::SnapshotChunk, Status>> + Send + 'static>,
    >;

    async fn transfer_leader(
        &self,
        req: Request<pb::TransferLeaderRequest>,
    ) -> Reply<pb::TransferLeaderResponse> {
        self.call("transfer_leader", async {
            let r = req.into_inner();
            let timeout = match r.timeout_ms {
                0 => crate::transfer::DEFAULT_TIMEOUT,
                ms => std::time::Duration::from_millis(ms.min(60_000)),
            };
            let to = (r.to != 0).then_some(r.to);
            let t = crate::transfer::transfer(&self.ops, to, timeout).await?;
            Ok(pb::TransferLeaderResponse {
                from: t.from,
                to: t.to,
                term: t.term,
                took_ms: t.took.as_millis() as u64,
            })
        })
        .await
    }

    async fn save_snapshot(
        &self,
        _req: Request<pb::SaveSnapshotRequest>,
    ) -> Reply<Self::SaveSnapshotStream> {
        use tokio_stream::StreamExt;
        self.ops
            .metrics
            .rpc_requests
            .with_label_values(&["save_snapshot"])
            .inc();
        // Fails fast on a follower (NOT_LEADER with the leader's address), before a stream opens.
        self.ops.leader().await.map_err(status)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (ops, shutdown) = (self.ops.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = ops.save_snapshot(tx) => {}
                _ = shutdown.wait() => {}
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|m| m.map(|data| pb::SnapshotChunk { data }).map_err(status));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn mount_segment(
        &self,
        req: Request<pb::MountSegmentRequest>,
    ) -> Reply<pb::MountSegmentResponse> {
        self.call("mount_segment", async {
            self.check_node_identity(&req, Some(&req.get_ref().node_name))?;
            let r = req.into_inner();
            let m = self
                .ops
                .mount(Mount {
                    node_name: r.node_name,
                    node_id_hint: r.node_id,
                    capacity: r.capacity,
                    data_addrs: r.data_addrs,
                })
                .await?;
            Ok(pb::MountSegmentResponse {
                node_id: m.node_id,
                generation: m.generation,
                term: m.term,
                grant_key: self.grants.node_key(SegmentId {
                    node: m.node_id,
                    generation: m.generation,
                }),
            })
        })
        .await
    }

    async fn unmount_segment(
        &self,
        req: Request<pb::UnmountSegmentRequest>,
    ) -> Reply<pb::UnmountSegmentResponse> {
        self.call("unmount_segment", async {
            let node = self.ops.node_name(req.get_ref().node_id);
            self.check_node_identity(&req, node.as_deref())?;
            let r = req.into_inner();
            let segment = SegmentId {
                node: r.node_id,
                generation: r.generation,
            };
            Ok(pb::UnmountSegmentResponse {
                dropped_objects: self.ops.unmount(segment).await?,
            })
        })
        .await
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Reply<pb::HeartbeatResponse> {
        self.call("heartbeat", async {
            let node = self.ops.node_name(req.get_ref().node_id);
            self.check_node_identity(&req, node.as_deref())?;
            let r = req.into_inner();
            check_heartbeat_lists(r.in_flight.len(), r.released.len())?;
            self.ops.check_keys(&r.accessed)?;
            let (term, reply) = self
                .ops
                .heartbeat_with(&convert::heartbeat(&r), &r.accessed)
                .await?;
            Ok(pb::HeartbeatResponse {
                term,
                leader_id: self.ops.id,
                remount: reply.remount,
                unmounted: reply.unmounted,
                quarantined: reply
                    .quarantined
                    .into_iter()
                    .map(convert::version)
                    .collect(),
                draining: reply.draining,
                offload: reply.offload.iter().map(convert::offload_order).collect(),
                promote: reply.promote.iter().map(convert::promote_order).collect(),
            })
        })
        .await
    }

    async fn disk_report(
        &self,
        req: Request<pb::DiskReportRequest>,
    ) -> Reply<pb::DiskReportResponse> {
        self.call("disk_report", async {
            let node = self.ops.node_name(req.get_ref().node_id);
            self.check_node_identity(&req, node.as_deref())?;
            let r = req.into_inner();
            let items = r.moved.len()
                + r.failed.len()
                + r.dropped.len()
                + r.held.len()
                + r.copied.len()
                + r.promoted.len()
                + r.promote_failed.len();
            if items > crate::config::MAX_BATCH_KEYS * 4 {
                return Err(crate::error::Error::InvalidArgument(format!(
                    "{items} items in one disk report; at most {}",
                    crate::config::MAX_BATCH_KEYS * 4
                )));
            }
            for k in r
                .moved
                .iter()
                .chain(&r.failed)
                .chain(&r.dropped)
                .chain(&r.held)
                .chain(&r.copied)
            {
                self.ops.check_keys(std::slice::from_ref(&k.key))?;
            }
            let reply = self.ops.disk_report(&convert::disk_report(&r)).await?;
            Ok(pb::DiskReportResponse {
                moved: reply.moved,
                unknown: reply.unknown.iter().map(convert::disk_item_of).collect(),
                offload: reply.offload.iter().map(convert::offload_order).collect(),
                copied: reply.copied,
                promoted: reply.promoted,
                promote: reply.promote.iter().map(convert::promote_order).collect(),
            })
        })
        .await
    }

    async fn reserve(&self, req: Request<pb::ReserveRequest>) -> Reply<pb::ReserveResponse> {
        self.call("reserve", async {
            let item = req.into_inner();
            let mut out = self.reserve_items(std::slice::from_ref(&item)).await?;
            Ok(out.pop().unwrap_or_default())
        })
        .await
    }

    async fn batch_reserve(
        &self,
        req: Request<pb::BatchReserveRequest>,
    ) -> Reply<pb::BatchReserveResponse> {
        self.call("batch_reserve", async {
            let items = req.into_inner().items;
            Ok(pb::BatchReserveResponse {
                items: self.reserve_items(&items).await?,
            })
        })
        .await
    }

    async fn commit(&self, req: Request<pb::CommitRequest>) -> Reply<pb::CommitResponse> {
        self.call("commit", async {
            let item = req.into_inner();
            let mut out = self.commit_items(std::slice::from_ref(&item)).await?;
            Ok(out.pop().unwrap_or_default())
        })
        .await
    }

    async fn batch_commit(
        &self,
        req: Request<pb::BatchCommitRequest>,
    ) -> Reply<pb::BatchCommitResponse> {
        self.call("batch_commit", async {
            let items = req.into_inner().items;
            Ok(pb::BatchCommitResponse {
                items: self.commit_items(&items).await?,
            })
        })
        .await
    }

    async fn abort(&self, req: Request<pb::AbortRequest>) -> Reply<pb::AbortResponse> {
        self.call("abort", async {
            let versions: Vec<Version> = req
                .into_inner()
                .versions
                .iter()
                .map(|v| Version {
                    term: v.term,
                    id: v.id,
                })
                .collect();
            self.ops.abort(&versions).await?;
            Ok(pb::AbortResponse {})
        })
        .await
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Reply<pb::ObjectPlacement> {
        self.call("get", async {
            let r = req.into_inner();
            if r.keys.len() != 1 {
                return Err(Error::InvalidArgument(format!(
                    "Get takes one key, got {}; use BatchGet",
                    r.keys.len()
                )));
            }
            let mut p = self.placements(&r.keys, r.requester_node_id).await?;
            Ok(p.pop().unwrap_or_default())
        })
        .await
    }

    async fn batch_get(&self, req: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        self.call("batch_get", async {
            let r = req.into_inner();
            Ok(pb::GetResponse {
                items: self.placements(&r.keys, r.requester_node_id).await?,
            })
        })
        .await
    }

    async fn exists(&self, req: Request<pb::ExistsRequest>) -> Reply<pb::ExistsResponse> {
        self.call("exists", async {
            let keys = req.into_inner().keys;
            Ok(pb::ExistsResponse {
                exists: self.ops.exists(&keys).await?,
            })
        })
        .await
    }

    async fn batch_exists(&self, req: Request<pb::ExistsRequest>) -> Reply<pb::ExistsResponse> {
        self.exists(req).await
    }

    async fn remove(&self, req: Request<pb::RemoveRequest>) -> Reply<pb::RemoveResponse> {
        self.call("remove", async {
            let found = self.ops.remove(req.into_inner().keys).await?;
            Ok(pb::RemoveResponse {
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
            })
        })
        .await
    }

    async fn remove_all(
        &self,
        _req: Request<pb::RemoveAllRequest>,
    ) -> Reply<pb::RemoveAllResponse> {
        self.call("remove_all", async {
            Ok(pb::RemoveAllResponse {
                removed: self.ops.remove_all().await?,
            })
        })
        .await
    }

    async fn stats(&self, _req: Request<pb::StatsRequest>) -> Reply<pb::StatsResponse> {
        self.call("stats", async {
            self.ops.read().await?;
            Ok(convert::stats(&self.ops.stats()))
        })
        .await
    }

    async fn list_segments(
        &self,
        _req: Request<pb::ListSegmentsRequest>,
    ) -> Reply<pb::ListSegmentsResponse> {
        self.call("list_segments", async {
            let segments = self.ops.list_segments().await?;
            Ok(pb::ListSegmentsResponse {
                segments: segments.iter().map(convert::segment_info).collect(),
            })
        })
        .await
    }

    async fn list_keys(&self, req: Request<pb::ListKeysRequest>) -> Reply<pb::ListKeysResponse> {
        self.call("list_keys", async {
            let r = req.into_inner();
            let page = self
                .ops
                .list_keys(&r.prefix, &r.start_after, r.limit)
                .await?;
            Ok(pb::ListKeysResponse {
                keys: page.keys.iter().map(convert::key_info).collect(),
                next_start_after: page.next_start_after,
            })
        })
        .await
    }

    async fn add_member(&self, req: Request<pb::AddMemberRequest>) -> Reply<pb::MembersResponse> {
        self.call("add_member", async {
            let r = req.into_inner();
            Ok(convert::members(&self.ops.add_member(r.id, &r.addr).await?))
        })
        .await
    }

    async fn remove_member(
        &self,
        req: Request<pb::RemoveMemberRequest>,
    ) -> Reply<pb::MembersResponse> {
        self.call("remove_member", async {
            let id = req.into_inner().id;
            Ok(convert::members(&self.ops.remove_member(id).await?))
        })
        .await
    }

    async fn drain(&self, req: Request<pb::DrainRequest>) -> Reply<pb::DrainResponse> {
        self.call("drain", async {
            let r = req.into_inner();
            let (segment, objects) = self.ops.drain(&r.node_name, r.timeout_ms).await?;
            Ok(pb::DrainResponse {
                node_id: segment.node,
                objects,
            })
        })
        .await
    }

    async fn meta_get(&self, req: Request<pb::MetaGetRequest>) -> Reply<pb::MetaGetResponse> {
        self.call("meta_get", async {
            let key = req.into_inner().key;
            let value = self.ops.meta_get(&key).await?;
            Ok(pb::MetaGetResponse {
                found: value.is_some(),
                value: value.unwrap_or_default(),
            })
        })
        .await
    }

    async fn meta_put(&self, req: Request<pb::MetaPutRequest>) -> Reply<pb::MetaResponse> {
        self.call("meta_put", async {
            let r = req.into_inner();
            Ok(pb::MetaResponse {
                existed: self.ops.meta_put(r.key, r.value).await?,
            })
        })
        .await
    }

    async fn meta_delete(&self, req: Request<pb::MetaDeleteRequest>) -> Reply<pb::MetaResponse> {
        self.call("meta_delete", async {
            let key = req.into_inner().key;
            Ok(pb::MetaResponse {
                existed: self.ops.meta_delete(key).await?,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn errors_map_to_the_statuses_clients_act_on() {
        let cases = [
            (
                Error::InvalidArgument("bad".into()),
                Code::InvalidArgument,
                "bad",
            ),
            (
                Error::NotReady("first entry not applied".into()),
                Code::Unavailable,
                "leader not ready: first entry not applied",
            ),
            (
                Error::NoLeaderState,
                Code::Unavailable,
                "leader state not built yet",
            ),
            (Error::Raft("lost".into()), Code::Unavailable, "raft: lost"),
            (
                Error::SegmentsNotReady {
                    key: "k".into(),
                    waiting: 2,
                    term: 3,
                },
                Code::Unavailable,
                "no segment can take \"k\" yet: 2 segment(s) have not heartbeated to the leader \
                 of term 3 since its election; retry",
            ),
            (
                Error::Unavailable("stopped".into()),
                Code::Unavailable,
                "stopped",
            ),
            (
                Error::NoSuch("no node named \"x\"".into()),
                Code::NotFound,
                "no node named \"x\"",
            ),
            (
                Error::Precondition("refused".into()),
                Code::FailedPrecondition,
                "refused",
            ),
            (
                Error::Internal("mount answered X".into()),
                Code::Internal,
                "mount answered X",
            ),
        ];
        for (e, code, msg) in cases {
            let s = status(e);
            assert_eq!((s.code(), s.message()), (code, msg));
        }
        let s = status(Error::NotLeader {
            leader: Some((3, "127.0.0.1:50053".into())),
        });
        assert!(regolith_proto::leader::is_not_leader(&s), "{s:?}");
        let hint = regolith_proto::leader::hint_of(&s).expect("hint");
        assert_eq!((hint.id, hint.addr.as_str()), (3, "127.0.0.1:50053"));
    }
}
