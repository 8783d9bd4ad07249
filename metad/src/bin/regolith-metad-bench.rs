//! `regolith-metad-bench`: benchmarks a 3-replica loopback metad cluster it starts itself
//! (fsync on, real processes) — see docs/benchmarks.md.
//!
//! Figures: commits/s with 1 and 64 concurrent writers (reserve + commit), exists and
//! get-placement latency over gRPC, time from `kill -9` of the leader to the first successful
//! commit, and replica RSS (steady and peak) with N objects of 64-byte keys.

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
    let log = std::fs::File::create(log_dir.join(format!("metad-{}.log", r.id))).expect("log file");
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

fn percentile(sorted: &[Duration], p: f64) -> f64 {
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

/// Loads `n` objects with 64-byte keys in batches of 1000 (batch reserve + batch commit).
async fn load(client: &MetadClient, node: u64, n: u64) {
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(1000);
        let items: Vec<pb::ReserveRequest> = (done..done + batch)
            .map(|i| pb::ReserveRequest {
                key: format!("{:064}", i),
                size: 64,
                options: None,
                requester_node_id: node,
            })
            .collect();
        let (r, addr) = client
            .batch_reserve(pb::BatchReserveRequest { items })
            .await
            .expect("batch reserve");
        let commits = r
            .items
            .iter()
            .filter_map(|x| x.reservation.as_ref())
            .map(|res| pb::CommitRequest {
                version: res.version,
                checksum: 7,
            })
            .collect();
        client
            .batch_commit_at(&addr, pb::BatchCommitRequest { items: commits })
            .await
            .expect("batch commit");
        done += batch;
        if done % 100_000 == 0 {
            eprintln!("  loaded {done} objects");
        }
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
        let (get50, get99) = latencies(opts.samples, |i| {
            let (c, k) = (client.clone(), keys[i % keys.len()].clone());
            async move {
                c.get(&k, 0)
                    .await
                    .map(|p| p.status.map(|s| s.code) == Some(0))
                    .unwrap_or(false)
            }
        })
        .await;
        (ex50, ex99, get50, get99)
    });
    let report = rt.block_on(async {
        let mut rss = Vec::new();
        if opts.objects > 0 {
            eprintln!("loading {} objects...", opts.objects);
            let t = Instant::now();
            load(&client, m.node_id, opts.objects).await;
            eprintln!("  loaded in {:?}", t.elapsed());
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        for r in &replicas {
            if let Some(c) = &r.child {
                let (now, peak) = rss_kib(c.id());
                eprintln!(
                    "  replica {}: RSS {} MiB, peak {} MiB",
                    r.id,
                    now / 1024,
                    peak / 1024
                );
                rss.push((now, peak));
            }
        }
        eprintln!("failover: kill -9 of the leader...");
        let leader = client.stats().await.expect("stats").leader_id;
        keepalive.abort();
        (rss, leader, m.node_id, hb)
    });
    let (rss, leader, node, hb) = report;
    let killed = Instant::now();
    if let Some(r) = replicas.iter_mut().find(|r| r.id == leader) {
        if let Some(mut c) = r.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    let failover = rt.block_on(async {
        let mut i = 0;
        loop {
            let _ = client.heartbeat(hb.clone()).await;
            if put(&client, format!("after-kill-{i}"), node).await {
                return killed.elapsed();
            }
            i += 1;
        }
    });
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
        "| RSS steady / peak with {} objects (MB) | {:.0} / {:.0} | <= 300 |",
        opts.objects,
        mb(rss_steady),
        mb(rss_peak)
    );
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
            })
        );
    }
    drop(replicas);
}
