//! `regolith-metad-bench`: benchmarks a 3-replica loopback metad cluster it starts itself
//! (fsync on, real processes) — see docs/benchmarks.md.
//!
//! Figures: commits/s with 1 and 64 concurrent writers (reserve + commit), exists and
//! get-placement latency over gRPC; then N objects of 64-byte keys loaded by concurrent writers
//! (load rate, elections and snapshot builds and installs during the load, replica RSS steady
//! and peak), the time from `kill -9` of the leader to the first successful commit, and the time
//! from starting all three replicas again (after SIGTERM) to the first successful commit, and
//! then a `RemoveAll` of everything loaded (its time, and the slowest commit beside it). With
//! `--segments N`, N simulated sidecars mount and heartbeat every second (module `segments`)
//! after the load, with the leader's CPU measured.

mod segments;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::launch::MetadLaunch;
use regolith_proto::metad as pb;
use regolith_test_support::bins;

#[derive(Parser, Debug)]
#[command(about = "Benchmark a 3-replica loopback regolith-metad cluster")]
struct Opts {
    /// Seconds per throughput figure.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Objects loaded for the memory figure (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// Concurrent writers loading the objects.
    #[arg(long, default_value_t = 64)]
    load_writers: u64,
    /// Objects per batch reserve + batch commit of a loading writer.
    #[arg(long, default_value_t = 100)]
    load_batch: u64,
    /// Latency samples per read figure.
    #[arg(long, default_value_t = 20_000)]
    samples: usize,
    /// Where the replicas keep their data (default: a temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Runtime worker threads of each replica: the three replicas and the bench share this
    /// machine's cores, so one each by default.
    #[arg(long, default_value_t = 1)]
    replica_threads: usize,
    /// Simulated sidecars that mount a segment each and heartbeat it every second after the
    /// load (0 skips the phase).
    #[arg(long, default_value_t = 0)]
    segments: u64,
    /// Seconds the simulated sidecars heartbeat.
    #[arg(long, default_value_t = 20)]
    segment_seconds: u64,
    /// Extra argument passed to every replica (repeatable), e.g. `--metad-arg=--sled-cache=16MiB`.
    #[arg(long = "metad-arg", allow_hyphen_values = true)]
    metad_args: Vec<String>,
}

struct Replica {
    id: u64,
    grpc: String,
    http: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for Replica {
    /// No replica outlives the bench, even when it panics.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What the load measured.
#[derive(Default)]
struct LoadReport {
    secs: f64,
    /// The highest term before and after the load.
    term: (f64, f64),
    snapshots_built: f64,
    snapshots_installed: f64,
    retries: u64,
}

/// Stops a replica with SIGTERM (as an operator would) and waits for it; kills it after 60 s.
fn stop(r: &mut Replica) {
    let Some(mut c) = r.child.take() else {
        return;
    };
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn free_port() -> u16 {
    regolith_test_support::free_loopback_port()
}

fn spawn(
    r: &mut Replica,
    peers: &[(u64, String)],
    log_dir: &Path,
    threads: usize,
    extra: &[String],
) {
    // Appended to: a restarted replica keeps its earlier log.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(format!("metad-{}.log", r.id)))
        .expect("log file");
    let launch = MetadLaunch {
        listen: Some(r.grpc.clone()),
        advertise: Some(r.grpc.clone()),
        metrics_addr: Some(r.http.clone()),
        peers: peers.to_vec(),
        bootstrap: true,
        data_dir: Some(r.dir.clone()),
        worker_threads: Some(threads),
        extra: extra.iter().map(Into::into).collect(),
        ..MetadLaunch::new(r.id)
    };
    let bin = bins::find(bins::METAD).unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new(bin)
        .args(launch.args())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn regolith-metad");
    r.child = Some(child);
}

/// The machine's ceiling for a request/reply: p50 of a 32-byte ping-pong between two threads
/// over loopback TCP with plain blocking sockets.
fn tcp_ping_pong_p50_us(rounds: usize) -> f64 {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut c, _) = l.accept().expect("accept");
        let _ = c.set_nodelay(true);
        let mut b = [0u8; 32];
        while c.read_exact(&mut b).is_ok() {
            if c.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    let _ = c.set_nodelay(true);
    let mut b = [0u8; 32];
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        c.write_all(&b).expect("write");
        c.read_exact(&mut b).expect("read");
        v.push(t.elapsed());
    }
    drop(c);
    let _ = echo.join();
    v.sort();
    percentile(&v, 0.5)
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn wait_leader(client: &MetadClient) -> Duration {
    let start = Instant::now();
    loop {
        if client.stats().await.is_ok() {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn put(client: &MetadClient, key: String, node: u64) -> bool {
    let req = pb::ReserveRequest {
        key,
        size: 64,
        options: None,
        requester_node_id: node,
    };
    let Ok((r, addr)) = client.reserve(req).await else {
        return false;
    };
    let Some(res) = r.reservation else {
        return false;
    };
    matches!(client.commit_at(&addr, pb::CommitRequest { version: res.version, checksum: 1 }).await,
        Ok(c) if c.status.as_ref().map(|s| s.code) == Some(0))
}

/// Commits per second with `writers` concurrent writers for `secs` seconds.
async fn commit_rate(
    client: &MetadClient,
    node: u64,
    writers: usize,
    secs: u64,
    prefix: &str,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (client, done, prefix) = (client.clone(), done.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < end {
                if put(&client, format!("{prefix}-{w}-{i}"), node).await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn latencies<F, Fut>(samples: usize, mut f: F) -> (f64, f64)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        let ok = f(i).await;
        v.push(t.elapsed());
        assert!(ok, "read failed during latency measurement");
    }
    v.sort();
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

/// Loads objects `from..to` with 64-byte keys in batches (batch reserve + batch commit). A
/// failed call is retried with the same keys (keys a lost reply committed answer
/// "already exists" and are skipped); answers the number of retries.
async fn load_range(client: &MetadClient, node: u64, next: &AtomicU64, n: u64, batch: u64) -> u64 {
    let mut retries = 0;
    loop {
        let from = next.fetch_add(batch, Ordering::Relaxed);
        if from >= n {
            return retries;
        }
        let to = (from + batch).min(n);
        while !load_batch(client, node, from, to).await {
            retries += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let done = to / 100_000;
        if done > from / 100_000 {
            eprintln!("  loaded {} objects", done * 100_000);
        }
    }
}

async fn load_batch(client: &MetadClient, node: u64, from: u64, to: u64) -> bool {
    let items: Vec<pb::ReserveRequest> = (from..to)
        .map(|i| pb::ReserveRequest {
            key: format!("{:064}", i),
            size: 64,
            options: None,
            requester_node_id: node,
        })
        .collect();
    let Ok((r, addr)) = client
        .batch_reserve(pb::BatchReserveRequest { items })
        .await
    else {
        return false;
    };
    let commits: Vec<_> = r
        .items
        .iter()
        .filter_map(|x| x.reservation.as_ref())
        .map(|res| pb::CommitRequest {
            version: res.version,
            checksum: 7,
        })
        .collect();
    if commits.is_empty() {
        return true;
    }
    client
        .batch_commit_at(&addr, pb::BatchCommitRequest { items: commits })
        .await
        .is_ok()
}

/// Loads `n` objects with `writers` concurrent writers; answers the retries.
async fn load(client: &MetadClient, node: u64, n: u64, writers: u64, batch: u64) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..writers.max(1))
        .map(|_| {
            let (client, next) = (client.clone(), next.clone());
            tokio::spawn(async move { load_range(&client, node, &next, n, batch.max(1)).await })
        })
        .collect();
    let mut retries = 0;
    for t in tasks {
        retries += t.await.unwrap_or(0);
    }
    retries
}

#[derive(Debug, Default)]
struct Removal {
    removed: u64,
    ms: f64,
    slowest_commit_ms: f64,
}

/// A `RemoveAll` of everything, with one writer committing back to back beside it: how long
/// the call took, and the slowest commit while it ran (a stall would show there).
async fn remove_all_beside_commits(
    client: &MetadClient,
    hb: &pb::HeartbeatRequest,
    node: u64,
) -> Removal {
    let _ = client.heartbeat(hb.clone()).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                put(&client, format!("beside-remove-all-{i}"), node).await;
                slowest = slowest.max(t.elapsed());
                i += 1;
            }
            slowest
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let removed = client.remove_all().await.expect("remove all");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::Relaxed);
    let slowest = writer.await.unwrap_or_default();
    Removal {
        removed,
        ms,
        slowest_commit_ms: slowest.as_secs_f64() * 1e3,
    }
}

/// What a replica's `/metrics` says, by metric name (gauges without labels).
fn scrape(addr: &str) -> std::collections::HashMap<String, f64> {
    use std::io::{Read, Write};
    let mut out = std::collections::HashMap::new();
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return out;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if c.write_all(req.as_bytes()).is_err() {
        return out;
    }
    let mut body = String::new();
    let _ = c.read_to_string(&mut body);
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let mut parts = line.split_whitespace();
        if let (Some(name), Some(v)) = (parts.next(), parts.next()) {
            if let Ok(v) = v.parse() {
                out.insert(name.to_string(), v);
            }
        }
    }
    out
}

/// The highest term any live replica reports, and the sums of snapshot builds and installs.
fn raft_counts(replicas: &[Replica]) -> (f64, f64, f64) {
    let mut term: f64 = 0.0;
    let (mut built, mut installed) = (0.0, 0.0);
    for r in replicas.iter().filter(|r| r.child.is_some()) {
        let m = scrape(&r.http);
        let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
        term = term.max(get("regolith_metad_term"));
        built += get("regolith_metad_snapshots_built");
        installed += get("regolith_metad_snapshots_installed");
    }
    (term, built, installed)
}

/// The first successful commit after `since`, heartbeating the bench's node meanwhile.
async fn first_commit(client: &MetadClient, hb: &pb::HeartbeatRequest, node: u64, tag: &str) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut i = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "{tag}: no put committed within 180 s (is the segment still mounted?)"
        );
        let _ = client.heartbeat(hb.clone()).await;
        if put(client, format!("{tag}-{i}"), node).await {
            return;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main() {
    let opts = Opts::parse();
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = opts.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&base).expect("data dir");
    let mut replicas: Vec<Replica> = (1..=3)
        .map(|id| Replica {
            id,
            grpc: format!("127.0.0.1:{}", free_port()),
            http: format!("127.0.0.1:{}", free_port()),
            dir: base.join(format!("metad-{id}")),
            child: None,
        })
        .collect();
    let peers: Vec<(u64, String)> = replicas.iter().map(|r| (r.id, r.grpc.clone())).collect();
    for r in replicas.iter_mut() {
        spawn(r, &peers, &base, opts.replica_threads, &opts.metad_args);
    }
    // Throughput figures use two worker threads; latency figures run on a one-thread runtime, so
    // a request and its reply wake no other thread of the client.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rt1 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut cfg = ClientConfig::new(replicas.iter().map(|r| r.grpc.clone()).collect());
    cfg.retry_deadline = Duration::from_secs(30);
    let client = MetadClient::new(cfg).expect("client");
    let report = rt.block_on(async {
        wait_leader(&client).await;
        let m = client
            .mount(pb::MountSegmentRequest {
                node_name: "bench-node".into(),
                node_id: 0,
                capacity: 1 << 40,
                data_addrs: vec!["127.0.0.1:7600".into()],
            })
            .await
            .expect("mount");
        let hb = pb::HeartbeatRequest {
            node_id: m.node_id,
            generation: m.generation,
            ..Default::default()
        };
        client.heartbeat(hb.clone()).await.expect("heartbeat");
        let keepalive = {
            let (client, hb) = (client.clone(), hb.clone());
            tokio::spawn(async move {
                loop {
                    let _ = client.heartbeat(hb.clone()).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        eprintln!("commits/s, 1 writer...");
        let c1 = commit_rate(&client, m.node_id, 1, opts.seconds, "w1").await;
        eprintln!("commits/s, 64 writers...");
        let c64 = commit_rate(&client, m.node_id, 64, opts.seconds, "w64").await;
        let keys: Vec<String> = (0..1000).map(|i| format!("lat-{i}")).collect();
        for k in &keys {
            assert!(put(&client, k.clone(), m.node_id).await, "put {k}");
        }
        (c1, c64, keys, m, hb, keepalive)
    });
    let (c1, c64, keys, m, hb, keepalive) = report;
    eprintln!("exists / get latency...");
    let ping = tcp_ping_pong_p50_us(opts.samples.max(1000));
    let (ex50, ex99, get50, get99) = rt1.block_on(async {
        // A client of its own on this runtime (connections belong to the runtime that made them).
        let mut cfg = ClientConfig::new(client.addrs().to_vec());
        cfg.retry_deadline = Duration::from_secs(30);
        let client = MetadClient::new(cfg).expect("client");
        let _ = client.stats().await;
        let (ex50, ex99) = latencies(opts.samples, |i| {
            let (c, k) = (client.clone(), keys[i % keys.len()].clone());
            async move { c.exists(&k).await.is_ok() }
        })
        .await;
        // A node's read (leased, recency refreshed), as a sidecar's get: a get that names no
        // node only looks.
        let node = m.node_id;
        let (get50, get99) = latencies(opts.samples, |i| {
            let (c, k) = (client.clone(), keys[i % keys.len()].clone());
            async move {
                c.get(&k, node)
                    .await
                    .map(|p| p.status.map(|s| s.code) == Some(0))
                    .unwrap_or(false)
            }
        })
        .await;
        (ex50, ex99, get50, get99)
    });
    let mut load_report = LoadReport::default();
    let report = rt.block_on(async {
        let mut rss = Vec::new();
        if opts.objects > 0 {
            eprintln!(
                "loading {} objects ({} writers, {} per batch)...",
                opts.objects, opts.load_writers, opts.load_batch
            );
            let before = raft_counts(&replicas);
            let t = Instant::now();
            load_report.retries = load(
                &client,
                m.node_id,
                opts.objects,
                opts.load_writers,
                opts.load_batch,
            )
            .await;
            load_report.secs = t.elapsed().as_secs_f64();
            let after = raft_counts(&replicas);
            load_report.term = (before.0, after.0);
            load_report.snapshots_built = after.1 - before.1;
            load_report.snapshots_installed = after.2 - before.2;
            eprintln!(
                "  loaded in {:.1} s ({:.0} objects/s); term {} -> {}; {} snapshot builds, {} installs; {} retried batches",
                load_report.secs,
                opts.objects as f64 / load_report.secs,
                before.0,
                after.0,
                load_report.snapshots_built,
                load_report.snapshots_installed,
                load_report.retries,
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        for r in &replicas {
            if let Some(c) = &r.child {
                let (now, peak) = rss_kib(c.id());
                let m = scrape(&r.http);
                let mib = |k: &str| m.get(k).copied().unwrap_or(0.0) / (1 << 20) as f64;
                eprintln!(
                    "  replica {}: RSS {} MiB, peak {} MiB; heap {:.0} MiB allocated, {:.0} MiB resident",
                    r.id,
                    now / 1024,
                    peak / 1024,
                    mib("regolith_metad_heap_allocated_bytes"),
                    mib("regolith_metad_heap_resident_bytes"),
                );
                rss.push((now, peak));
            }
        }
        let leader = client.stats().await.expect("stats").leader_id;
        let seg_report = if opts.segments > 0 {
            eprintln!(
                "{} simulated sidecars heartbeating every second for {} s...",
                opts.segments, opts.segment_seconds
            );
            let pid = replicas
                .iter()
                .find(|r| r.id == leader)
                .and_then(|r| r.child.as_ref())
                .map(|c| c.id())
                .unwrap_or(0);
            let r = segments::run(client.addrs(), pid, opts.segments, opts.segment_seconds).await;
            eprintln!("  {r:?}");
            Some(r)
        } else {
            None
        };
        eprintln!("failover: kill -9 of the leader...");
        let leader = client.stats().await.expect("stats").leader_id;
        (rss, leader, m.node_id, hb, seg_report)
    });
    let (rss, leader, node, hb, seg_report) = report;
    let killed = Instant::now();
    if let Some(r) = replicas.iter_mut().find(|r| r.id == leader) {
        if let Some(mut c) = r.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    let failover = rt.block_on(async {
        first_commit(&client, &hb, node, "after-kill").await;
        killed.elapsed()
    });
    eprintln!("restart: SIGTERM to every replica, then start all three...");
    for r in replicas.iter_mut() {
        stop(r);
    }
    let restarted = Instant::now();
    for r in replicas.iter_mut() {
        spawn(r, &peers, &base, opts.replica_threads, &opts.metad_args);
    }
    let restart = rt.block_on(async {
        first_commit(&client, &hb, node, "after-restart").await;
        restarted.elapsed()
    });
    let removal = rt.block_on(remove_all_beside_commits(&client, &hb, node));
    // Heartbeats went on through the failover and the restart, as a live sidecar's would: a
    // segment silent for node_ttl while the replicas stop (last snapshots take seconds at 10M)
    // is declared dead and its objects dropped, and nothing after that would measure anything.
    keepalive.abort();
    eprintln!("  {removal:?}");
    let mb = |kib: u64| kib as f64 / 1024.0;
    let rss_steady = rss.iter().map(|r| r.0).max().unwrap_or(0);
    let rss_peak = rss.iter().map(|r| r.1).max().unwrap_or(0);
    eprintln!();
    eprintln!("| figure | value | goal |");
    eprintln!("|---|---|---|");
    eprintln!("| commits/s, 1 writer | {c1:.0} | report |");
    eprintln!("| commits/s, 64 writers | {c64:.0} | >= 10000 |");
    eprintln!("| machine ceiling: TCP ping-pong p50 (us) | {ping:.0} | - |");
    eprintln!(
        "| exists p50 / p99 (us) | {ex50:.0} / {ex99:.0} ({:.2} x ping-pong) | p50 <= 60 |",
        ex50 / ping
    );
    eprintln!("| get placement p50 / p99 (us) | {get50:.0} / {get99:.0} ({:.2} x ping-pong) | p50 <= 80 |", get50 / ping);
    eprintln!(
        "| kill -9 leader -> first commit (ms) | {:.0} | <= 2000 |",
        failover.as_secs_f64() * 1e3
    );
    eprintln!(
        "| RSS steady / peak with {} objects (MB) | {:.0} / {:.0} | <= 2048 / 3072 at 10M |",
        opts.objects,
        mb(rss_steady),
        mb(rss_peak)
    );
    let load_rate = if load_report.secs > 0.0 {
        opts.objects as f64 / load_report.secs
    } else {
        0.0
    };
    eprintln!(
        "| load rate, {} writers x {} (objects/s) | {load_rate:.0} | >= 50000 |",
        opts.load_writers, opts.load_batch
    );
    eprintln!(
        "| elections during the load (term before -> after) | {} ({} -> {}) | 0 |",
        load_report.term.1 - load_report.term.0,
        load_report.term.0,
        load_report.term.1
    );
    eprintln!(
        "| snapshot builds / installs during the load (all replicas) | {} / {} | - |",
        load_report.snapshots_built, load_report.snapshots_installed
    );
    eprintln!(
        "| all replicas restarted -> first commit (ms) | {:.0} | <= 30000 |",
        restart.as_secs_f64() * 1e3
    );
    eprintln!(
        "| RemoveAll of {} objects (ms) / slowest commit beside it (ms) | {:.0} / {:.0} | bounded |",
        removal.removed, removal.ms, removal.slowest_commit_ms
    );
    if let Some(r) = &seg_report {
        eprintln!(
            "| {} segments heartbeating every second: leader CPU (share of a core) | {:.3} | <= 0.25 |",
            r.segments, r.leader_cpu
        );
        eprintln!(
            "| heartbeats / errors / remounts / segments lost | {} / {} / {} / {} | - / 0 / 0 / 0 |",
            r.heartbeats, r.errors, r.remounts, r.lost
        );
        eprintln!(
            "| heartbeat p50 / p99 / max (us) | {:.0} / {:.0} / {:.0} | - |",
            r.hb_p50_us, r.hb_p99_us, r.hb_max_us
        );
    }
    if opts.json {
        println!(
            "{}",
            serde_json::json!({
                "tcp_ping_pong_p50_us": ping,
                "commits_per_s_1": c1, "commits_per_s_64": c64,
                "exists_p50_us": ex50, "exists_p99_us": ex99,
                "get_p50_us": get50, "get_p99_us": get99,
                "failover_ms": failover.as_secs_f64() * 1e3,
                "objects": opts.objects,
                "rss_steady_mb": mb(rss_steady), "rss_peak_mb": mb(rss_peak),
                "load_objects_per_s": load_rate, "load_writers": opts.load_writers,
                "load_batch": opts.load_batch, "load_retries": load_report.retries,
                "term_before_load": load_report.term.0, "term_after_load": load_report.term.1,
                "snapshot_builds_during_load": load_report.snapshots_built,
                "snapshot_installs_during_load": load_report.snapshots_installed,
                "restart_ms": restart.as_secs_f64() * 1e3,
                "remove_all_objects": removal.removed,
                "remove_all_ms": removal.ms,
                "remove_all_slowest_commit_ms": removal.slowest_commit_ms,
                "segments": seg_report.as_ref().map(|r| serde_json::json!({
                    "count": r.segments,
                    "mount_s": r.mount_secs,
                    "seconds": r.secs,
                    "leader_cpu": r.leader_cpu,
                    "heartbeats": r.heartbeats,
                    "heartbeat_errors": r.errors,
                    "remounts": r.remounts,
                    "segments_lost": r.lost,
                    "heartbeat_p50_us": r.hb_p50_us,
                    "heartbeat_p99_us": r.hb_p99_us,
                    "heartbeat_max_us": r.hb_max_us,
                })),
            })
        );
    }
    drop(replicas);
}
