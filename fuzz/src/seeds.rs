//! Valid encodings for each target, from the real encoders: the seed corpus the `seed-corpus`
//! bin writes to `corpus/<target>/seed-<n>`. Mutations of valid inputs reach far deeper into a
//! decoder than random bytes, which fail at the first check.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta,
    StoredMembership, Vote,
};
use prost::Message;
use regolith_metad::command::{Batch, Command};
use regolith_metad::network::encode;
use regolith_metad::raft_types::{NodeId, TypeConfig};
use regolith_metad::state::StateMachine;
use regolith_metad::types::{Extent, Pin, Replica, Version};
use regolith_proto::dataplane::{
    Hello, HelloReply, Kind, RefuseReason, Reply, Request, Status, REQUEST_LEN_V1,
};
use regolith_proto::frame;
use regolith_proto::grant::Grant;
use regolith_proto::rdma::{Accept, LinkLayer, Offer, PortAddr};
use regolith_proto::uds::pb;
use serde::Serialize;

use crate::uds::{REPLY_OPS, REQUEST_OPS};

/// The seeds of `target` (empty for an unknown name).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "uds_frame" => uds_frame(),
        "uds_request" => uds_request(),
        "uds_reply" => uds_reply(),
        "dataplane_hello" => dataplane_hello(),
        "dataplane_request" => dataplane_request(),
        "dataplane_reply" => dataplane_reply(),
        "rdma_upgrade" => rdma_upgrade(),
        "raft_payload" => raft_payload(),
        "snapshot_file" => snapshot_file(),
        "snapshot_state" => snapshot_state(),
        "sled_record" => sled_record(),
        _ => Vec::new(),
    }
}

fn rdma_port(link_layer: LinkLayer) -> PortAddr {
    PortAddr {
        device: "mlx5_0".into(),
        port: 1,
        link_layer,
        mtu: 5,
        gid_index: 3,
        lid: 7,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3],
    }
}

fn rdma_upgrade() -> Vec<Vec<u8>> {
    let offer = Offer {
        port: rdma_port(LinkLayer::Ethernet),
        qpn: 0x1234,
        psn: 0x42,
        stripe: 2,
        max_slice: 1 << 20,
    };
    let accept = Accept {
        port: rdma_port(LinkLayer::InfiniBand),
        qpn: 99,
        psn: 7,
        generation: 3,
        seg_addr: 0x7f00_0000_0000,
        seg_len: 1 << 30,
        seg_rkey: 0x1111,
        win_addr: 0x7e00_0000_0000,
        win_len: 1 << 20,
        win_rkey: 0x2222,
    };
    let mut out = Vec::new();
    if let Ok(b) = offer.encode() {
        out.push(prefixed(0, &b));
    }
    if let Ok(b) = accept.encode() {
        out.push(prefixed(1, &b));
    }
    out
}

fn uds_frame() -> Vec<Vec<u8>> {
    let mut two = Vec::new();
    for (op, id, body) in [(5u16, 1u64, &b"abc"[..]), (6, 2, &b""[..])] {
        let _ = frame::encode(op, id, body, frame::DEFAULT_MAX_LENGTH, &mut two);
    }
    let one = frame::encode_to_vec(1, 7, &get_request().encode_to_vec()).unwrap_or_default();
    // Byte 0 is the knob: default cap in 1-byte and 16-byte pieces, a small cap.
    [
        (0x00, one.clone()),
        (0x0f, two.clone()),
        (0x81, two),
        (0x8f, one),
    ]
    .into_iter()
    .map(|(knob, wire)| prefixed(knob, &wire))
    .collect()
}

fn get_request() -> pb::GetRequest {
    pb::GetRequest {
        items: vec![pb::GetItem {
            key: "layer-0/block-17".into(),
            dest: Some(pb::Region {
                r#where: Some(pb::region::Where::Staging(pb::Window {
                    offset: 4096,
                    len: 65536,
                })),
            }),
            local_ok: true,
            ..Default::default()
        }],
    }
}

fn op_index(ops: &[regolith_proto::uds::Op], op: regolith_proto::uds::Op) -> u8 {
    ops.iter().position(|o| *o == op).unwrap_or(0) as u8
}

fn uds_request() -> Vec<Vec<u8>> {
    use regolith_proto::uds::Op;
    let put_begin = pb::PutBeginRequest {
        items: vec![pb::PutBeginItem {
            key: "k".into(),
            size: 1 << 20,
            ..Default::default()
        }],
    };
    let put_commit = pb::PutCommitRequest {
        items: vec![pb::PutCommitItem {
            version: Some(pb::Version { term: 3, id: 9 }),
            checksum: 0xdead_beef,
            checksum_known: true,
            source: Some(pb::Region {
                r#where: Some(pb::region::Where::Inline(pb::Inline {
                    data: b"value".to_vec(),
                    max_len: 5,
                })),
            }),
        }],
    };
    let keys = pb::KeysRequest {
        keys: vec!["a".into(), "b".into()],
    };
    vec![
        prefixed(
            op_index(&REQUEST_OPS, Op::PutBegin),
            &put_begin.encode_to_vec(),
        ),
        prefixed(
            op_index(&REQUEST_OPS, Op::PutCommit),
            &put_commit.encode_to_vec(),
        ),
        prefixed(
            op_index(&REQUEST_OPS, Op::Get),
            &get_request().encode_to_vec(),
        ),
        prefixed(op_index(&REQUEST_OPS, Op::Remove), &keys.encode_to_vec()),
        prefixed(op_index(&REQUEST_OPS, Op::Stats), &[]),
    ]
}

fn uds_reply() -> Vec<Vec<u8>> {
    use regolith_proto::uds::Op;
    let get = pb::GetReply {
        items: vec![pb::GetResult {
            status: Some(regolith_proto::uds::ok()),
            size: 5,
            data: b"value".to_vec(),
            version: Some(pb::Version { term: 3, id: 9 }),
            ..Default::default()
        }],
    };
    let sizes = pb::SizesReply {
        status: Some(regolith_proto::uds::ok()),
        sizes: vec![1, 0, u64::MAX],
        ..Default::default()
    };
    let error = pb::ErrorReply {
        status: Some(regolith_proto::uds::status(
            pb::Code::InvalidArgument,
            "bad",
        )),
    };
    vec![
        prefixed(op_index(&REPLY_OPS, Op::Get), &get.encode_to_vec()),
        prefixed(op_index(&REPLY_OPS, Op::GetSize), &sizes.encode_to_vec()),
        prefixed(op_index(&REPLY_OPS, Op::Error), &error.encode_to_vec()),
    ]
}

fn dataplane_hello() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for token in [&b""[..], b"cluster-token-0123456789abcdef"] {
        if let Ok(b) = Hello::new(42, token).encode() {
            out.push(b);
        }
    }
    for verdict in [Ok(()), Err(RefuseReason::BadToken)] {
        let r = HelloReply {
            version: 2,
            verdict,
            node_id: 7,
        };
        out.push(r.encode().to_vec());
    }
    out
}

fn dataplane_request() -> Vec<Vec<u8>> {
    let r = Request {
        kind: Kind::Write,
        req_id: 1,
        generation: 2,
        offset: 1 << 20,
        len: 65536,
        term: 5,
        res_id: 6,
        grant: Grant {
            offset: 1 << 20,
            len: 1 << 21,
            mac: [0xa5; 16],
        },
    };
    let read = Request {
        kind: Kind::Read,
        ..r
    };
    // Byte 0: 0 caps `len` at MAX_SLICE_LEN.
    vec![
        prefixed(0, &r.encode()),
        prefixed(0, &read.encode()),
        prefixed(2, &read.encode()[..REQUEST_LEN_V1]),
    ]
}

fn dataplane_reply() -> Vec<Vec<u8>> {
    [Status::Ok, Status::StaleTerm, Status::Forbidden]
        .into_iter()
        .map(|status| {
            Reply {
                req_id: 11,
                status,
                len: if status == Status::Ok { 4096 } else { 0 },
                term: 3,
            }
            .encode()
            .to_vec()
        })
        .collect()
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership() -> Membership<NodeId, BasicNode> {
    let nodes: BTreeMap<NodeId, BasicNode> = (1..=3)
        .map(|i| (i, BasicNode::new(format!("10.0.0.{i}:7700"))))
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

fn snapshot_meta() -> SnapshotMeta<NodeId, BasicNode> {
    SnapshotMeta {
        last_log_id: Some(log_id(2, 40)),
        last_membership: StoredMembership::new(Some(log_id(1, 1)), membership()),
        snapshot_id: "2-40-18c2f-0".into(),
    }
}

fn entries() -> Vec<Entry<TypeConfig>> {
    let batch = Batch(vec![
        Command::MetaPut {
            key: "m".into(),
            value: vec![1, 2, 3],
        },
        Command::Remove {
            keys: vec!["k".into()],
        },
    ]);
    vec![
        Entry {
            log_id: log_id(2, 41),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 42),
            payload: EntryPayload::Normal(batch),
        },
        Entry {
            log_id: log_id(2, 43),
            payload: EntryPayload::Membership(membership()),
        },
    ]
}

fn raft_payload() -> Vec<Vec<u8>> {
    let vote = Vote::new_committed(2, 1);
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id(2, 40)),
        entries: entries(),
        leader_commit: Some(log_id(2, 40)),
    };
    let vote_req = VoteRequest::new(Vote::new(3, 2), Some(log_id(2, 43)));
    let install = InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta: snapshot_meta(),
        offset: 0,
        data: b"REGOSNAP".to_vec(),
        done: false,
    };
    type E = RaftError<NodeId>;
    let appended: Result<AppendEntriesResponse<NodeId>, E> = Ok(AppendEntriesResponse::Success);
    let voted: Result<VoteResponse<NodeId>, E> = Ok(VoteResponse::new(vote, None, true));
    let installed: Result<
        InstallSnapshotResponse<NodeId>,
        RaftError<NodeId, InstallSnapshotError>,
    > = Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
        SnapshotMismatch {
            expect: openraft::SnapshotSegmentId {
                id: "a".into(),
                offset: 0,
            },
            got: openraft::SnapshotSegmentId {
                id: "b".into(),
                offset: 8,
            },
        },
    )));
    let installed_ok: Result<InstallSnapshotResponse<NodeId>, E> =
        Ok(InstallSnapshotResponse { vote });
    vec![
        payload(0, &append),
        payload(1, &vote_req),
        payload(2, &install),
        payload(3, &appended),
        payload(4, &voted),
        payload(5, &installed),
        payload(5, &installed_ok),
    ]
}

/// Byte 0 picks the type in [`crate::raft::raft_payload`]; then the payload as metad sends it.
fn payload<T: Serialize>(pick: u8, v: &T) -> Vec<u8> {
    prefixed(pick, &encode(v).unwrap_or_default())
}

fn snapshot_file() -> Vec<Vec<u8>> {
    let Ok(dir) = tempfile::tempdir() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, payload) in [Vec::new(), state_bytes()].into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.snap"));
        if regolith_raft_log::fuzz::write_snapshot_file(&path, &snapshot_meta(), &payload).is_ok() {
            if let Ok(b) = std::fs::read(&path) {
                out.push(b);
            }
        }
    }
    out
}

/// A state machine with two mounted segments, one object on both, and a metadata entry.
fn state_bytes() -> Vec<u8> {
    let mut sm = StateMachine::new();
    let mut fx = Vec::new();
    for (name, id) in [("node-a", 1), ("node-b", 2)] {
        let mount = Command::MountSegment {
            node_name: name.into(),
            node_id_hint: id,
            capacity: 1 << 20,
            data_addrs: vec![format!("10.0.0.{id}:7600")],
            now_ms: 1000,
        };
        sm.apply(&mount, &mut fx);
    }
    let replicas: Vec<Replica> = sm
        .segments()
        .map(|s| Replica {
            segment: s.id,
            extents: vec![Extent::new(4096, 8000)],
        })
        .collect();
    let commands = [
        Command::CommitPut {
            key: "layer-0/block-17".into(),
            size: 8000,
            replicas,
            checksum: 0x1234,
            version: Version { term: 2, id: 5 },
            pin: Pin::Soft { until_ms: 5000 },
            expires_ms: 0,
        },
        Command::MetaPut {
            key: "model".into(),
            value: b"llama".to_vec(),
        },
    ];
    for c in &commands {
        sm.apply(c, &mut fx);
    }
    sm.snapshot_bytes()
}

fn snapshot_state() -> Vec<Vec<u8>> {
    vec![StateMachine::new().snapshot_bytes(), state_bytes()]
}

fn sled_record() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for e in entries() {
        let mut b = vec![0];
        b.extend_from_slice(&e.log_id.index.to_be_bytes());
        b.extend_from_slice(&bincode::serialize(&e).unwrap_or_default());
        out.push(b);
    }
    out.push(prefixed(
        1,
        &bincode::serialize(&Vote::new_committed(2, 1)).unwrap_or_default(),
    ));
    out.push(prefixed(
        2,
        &bincode::serialize(&log_id(2, 40)).unwrap_or_default(),
    ));
    out.push(prefixed(
        3,
        &bincode::serialize(&log_id(1, 10)).unwrap_or_default(),
    ));
    out
}

fn prefixed(first: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + rest.len());
    v.push(first);
    v.extend_from_slice(rest);
    v
}
