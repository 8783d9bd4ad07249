//! Regression tests of issue 14 (hostile peers and clients), one per finding, with real
//! `regolith-metad` processes on loopback. After each attack the cluster must still have a
//! leader, serve a put (reserve + commit) and a get, and no replica may have died.

// openraft's reply types are what they are; the tests only decode them.
#![allow(clippy::result_large_err)]

mod common;

use std::time::Duration;

use common::*;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};
use regolith_metad::network::{decode, encode};
use regolith_metad::raft_types::TypeConfig;
use regolith_proto::auth::PeerInterceptor;
use regolith_proto::metad as pb;
use regolith_proto::raft::raft_client::RaftClient;
use regolith_proto::raft::RaftMessage;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What a replica's Raft service answered: a gRPC refusal, or openraft's own reply.
type Answer<T, E = openraft::error::Infallible> =
    Result<Result<T, RaftError<u64, E>>, tonic::Status>;

enum Msg {
    Vote(VoteRequest<u64>),
    Append(AppendEntriesRequest<TypeConfig>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// Sends one Raft message to replica `to` with the peer credential (as a replica, or whoever
/// stole it, could), bypassing openraft.
async fn send_raw(c: &Cluster, to: u64, msg: &Msg) -> Result<Vec<u8>, tonic::Status> {
    send_as(c, to, msg, Some(&c.peer_token())).await
}

/// Sends one Raft message with the cluster token and the peer credential `peer`.
async fn send_as(
    c: &Cluster,
    to: u64,
    msg: &Msg,
    peer: Option<&str>,
) -> Result<Vec<u8>, tonic::Status> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.replicas[&to].grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let token = c.token();
    let mut client =
        RaftClient::with_interceptor(ch, PeerInterceptor::new(Some(&token), peer).unwrap());
    let r = match msg {
        Msg::Vote(v) => {
            client
                .vote(RaftMessage {
                    payload: encode(v).unwrap(),
                })
                .await
        }
        Msg::Append(a) => {
            client
                .append_entries(RaftMessage {
                    payload: encode(a).unwrap(),
                })
                .await
        }
        Msg::Snapshot(s) => {
            client
                .install_snapshot(RaftMessage {
                    payload: encode(s).unwrap(),
                })
                .await
        }
    };
    r.map(|r| r.into_inner().payload)
}

async fn vote(c: &Cluster, to: u64, req: VoteRequest<u64>) -> Answer<VoteResponse<u64>> {
    send_raw(c, to, &Msg::Vote(req))
        .await
        .map(|p| decode(&p).unwrap())
}

async fn append(
    c: &Cluster,
    to: u64,
    req: AppendEntriesRequest<TypeConfig>,
) -> Answer<AppendEntriesResponse<u64>> {
    send_raw(c, to, &Msg::Append(req))
        .await
        .map(|p| decode(&p).unwrap())
}

async fn snapshot(
    c: &Cluster,
    to: u64,
    req: InstallSnapshotRequest<TypeConfig>,
) -> Answer<InstallSnapshotResponse<u64>, InstallSnapshotError> {
    send_raw(c, to, &Msg::Snapshot(req))
        .await
        .map(|p| decode(&p).unwrap())
}

fn log_id(term: u64, node: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn snapshot_req(vote: Vote<u64>, last: Option<LogId<u64>>) -> InstallSnapshotRequest<TypeConfig> {
    InstallSnapshotRequest {
        vote,
        meta: SnapshotMeta {
            last_log_id: last,
            last_membership: StoredMembership::default(),
            snapshot_id: "hostile".into(),
        },
        offset: 0,
        data: vec![],
        done: false,
    }
}

/// Every replica alive (process up, no panic in its log, its openraft core answers), a ready
/// leader, and a put (reserve + commit) and a get served. `seg` is a mounted segment.
fn assert_serves(c: &mut Cluster, rt: &tokio::runtime::Runtime, seg: (u64, u64), what: &str) {
    let ids: Vec<u64> = c.replicas.keys().copied().collect();
    for id in &ids {
        let r = c.replicas.get_mut(id).unwrap();
        if let Some(child) = r.child.as_mut() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{what}: metad {id} exited"
            );
        }
    }
    let leader = c.wait_leader(Duration::from_secs(20));
    rt.block_on(async {
        for id in &ids {
            if c.replicas[id].child.is_none() {
                continue;
            }
            // A vote far below every term: refused by openraft, harmless; a panicked core
            // answers Fatal instead.
            let probe = VoteRequest::new(Vote::new(0, *id), None);
            match vote(c, *id, probe).await {
                Ok(Ok(_)) => {}
                other => {
                    c.dump_logs();
                    panic!("{what}: metad {id}'s Raft core does not answer: {other:?}");
                }
            }
        }
        for id in &ids {
            let log = std::fs::read_to_string(&c.replicas[id].log).unwrap_or_default();
            if log.contains("panicked") {
                c.dump_logs();
                panic!("{what}: metad {id} panicked");
            }
        }
        let client = c.client();
        heartbeat(&client, seg.0, seg.1, vec![]).await;
        let key = format!("after-{what}-{leader}").replace(' ', "-");
        if let Err(e) = put(&client, &key, 4096, 1).await {
            c.dump_logs();
            panic!("{what}: put failed: {e}");
        }
        let g = client.get(&key, seg.0).await.unwrap();
        assert_eq!(
            g.status.unwrap_or_default().code,
            pb::Code::Ok as i32,
            "{what}: get {key}"
        );
    });
}

/// A bootstrapped trio with one mounted segment, checked to serve: the cluster, a runtime, the
/// segment and the leader's id.
fn serving_trio() -> (Cluster, tokio::runtime::Runtime, (u64, u64), u64) {
    let mut c = Cluster::start(3);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let seg = rt.block_on(mount(&c.client(), "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "start");
    let leader = c.wait_leader(Duration::from_secs(15));
    (c, rt, seg, leader)
}

fn refused(status: &tonic::Status, code: tonic::Code, needles: &[&str], what: &str) {
    assert_eq!(status.code(), code, "{what}: {status:?}");
    for n in needles {
        assert!(
            status.message().contains(n),
            "{what}: refusal does not name {n:?}: {}",
            status.message()
        );
    }
}

/// Finding 1: one `Vote` with term 2^64-1 made openraft wrap `term + 1` at the next election
/// timeout and panic on an `unwrap`; the vote was persisted, so the replica panicked again on
/// every restart, and the leader, learning the higher vote, panicked too.
#[test]
fn finding_1_raft_terms_near_u64_max_are_refused_and_break_nothing() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let seg = rt.block_on(mount(&c.client(), "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "start");
    let ids: Vec<u64> = c.replicas.keys().copied().collect();
    let follower = *ids.iter().find(|id| **id != leader).unwrap();
    // The sender is a real member: only the term is wrong.
    let other = *ids
        .iter()
        .find(|id| **id != leader && **id != follower)
        .unwrap();
    let max = u64::MAX;
    let (v, a, s, v_leader) = rt.block_on(async {
        // The exact message of the finding: a vote at term 2^64-1 with an invented log position.
        let hostile = VoteRequest::new(Vote::new(max, other), Some(log_id(max, other, max)));
        let v = vote(&c, follower, hostile).await;
        let a = append(
            &c,
            follower,
            AppendEntriesRequest {
                vote: Vote::new_committed(max - 1, leader),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            },
        )
        .await;
        let s = snapshot(
            &c,
            follower,
            snapshot_req(Vote::new_committed(max - 2, leader), None),
        )
        .await;
        // Past the ceiling by a smaller margin, to the leader.
        let v_leader = vote(
            &c,
            leader,
            VoteRequest::new(
                Vote::new(1 << 50, other),
                Some(log_id(1 << 50, other, 1 << 50)),
            ),
        )
        .await;
        (v, a, s, v_leader)
    });
    // Beyond an election timeout: a replica that took the vote would have campaigned by now.
    std::thread::sleep(Duration::from_secs(3));
    assert_serves(&mut c, &rt, seg, "hostile terms");
    // Another election: a replica that took a term near 2^64 would wrap `term + 1` now.
    c.kill(leader);
    assert_serves(&mut c, &rt, seg, "election after killing the leader");
    c.spawn(leader, None, false);
    let v = v.expect_err("vote at term 2^64-1 reached openraft");
    refused(
        &v,
        tonic::Code::InvalidArgument,
        &[
            &max.to_string(),
            &format!("node {other}"),
            &format!("metad {follower}"),
        ],
        "vote",
    );
    let a = a.expect_err("append at term 2^64-2 reached openraft");
    refused(
        &a,
        tonic::Code::InvalidArgument,
        &[&(max - 1).to_string(), &format!("node {leader}")],
        "append_entries",
    );
    let s = s.expect_err("install_snapshot at term 2^64-3 reached openraft");
    refused(
        &s,
        tonic::Code::InvalidArgument,
        &[&(max - 2).to_string(), &format!("node {leader}")],
        "install_snapshot",
    );
    let vl = v_leader.expect_err("vote at term 2^50 reached openraft");
    refused(
        &vl,
        tonic::Code::InvalidArgument,
        &[&(1u64 << 50).to_string(), &format!("node {other}")],
        "vote to the leader",
    );
    // A log id above the message's own term is refused too.
    let now_leader = c.wait_leader(Duration::from_secs(20));
    let term = c.status(now_leader).unwrap()["term"].as_u64().unwrap();
    let e = rt
        .block_on(vote(
            &c,
            follower,
            VoteRequest::new(Vote::new(term, other), Some(log_id(term + 5, other, 1))),
        ))
        .expect_err("log id above the vote's term reached openraft");
    refused(&e, tonic::Code::InvalidArgument, &["log id"], "log id");
    // Counted.
    let (_, metrics) = http_get(&c.replicas[&follower].http, "/metrics").unwrap();
    assert!(
        metrics.contains(
            "regolith_metad_raft_rejected_messages_total{reason=\"term_out_of_range\",rpc=\"vote\"}"
        ),
        "{metrics}"
    );
    // The attacked replica restarts cleanly: nothing hostile was persisted.
    c.kill(follower);
    c.spawn(follower, None, false);
    std::thread::sleep(Duration::from_secs(3));
    assert_serves(&mut c, &rt, seg, "restart of the attacked replica");
    let s = c.status(follower).unwrap();
    assert!(s["term"].as_u64().unwrap() < 1 << 20, "{s}");
}

/// Finding 2: any token holder could act as a Raft peer: a `Vote` from a node id that is not a
/// member, with a higher term and an invented log position, was granted and the leader stepped
/// down. Appends and snapshots from a non-member are refused the same way.
#[test]
fn finding_2_raft_messages_from_a_non_member_are_refused() {
    let (mut c, rt, seg, leader) = serving_trio();
    let s = c.status(leader).unwrap();
    let term = s["term"].as_u64().unwrap();
    let last = s["last_log_index"].as_u64().unwrap_or(0);
    let follower = *c.replicas.keys().find(|id| **id != leader).unwrap();
    let stranger = 99;
    let (v, a, sn) = rt.block_on(async {
        // The finding's message: a higher term and a log ahead of everyone's, to the leader.
        let v = vote(
            &c,
            leader,
            VoteRequest::new(
                Vote::new(term + 1, stranger),
                Some(log_id(term + 1, stranger, last + 1000)),
            ),
        )
        .await;
        // Posing as a leader of a higher term to a follower.
        let a = append(
            &c,
            follower,
            AppendEntriesRequest {
                vote: Vote::new_committed(term + 1, stranger),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            },
        )
        .await;
        let sn = snapshot(
            &c,
            follower,
            snapshot_req(Vote::new_committed(term + 1, stranger), None),
        )
        .await;
        (v, a, sn)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_serves(&mut c, &rt, seg, "non-member messages");
    let needles = [
        format!("node {stranger}"),
        "not in this replica's membership".to_string(),
    ];
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    match v {
        Err(e) => refused(&e, tonic::Code::PermissionDenied, &needles, "vote"),
        Ok(r) => panic!("a vote from non-member {stranger} reached openraft: {r:?}"),
    }
    match a {
        Err(e) => refused(
            &e,
            tonic::Code::PermissionDenied,
            &needles,
            "append_entries",
        ),
        Ok(r) => panic!("an append from non-member {stranger} reached openraft: {r:?}"),
    }
    match sn {
        Err(e) => refused(
            &e,
            tonic::Code::PermissionDenied,
            &needles,
            "install_snapshot",
        ),
        Ok(r) => panic!("a snapshot from non-member {stranger} reached openraft: {r:?}"),
    }
    let (_, metrics) = http_get(&c.replicas[&leader].http, "/metrics").unwrap();
    assert!(
        metrics.contains(
            "regolith_metad_raft_rejected_messages_total{reason=\"not_a_member\",rpc=\"vote\"}"
        ),
        "{metrics}"
    );
}

/// The Raft peer credential (issue 14, "separate identities"): a holder of the cluster token
/// alone (every sidecar and CLI user) cannot send Raft messages at all, even posing as a real
/// member with a plausible term; a wrong credential is refused too. The replicas, which share
/// `--peer-token-file`, keep electing and serving.
#[test]
fn raft_messages_need_the_peer_credential_not_just_the_cluster_token() {
    let (mut c, rt, seg, leader) = serving_trio();
    let term = c.status(leader).unwrap()["term"].as_u64().unwrap();
    let member = *c.replicas.keys().find(|id| **id != leader).unwrap();
    // A member's id and the next term: what a real candidate sends.
    let msg = Msg::Vote(VoteRequest::new(Vote::new(term + 1, member), None));
    let (none, wrong) = rt.block_on(async {
        (
            send_as(&c, leader, &msg, None).await,
            send_as(&c, leader, &msg, Some("not-the-peer-credential")).await,
        )
    });
    match none {
        Err(e) => refused(
            &e,
            tonic::Code::PermissionDenied,
            &["peer credential"],
            "vote without the credential",
        ),
        Ok(_) => panic!("a vote with only the cluster token reached openraft"),
    }
    match wrong {
        Err(e) => refused(
            &e,
            tonic::Code::PermissionDenied,
            &["wrong Raft peer credential"],
            "vote with a wrong credential",
        ),
        Ok(_) => panic!("a vote with a wrong credential reached openraft"),
    }
    assert_serves(&mut c, &rt, seg, "refused votes");
}

/// Finding 3: one `Remove` of 20,000 keys of 1 KB made a single Raft entry above the message
/// cap that never replicated (no leader for 18 s, elections). Now the batch is split into
/// entries below `--max-entry-bytes`: it is answered, the leader stays, the cluster serves.
#[test]
fn finding_3_a_remove_of_many_large_keys_never_makes_an_entry_above_the_message_cap() {
    let mut c = Cluster::start(3);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let seg = rt.block_on(mount(&client, "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "start");
    // Some of the keys exist: their outcomes must come back in order.
    rt.block_on(async {
        for i in [0usize, 19_999] {
            put(&client, &big_key(i), 4096, 1).await.unwrap();
        }
    });
    let leader = c.wait_leader(Duration::from_secs(15));
    let term = c.status(leader).unwrap()["term"].as_u64().unwrap();
    let keys: Vec<String> = (0..20_000).map(big_key).collect();
    let started = std::time::Instant::now();
    let r = rt
        .block_on(client.remove(keys))
        .expect("the remove is answered");
    eprintln!("removed 20,000 keys of 1 KB in {:?}", started.elapsed());
    assert_eq!(r.codes.len(), 20_000);
    let found: Vec<usize> = r
        .codes
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == pb::Code::Ok as i32)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(found, vec![0, 19_999]);
    assert_eq!(
        c.status(c.wait_leader(Duration::from_secs(5))).unwrap()["term"].as_u64(),
        Some(term),
        "no election"
    );
    assert_serves(&mut c, &rt, seg, "after the large remove");
}

fn big_key(i: usize) -> String {
    format!("{i:0>1024}")
}

/// User plus system CPU time of a process, in clock ticks (/proc/PID/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Finding 5: at the file-descriptor limit metad's HTTP accept loop spun (~80 % CPU, 1.48 GB
/// of log in 10 s) with 20,000 partial HTTP requests (no header timeout, no connection cap),
/// and gRPC to that replica timed out. Now a partial request is closed after the header
/// timeout, connections past the cap are closed at once and counted, and a failing accept
/// backs off with a rate-limited log line.
#[test]
fn finding_5_partial_requests_and_the_fd_limit_neither_spin_nor_flood_the_log() {
    use std::io::{Read, Write};
    let mut c = Cluster::start_with(0, &[]);
    c.nofile = Some(160);
    c.add_replica_slot(1);
    let peers = c.members();
    c.spawn(1, Some(&peers), true);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let seg = rt.block_on(mount(&c.client(), "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "start");
    let http = c.replicas[&1].http.clone();
    let kv = c.replicas[&1].kv.clone();

    // A request whose headers never end is closed by the server.
    let mut partial = std::net::TcpStream::connect(&http).unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    partial
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let n = partial.read(&mut buf).unwrap_or(0);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(19),
        "a partial request stayed open {waited:?} (read {n} bytes)"
    );

    // Far more connections than descriptors: accept fails with EMFILE for as long as they are
    // held. The replica must not spin, nor write a line per failure.
    let pid = c.replicas[&1].child.as_ref().unwrap().id();
    let log_before = std::fs::metadata(&c.replicas[&1].log).unwrap().len();
    let mut held = Vec::new();
    for i in 0..400 {
        let addr = if i % 2 == 0 { &http } else { &kv };
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
            held.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu_ticks(pid) - t0;
    let logged = std::fs::metadata(&c.replicas[&1].log).unwrap().len() - log_before;
    // 100 ticks a second: a spinning loop spends ~300 ticks in 3 s; back-off, a handful.
    assert!(spent < 60, "{spent} ticks of CPU in 3 s at the fd limit");
    assert!(
        logged < 64 * 1024,
        "{logged} bytes of log in 3.5 s at the fd limit"
    );
    let text = std::fs::read_to_string(&c.replicas[&1].log).unwrap();
    assert!(
        text.contains("accept failing"),
        "the fd limit was never reached or never logged"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(1500));
    let (code, _) = http_get(&http, "/health").unwrap();
    assert_eq!(code, 200);
    // The test ran past the node TTL without heartbeats: the segment mounts anew.
    let seg = rt.block_on(mount(&c.client(), "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "after the fd limit");
}

/// Finding 4: the HTTP metadata KV needed no credentials and forwarded with the replica's own
/// token, and 400 PUTs of 512 KiB caused 34 elections, hundreds of MiB per replica and failed
/// puts and gets. Now: an optional token (`--http-metadata-token-file`), quotas on bytes and
/// keys (`--meta-max-bytes`, `--meta-max-keys`) answered 507, a few writes at a time per
/// replica, and snapshots spaced by their own size.
#[test]
fn finding_4_the_metadata_kv_takes_a_token_keeps_quotas_and_a_flood_breaks_nothing() {
    let secrets = tempfile::tempdir().unwrap();
    let kv_token = secrets.path().join("kv-token");
    std::fs::write(&kv_token, "kv-secret-0123456789\n").unwrap();
    let token_arg = kv_token.to_str().unwrap().to_string();
    let mut c = Cluster::start_with(
        3,
        &[
            "--http-metadata-token-file",
            &token_arg,
            "--meta-max-bytes",
            "4MiB",
            "--meta-max-keys",
            "100",
        ],
    );
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let seg = rt.block_on(mount(&c.client(), "node-a", 64 << 20));
    assert_serves(&mut c, &rt, seg, "start");
    let follower = *c.replicas.keys().find(|id| **id != leader).unwrap();
    let auth = "Authorization: Bearer kv-secret-0123456789\r\n";
    let kv = |id: u64| c.replicas[&id].kv.clone();

    // No token, a wrong one, the cluster token: 401. The right one: served, on any replica.
    for headers in [
        "",
        "Authorization: Bearer wrong\r\n",
        "Authorization: Bearer test-token-0123456789\r\n",
    ] {
        let (code, _) =
            http_request_with(&kv(follower), "PUT", "/metadata?key=a", headers, b"v").unwrap();
        assert_eq!(code, 401, "PUT with {headers:?}");
        let (code, _) =
            http_request_with(&kv(leader), "GET", "/metadata?key=a", headers, b"").unwrap();
        assert_eq!(code, 401, "GET with {headers:?}");
    }
    let (code, _) =
        http_request_with(&kv(follower), "PUT", "/metadata?key=a", auth, b"v1").unwrap();
    assert_eq!(code, 200);
    let (code, body) = http_request_with(&kv(leader), "GET", "/metadata?key=a", auth, b"").unwrap();
    assert_eq!((code, body.as_slice()), (200, &b"v1"[..]));

    // Bytes: 512 KiB values until the 4 MiB quota refuses one, through a follower (forwarded).
    let big = vec![7u8; 512 * 1024];
    let mut stored = 0;
    let refusal = loop {
        let path = format!("/metadata?key=big-{stored}");
        let (code, body) = http_request_with(&kv(follower), "PUT", &path, auth, &big).unwrap();
        match code {
            200 => stored += 1,
            507 => break String::from_utf8_lossy(&body).to_string(),
            other => panic!("PUT {path}: {other} {}", String::from_utf8_lossy(&body)),
        }
        assert!(stored <= 8, "more than 4 MiB stored");
    };
    assert_eq!(stored, 7, "{refusal}");
    assert!(refusal.contains("--meta-max-bytes"), "{refusal}");
    // Replacing a value is not growth.
    let (code, _) =
        http_request_with(&kv(leader), "PUT", "/metadata?key=big-0", auth, &big).unwrap();
    assert_eq!(code, 200);

    // Keys: small values up to 100 keys.
    let mut keys = 1 + stored;
    let refusal = loop {
        let path = format!("/metadata?key=small-{keys}");
        let (code, body) = http_request_with(&kv(leader), "PUT", &path, auth, b"x").unwrap();
        match code {
            200 => keys += 1,
            507 => break String::from_utf8_lossy(&body).to_string(),
            other => panic!("PUT {path}: {other}"),
        }
        assert!(keys <= 100, "more than 100 keys stored");
    };
    assert_eq!(keys, 100);
    assert!(refusal.contains("--meta-max-keys"), "{refusal}");

    // A flood of 512 KiB overwrites from 16 clients at once (4 each), on every replica: answered (200,
    // or 503 when too many wait), no election, and the cluster serves meanwhile.
    let term = c.status(leader).unwrap()["term"].as_u64().unwrap();
    let addrs: Vec<String> = c.replicas.values().map(|r| r.kv.clone()).collect();
    let answered: Vec<std::result::Result<u16, String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..16)
            .map(|w| {
                let (addr, big) = (addrs[w % addrs.len()].clone(), &big);
                s.spawn(move || {
                    (0..4)
                        .map(|i| {
                            let path = format!("/metadata?key=big-{}", (w + i) % 7);
                            let t0 = std::time::Instant::now();
                            http_request_with(&addr, "PUT", &path, auth, big)
                                .map(|(code, _)| code)
                                .map_err(|e| {
                                    format!("{path} on {addr}: {e} after {:?}", t0.elapsed())
                                })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let ok = answered.iter().filter(|c| **c == Ok(200)).count();
    assert!(
        answered.iter().all(|c| *c == Ok(200) || *c == Ok(503)),
        "answers: {answered:?}"
    );
    assert!(ok >= 8, "only {ok} of 64 overwrites stored");
    assert_eq!(
        c.status(c.wait_leader(Duration::from_secs(5))).unwrap()["term"].as_u64(),
        Some(term),
        "an election during the flood"
    );
    assert_serves(&mut c, &rt, seg, "after the metadata flood");
}
