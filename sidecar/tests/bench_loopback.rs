//! Quick throughput check (ignored by default; run in release):
//! `cargo test --release -p regolith-sidecar --test bench_loopback -- --ignored --nocapture`
//!
//! Measures, in the same process and runtime: memcpy, plain loopback TCP (one connection, and
//! as many connections as the striped transfer uses), and the striped 32 MiB write and read.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use regolith_proto::checksum::chunk_count;
use regolith_sidecar::transport::{RemoteRange, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LEN: usize = 32 * MIB;
const ROUNDS: usize = 31;

fn report(name: &str, mut times: Vec<Duration>) {
    if std::env::var("BENCH_VERBOSE").is_ok() {
        let ms: Vec<String> = times
            .iter()
            .map(|t| format!("{:.1}", t.as_secs_f64() * 1e3))
            .collect();
        eprintln!("{name}: {} ms", ms.join(" "));
    }
    times.sort();
    let gb = |d: Duration| LEN as f64 / d.as_secs_f64() / 1e9;
    eprintln!(
        "{name:<34} median {:>5.2} GB/s   best {:>5.2} GB/s",
        gb(times[times.len() / 2]),
        gb(times[0])
    );
}

/// `conns` plain TCP connections on loopback, each carrying LEN / conns bytes: the sender
/// (this task) writes 1 MiB at a time, a spawned receiver per connection does `read_exact`
/// straight into its destination buffer, as the data-plane server does.
async fn plain_tcp(conns: usize, src: &[u8], dst: &mut [Vec<u8>]) -> Duration {
    let l = TcpListener::bind("127.0.0.4:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let per = LEN / conns;
    let mut clients = Vec::new();
    let mut receivers = Vec::new();
    let (go_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    for slot in dst.iter_mut() {
        let c = TcpStream::connect(addr).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.set_nodelay(true).unwrap();
        s.set_nodelay(true).unwrap();
        clients.push(c);
        let mut buf = std::mem::take(slot);
        buf.resize(per, 0);
        receivers.push(tokio::spawn(async move {
            s.read_exact(&mut buf).await.unwrap();
            buf
        }));
    }
    let t = Instant::now();
    let _ = go_tx.send(());
    let sends = clients
        .iter_mut()
        .zip(src.chunks(per))
        .map(|(c, src)| async move {
            for piece in src.chunks(MIB) {
                c.write_all(piece).await.unwrap();
            }
        });
    futures::future::join_all(sends).await;
    for (i, r) in receivers.into_iter().enumerate() {
        dst[i] = r.await.unwrap();
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_32mib_loopback() {
    init_logs();
    let src = random_bytes(LEN, 9);
    let mut dst = vec![0u8; LEN];

    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        times.push(t.elapsed());
    }
    report("memcpy", times);

    for conns in [1, 8] {
        let mut times = Vec::new();
        let mut bufs = vec![Vec::new(); conns];
        for _ in 0..ROUNDS {
            times.push(plain_tcp(conns, &src, &mut bufs).await);
        }
        assert!(bufs.concat() == src);
        report(&format!("plain loopback TCP, {conns} conn(s)"), times);
    }

    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let a = Node::start_with(1, ips("127.0.0.2", "127.0.0.3"), 0, 1, |_, st| {
        if let Some(s) = env("BENCH_SLICE_KIB") {
            st.slice_size = s * 1024;
        }
        if let Some(c) = env("BENCH_CONNS") {
            st.conns_per_nic_pair = c as usize;
        }
    })
    .await;
    let b = Node::start_with(2, ips("127.0.0.4", "127.0.0.5"), LEN as u64, 1, |sc, _| {
        sc.sendfile = env("BENCH_SENDFILE") != Some(0);
    })
    .await;
    let peer = b.peer();
    a.client.connect_all(&peer).await;
    let v = Version { term: 1, id: 1 };
    let r = RemoteRange {
        generation: 1,
        offset: 0,
        len: LEN as u64,
        grant: Default::default(),
    };
    let mut h = vec![0u64; chunk_count(LEN as u64)];
    let mut w = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        a.client.write(&peer, r, v, &src, &mut h).await.unwrap();
        w.push(t.elapsed());
    }
    report("striped write (4 pairs x 2 conns)", w);
    let mut rd = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        a.client.read(&peer, r, v, &mut dst, &mut h).await.unwrap();
        rd.push(t.elapsed());
    }
    assert!(dst == src);
    report("striped read (4 pairs x 2 conns)", rd);
}

/// Segment set-up cost (fallocate + pre-fault) of 1 GiB; the log lines carry the split.
#[test]
#[ignore]
fn bench_segment_setup_1gib() {
    use regolith_sidecar::segment::{Segment, SegmentOptions};
    init_logs();
    let t = Instant::now();
    let s = Segment::create("bench", 1 << 30, &SegmentOptions::default()).unwrap();
    let d = t.elapsed();
    eprintln!(
        "1 GiB segment ({:?}) ready in {:.0} ms ({:.2} GB/s)",
        s.page_kind(),
        d.as_secs_f64() * 1e3,
        (1u64 << 30) as f64 / d.as_secs_f64() / 1e9
    );
}
