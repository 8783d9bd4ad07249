//! The `Raft` gRPC service: hands peers' messages to the local openraft instance.

use regolith_proto::raft::raft_server::Raft as RaftRpc;
use regolith_proto::raft::RaftMessage;
use tonic::{Request, Response, Status};

use crate::network::{decode, encode};
use crate::raft_types::Raft;

pub struct RaftService {
    pub raft: Raft,
}

fn reply<T: serde::Serialize>(v: &T) -> Result<Response<RaftMessage>, Status> {
    encode(v)
        .map(|payload| Response::new(RaftMessage { payload }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(&req.into_inner().payload).map_err(Status::invalid_argument)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }
}
