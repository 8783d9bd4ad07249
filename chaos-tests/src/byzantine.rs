//! The `byzantine-client` fault: a client on every sidecar host that sends malformed and
//! hostile traffic to every daemon it can reach while the workload clients run, the way they
//! reach them (the sidecar's Unix socket, the data ports, metad's gRPC and HTTP ports, from
//! inside the host's network namespace).
//!
//! Nothing it sends is a well-formed request that may change data: every UDS request after the
//! hello has a body no protobuf decoder accepts (or REMOVE_ALL with a non-empty body, which
//! must remove nothing), every data-plane slice lacks the leader's grant, every Raft `Vote`
//! carries a term above metad's ceiling. So the checker's verdicts must not move; what the
//! daemons answered is tallied, and answers that mean a check is missing (a slice served or
//! written without a grant, a garbage request answered as if valid, a forged term echoed as the
//! node's highest, a forged `Vote` accepted) are violations that fail the heal.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use regolith_proto::dataplane::{self, Hello, HelloReply, Kind, Reply, Request, Status};
use regolith_proto::frame::{self, FrameCodec};
use regolith_proto::grant::Grant;
use regolith_proto::uds::{self, pb, Op};

use crate::error::{Error, Result};
use crate::netns::{Host, NetnsHandle};

/// Pause between two probes of one attacker thread (a probe is one to twenty messages), so the
/// twelve threads send a few hundred messages a second together and leave the CPUs to the
/// workload.
const PACE: Duration = Duration::from_millis(50);
/// How long a probe waits for an answer before calling the peer quiet.
const QUIET: Duration = Duration::from_millis(400);
/// How long a connection that the server may keep open (a half-open preface, a partial
/// request) is held before we hang up.
const HOLD: Duration = Duration::from_millis(150);
/// A node id no replica or sidecar has.
const STRANGER: u64 = 0xB1_2A;

/// Where one attacker (on one sidecar host) sends its traffic.
#[derive(Clone, Debug)]
pub struct Targets {
    /// The sidecar host the attacker runs in (its namespace).
    pub host: Host,
    /// Its sidecar's Unix socket.
    pub socket: PathBuf,
    /// Every sidecar's data ports, with the `/status` address that names its generation.
    pub data_ports: Vec<(SocketAddr, String)>,
    /// gRPC and HTTP addresses of the running metad replicas.
    pub metad_grpc: Vec<SocketAddr>,
    pub metad_http: Vec<SocketAddr>,
    pub token: String,
}

/// What one attacker sent and what came back.
#[derive(Debug, Default)]
pub struct Tally {
    /// Counts by `area/what`, e.g. `data/FORBIDDEN`, `uds/error INVALID_ARGUMENT`.
    pub counts: BTreeMap<String, u64>,
    /// Answers that mean a check is missing (see the module documentation).
    pub violations: Vec<String>,
}

impl Tally {
    fn add(&mut self, key: impl Into<String>) {
        *self.counts.entry(key.into()).or_insert(0) += 1;
    }

    /// Records an answer that means a check is missing (or the attacker itself failed).
    pub fn violation_line(&mut self, what: String) {
        self.violation(what)
    }

    fn violation(&mut self, what: String) {
        tracing::error!("byzantine client: {what}");
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }

    pub fn merge(&mut self, other: Tally) {
        for (k, v) in other.counts {
            *self.counts.entry(k).or_insert(0) += v;
        }
        self.violations.extend(other.violations);
    }

    pub fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    /// Sum of the counts whose key starts with `prefix`.
    pub fn sum(&self, prefix: &str) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    }

    /// One line: every count, grouped by area.
    pub fn summary(&self) -> String {
        let mut areas: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (k, v) in &self.counts {
            let (area, what) = k.split_once('/').unwrap_or(("other", k.as_str()));
            areas.entry(area).or_default().push(format!("{what} {v}"));
        }
        areas
            .iter()
            .map(|(a, w)| format!("{a}: {}", w.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Why the fault did not show what it must: missing answers, or violations.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self.violations.clone();
        let needed = [
            ("data/FORBIDDEN", "no data port answered FORBIDDEN"),
            ("uds/error ", "no sidecar socket answered an error frame"),
            ("data/hello BadToken", "no data port refused a wrong token"),
            (
                "metad/forged vote refused",
                "no metad refused the forged Vote",
            ),
        ];
        for (prefix, why) in needed {
            if self.sum(prefix) == 0 {
                out.push(why.to_string());
            }
        }
        out
    }
}

/// What one attacker thread aims at. Each has its own thread, so that a probe that waits on a
/// quiet peer does not hold up the others.
#[derive(Clone, Copy, Debug)]
enum Area {
    Uds,
    Data,
    Grpc,
    Http,
}

const AREAS: [Area; 4] = [Area::Uds, Area::Data, Area::Grpc, Area::Http];

/// Starts one attacker thread per target set and area; they run until `stop` is set.
pub fn start(targets: Vec<Targets>, stop: Arc<AtomicBool>) -> Result<Vec<JoinHandle<Tally>>> {
    let mut threads = Vec::new();
    for (i, t) in targets.into_iter().enumerate() {
        let ns = NetnsHandle::open(&t.host.ns)?;
        for (j, area) in AREAS.into_iter().enumerate() {
            let (ns, t, stop) = (ns.clone(), t.clone(), stop.clone());
            let name = format!("byzantine-{}-{area:?}", t.host.name);
            let seed = (i * AREAS.len() + j) as u64;
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || attacker(ns, t, area, seed, stop))
                .map_err(|e| Error::io(format!("spawn {name}"), e))?;
            threads.push(handle);
        }
    }
    Ok(threads)
}

/// One attacker: enters the host's namespace (sockets it opens afterwards are that host's),
/// then sends one probe of its area per [`PACE`] until stopped.
fn attacker(ns: NetnsHandle, t: Targets, area: Area, seed: u64, stop: Arc<AtomicBool>) -> Tally {
    let mut tally = Tally::default();
    if let Err(e) = ns.enter() {
        tally.violation(format!("could not enter {}: {e}", ns.name()));
        return tally;
    }
    // A runtime made on this thread, for the gRPC and HTTP clients: its sockets are the host's.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tally.violation(format!("no runtime: {e}"));
            return tally;
        }
    };
    let mut rng = StdRng::seed_from_u64(0xB12A_0000 ^ seed);
    let mut round: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        match area {
            Area::Uds => uds_probe(&t, &mut rng, round, &mut tally),
            Area::Data => {
                if let Some((addr, status)) = pick(&t.data_ports, &mut rng) {
                    data_probe(&rt, addr, status, &t.token, &mut rng, round, &mut tally);
                }
            }
            Area::Grpc => {
                if let Some(addr) = pick(&t.metad_grpc, &mut rng) {
                    grpc_probe(&rt, *addr, &t.token, &mut rng, round, &mut tally);
                }
            }
            Area::Http => {
                if let Some(addr) = pick(&t.metad_http, &mut rng) {
                    http_probe(*addr, round, &mut tally);
                }
            }
        }
        round += 1;
        std::thread::sleep(PACE);
    }
    tally
}

fn pick<'a, T>(v: &'a [T], rng: &mut StdRng) -> Option<&'a T> {
    (!v.is_empty()).then(|| &v[rng.gen_range(0..v.len())])
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.gen()).collect()
}

/// Says when what arrived so far is a whole answer.
type Enough<'a> = Option<&'a dyn Fn(&[u8]) -> bool>;

/// Reads what the peer sends until it closes or is quiet for [`QUIET`] (or `enough` bytes
/// arrived); returns the bytes and whether it closed.
fn drain(s: &mut impl Read, enough: Enough<'_>) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > 1 << 20 || enough.is_some_and(|f| f(&out)) {
                    return (out, false);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return (out, false)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return (out, true),
        }
    }
}

// ---------------------------------------------------------------------------- UDS

fn hello_frame() -> Vec<u8> {
    let h = pb::HelloRequest {
        protocol_version: uds::PROTOCOL_VERSION,
        staging_size: 0,
        client_name: "byzantine".into(),
    };
    frame::encode_to_vec(Op::Hello as u16, 1, &h.encode_to_vec()).unwrap_or_default()
}

/// Bodies no decoder accepts: a truncated varint, tag 0 (invalid) before random bytes, a
/// length-delimited field longer than the body.
fn garbage_body(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..3) {
        0 => vec![0xff, 0xff, 0xff],
        1 => {
            let mut b = vec![0x00];
            let n = rng.gen_range(1..64);
            b.extend(random_bytes(rng, n));
            b
        }
        _ => vec![0x0a, 0x7f, 0x01, 0x02],
    }
}

/// Every opcode a client may send besides HELLO, and some no sidecar knows.
const UDS_OPS: [u16; 17] = [
    Op::PutBegin as u16,
    Op::PutCommit as u16,
    Op::PutAbort as u16,
    Op::Get as u16,
    Op::Exists as u16,
    Op::GetSize as u16,
    Op::Remove as u16,
    Op::RemoveAll as u16,
    Op::RegisterShm as u16,
    Op::UnregisterShm as u16,
    Op::ListSegments as u16,
    Op::Stats as u16,
    Op::ListKeys as u16,
    Op::Error as u16,
    0,
    777,
    0x7ffe,
];

/// One connection to the sidecar's socket with one kind of hostile input.
fn uds_probe(t: &Targets, rng: &mut StdRng, round: u64, tally: &mut Tally) {
    let mut s = match UnixStream::connect(&t.socket) {
        Ok(s) => s,
        Err(_) => return tally.add("uds/connect failed"),
    };
    let _ = s.set_read_timeout(Some(QUIET));
    let _ = s.set_write_timeout(Some(QUIET));
    let kind = round % 5;
    let (bytes, expect): (Vec<u8>, usize) = match kind {
        0 => {
            let n = rng.gen_range(16..4096);
            (random_bytes(rng, n), 0)
        }
        // A length prefix of ~2 GiB, then a little of its "body".
        1 => {
            let mut b = vec![0xff, 0xff, 0xff, 0x7f, 2, 0];
            b.extend(random_bytes(rng, 64));
            (b, 0)
        }
        // A frame cut short, then our end closed.
        2 => {
            let mut f = frame::encode_to_vec(Op::Get as u16, 3, &[0u8; 100]).unwrap_or_default();
            f.truncate(rng.gen_range(3..40));
            (f, 0)
        }
        // A request before any hello.
        3 => (
            frame::encode_to_vec(Op::Exists as u16, 2, &garbage_body(rng)).unwrap_or_default(),
            1,
        ),
        // After a valid hello: a garbage body for every opcode, REMOVE_ALL among them (also
        // with bodies that decode as an empty message with unknown fields).
        _ => {
            let mut b = hello_frame();
            let mut n = 0;
            for (id, op) in (10u64..).zip(UDS_OPS) {
                b.extend(frame::encode_to_vec(op, id, &garbage_body(rng)).unwrap_or_default());
                n += 1;
            }
            for (id, body) in [
                (40u64, &[0x08u8, 0x01][..]),
                (41, &[0x7a, 0x02, b'h', b'i']),
            ] {
                b.extend(frame::encode_to_vec(Op::RemoveAll as u16, id, body).unwrap_or_default());
                n += 1;
            }
            (b, n + 1)
        }
    };
    tally.add(format!("uds/sent {}", uds_kind_name(kind)));
    let _ = s.write_all(&bytes);
    if kind == 2 {
        let _ = s.shutdown(Shutdown::Write);
    }
    let whole = |b: &[u8]| count_frames(b) >= expect.max(1);
    let (reply, closed) = drain(
        &mut s,
        (expect > 0).then_some(&whole as &dyn Fn(&[u8]) -> bool),
    );
    // Random bytes may (very rarely) happen to frame a valid request: only the answers to
    // requests known to be garbage are held to ERROR.
    let strict = expect > 0;
    for f in decode_frames(&reply) {
        classify_uds_reply(&f, strict, tally);
    }
    if closed {
        tally.add("uds/closed");
    }
}

fn uds_kind_name(kind: u64) -> &'static str {
    match kind {
        0 => "random bytes",
        1 => "absurd length",
        2 => "truncated frame",
        3 => "request before hello",
        _ => "garbage bodies after hello",
    }
}

fn decode_frames(bytes: &[u8]) -> Vec<frame::Frame> {
    let mut c = FrameCodec::new(uds::MAX_FRAME);
    c.feed(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = c.next_frame() {
        out.push(f);
    }
    out
}

fn count_frames(bytes: &[u8]) -> usize {
    decode_frames(bytes).len()
}

/// A hello is answered in kind; everything else this client sends must get an ERROR frame.
fn classify_uds_reply(f: &frame::Frame, strict: bool, tally: &mut Tally) {
    if f.opcode == Op::Hello as u16 && f.request_id == 1 {
        return tally.add("uds/hello accepted");
    }
    if f.opcode != Op::Error as u16 && !strict {
        return tally.add(format!("uds/reply opcode {}", f.opcode));
    }
    if f.opcode != Op::Error as u16 {
        return tally.violation(format!(
            "the sidecar answered garbage request {} with opcode {}, not ERROR",
            f.request_id, f.opcode
        ));
    }
    let code = pb::ErrorReply::decode(f.body.as_ref())
        .ok()
        .and_then(|e| e.status)
        .map(|s| {
            pb::Code::try_from(s.code)
                .map(|c| c.as_str_name().to_string())
                .unwrap_or_else(|_| format!("code {}", s.code))
        })
        .unwrap_or_else(|| "undecodable".into());
    tally.add(format!("uds/error {code}"));
}

// ---------------------------------------------------------------------------- data plane

/// The generation a sidecar serves, from its `/status` (so refusals are about grants, not
/// about a stale generation).
fn generation(rt: &tokio::runtime::Runtime, status_addr: &str) -> Option<u64> {
    let (code, body) = rt
        .block_on(crate::status::http_get(
            status_addr,
            "/status",
            Duration::from_secs(1),
        ))
        .ok()?;
    (code == 200)
        .then(|| crate::sidecars::parse_sidecar_status(&body).ok())
        .flatten()
        .map(|s| s.generation)
}

fn connect(addr: &SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(addr, QUIET).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_nodelay(true);
    Some(s)
}

/// Sends a handshake and returns the verdict (None: closed or unreadable).
fn handshake(s: &mut TcpStream, hello: &[u8]) -> Option<HelloReply> {
    s.write_all(hello).ok()?;
    let mut b = [0u8; dataplane::HELLO_REPLY_LEN];
    s.read_exact(&mut b).ok()?;
    HelloReply::decode(&b).ok()
}

fn verdict_name(r: Option<HelloReply>) -> String {
    match r {
        Some(HelloReply {
            verdict: Ok(()), ..
        }) => "accepted".into(),
        Some(HelloReply {
            verdict: Err(why), ..
        }) => format!("{why:?}"),
        None => "closed".into(),
    }
}

/// One data-plane connection: a bad magic, a wrong token, or the right token followed by
/// slices without a valid grant.
fn data_probe(
    rt: &tokio::runtime::Runtime,
    addr: &SocketAddr,
    status_addr: &str,
    token: &str,
    rng: &mut StdRng,
    round: u64,
    tally: &mut Tally,
) {
    let Some(mut s) = connect(addr) else {
        return tally.add("data/connect failed");
    };
    match round % 3 {
        0 => {
            let mut b = b"XXXX".to_vec();
            b.extend(random_bytes(rng, 60));
            tally.add("data/sent bad magic");
            let r = handshake(&mut s, &b);
            tally.add(format!("data/hello {}", verdict_name(r)));
        }
        1 => {
            let hello = Hello::new(STRANGER, b"not-the-cluster-token")
                .encode()
                .unwrap_or_default();
            tally.add("data/sent wrong token");
            let r = handshake(&mut s, &hello);
            if matches!(
                r,
                Some(HelloReply {
                    verdict: Ok(()),
                    ..
                })
            ) {
                return tally.violation(format!("{addr} accepted a wrong cluster token"));
            }
            tally.add(format!("data/hello {}", verdict_name(r)));
        }
        _ => {
            let Some(gen) = generation(rt, status_addr) else {
                return tally.add("data/status unavailable");
            };
            let hello = Hello::new(STRANGER, token.as_bytes())
                .encode()
                .unwrap_or_default();
            let r = handshake(&mut s, &hello);
            if !matches!(
                r,
                Some(HelloReply {
                    verdict: Ok(()),
                    ..
                })
            ) {
                return tally.add(format!("data/hello with token {}", verdict_name(r)));
            }
            ungranted_slices(&mut s, addr, gen, rng, tally);
        }
    }
}

/// Slices no leader granted, on an accepted connection; ends with a header whose `len` is
/// over the cap (the server answers TOO_LARGE and closes).
fn ungranted_slices(
    s: &mut TcpStream,
    addr: &SocketAddr,
    gen: u64,
    rng: &mut StdRng,
    tally: &mut Tally,
) {
    let base = Request {
        kind: Kind::Read,
        req_id: 1,
        generation: gen,
        offset: rng.gen_range(0..16_384u64) * 4096,
        len: 4096,
        term: rng.gen_range(1..1000),
        res_id: rng.gen(),
        grant: Grant::default(),
    };
    let forged_grant = Grant {
        offset: base.offset,
        len: 4096,
        mac: rng.gen(),
    };
    let requests = [
        ("read invented version", base),
        (
            "read forged grant",
            Request {
                grant: forged_grant,
                ..base
            },
        ),
        (
            "write no grant",
            Request {
                kind: Kind::Write,
                ..base
            },
        ),
        (
            "write term max",
            Request {
                kind: Kind::Write,
                term: u64::MAX,
                ..base
            },
        ),
        (
            "read out of range",
            Request {
                offset: u64::MAX - 10,
                term: u64::MAX,
                ..base
            },
        ),
        (
            "read old generation",
            Request {
                generation: gen.wrapping_add(1000),
                ..base
            },
        ),
        (
            "read after forged term",
            Request {
                res_id: rng.gen(),
                ..base
            },
        ),
        (
            "oversize len",
            Request {
                len: dataplane::MAX_SLICE_LEN + 1,
                ..base
            },
        ),
    ];
    for (i, (what, req)) in requests.into_iter().enumerate() {
        let req = Request {
            req_id: 100 + i as u64,
            ..req
        };
        tally.add(format!("data/sent {what}"));
        match slice(s, &req) {
            Some(r) => {
                tally.add(format!("data/{}", r.status.as_str()));
                check_slice_reply(addr, what, &req, &r, tally);
            }
            None => {
                tally.add("data/closed");
                return;
            }
        }
    }
}

/// Sends one request (a write's body too, unless its `len` is over the cap) and reads its reply
/// header (and a read's bytes, should any be served).
fn slice(s: &mut TcpStream, req: &Request) -> Option<Reply> {
    s.write_all(&req.encode()).ok()?;
    if req.kind == Kind::Write && req.len <= dataplane::MAX_SLICE_LEN {
        s.write_all(&vec![0xEE; req.len as usize]).ok()?;
    }
    let mut b = [0u8; dataplane::REPLY_LEN];
    s.read_exact(&mut b).ok()?;
    let r = Reply::decode(&b).ok()?;
    if r.len > 0 {
        let mut sink = vec![0u8; (r.len as usize).min(dataplane::MAX_SLICE_LEN as usize)];
        s.read_exact(&mut sink).ok()?;
    }
    Some(r)
}

/// No slice without a grant is served; a forged term never becomes the node's highest.
fn check_slice_reply(addr: &SocketAddr, what: &str, req: &Request, r: &Reply, tally: &mut Tally) {
    if r.status == Status::Ok {
        tally.violation(format!(
            "{addr} answered OK to {what} (kind {:?}, offset {}, no grant)",
            req.kind, req.offset
        ));
    }
    if r.term == u64::MAX {
        tally.violation(format!(
            "{addr} reports term 2^64-1 as its highest after {what}: a forged term was taken"
        ));
    }
}

// ---------------------------------------------------------------------------- metad

/// A `VoteRequest` of openraft 0.9 (single-term-leader: `LeaderId { term, voted_for }`) as
/// metad's Raft codec lays it out: payload format 1, then bincode (fixed-width little-endian
/// integers, one-byte option tags). Term 2^64-1, from a node that is no member.
fn forged_vote() -> Vec<u8> {
    let mut p = vec![1u8];
    p.extend(u64::MAX.to_le_bytes()); // vote.leader_id.term
    p.push(1); // voted_for: Some
    p.extend(STRANGER.to_le_bytes());
    p.push(0); // committed: false
    p.push(0); // last_log_id: None
    p
}

/// Garbage bytes or a half-open HTTP/2 preface on the gRPC port; or Raft `Vote`s with the
/// cluster token (forged, undecodable), and one without it.
fn grpc_probe(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    token: &str,
    rng: &mut StdRng,
    round: u64,
    tally: &mut Tally,
) {
    match round % 3 {
        0 => raw_tcp(addr, random_bytes(rng, 256), "metad/grpc garbage", tally),
        1 => raw_tcp(
            addr,
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            "metad/grpc half-open preface",
            tally,
        ),
        _ => rt.block_on(votes(addr, token, rng, tally)),
    }
}

async fn votes(addr: SocketAddr, token: &str, rng: &mut StdRng, tally: &mut Tally) {
    use regolith_proto::auth::PeerInterceptor;
    use regolith_proto::raft::{raft_client::RaftClient, RaftMessage};
    let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return;
    };
    let ch = match ep
        .connect_timeout(QUIET)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
    {
        Ok(ch) => ch,
        Err(_) => return tally.add("metad/connect failed"),
    };
    let Ok(icpt) = PeerInterceptor::new(Some(token), None) else {
        return;
    };
    let mut with_token = RaftClient::with_interceptor(ch.clone(), icpt);
    let mut garbage = vec![1u8];
    garbage.extend(random_bytes(rng, 24));
    for (what, payload) in [
        ("forged vote", forged_vote()),
        ("garbage vote", garbage),
        ("vote format 9", vec![9, 1, 2, 3]),
    ] {
        tally.add(format!("metad/sent {what}"));
        match with_token.vote(RaftMessage { payload }).await {
            Ok(_) => tally.violation(format!(
                "metad at {addr} answered OK to a {what} from non-member {STRANGER}"
            )),
            // "undecodable" would mean the forged Vote never reached metad's term check.
            Err(st) if st.message().contains("undecodable") => {
                tally.add(format!("metad/{what} undecodable {:?}", st.code()))
            }
            Err(st) => tally.add(format!("metad/{what} refused {:?}", st.code())),
        }
    }
    tally.add("metad/sent vote without token");
    match RaftClient::new(ch)
        .vote(RaftMessage {
            payload: forged_vote(),
        })
        .await
    {
        Ok(_) => tally.violation(format!("metad at {addr} took a Vote without the token")),
        Err(st) => tally.add(format!("metad/vote without token refused {:?}", st.code())),
    }
}

/// Sends `bytes` on a fresh connection and waits a moment; counts whether the server closed.
fn raw_tcp(addr: SocketAddr, bytes: Vec<u8>, what: &str, tally: &mut Tally) {
    let Some(mut s) = connect(&addr) else {
        return tally.add(format!("{what}: connect failed"));
    };
    let _ = s.set_read_timeout(Some(HOLD));
    tally.add(format!("{what}: sent"));
    let _ = s.write_all(&bytes);
    let (_, closed) = drain(&mut s, None);
    tally.add(format!(
        "{what}: {}",
        if closed {
            "closed by server"
        } else {
            "held open"
        }
    ));
}

/// A request cut off inside its headers on one of metad's HTTP ports (the header timeout and
/// connection cap are the server's defence; we hang up after [`QUIET`]).
fn http_probe(addr: SocketAddr, round: u64, tally: &mut Tally) {
    let partial: &[u8] = if round.is_multiple_of(2) {
        b"GET /status HTTP/1.1\r\nHost: byzantine\r\n"
    } else {
        b"PUT /kv/byzantine HTTP/1.1\r\nContent-Le"
    };
    raw_tcp(addr, partial.to_vec(), "metad/http partial request", tally);
}
