//! The client ↔ sidecar protocol over the Unix socket (`proto/uds.proto`): opcodes, the
//! protocol version, and limits both ends agree on. Frames are [`crate::frame`]'s.
//!
//! | opcode | request | reply |
//! |---|---|---|
//! | 1 `HELLO` | `HelloRequest` | `HelloReply` + segment and staging memfds (SCM_RIGHTS) |
//! | 2 `PUT_BEGIN` | `PutBeginRequest` | `PutBeginReply` |
//! | 3 `PUT_COMMIT` | `PutCommitRequest` | `PutCommitReply` |
//! | 4 `PUT_ABORT` | `PutAbortRequest` | `Empty` |
//! | 5 `GET` | `GetRequest` | `GetReply` |
//! | 6 `EXISTS` | `KeysRequest` | `ExistsReply` |
//! | 7 `GET_SIZE` | `KeysRequest` | `SizesReply` |
//! | 8 `REMOVE` | `KeysRequest` | `RemoveReply` |
//! | 9 `REMOVE_ALL` | `Empty` | `RemoveAllReply` |
//! | 10 `REGISTER_SHM` | `RegisterShmRequest` + one memfd (SCM_RIGHTS) | `RegisterShmReply` |
//! | 11 `UNREGISTER_SHM` | `UnregisterShmRequest` | `StatusReply` |
//! | 12 `LIST_SEGMENTS` | `Empty` | `SegmentsReply` |
//! | 13 `STATS` | `Empty` | `StatsReply` |
//! | 0xFFFF `ERROR` | — | `ErrorReply` (unparsable or unknown request) |
//!
//! A reply has the opcode and request id of its request. A request that cannot be parsed gets
//! an `ERROR` reply with its request id; a frame whose framing itself is broken closes the
//! connection.

/// Generated code of `proto/uds.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/regolith.uds.v1.rs"));
    pub use crate::common::{Extent, PinKind, PutOptions, Version};
}

/// Version negotiated by `HELLO`: both ends speak `min(client, sidecar)`; a sidecar refuses
/// versions it cannot speak.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest UDS frame either end accepts (bodies up to 64 MiB).
pub const MAX_FRAME: u32 = crate::frame::DEFAULT_MAX_LENGTH;

/// Default and minimum staging area per connection.
pub const DEFAULT_STAGING: u64 = 64 << 20;
pub const MIN_STAGING: u64 = 16 << 20;

/// Values up to this size may travel inline in frames.
pub const MAX_INLINE: u64 = 1 << 20;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    Hello = 1,
    PutBegin = 2,
    PutCommit = 3,
    PutAbort = 4,
    Get = 5,
    Exists = 6,
    GetSize = 7,
    Remove = 8,
    RemoveAll = 9,
    RegisterShm = 10,
    UnregisterShm = 11,
    ListSegments = 12,
    Stats = 13,
    ListKeys = 14,
    Error = 0xFFFF,
}

impl Op {
    pub fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Hello,
            2 => Op::PutBegin,
            3 => Op::PutCommit,
            4 => Op::PutAbort,
            5 => Op::Get,
            6 => Op::Exists,
            7 => Op::GetSize,
            8 => Op::Remove,
            9 => Op::RemoveAll,
            10 => Op::RegisterShm,
            11 => Op::UnregisterShm,
            12 => Op::ListSegments,
            13 => Op::Stats,
            14 => Op::ListKeys,
            0xFFFF => Op::Error,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Hello => "hello",
            Op::PutBegin => "put_begin",
            Op::PutCommit => "put_commit",
            Op::PutAbort => "put_abort",
            Op::Get => "get",
            Op::Exists => "exists",
            Op::GetSize => "get_size",
            Op::Remove => "remove",
            Op::RemoveAll => "remove_all",
            Op::RegisterShm => "register_shm",
            Op::UnregisterShm => "unregister_shm",
            Op::ListSegments => "list_segments",
            Op::Stats => "stats",
            Op::ListKeys => "list_keys",
            Op::Error => "error",
        }
    }
}

/// A status of the given code and message.
pub fn status(code: pb::Code, message: impl Into<String>) -> pb::Status {
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

pub fn ok() -> pb::Status {
    status(pb::Code::Ok, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_round_trip() {
        for v in 0..=20u16 {
            if let Some(op) = Op::from_u16(v) {
                assert_eq!(op as u16, v);
            }
        }
        assert_eq!(Op::from_u16(0xFFFF), Some(Op::Error));
        assert_eq!(Op::from_u16(14), Some(Op::ListKeys));
        assert_eq!(Op::from_u16(15), None);
    }
}
