//! UDS bodies by opcode (`regolith_proto::uds`): the requests the sidecar decodes from a local
//! client, and the replies the client decodes from the sidecar.

use prost::Message;
use regolith_proto::uds::{pb, Op};

/// Request opcodes, in the order byte 0 of an input picks them.
pub const REQUEST_OPS: [Op; 14] = [
    Op::Hello,
    Op::PutBegin,
    Op::PutCommit,
    Op::PutAbort,
    Op::Get,
    Op::Exists,
    Op::GetSize,
    Op::Remove,
    Op::RemoveAll,
    Op::RegisterShm,
    Op::UnregisterShm,
    Op::ListSegments,
    Op::Stats,
    Op::ListKeys,
];

/// Reply opcodes: the request ones and `ERROR`.
pub const REPLY_OPS: [Op; REQUEST_OPS.len() + 1] = {
    let mut ops = [Op::Error; REQUEST_OPS.len() + 1];
    let mut i = 0;
    while i < REQUEST_OPS.len() {
        ops[i] = REQUEST_OPS[i];
        i += 1;
    }
    ops
};

/// Byte 0 picks the opcode ([`REQUEST_OPS`]); the rest is the body, decoded as the sidecar's
/// dispatch decodes that opcode's request.
pub fn uds_request(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let op = REQUEST_OPS[usize::from(pick) % REQUEST_OPS.len()];
    match op {
        Op::Hello => round_trip::<pb::HelloRequest>(body),
        Op::PutBegin => round_trip::<pb::PutBeginRequest>(body),
        Op::PutCommit => round_trip::<pb::PutCommitRequest>(body),
        Op::PutAbort => round_trip::<pb::PutAbortRequest>(body),
        Op::Get => round_trip::<pb::GetRequest>(body),
        Op::Exists | Op::GetSize | Op::Remove => round_trip::<pb::KeysRequest>(body),
        Op::RegisterShm => round_trip::<pb::RegisterShmRequest>(body),
        Op::UnregisterShm => round_trip::<pb::UnregisterShmRequest>(body),
        Op::ListKeys => round_trip::<pb::ListKeysRequest>(body),
        Op::RemoveAll | Op::ListSegments | Op::Stats | Op::Error => round_trip::<pb::Empty>(body),
    }
}

/// Byte 0 picks the opcode ([`REPLY_OPS`]); the rest is the body, decoded as the client decodes
/// that opcode's reply.
pub fn uds_reply(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let op = REPLY_OPS[usize::from(pick) % REPLY_OPS.len()];
    match op {
        Op::Hello => round_trip::<pb::HelloReply>(body),
        Op::PutBegin => round_trip::<pb::PutBeginReply>(body),
        Op::PutCommit => round_trip::<pb::PutCommitReply>(body),
        Op::PutAbort => round_trip::<pb::Empty>(body),
        Op::Get => round_trip::<pb::GetReply>(body),
        Op::Exists => round_trip::<pb::ExistsReply>(body),
        Op::GetSize => round_trip::<pb::SizesReply>(body),
        Op::Remove => round_trip::<pb::RemoveReply>(body),
        Op::RemoveAll => round_trip::<pb::RemoveAllReply>(body),
        Op::RegisterShm => round_trip::<pb::RegisterShmReply>(body),
        Op::UnregisterShm => round_trip::<pb::StatusReply>(body),
        Op::ListSegments => round_trip::<pb::SegmentsReply>(body),
        Op::Stats => round_trip::<pb::StatsReply>(body),
        Op::ListKeys => round_trip::<pb::ListKeysReply>(body),
        Op::Error => round_trip::<pb::ErrorReply>(body),
    }
}

/// What decodes re-encodes to a message that decodes equal (unknown fields are dropped).
fn round_trip<M: Message + Default + PartialEq>(body: &[u8]) {
    let Ok(m) = M::decode(body) else {
        return;
    };
    let again = m.encode_to_vec();
    match M::decode(again.as_slice()) {
        Ok(m2) => assert!(m2 == m, "decode → encode → decode changed the message"),
        Err(e) => panic!("a re-encoded message does not decode: {e}"),
    }
}
