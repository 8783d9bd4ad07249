//! Hostile and broken peers: the server answers with an error or closes the connection, never
//! panics, never allocates by a peer-given length, and keeps serving well-behaved clients.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use regolith_proto::checksum::chunk_count;
use regolith_proto::dataplane;
use regolith_proto::dataplane::{
    Hello, HelloReply, Kind, RefuseReason, Reply, Request, Status, HELLO_REPLY_LEN, REPLY_LEN,
};
use regolith_sidecar::transport::{RemoteRange, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Panics anywhere in the process (including spawned server tasks, which tokio would swallow).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, SeqCst);
            prev(info);
        }));
    });
}

const GEN: u64 = 9;
const SEG: u64 = 8 * MIB as u64;

fn req(kind: Kind, req_id: u64, generation: u64, offset: u64, len: u32) -> Request {
    Request {
        kind,
        req_id,
        generation,
        offset,
        len,
        term: 1,
        res_id: 1,
        grant: Default::default(),
    }
}

async fn read_reply(s: &mut TcpStream) -> Reply {
    let mut b = [0u8; REPLY_LEN];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b))
        .await
        .expect("reply in time")
        .expect("reply");
    Reply::decode(&b).unwrap()
}

async fn well_behaved_round_trip(client_node: &Node, server: &Node) {
    let data = random_bytes(3 * MIB + 5, 77);
    let v = Version { term: 1, id: 2 };
    let r = RemoteRange {
        generation: GEN,
        offset: MIB as u64,
        len: data.len() as u64,
        grant: Default::default(),
    };
    let mut h = vec![0u64; chunk_count(r.len)];
    client_node
        .client
        .write(&server.peer(), r, v, &data, &mut h)
        .await
        .unwrap();
    let mut back = vec![0u8; data.len()];
    client_node
        .client
        .read(&server.peer(), r, v, &mut back, &mut h)
        .await
        .unwrap();
    assert!(back == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_handshakes_are_refused_and_closed() {
    init_logs();
    count_panics();
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN).await;
    let addr = b.server.local_addrs()[0];

    // Not our protocol at all.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut s).await;
    let reply = HelloReply::decode(&got[..HELLO_REPLY_LEN].try_into().unwrap()).unwrap();
    assert_eq!(reply.verdict, Err(RefuseReason::BadMagic));

    // A token length above the cap is refused without being read.
    let mut hello = Hello::new(1, TOKEN).encode().unwrap();
    hello[6..8].copy_from_slice(&60000u16.to_le_bytes());
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello[..16]).await.unwrap();
    let got = read_to_close(&mut s).await;
    let reply = HelloReply::decode(&got[..HELLO_REPLY_LEN].try_into().unwrap()).unwrap();
    assert_eq!(reply.verdict, Err(RefuseReason::BadToken));

    // Version 0 is not spoken.
    let mut h = Hello::new(1, TOKEN);
    h.version = 0;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&h.encode().unwrap()).await.unwrap();
    let got = read_to_close(&mut s).await;
    let reply = HelloReply::decode(&got[..HELLO_REPLY_LEN].try_into().unwrap()).unwrap();
    assert_eq!(reply.verdict, Err(RefuseReason::UnsupportedVersion));
    assert_eq!(reply.version, dataplane::VERSION);

    // A newer client is answered with our version.
    let mut h = Hello::new(1, TOKEN);
    h.version = 42;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&h.encode().unwrap()).await.unwrap();
    let mut rb = [0u8; HELLO_REPLY_LEN];
    s.read_exact(&mut rb).await.unwrap();
    let reply = HelloReply::decode(&rb).unwrap();
    assert_eq!(
        (reply.verdict, reply.version, reply.node_id),
        (Ok(()), dataplane::VERSION, 2)
    );

    // Truncated hellos, and a client that connects and says nothing, then leaves.
    for cut in [0usize, 3, 15, 17] {
        let hello = Hello::new(1, TOKEN).encode().unwrap();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&hello[..cut]).await.unwrap();
        s.shutdown().await.unwrap();
        assert!(read_to_close(&mut s).await.is_empty(), "cut at {cut}");
    }

    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    well_behaved_round_trip(&a, &b).await;
    assert_eq!(PANICS.load(SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_and_the_server_keeps_serving() {
    init_logs();
    count_panics();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN).await;
    let addr = b.server.local_addrs()[1];

    // A 4 GiB write: TOO_LARGE, then the connection closes (its body cannot be skipped).
    let (mut s, _) = raw_connect(addr, TOKEN).await;
    s.write_all(&req(Kind::Write, 1, GEN, 0, u32::MAX).encode())
        .await
        .unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.req_id, r.status), (1, Status::TooLarge));
    assert!(read_to_close(&mut s).await.is_empty());

    // Unknown request kind and non-zero reserved bytes: BAD_REQUEST, then closed.
    for corrupt in [0usize, 2] {
        let (mut s, _) = raw_connect(addr, TOKEN).await;
        let mut h = req(Kind::Read, 2, GEN, 0, 10).encode();
        h[corrupt] = 0x7f;
        s.write_all(&h).await.unwrap();
        let r = read_reply(&mut s).await;
        assert_eq!((r.req_id, r.status), (2, Status::BadRequest));
        assert!(read_to_close(&mut s).await.is_empty());
    }

    // A truncated header, then the client leaves: the server just closes.
    let (mut s, _) = raw_connect(addr, TOKEN).await;
    s.write_all(&req(Kind::Write, 3, GEN, 0, 10).encode()[..20])
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    assert!(read_to_close(&mut s).await.is_empty());

    // A write whose body stops short: the connection closes and the slice is not in flight.
    let (mut s, _) = raw_connect(addr, TOKEN).await;
    s.write_all(&req(Kind::Write, 4, GEN, 0, MIB as u32).encode())
        .await
        .unwrap();
    s.write_all(&[1u8; 1000]).await.unwrap();
    s.shutdown().await.unwrap();
    assert!(read_to_close(&mut s).await.is_empty());
    assert_eq!(b.admission.in_flight(1, 1), 0);

    // Refusals that keep framing: read past the segment, read and write of an old generation.
    let (mut s, _) = raw_connect(addr, TOKEN).await;
    s.write_all(&req(Kind::Read, 5, GEN, SEG - 10, 11).encode())
        .await
        .unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.status, r.len), (Status::OutOfRange, 0));
    s.write_all(&req(Kind::Read, 6, GEN, u64::MAX - 5, 10).encode())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, Status::OutOfRange);
    s.write_all(&req(Kind::Read, 7, GEN - 1, 0, 10).encode())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, Status::BadGeneration);
    s.write_all(&req(Kind::Write, 8, GEN - 1, 0, 5).encode())
        .await
        .unwrap();
    s.write_all(b"stale").await.unwrap();
    assert_eq!(read_reply(&mut s).await.status, Status::BadGeneration);
    s.write_all(&req(Kind::Write, 9, GEN, SEG - 2, 5).encode())
        .await
        .unwrap();
    s.write_all(b"12345").await.unwrap();
    assert_eq!(read_reply(&mut s).await.status, Status::OutOfRange);
    // ... and the same connection still works.
    s.write_all(&req(Kind::Write, 10, GEN, 64, 5).encode())
        .await
        .unwrap();
    s.write_all(b"fresh").await.unwrap();
    assert_eq!(read_reply(&mut s).await.status, Status::Ok);
    s.write_all(&req(Kind::Read, 11, GEN, 64, 5).encode())
        .await
        .unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.req_id, r.status, r.len), (11, Status::Ok, 5));
    let mut five = [0u8; 5];
    s.read_exact(&mut five).await.unwrap();
    assert_eq!(&five, b"fresh");
    // SAFETY: nothing writes the segment concurrently in this test.
    assert_ne!(unsafe { b.segment.slice(0, 5).unwrap() }, b"stale");

    well_behaved_round_trip(&a, &b).await;
    assert_eq!(PANICS.load(SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_requests_at_a_node_without_rdma_are_answered_unsupported() {
    init_logs();
    count_panics();
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN).await;
    let addr = b.server.local_addrs()[0];
    let (mut s, hello) = raw_connect(addr, TOKEN).await;
    assert_eq!(hello.verdict, Ok(()));

    // An upgrade with a garbage offer: read in full, answered UNSUPPORTED (this node has no
    // RDMA), and the connection stays in step.
    let mut up = req(Kind::RdmaConnect, 1, 0, 0, 20);
    up.term = 0;
    up.res_id = 0;
    s.write_all(&up.encode()).await.unwrap();
    s.write_all(&[0xAB; 20]).await.unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.req_id, r.status, r.len), (1, Status::Unsupported, 0));

    // A commit on a connection that was never upgraded: UNSUPPORTED, nothing written.
    s.write_all(&req(Kind::RdmaCommit, 2, GEN, 0, 4096).encode())
        .await
        .unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.req_id, r.status), (2, Status::Unsupported));
    let mut seg = vec![0u8; 4096];
    b.segment.read_at(0, &mut seg).unwrap();
    assert!(seg.iter().all(|&x| x == 0));

    // Still a working TCP connection: a plain read is served.
    s.write_all(&req(Kind::Read, 3, GEN, 0, 4096).encode())
        .await
        .unwrap();
    let r = read_reply(&mut s).await;
    assert_eq!((r.req_id, r.status, r.len), (3, Status::Ok, 4096));
    let mut body = vec![0u8; 4096];
    s.read_exact(&mut body).await.unwrap();

    // An offer longer than any offer can be is not read: TOO_LARGE and the connection closes.
    s.write_all(&req(Kind::RdmaConnect, 4, 0, 0, 1 << 20).encode())
        .await
        .unwrap();
    let got = read_to_close(&mut s).await;
    let r = Reply::decode(&got[..REPLY_LEN].try_into().unwrap()).unwrap();
    assert_eq!((r.req_id, r.status), (4, Status::TooLarge));

    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    well_behaved_round_trip(&a, &b).await;
    assert_eq!(PANICS.load(SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_refuses_with_busy() {
    init_logs();
    let b = Node::start_with(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN, |sc, _| {
        sc.max_connections = 2;
    })
    .await;
    let addr = b.server.local_addrs()[0];
    let (_s1, r1) = raw_connect(addr, TOKEN).await;
    let (_s2, r2) = raw_connect(addr, TOKEN).await;
    assert_eq!((r1.verdict, r2.verdict), (Ok(()), Ok(())));
    // The limit counts authenticated connections: the third peer is refused in its handshake.
    let (mut s3, r3) = raw_connect(addr, TOKEN).await;
    assert_eq!(r3.verdict, Err(RefuseReason::Busy));
    assert!(read_to_close(&mut s3).await.is_empty(), "closed after BUSY");
    assert_eq!(b.stats.refused_busy.load(SeqCst), 1);
    // A closed authenticated connection frees its place.
    drop(_s1);
    let mut ok = false;
    for _ in 0..50 {
        if raw_connect(addr, TOKEN).await.1.verdict.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "a place under max_connections came free");
}

/// Finding 8: silent unauthenticated connections no longer lock real peers out. They are
/// counted apart from authenticated ones (at most `max_pending`, the oldest closed to make
/// room), so a real peer's fresh handshake always finds a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_8_silent_unauthenticated_connections_do_not_lock_peers_out() {
    init_logs();
    count_panics();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start_with(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN, |sc, _| {
        sc.max_connections = 8;
        sc.max_pending = 16;
        sc.handshake_timeout = Duration::from_secs(30);
    })
    .await;
    let mut silent = Vec::new();
    for addr in b.server.local_addrs() {
        for _ in 0..150 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
    }
    // Past max_pending, the oldest silent ones are closed (not the newest refused).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.stats.evicted_pending.load(SeqCst) < 300 - 16 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        b.stats.evicted_pending.load(SeqCst) >= 300 - 16,
        "evicted {}",
        b.stats.evicted_pending.load(SeqCst)
    );
    assert!(
        b.server.active_connections() <= 16 + 8,
        "{}",
        b.server.active_connections()
    );
    // The first silent connections were closed by the server.
    let got = read_to_close(&mut silent[0]).await;
    assert!(got.is_empty(), "closed without a reply: {got:?}");
    // A real peer gets through while the newest silent connections still sit there.
    well_behaved_round_trip(&a, &b).await;
    assert_eq!(b.stats.refused_busy.load(SeqCst), 0);
    drop(silent);
    well_behaved_round_trip(&a, &b).await;
    assert_eq!(PANICS.load(SeqCst), 0);
}

/// Random bytes after a valid handshake (or instead of one) never panic the server, and it
/// always either answers or closes.
#[test]
fn random_bytes_never_hurt_the_server() {
    init_logs();
    count_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = rt.block_on(async {
        (
            Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await,
            Node::start(2, ips("127.0.0.4", "127.0.0.5"), SEG, GEN).await,
        )
    });
    let addr = b.server.local_addrs()[0];
    let cfg = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                     handshake in any::<bool>(),
                     valid_prefix in any::<bool>())| {
        rt.block_on(async {
            let mut s = if handshake {
                raw_connect(addr, TOKEN).await.0
            } else {
                TcpStream::connect(addr).await.unwrap()
            };
            let mut wire = Vec::new();
            if handshake && valid_prefix {
                // A plausible header with random fields, so deeper paths are reached too.
                let mut rng = rand::rngs::StdRng::seed_from_u64(bytes.len() as u64);
                let kind = if rng.gen() { Kind::Write } else { Kind::Read };
                let gen = if rng.gen() { GEN } else { rng.gen() };
                let off = rng.gen_range(0..SEG * 2);
                wire.extend_from_slice(&req(kind, 1, gen, off, rng.gen_range(0..4096)).encode());
            }
            wire.extend_from_slice(&bytes);
            let _ = s.write_all(&wire).await;
            let _ = s.shutdown().await;
            read_to_close(&mut s).await;
        });
    });
    rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        well_behaved_round_trip(&a, &b).await;
    });
    assert_eq!(PANICS.load(SeqCst), 0);
    // Only the well-behaved client's pooled connections remain.
    assert!(
        b.server.active_connections() <= 8,
        "{}",
        b.server.active_connections()
    );
}
