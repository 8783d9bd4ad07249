//! metad's Raft RPC payloads (`regolith_metad::network::decode`): a format byte, then bincode of
//! openraft's requests (what a replica's Raft service decodes from a peer) and of the results
//! (what the sending replica decodes from the answer).

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use regolith_metad::network::{decode, encode};
use regolith_metad::raft_types::{NodeId, TypeConfig};
use serde::de::DeserializeOwned;
use serde::Serialize;

type Answer<T, E = openraft::error::Infallible> = Result<T, RaftError<NodeId, E>>;

/// Byte 0 picks the message type; the rest is the payload, format byte included.
pub fn raft_payload(data: &[u8]) {
    let Some((&pick, payload)) = data.split_first() else {
        return;
    };
    match pick % 6 {
        0 => round_trip::<AppendEntriesRequest<TypeConfig>>(payload),
        1 => round_trip::<VoteRequest<NodeId>>(payload),
        2 => round_trip::<InstallSnapshotRequest<TypeConfig>>(payload),
        3 => round_trip::<Answer<AppendEntriesResponse<NodeId>>>(payload),
        4 => round_trip::<Answer<VoteResponse<NodeId>>>(payload),
        _ => round_trip::<Answer<InstallSnapshotResponse<NodeId>, InstallSnapshotError>>(payload),
    }
}

/// What decodes re-encodes, and the re-encoding is a fixed point: decoding and encoding it
/// again gives the same bytes (the input itself may carry trailing bytes bincode ignores).
pub fn round_trip<T: Serialize + DeserializeOwned>(payload: &[u8]) {
    let Ok(v) = decode::<T>(payload) else {
        return;
    };
    let once = match encode(&v) {
        Ok(b) => b,
        Err(e) => panic!("a decoded payload does not re-encode: {e}"),
    };
    assert!(
        once.len() <= payload.len(),
        "re-encoding is longer than the input"
    );
    let again = match decode::<T>(&once) {
        Ok(v2) => encode(&v2),
        Err(e) => panic!("a re-encoded payload does not decode: {e}"),
    };
    match again {
        Ok(twice) => assert_eq!(once, twice, "decode → encode is not a fixed point"),
        Err(e) => panic!("re-encoding failed: {e}"),
    }
}
