//! Bad input on the UDS socket and the data port: error replies or closed connections, the
//! sidecar keeps serving other clients, and its memory does not blow up.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use regolith_client::ReplicateConfig;
use regolith_e2e::{value, Cluster};
use regolith_proto::dataplane::{self, HelloReply, Kind, Reply, Request, Status};
use regolith_proto::frame;
use regolith_proto::uds::{pb, Op};

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Sends `bytes` and returns what comes back before the sidecar closes or goes quiet.
fn poke(sock: &std::path::Path, bytes: &[u8]) -> Vec<u8> {
    poke_for(sock, bytes, Duration::from_millis(500))
}

fn poke_for(sock: &std::path::Path, bytes: &[u8], quiet: Duration) -> Vec<u8> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(quiet)).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn hello_frame() -> Vec<u8> {
    let h = pb::HelloRequest {
        protocol_version: 1,
        staging_size: 0,
        client_name: "hostile".into(),
    };
    frame::encode_to_vec(Op::Hello as u16, 1, &h.encode_to_vec()).unwrap()
}

/// Decodes every whole frame in `bytes`.
fn frames(bytes: &[u8]) -> Vec<frame::Frame> {
    let mut c = frame::FrameCodec::new(regolith_proto::uds::MAX_FRAME);
    c.feed(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = c.next_frame() {
        out.push(f);
    }
    out
}

#[test]
fn garbage_on_the_socket_gets_errors_and_harms_no_one() {
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let good = c.client(0);
    good.put(
        "before",
        &value("before", 100_000),
        &ReplicateConfig::default(),
    )
    .unwrap();
    let pid = c.sidecars[0].proc.pid().unwrap();
    let rss0 = rss_kib(pid);
    let sock = c.socket(0);
    // Random bytes, a length of 4 GiB, a truncated frame, a zero-length frame: closed.
    let mut rng = 0x1234_5678u64;
    let random: Vec<u8> = (0..10_000)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u8
        })
        .collect();
    for bytes in [
        random.clone(),
        vec![0xFF, 0xFF, 0xFF, 0xFF, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        hello_frame()[..7].to_vec(),
        vec![0, 0, 0, 0],
    ] {
        let _ = poke(sock, &bytes);
    }
    // Not hello first: an error reply.
    let f = frames(&poke(
        sock,
        &frame::encode_to_vec(Op::Get as u16, 9, b"").unwrap(),
    ));
    assert_eq!(f.first().map(|f| f.opcode), Some(Op::Error as u16));
    // After hello: unknown opcode, undecodable body, bad regions, unknown reservation.
    let mut req = hello_frame();
    req.extend(frame::encode_to_vec(777, 2, b"??").unwrap());
    req.extend(frame::encode_to_vec(Op::PutBegin as u16, 3, &[0xFF; 40]).unwrap());
    let get = pb::GetRequest {
        items: vec![pb::GetItem {
            key: "before".into(),
            dest: Some(pb::Region {
                r#where: Some(pb::region::Where::Staging(pb::Window {
                    offset: u64::MAX - 10,
                    len: 1 << 20,
                })),
            }),
            local_ok: false,
            report_mismatch: false,
            mismatched_version: None,
        }],
    };
    req.extend(frame::encode_to_vec(Op::Get as u16, 4, &get.encode_to_vec()).unwrap());
    let commit = pb::PutCommitRequest {
        items: vec![pb::PutCommitItem {
            version: Some(pb::Version {
                term: 1,
                id: 424242,
            }),
            ..Default::default()
        }],
    };
    req.extend(frame::encode_to_vec(Op::PutCommit as u16, 5, &commit.encode_to_vec()).unwrap());
    req.extend(
        frame::encode_to_vec(
            Op::RegisterShm as u16,
            6,
            &pb::RegisterShmRequest { size: 4096 }.encode_to_vec(),
        )
        .unwrap(),
    );
    let replies = frames(&poke(sock, &req));
    let by_id = |id: u64| {
        replies
            .iter()
            .find(|f| f.request_id == id)
            .unwrap_or_else(|| panic!("no reply to request {id}: {replies:?}"))
    };
    assert_eq!(by_id(2).opcode, Op::Error as u16, "unknown opcode");
    assert_eq!(by_id(3).opcode, Op::Error as u16, "undecodable body");
    let g = pb::GetReply::decode(by_id(4).body.as_ref()).unwrap();
    assert_ne!(
        g.items[0].status.as_ref().unwrap().code,
        0,
        "a window past the staging area was accepted"
    );
    let pc = pb::PutCommitReply::decode(by_id(5).body.as_ref()).unwrap();
    assert_eq!(
        pc.items[0].status.as_ref().unwrap().code,
        pb::Code::InvalidArgument as i32
    );
    let rs = pb::RegisterShmReply::decode(by_id(6).body.as_ref()).unwrap();
    assert_eq!(
        rs.status.unwrap().code,
        pb::Code::InvalidArgument as i32,
        "REGISTER_SHM without a memfd"
    );
    // Many connections that say hello and leave: staging areas come back.
    for _ in 0..50 {
        let _ = poke_for(sock, &hello_frame(), Duration::from_millis(20));
    }
    // Everyone else is unharmed.
    assert!(good.get("before").unwrap() == value("before", 100_000));
    let other = c.client(0);
    other
        .put(
            "after",
            &value("after", 100_000),
            &ReplicateConfig::default(),
        )
        .unwrap();
    assert!(c.client(1).get("after").unwrap() == value("after", 100_000));
    let grown = rss_kib(pid).saturating_sub(rss0);
    assert!(
        grown < 64 * 1024,
        "sidecar RSS grew by {grown} KiB under bad input"
    );
}

#[test]
fn garbage_on_the_data_port_is_refused() {
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let a = c.client(0);
    a.put(
        "kept",
        &value("kept", 200_000),
        &ReplicateConfig {
            prefer_local: true,
            ..Default::default()
        },
    )
    .unwrap();
    let addr = format!("{}:{}", c.sidecars[0].nics[0], c.sidecars[0].data_port);
    let send = |bytes: &[u8]| -> Vec<u8> {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    };
    // Random bytes; a wrong token.
    let _ = send(&[0x5A; 5000]);
    let hello = dataplane::Hello::new(99, b"wrong-token").encode().unwrap();
    let r = send(&hello);
    assert!(r.len() >= dataplane::HELLO_REPLY_LEN);
    let reply = HelloReply::decode(r[..dataplane::HELLO_REPLY_LEN].try_into().unwrap()).unwrap();
    assert!(reply.verdict.is_err(), "a wrong token was accepted");
    // With the right token: a length of 4 GiB, an old generation, a read past the segment.
    let token = c.token();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(
        &dataplane::Hello::new(99, token.as_bytes())
            .encode()
            .unwrap(),
    )
    .unwrap();
    let mut hr = [0u8; dataplane::HELLO_REPLY_LEN];
    s.read_exact(&mut hr).unwrap();
    assert!(HelloReply::decode(&hr).unwrap().verdict.is_ok());
    let mc = c.metad_client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gen = rt
        .block_on(mc.list_segments())
        .unwrap()
        .iter()
        .find(|x| x.node_name == "node-a")
        .unwrap()
        .generation;
    let read = |s: &mut std::net::TcpStream, generation: u64, offset: u64, len: u32| -> Status {
        let req = Request {
            kind: Kind::Read,
            req_id: 7,
            generation,
            offset,
            len,
            term: 1,
            res_id: 1,
            grant: Default::default(),
        };
        s.write_all(&req.encode()).unwrap();
        let mut rb = [0u8; dataplane::REPLY_LEN];
        s.read_exact(&mut rb).unwrap();
        let r = Reply::decode(&rb).unwrap();
        if r.status == Status::Ok {
            let mut sink = vec![0u8; r.len as usize];
            s.read_exact(&mut sink).unwrap();
        }
        r.status
    };
    assert_eq!(read(&mut s, gen + 5, 0, 4096), Status::BadGeneration);
    assert_eq!(
        read(&mut s, gen, (64 << 20) - 100, 4096),
        Status::OutOfRange
    );
    assert_eq!(
        read(&mut s, gen, 0, 4096),
        Status::Forbidden,
        "a well-formed read without the leader's grant, answered on the same connection"
    );
    let mut huge = Request {
        kind: Kind::Write,
        req_id: 8,
        generation: gen,
        offset: 0,
        len: 4096,
        term: 1,
        res_id: 1,
        grant: Default::default(),
    }
    .encode();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let _ = s.write_all(&huge);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // Still serving.
    assert!(c.client(1).get("kept").unwrap() == value("kept", 200_000));
}

/// Finding 10 (issue 14): a REMOVE_ALL frame with a garbage body wiped every key of the
/// cluster; REMOVE_ALL, LIST_SEGMENTS and STATS never decoded their bodies.
#[test]
fn finding_10_remove_all_with_a_garbage_body_removes_nothing() {
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let good = c.client(0);
    good.put("kept", &value("kept", 100_000), &ReplicateConfig::default())
        .unwrap();
    let sock = c.socket(0);
    let error_of = |f: &frame::Frame| {
        assert_eq!(
            f.opcode,
            Op::Error as u16,
            "request {} answered opcode {}, not ERROR",
            f.request_id,
            f.opcode
        );
        let st = pb::ErrorReply::decode(f.body.as_ref())
            .unwrap()
            .status
            .unwrap();
        assert_eq!(st.code, pb::Code::InvalidArgument as i32, "{st:?}");
        st.message
    };
    // Undecodable, and decodable as Empty with unknown fields (field 1 = 1; field 15 bytes).
    let bodies: [&[u8]; 3] = [
        &[0xff, 0xff, 0xff],
        &[0x08, 0x01],
        &[0x7a, 0x02, b'h', b'i'],
    ];
    let mut req = hello_frame();
    for (id, body) in (10..).zip(bodies) {
        req.extend(frame::encode_to_vec(Op::RemoveAll as u16, id, body).unwrap());
    }
    // LIST_SEGMENTS and STATS: an undecodable body is an error, an empty one answered.
    req.extend(frame::encode_to_vec(Op::ListSegments as u16, 20, &[0xff, 0xff, 0xff]).unwrap());
    req.extend(frame::encode_to_vec(Op::Stats as u16, 21, &[0xff, 0xff, 0xff]).unwrap());
    req.extend(frame::encode_to_vec(Op::ListSegments as u16, 22, b"").unwrap());
    req.extend(frame::encode_to_vec(Op::Stats as u16, 23, b"").unwrap());
    let replies = frames(&poke_for(sock, &req, Duration::from_secs(2)));
    let by_id = |id: u64| {
        replies
            .iter()
            .find(|f| f.request_id == id)
            .unwrap_or_else(|| panic!("no reply to request {id}: {replies:?}"))
    };
    let m = error_of(by_id(10));
    assert!(m.contains("undecodable"), "{m}");
    for id in [11, 12] {
        let m = error_of(by_id(id));
        assert!(m.contains("REMOVE_ALL takes an empty body"), "{m}");
    }
    error_of(by_id(20));
    error_of(by_id(21));
    assert_eq!(by_id(22).opcode, Op::ListSegments as u16);
    let segs = pb::SegmentsReply::decode(by_id(22).body.as_ref()).unwrap();
    assert_eq!(segs.segments.len(), 2, "{segs:?}");
    assert_eq!(by_id(23).opcode, Op::Stats as u16);
    // Nothing was removed: the key is there and reads back, from both nodes.
    assert!(
        good.exists("kept").unwrap(),
        "REMOVE_ALL with a bad body removed \"kept\""
    );
    assert!(good.get("kept").unwrap() == value("kept", 100_000));
    assert!(c.client(1).get("kept").unwrap() == value("kept", 100_000));
    // The real request (an empty body) still works, and a put/get round trip after it.
    let mut req = hello_frame();
    req.extend(frame::encode_to_vec(Op::RemoveAll as u16, 30, b"").unwrap());
    let replies = frames(&poke_for(sock, &req, Duration::from_secs(2)));
    let r = replies
        .iter()
        .find(|f| f.request_id == 30)
        .unwrap_or_else(|| panic!("no reply to REMOVE_ALL: {replies:?}"));
    assert_eq!(r.opcode, Op::RemoveAll as u16);
    let ra = pb::RemoveAllReply::decode(r.body.as_ref()).unwrap();
    assert_eq!(ra.removed, 1, "{ra:?}");
    assert!(!good.exists("kept").unwrap());
    good.put(
        "after",
        &value("after", 100_000),
        &ReplicateConfig::default(),
    )
    .unwrap();
    assert!(c.client(1).get("after").unwrap() == value("after", 100_000));
}

/// Every file and directory under `dir` (itself included), with its permission bits.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue; // removed meanwhile (a sled temp file)
        };
        out.push((p.clone(), md.permissions().mode() & 0o777));
        if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    out
}

/// Finding 12 (issue 14): sled files were 0644 in 0755 directories (any local user could read
/// the metadata KV from the database), and the socket was made 0660 only after bind.
#[test]
fn finding_12_daemon_files_are_private_and_the_socket_is_0660() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::start(&["64MiB"]);
    let good = c.client(0);
    good.put("kept", &value("kept", 100_000), &ReplicateConfig::default())
        .unwrap();
    let mut checked = 0;
    let dirs = c
        .metad
        .iter()
        .map(|m| m.dir.clone())
        .chain(std::iter::once(c.sidecars[0].state_dir.clone()));
    for dir in dirs {
        let modes = modes_under(&dir);
        assert!(
            modes.len() > 1 || dir == c.sidecars[0].state_dir,
            "{dir:?} is empty"
        );
        assert_eq!(modes[0].1, 0o700, "{dir:?}");
        for (p, mode) in &modes {
            assert_eq!(mode & 0o077, 0, "{p:?} has mode {mode:o}");
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} paths checked");
    let sock = std::fs::metadata(c.socket(0)).unwrap().permissions().mode() & 0o777;
    assert_eq!(sock, 0o660, "socket mode {sock:o}");
    assert!(good.get("kept").unwrap() == value("kept", 100_000));
}

/// Finding 6 (issue 14): a local client could make the sidecar use unbounded memory: replies a
/// client never read were not bounded (300,000 small requests added 814 MiB), and a 4-byte
/// length prefix made the decoder reserve up to 64 MiB before hello, with no read timeout
/// (40 stalled connections: +1.29 GiB).
#[test]
fn finding_6_clients_that_stall_or_never_read_cost_bounded_memory() {
    let c = Cluster::start(&["64MiB"]);
    let good = c.client(0);
    good.put("kept", &value("kept", 100_000), &ReplicateConfig::default())
        .unwrap();
    let pid = c.sidecars[0].proc.pid().unwrap();
    let sock = c.socket(0);
    let rss0 = rss_kib(pid);

    // 40 connections announcing a frame (before hello) and sending nothing more: half a
    // 64 MiB one (above what may come before hello: closed at once), half one of 60 KB.
    let mut stalled = Vec::new();
    let mut oversized = Vec::new();
    for i in 0..40 {
        let mut s = UnixStream::connect(sock).unwrap();
        let len: u32 = if i % 2 == 0 { (64 << 20) - 1 } else { 60 << 10 };
        s.write_all(&len.to_le_bytes()).unwrap();
        if i % 2 == 0 {
            oversized.push(s);
        } else {
            stalled.push(s);
        }
    }
    // And one client that says hello, then pipelines requests without reading any reply.
    let mut flood = UnixStream::connect(sock).unwrap();
    flood.write_all(&hello_frame()).unwrap();
    let body = pb::KeysRequest {
        keys: vec!["absent".into()],
    }
    .encode_to_vec();
    let frame = frame::encode_to_vec(Op::Exists as u16, 7, &body).unwrap();
    flood.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        match flood.write(&frame) {
            Ok(n) if n == frame.len() => sent += 1,
            Ok(_) => break, // a partial write: the socket is full, the frame is cut
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("flood: {e}"),
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let grown = rss_kib(pid).saturating_sub(rss0);
    eprintln!(
        "{sent} unread requests of {} bytes sent; RSS grew {grown} KiB",
        frame.len()
    );
    // The sidecar stops reading once --max-in-flight replies wait to be read: what is not read
    // stays in the socket's buffer, so the writer soon blocks (before, it read on and built
    // replies for every request).
    assert!(
        sent < 200_000,
        "{sent} requests were taken in without replies being read"
    );
    assert!(grown < 128 * 1024, "RSS grew {grown} KiB");

    for s in &mut oversized {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        assert!(
            s.read_to_end(&mut buf).is_ok(),
            "a 64 MiB frame before hello was not refused at once"
        );
    }
    // The stalled connections are closed after the hello timeout (10 s).
    let first = &mut stalled[0];
    first
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let _ = first.read_to_end(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a connection without hello stayed open"
    );
    let replies = frames(&buf);
    assert!(
        replies.iter().any(|f| f.opcode == Op::Error as u16),
        "no error frame for the missing hello"
    );
    // The other stalled connections were opened right after the first: closed by now or
    // within moments; each is counted as it is closed.
    for s in &mut stalled[1..] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        assert!(
            s.read_to_end(&mut buf).is_ok(),
            "a connection without hello stayed open"
        );
    }
    drop(flood);
    assert!(good.get("kept").unwrap() == value("kept", 100_000));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let bad = loop {
        let m = c.sidecar_metrics(0);
        let bad = regolith_e2e::metric(&m, "regolith_sidecar_uds_bad_requests_total").unwrap();
        if bad >= 40.0 || std::time::Instant::now() > deadline {
            break bad;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        bad >= 40.0,
        "{bad} bad requests counted, 40 connections refused"
    );
}

/// Finding 14: a client whose sidecar goes away spaces its reconnection attempts (10 ms
/// doubling to 1 s) instead of failing every call at once, and reconnects once the sidecar is
/// back.
#[test]
fn finding_14_a_client_backs_off_while_its_sidecar_restarts() {
    let mut c = Cluster::start(&["64MiB"]);
    let a = c.client(0);
    let v = value("before", 4096);
    a.put("before", &v, &ReplicateConfig::default()).unwrap();
    assert!(a.get("before").unwrap() == v);
    c.sidecars[0].proc.kill();
    // An application that retries every failed call at once, for 3 s.
    let end = std::time::Instant::now() + Duration::from_secs(3);
    let (mut calls, mut errors) = (0u32, 0u32);
    while std::time::Instant::now() < end {
        calls += 1;
        if a.exists("before").is_err() {
            errors += 1;
        }
    }
    // 3 s of back-off is about 9 attempts; without it a loop like this fails ~10^5 times.
    assert!(errors >= 1, "the sidecar is down: calls must fail");
    assert!(
        calls <= 40 && errors <= 40,
        "{calls} calls, {errors} errors in 3 s: reconnection is not backing off"
    );
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    // The same client object reconnects by itself (next attempt within 1 s).
    let v2 = value("after", 70_000);
    let mut put = Err(regolith_client::Error::InvalidArgument("not tried".into()));
    for _ in 0..20 {
        put = a.put("after", &v2, &ReplicateConfig::default());
        if put.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    put.unwrap_or_else(|e| panic!("no put after the sidecar came back: {e}"));
    assert!(a.get("after").unwrap() == v2);
}

/// A raw data-plane connection to sidecar `i`, authenticated with the cluster token (what any
/// sidecar or CLI user holds), speaking the current protocol version.
fn data_plane(c: &Cluster, i: usize) -> std::net::TcpStream {
    let addr = format!("{}:{}", c.sidecars[i].nics[0], c.sidecars[i].data_port);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = dataplane::Hello::new(99, c.token().as_bytes());
    s.write_all(&hello.encode().unwrap()).unwrap();
    let mut hr = [0u8; dataplane::HELLO_REPLY_LEN];
    s.read_exact(&mut hr).unwrap();
    let reply = HelloReply::decode(&hr).unwrap();
    assert_eq!((reply.verdict, reply.version), (Ok(()), dataplane::VERSION));
    s
}

/// Sends one request (and a write's body of `len` bytes of 0xEE); its reply and a read's bytes.
fn slice(s: &mut std::net::TcpStream, req: &Request) -> (Reply, Vec<u8>) {
    s.write_all(&req.encode()).unwrap();
    if req.kind == Kind::Write {
        s.write_all(&vec![0xEE; req.len as usize]).unwrap();
    }
    let mut rb = [0u8; dataplane::REPLY_LEN];
    s.read_exact(&mut rb).unwrap();
    let r = Reply::decode(&rb).unwrap();
    let mut data = vec![0u8; r.len as usize];
    s.read_exact(&mut data).unwrap();
    (r, data)
}

/// A request for the first extent of `p`'s first replica, with the grant metad gave for it.
fn granted(kind: Kind, p: &regolith_proto::metad::ObjectPlacement, len: u32) -> Request {
    let r = &p.replicas[0];
    let (e, mac) = (&r.extents[0], &r.grants[0]);
    let v = p.version.unwrap();
    Request {
        kind,
        req_id: 1,
        generation: r.generation,
        offset: e.offset,
        len,
        term: v.term,
        res_id: v.id,
        grant: regolith_proto::grant::Grant {
            offset: e.offset,
            len: e.len,
            mac: mac.as_slice().try_into().unwrap(),
        },
    }
}

/// Finding 7: the data plane trusted any token holder fully. A read at any offset with an
/// invented version returned another object's bytes; a write over a committed object without
/// a reservation was accepted; one write carrying term 2^64-1 raised the node's highest term
/// for good (even when refused as out of range), and every later remote write to that node
/// failed STALE_TERM. Now every slice needs the leader's grant of the extent it lies in (a MAC
/// under a key derived from the replicas' peer credential, which token holders lack), checked
/// before the term.
#[test]
fn finding_7_the_data_plane_serves_only_what_the_leader_granted() {
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let (a, b) = (c.client(0), c.client(1));
    let on_b = ReplicateConfig {
        preferred_segments: vec!["node-b".into()],
        ..Default::default()
    };
    a.put("victim", &value("victim", 300_000), &on_b).unwrap();
    a.put("secret", &value("secret", 300_000), &on_b).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mc = c.metad_client();
    let victim = rt.block_on(mc.get("victim", 0)).unwrap();
    let secret = rt.block_on(mc.get("secret", 0)).unwrap();
    assert_eq!(victim.replicas[0].node_name, "node-b");
    assert_eq!(secret.replicas[0].node_name, "node-b");
    assert_eq!(
        victim.replicas[0].grants.len(),
        victim.replicas[0].extents.len(),
        "metad grants every extent it hands out"
    );
    let status = c.sidecar_status(1);
    assert_eq!(status["grants_enforced"], true, "{status}");
    let mut s = data_plane(&c, 1);

    // What the leader granted is served: a read of the victim's first 4 KiB.
    let (r, data) = slice(&mut s, &granted(Kind::Read, &victim, 4096));
    assert_eq!(r.status, Status::Ok);
    assert_eq!(data, value("victim", 300_000)[..4096]);
    let term_before = r.term;

    // (a) Reads: an invented version with no grant; the victim's grant at the secret's offset;
    // the victim's grant with another version: all FORBIDDEN, no byte of the secret leaves.
    let mut invented = granted(Kind::Read, &secret, 4096);
    invented.grant = Default::default();
    invented.term = 1;
    invented.res_id = 1;
    let mut elsewhere = granted(Kind::Read, &victim, 4096);
    elsewhere.offset = secret.replicas[0].extents[0].offset;
    let mut other_version = granted(Kind::Read, &victim, 4096);
    other_version.res_id ^= 1;
    for (what, req) in [
        ("invented version", invented),
        ("another object's offset", elsewhere),
        ("another version", other_version),
    ] {
        let (r, data) = slice(&mut s, &req);
        assert_eq!((r.status, data.len()), (Status::Forbidden, 0), "{what}");
    }

    // (b) Writes over the committed victim: with its read grant, with no grant at all.
    let mut with_read_grant = granted(Kind::Read, &victim, 4096);
    with_read_grant.kind = Kind::Write;
    let mut no_grant = with_read_grant;
    no_grant.grant = Default::default();
    for (what, req) in [("a read grant", with_read_grant), ("no grant", no_grant)] {
        assert_eq!(slice(&mut s, &req).0.status, Status::Forbidden, "{what}");
    }

    // (c) Term 2^64-1, in range and far out of range: refused, and the node's highest term is
    // what it was.
    let mut huge_term = no_grant;
    huge_term.term = u64::MAX;
    let mut out_of_range = huge_term;
    out_of_range.offset = u64::MAX - 10;
    assert_eq!(slice(&mut s, &huge_term).0.status, Status::Forbidden);
    let (r, _) = slice(&mut s, &out_of_range);
    assert_eq!(r.status, Status::OutOfRange);
    let (r, _) = slice(&mut s, &granted(Kind::Read, &victim, 4096));
    assert_eq!((r.status, r.term), (Status::Ok, term_before));

    // The victim is intact (not even CORRUPT), and remote writes to node-b still succeed.
    assert!(b.get("victim").unwrap() == value("victim", 300_000));
    a.put("after", &value("after", 300_000), &on_b).unwrap();
    assert!(b.get("after").unwrap() == value("after", 300_000));
    let m = c.sidecar_metrics(1);
    let bad = regolith_e2e::metric(
        &m,
        "regolith_sidecar_data_plane_refusals{reason=\"bad_grant\"}",
    )
    .unwrap();
    assert!(
        bad >= 6.0,
        "{bad} slices counted as refused for their grant"
    );
}
