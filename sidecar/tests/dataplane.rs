//! The TCP data plane end to end on loopback: two in-process sidecars, each with two NIC
//! addresses (127.0.0.2/.3 and 127.0.0.4/.5) on ephemeral ports.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;
use regolith_proto::checksum::{checksum, chunk_count, combine};
use regolith_proto::dataplane::Status;
use regolith_sidecar::transport::{Admission, RemoteRange, Version};
use regolith_sidecar::Error;

fn range(generation: u64, offset: u64, len: usize) -> RemoteRange {
    RemoteRange {
        generation,
        offset,
        len: len as u64,
        grant: Default::default(),
    }
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_32mib_striped_over_both_nics() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 64 * MIB as u64, 3).await;
    let len = 32 * MIB + 12345;
    let data = random_bytes(len, 1);
    let v = Version { term: 4, id: 77 };
    let offset = 8 * MIB as u64;

    let mut wh = vec![0u64; chunk_count(len as u64)];
    let t = Instant::now();
    let rep = a
        .client
        .write(&b.peer(), range(3, offset, len), v, &data, &mut wh)
        .await
        .unwrap();
    let wt = t.elapsed();
    assert_eq!(rep.slices, 33);
    let expected = checksum(v.seed(), &data);
    assert_eq!(combine(v.seed(), &wh), expected, "writer's chunk hashes");
    // SAFETY: nothing else touches node b's segment during this check.
    let stored = unsafe { b.segment.slice(offset, len as u64).unwrap() };
    assert!(stored == &data[..], "segment holds the bytes written");

    let mut back = vec![0u8; len];
    let mut rh = vec![0u64; chunk_count(len as u64)];
    let t = Instant::now();
    a.client
        .read(&b.peer(), range(3, offset, len), v, &mut back, &mut rh)
        .await
        .unwrap();
    let rt = t.elapsed();
    assert!(back == data, "read back byte-exact");
    assert_eq!(
        combine(v.seed(), &rh),
        expected,
        "reader's chunk hashes verify"
    );
    eprintln!(
        "32 MiB write {:.2} GB/s, read {:.2} GB/s (debug build)",
        gbps(len, wt),
        gbps(len, rt)
    );

    // Both of the client's NICs and both of the server's carried bytes, both ways.
    for ip in &a.nics {
        let s = a.stats.nic_snapshot(*ip);
        assert!(s.bytes_out > 0 && s.bytes_in > 0, "client NIC {ip}: {s:?}");
    }
    for ip in &b.nics {
        let s = b.stats.nic_snapshot(*ip);
        assert!(s.bytes_in > 0 && s.bytes_out > 0, "server NIC {ip}: {s:?}");
    }
    let total_out: u64 = a
        .nics
        .iter()
        .map(|ip| a.stats.nic_snapshot(*ip).bytes_out)
        .sum();
    assert_eq!(total_out, len as u64, "no slice was sent twice");
    assert_eq!(b.admission.in_flight(4, 77), 0);
    assert_eq!(a.stats.transfers.load(Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_between_two_sidecars() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 16 * MIB as u64, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 16 * MIB as u64, 1).await;
    let v = Version { term: 1, id: 1 };
    for (from, to, seed) in [(&a, &b, 10u64), (&b, &a, 11)] {
        let data = random_bytes(5 * MIB + 7, seed);
        let mut h = vec![0u64; chunk_count(data.len() as u64)];
        from.client
            .write(&to.peer(), range(1, 0, data.len()), v, &data, &mut h)
            .await
            .unwrap();
        let mut back = vec![0u8; data.len()];
        let mut h2 = vec![0u64; h.len()];
        from.client
            .read(&to.peer(), range(1, 0, data.len()), v, &mut back, &mut h2)
            .await
            .unwrap();
        assert!(back == data);
        assert_eq!(h, h2);
    }
    // Connections are pooled: a second transfer dials nothing new.
    let before = a.server.active_connections() + b.server.active_connections();
    let data = random_bytes(4 * MIB, 12);
    let mut h = vec![0u64; chunk_count(data.len() as u64)];
    a.client
        .write(&b.peer(), range(1, 0, data.len()), v, &data, &mut h)
        .await
        .unwrap();
    assert_eq!(
        a.server.active_connections() + b.server.active_connections(),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_survives_a_nic_going_away() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 160 * MIB as u64, 1).await;
    let len = 128 * MIB;
    let data = random_bytes(len, 2);
    let v = Version { term: 1, id: 5 };
    let peer = b.peer();
    let dying = peer.addrs[0];
    a.client.connect_all(&peer).await;

    let mut wh = vec![0u64; chunk_count(len as u64)];
    let write = a.client.write(&peer, range(1, 0, len), v, &data, &mut wh);
    let kill = async {
        // Close the first NIC once it has carried a few slices: mid-transfer.
        let nic = b.stats.nic(Some(dying.ip()));
        while nic.bytes_in.load(Relaxed) < 4 * MIB as u64 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        assert!(b.server.close_nic(dying));
    };
    let (rep, ()) = tokio::join!(write, kill);
    let rep = rep.unwrap();
    assert!(
        rep.retries > 0,
        "slices in flight on the closed NIC were retried: {rep:?}"
    );
    assert_eq!(combine(v.seed(), &wh), checksum(v.seed(), &data));
    // SAFETY: nothing else touches node b's segment during this check.
    let stored = unsafe { b.segment.slice(0, len as u64).unwrap() };
    assert!(stored == &data[..]);

    // Later transfers avoid the dead NIC and still complete; a read too.
    let dead_before = b.stats.nic_snapshot(dying.ip()).bytes_out;
    let mut back = vec![0u8; 16 * MIB];
    let mut rh = vec![0u64; chunk_count(back.len() as u64)];
    a.client
        .read(&peer, range(1, 0, back.len()), v, &mut back, &mut rh)
        .await
        .unwrap();
    assert!(back[..] == data[..16 * MIB]);
    assert_eq!(b.stats.nic_snapshot(dying.ip()).bytes_out, dead_before);
    let retried: u64 = a
        .nics
        .iter()
        .map(|ip| a.stats.nic_snapshot(*ip).retries)
        .sum();
    assert!(retried > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_working_nic_pair_fails_the_transfer() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 8 * MIB as u64, 1).await;
    let peer = b.peer();
    for addr in &peer.addrs {
        b.server.close_nic(*addr);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let data = vec![1u8; 3 * MIB];
    let mut h = vec![0u64; 48];
    let t = Instant::now();
    let e = a
        .client
        .write(
            &peer,
            range(1, 0, data.len()),
            Version { term: 1, id: 1 },
            &data,
            &mut h,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoPath { node: 2, .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "fails fast: {:?}",
        t.elapsed()
    );
    assert_eq!(a.stats.failed_transfers.load(Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_refused_before_any_request() {
    init_logs();
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 8 * MIB as u64, 1).await;
    let peer = b.peer();

    // Through the client: every pair refuses, the transfer fails naming the reason.
    let stats = regolith_sidecar::transport::TransportStats::new();
    let bad = client_for(
        1,
        &ips("127.0.0.2", "127.0.0.3"),
        Some(b"wrong-token"),
        stats,
    );
    let data = vec![7u8; MIB];
    let mut h = vec![0u64; 16];
    let e = bad
        .write(
            &peer,
            range(1, 0, MIB),
            Version { term: 1, id: 1 },
            &data,
            &mut h,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wrong cluster token"), "{e}");
    let none = client_for(
        1,
        &[],
        None,
        regolith_sidecar::transport::TransportStats::new(),
    );
    assert!(none
        .write(
            &peer,
            range(1, 0, MIB),
            Version { term: 1, id: 1 },
            &data,
            &mut h
        )
        .await
        .is_err());
    // SAFETY: nothing else touches the segment during this check.
    assert!(unsafe { b.segment.slice(0, 16).unwrap() }
        .iter()
        .all(|&x| x == 0));

    // Raw: a request sent right behind a wrong hello is never read; the server closes.
    use regolith_proto::dataplane::{Hello, HelloReply, Kind, RefuseReason, Request};
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(peer.addrs[0]).await.unwrap();
    let mut bytes = Hello::new(1, b"nope").encode().unwrap();
    bytes.extend_from_slice(
        &Request {
            kind: Kind::Write,
            req_id: 1,
            generation: 1,
            offset: 0,
            len: 4,
            term: 1,
            res_id: 1,
            grant: Default::default(),
        }
        .encode(),
    );
    bytes.extend_from_slice(b"evil");
    s.write_all(&bytes).await.unwrap();
    let got = read_to_close(&mut s).await;
    assert_eq!(got.len(), 16, "only the refusal comes back");
    let reply = HelloReply::decode(&got[..16].try_into().unwrap()).unwrap();
    assert_eq!(reply.verdict, Err(RefuseReason::BadToken));
    // SAFETY: as above.
    assert!(unsafe { b.segment.slice(0, 4).unwrap() } != b"evil");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_generation_stale_term_fenced_and_out_of_range_are_refused() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 8 * MIB as u64, 5).await;
    let peer = b.peer();
    let data = random_bytes(2 * MIB, 3);
    let mut h = vec![0u64; 32];
    let status = |r: regolith_sidecar::Result<_>| r.unwrap_err().status();

    let ok = a
        .client
        .write(
            &peer,
            range(5, 0, data.len()),
            Version { term: 7, id: 1 },
            &data,
            &mut h,
        )
        .await;
    assert!(ok.is_ok());
    assert_eq!(b.admission.highest_term(), 7);

    let old_gen = a
        .client
        .write(
            &peer,
            range(4, 0, data.len()),
            Version { term: 7, id: 2 },
            &data,
            &mut h,
        )
        .await;
    assert_eq!(status(old_gen), Some(Status::BadGeneration));

    let stale = a
        .client
        .write(
            &peer,
            range(5, 0, data.len()),
            Version { term: 6, id: 3 },
            &data,
            &mut h,
        )
        .await;
    let e = stale.unwrap_err();
    assert_eq!(e.status(), Some(Status::StaleTerm));
    let msg = e.to_string();
    assert!(
        msg.contains("generation 5") && msg.contains("term 7"),
        "{msg}"
    );

    b.admission.fence(7, 4);
    let fenced = a
        .client
        .write(
            &peer,
            range(5, 0, data.len()),
            Version { term: 7, id: 4 },
            &data,
            &mut h,
        )
        .await;
    assert_eq!(status(fenced), Some(Status::Fenced));

    let past_end = a
        .client
        .write(
            &peer,
            range(5, 7 * MIB as u64, data.len()),
            Version { term: 7, id: 5 },
            &data,
            &mut h,
        )
        .await;
    assert_eq!(status(past_end), Some(Status::OutOfRange));

    let mut dst = vec![0u8; 2 * MIB];
    let read_past = a
        .client
        .read(
            &peer,
            range(5, 7 * MIB as u64, dst.len()),
            Version { term: 7, id: 1 },
            &mut dst,
            &mut h,
        )
        .await;
    assert_eq!(status(read_past), Some(Status::OutOfRange));
    let read_old = a
        .client
        .read(
            &peer,
            range(4, 0, dst.len()),
            Version { term: 7, id: 1 },
            &mut dst,
            &mut h,
        )
        .await;
    assert_eq!(status(read_old), Some(Status::BadGeneration));

    // The refused writes changed nothing, and refusals did not cost connections.
    let mut back = vec![0u8; data.len()];
    a.client
        .read(
            &peer,
            range(5, 0, back.len()),
            Version { term: 7, id: 1 },
            &mut back,
            &mut h,
        )
        .await
        .unwrap();
    assert!(back == data);
    let failed: u64 = a
        .nics
        .iter()
        .map(|ip| a.stats.nic_snapshot(*ip).failed_conns)
        .sum();
    assert_eq!(failed, 0);
    assert_eq!(b.admission.in_flight(7, 1) + b.admission.in_flight(7, 4), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_errors_are_reported_not_panicked() {
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 8 * MIB as u64, 1).await;
    let v = Version { term: 1, id: 1 };
    let data = vec![0u8; 100];
    let mut h = vec![0u64; 1];
    let e = a
        .client
        .write(&b.peer(), range(1, 0, 99), v, &data, &mut h)
        .await;
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
    let mut h2 = vec![0u64; 2];
    let e = a
        .client
        .write(&b.peer(), range(1, 0, 100), v, &data, &mut h2)
        .await;
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
    let e = a
        .client
        .write(&b.peer(), range(1, u64::MAX - 10, 100), v, &data, &mut h)
        .await;
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
    // A wrong node id behind the right address is refused in the handshake.
    let mut wrong = b.peer();
    wrong.node_id = 3;
    let e = a
        .client
        .write(&wrong, range(1, 0, 100), v, &data, &mut h)
        .await;
    assert!(e.unwrap_err().to_string().contains("expected node 3"));
    // Empty transfers are no-ops.
    let mut none: [u64; 0] = [];
    assert!(a
        .client
        .write(&b.peer(), range(1, 0, 0), v, &[], &mut none)
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_survive_a_server_restart() {
    use regolith_sidecar::transport::tcp::{ServerConfig, TcpServer};
    use std::sync::Arc;
    init_logs();
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let mut b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 8 * MIB as u64, 1).await;
    let peer = b.peer();
    let v = Version { term: 1, id: 1 };
    let data = random_bytes(4 * MIB, 5);
    let mut h = vec![0u64; chunk_count(data.len() as u64)];
    a.client
        .write(&peer, range(1, 0, data.len()), v, &data, &mut h)
        .await
        .unwrap();

    // The server goes away (its connections with it) and comes back on the same addresses
    // and ports: same node, fresh process state.
    for addr in &peer.addrs {
        b.server.close_nic(*addr);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.server = TcpServer::start(
        ServerConfig {
            listen: peer.addrs.clone(),
            node_id: 2,
            token: Some(TOKEN.to_vec()),
            ..ServerConfig::default()
        },
        b.segment.clone(),
        Arc::new(b.admission.clone()),
        b.stats.clone(),
    )
    .await
    .unwrap();
    let mut back = vec![0u8; data.len()];
    let rep = a
        .client
        .read(&peer, range(1, 0, data.len()), v, &mut back, &mut h)
        .await
        .unwrap();
    assert!(back == data);
    assert_eq!(
        rep.retries, 0,
        "dead pooled connections are noticed before use"
    );
}

/// Runs where hugetlb pages are available (`vm.nr_hugepages`), skips elsewhere: a huge-page
/// segment serves writes and reads (reads fall back from sendfile if hugetlbfs cannot splice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_page_segment_when_available() {
    use regolith_sidecar::segment::{HugePages, PageKind, Segment, SegmentOptions};
    use regolith_sidecar::transport::tcp::{ServerConfig, TcpServer};
    use std::sync::Arc;
    init_logs();
    let opts = SegmentOptions {
        huge_pages: HugePages::Require,
        prefault: true,
        allocate: true,
    };
    let seg = match Segment::create("huge", 8 * MIB as u64, &opts) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    assert!(matches!(seg.page_kind(), PageKind::Huge { .. }));
    let a = Node::start(1, ips("127.0.0.2", "127.0.0.3"), 0, 1).await;
    let b = Node::start(2, ips("127.0.0.4", "127.0.0.5"), 0, 1).await;
    let server = TcpServer::start(
        ServerConfig {
            listen: vec!["127.0.0.6:0".parse().unwrap()],
            node_id: 3,
            token: Some(TOKEN.to_vec()),
            ..ServerConfig::default()
        },
        seg.clone(),
        Arc::new(b.admission.clone()),
        b.stats.clone(),
    )
    .await
    .unwrap();
    let peer = regolith_sidecar::transport::PeerAddrs {
        node_id: 3,
        addrs: server.local_addrs(),
    };
    let v = Version { term: 1, id: 1 };
    let data = random_bytes(5 * MIB, 8);
    let mut h = vec![0u64; chunk_count(data.len() as u64)];
    a.client
        .write(&peer, range(1, MIB as u64, data.len()), v, &data, &mut h)
        .await
        .unwrap();
    let mut back = vec![0u8; data.len()];
    let mut h2 = vec![0u64; h.len()];
    a.client
        .read(
            &peer,
            range(1, MIB as u64, data.len()),
            v,
            &mut back,
            &mut h2,
        )
        .await
        .unwrap();
    assert!(back == data);
    assert_eq!(h, h2);
}
