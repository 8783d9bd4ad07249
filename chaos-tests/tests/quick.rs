//! The quick chaos profile and the mechanism tests of the faults (run as root; they fail,
//! never skip, where root or iproute2/nftables are missing).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::init_logs;
use regolith_chaos::cluster::{Cluster, MetadProgram};
use regolith_chaos::firewall::{self, Rule};
use regolith_chaos::history::{EventKind, History};
use regolith_chaos::metad_only::{MetadOnly, MetadOnlyConfig};
use regolith_chaos::nemesis::Fault;
use regolith_chaos::netns::{self, NsRuntime, Topology};
use regolith_chaos::proxy::Proxy;
use regolith_chaos::run::{run_profile, HarnessConfig, RunOutcome};
use regolith_chaos::schedule::{self, Step};
use regolith_chaos::sidecars::{SidecarConfig, SidecarProgram, SidecarWorkload};
use regolith_proto::client::{ClientConfig, MetadClient};

const CHAOS: &str = env!("CARGO_BIN_EXE_regolith-chaos");

fn seed() -> u64 {
    std::env::var("REGOLITH_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn namespaces_of(run_id: &str) -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{run_id}-")))
        .map(str::to_string)
        .collect()
}

/// A TCP connect from inside `rt`'s host to `addr`, bounded in time.
fn can_connect(rt: &NsRuntime, addr: SocketAddr) -> bool {
    rt.run(async move {
        matches!(
            tokio::time::timeout(
                Duration::from_millis(700),
                tokio::net::TcpStream::connect(addr)
            )
            .await,
            Ok(Ok(_))
        )
    })
}

/// Accepts (and drops) connections on `addr` inside `rt`'s host.
fn listen(rt: &NsRuntime, addr: SocketAddr) {
    let l = rt.run(async move { tokio::net::TcpListener::bind(addr).await });
    let l = l.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    rt.spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
}

#[test]
fn preconditions_hold_here() {
    // Fails (does not skip) where the suite cannot run, naming what is missing.
    netns::check_preconditions().unwrap();
}

#[test]
fn topology_connects_hosts_and_removes_everything() {
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let run_id = topo.run_id.clone();
    assert_eq!(namespaces_of(&run_id).len(), 8, "bridge + 7 hosts");
    let s1 = NsRuntime::new(&topo.host("s1").unwrap().ns, 1).unwrap();
    let m1 = NsRuntime::new(&topo.host("m1").unwrap().ns, 1).unwrap();
    let m1_addr = SocketAddr::new(topo.host("m1").unwrap().addr().into(), 7100);
    listen(&m1, m1_addr);
    assert!(can_connect(&s1, m1_addr), "s1 reaches m1 over the bridge");
    // (Never probe host addresses from the root namespace: there they are not ours.)
    let dir = topo.dir.clone();
    drop((s1, m1));
    drop(topo);
    assert!(namespaces_of(&run_id).is_empty(), "namespaces left behind");
    assert!(!dir.exists(), "run directory left behind");
}

#[test]
fn nic_cut_blocks_only_that_interface_and_host_cutoff_blocks_all() {
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let (s1, s2) = (topo.host("s1").unwrap(), topo.host("s2").unwrap());
    let rt1 = NsRuntime::new(&s1.ns, 1).unwrap();
    let rt2 = NsRuntime::new(&s2.ns, 1).unwrap();
    let nic0 = SocketAddr::new(s2.nics[0].addr.into(), 7200);
    let nic1 = SocketAddr::new(s2.nics[1].addr.into(), 7200);
    listen(&rt2, nic0);
    listen(&rt2, nic1);
    assert!(can_connect(&rt1, nic0) && can_connect(&rt1, nic1));

    firewall::install(s1, &topo.dir, "nic", &[Rule::DropInterface("eth1".into())]).unwrap();
    assert!(can_connect(&rt1, nic0), "eth0 still carries traffic");
    assert!(!can_connect(&rt1, nic1), "eth1 is cut");
    firewall::remove(s1, "nic").unwrap();
    assert!(can_connect(&rt1, nic1), "eth1 healed");

    firewall::install(s1, &topo.dir, "cutoff", &[Rule::DropAll]).unwrap();
    assert!(!can_connect(&rt1, nic0) && !can_connect(&rt1, nic1));
    // The observer sees through faults.
    let obs = NsRuntime::new(&topo.bridge_ns, 1).unwrap();
    let s1_addr = SocketAddr::new(s1.addr().into(), 7201);
    listen(&rt1, s1_addr);
    assert!(can_connect(&obs, s1_addr), "observer exempt from the cut");
    firewall::remove(s1, "cutoff").unwrap();
    assert!(can_connect(&rt1, nic0) && can_connect(&rt1, nic1));
}

#[test]
fn packet_loss_drops_a_share_of_packets() {
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let (s1, s2) = (topo.host("s1").unwrap(), topo.host("s2").unwrap());
    let rt1 = NsRuntime::new(&s1.ns, 1).unwrap();
    let rt2 = NsRuntime::new(&s2.ns, 1).unwrap();
    let sock = |rt: &NsRuntime, ip: std::net::Ipv4Addr| {
        let addr = SocketAddr::new(ip.into(), 7300);
        rt.run(async move { tokio::net::UdpSocket::bind(addr).await.unwrap() })
    };
    let rx = Arc::new(sock(&rt2, s2.addr()));
    let tx = sock(&rt1, s1.addr());
    let dst = SocketAddr::new(s2.addr().into(), 7300);
    firewall::install(s1, &topo.dir, "loss", &[Rule::Loss { percent: 50 }]).unwrap();
    let received = rt1.run({
        let rx = rx.clone();
        async move {
            for _ in 0..400 {
                let _ = tx.send_to(b"x", dst).await;
            }
            let mut n = 0;
            let mut buf = [0u8; 8];
            while let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(300), rx.recv_from(&mut buf)).await
            {
                n += 1;
            }
            n
        }
    });
    // 50 % of 400 lost: well inside (100, 300) unless numgen is broken.
    assert!((100..300).contains(&received), "received {received} of 400");
}

#[test]
fn proxy_in_front_of_a_metad_port_adds_latency_and_drops_connections() {
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let observer = Arc::new(NsRuntime::new(&topo.bridge_ns, 1).unwrap());
    let cluster = Cluster::start(
        &topo,
        MetadProgram::built(),
        observer.clone(),
        History::new(),
        3,
    )
    .unwrap();
    let leader = cluster.wait_leader(Duration::from_secs(20)).unwrap();
    let upstream: SocketAddr = cluster.replica(leader).unwrap().grpc().parse().unwrap();
    let listen = SocketAddr::new(netns::observer_addr(0).into(), 0);
    let proxy = observer.run(async move { Proxy::start(listen, upstream).await.unwrap() });
    let mut cfg = ClientConfig::new(vec![proxy.listen.to_string()]);
    cfg.token = Some(cluster.token().to_string());
    cfg.retry_deadline = Duration::from_secs(10);
    let client = MetadClient::new(cfg).unwrap();
    let timed = |client: MetadClient| {
        observer.run(async move {
            let t = Instant::now();
            let r = client.stats().await;
            (r.map(|s| s.leader_id), t.elapsed())
        })
    };
    let (r, _) = timed(client.clone());
    assert_eq!(r.unwrap(), leader);
    let (_, base) = timed(client.clone());
    proxy.set_delay(Duration::from_millis(150));
    let (r, slow) = timed(client.clone());
    assert_eq!(r.unwrap(), leader);
    assert!(
        slow >= base + Duration::from_millis(250),
        "base {base:?}, delayed {slow:?}"
    );
    proxy.set_delay(Duration::ZERO);
    let before = proxy.control().connections();
    proxy.drop_connections();
    // The client reconnects through the proxy and the call succeeds.
    let (r, _) = timed(client.clone());
    assert_eq!(r.unwrap(), leader);
    assert!(
        proxy.control().connections() > before,
        "a new connection was made"
    );
}

#[test]
fn interrupted_run_removes_its_namespaces() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut child = std::process::Command::new(CHAOS)
        .args(["--duration", "60s", "--seed", "3"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let run_prefix = format!("{}{}n0", netns::PREFIX, child.id());
    let end = Instant::now() + Duration::from_secs(60);
    // Wait until the run is well under way: its namespaces exist and metad runs in them.
    while namespaces_of(&run_prefix).len() < 8 || !metad_running_in(&run_prefix) {
        assert!(Instant::now() < end, "the run never came up");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(
        namespaces_of(&run_prefix).is_empty(),
        "namespaces left behind"
    );
    assert!(
        !netns::runs_root().join(&run_prefix).exists(),
        "run dir left behind"
    );
}

fn metad_running_in(run_prefix: &str) -> bool {
    namespaces_of(run_prefix).iter().any(|ns| {
        std::process::Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| !o.stdout.is_empty())
            .unwrap_or(false)
    })
}

/// Prints the outcome to the real stderr, not through the test harness's capture, so that
/// every CI log shows the table.
fn print_outcome(what: &str, seed: u64, started: Instant, outcome: &RunOutcome) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "{what}, seed {seed}, {:.1}s\n{outcome}",
        started.elapsed().as_secs_f64()
    );
}

/// The profiles load both cores: run one at a time, so neither's timings suffer the other.
fn one_profile_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static PROFILES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PROFILES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The quick profile: every fault once, a few seconds each, against real sidecars (values of
/// a few KiB to a few MiB over the data plane) with disk tiers: the working set is larger
/// than the sidecars' memory, so objects move to their disks throughout, and the disk faults
/// (`disk-fail`, `sidecar-restart-warm`) meet disks that hold objects.
#[test]
fn quick_profile() {
    init_logs();
    let _one = one_profile_at_a_time();
    let seed = seed();
    let mut cfg = HarnessConfig::new(MetadProgram::built());
    cfg.workload.seed = seed;
    cfg.workload.keys = regolith_chaos::sidecars::DISK_TIER_KEYS;
    let steps = schedule::quick(seed, true);
    let started = Instant::now();
    let workload = SidecarWorkload::new(SidecarConfig::new(SidecarProgram::built()));
    let outcome = run_profile(cfg, workload, steps, None).expect("the harness ran");
    print_outcome("quick profile (sidecars)", seed, started, &outcome);
    assert!(
        outcome.passed(),
        "chaos found problems (seed {seed}):\n{outcome}"
    );
    let total: usize = outcome.report.rows.iter().map(|r| r.ops).sum();
    assert!(
        total > 500,
        "too little load to mean anything: {total} operations"
    );
    // The disks were used: the sidecars moved objects to them and metad listed them there.
    let offloads = outcome.disk_offloads.expect("the sidecars have disks");
    let on_disk = outcome.objects_listed_on_disk();
    assert!(
        offloads > 0 && on_disk > 0,
        "no object reached a disk (offloads {offloads}, listed on a disk {on_disk}):\n{outcome}"
    );
    // The warm restart killed a sidecar that held objects on its disk, and the disk failure
    // took a disk out that held some.
    let held = outcome
        .recorded
        .events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::DiskHeld { objects, .. } => Some(objects.len()),
            _ => None,
        })
        .expect("the warm restart ran");
    assert!(held > 0, "the warm restart's node held nothing on its disk");
    assert_eq!(outcome.report.warm_restarts.len(), 1, "{outcome}");
}

/// The metadata faults once more with the metad-only workload, for the two checks only it can
/// make: (e) no overlapping extents (it knows every placement) and (f) no node declared dead
/// within a node TTL of a heartbeat the leader acknowledged (it sees every heartbeat reply).
/// Faults meet a preloaded state of 50,000 objects besides the workload's keys.
#[test]
fn quick_profile_metad_only() {
    init_logs();
    let _one = one_profile_at_a_time();
    let seed = seed();
    let mut cfg = HarnessConfig::new(MetadProgram::built());
    cfg.workload.seed = seed;
    // A modest state under the faults (the long profile runs with a million: docs/reliability.md);
    // the run fails if any preloaded object is gone at the end.
    cfg.preload = 50_000;
    let steps = schedule::quick(seed, false);
    let started = Instant::now();
    let outcome = run_profile(cfg, MetadOnly::new(MetadOnlyConfig::default()), steps, None)
        .expect("the harness ran");
    print_outcome("quick profile (metad only)", seed, started, &outcome);
    assert!(
        outcome.passed(),
        "chaos found problems (seed {seed}):\n{outcome}"
    );
}

/// Regression test of a bug the suite found in `regolith_proto::client::MetadClient::call`:
/// when the cached leader was also `addrs[0]` and stopped answering (partitioned: packets
/// dropped), the call retried that same address as its "next" replica and spent its whole
/// retry deadline on it, never trying the others (~20 s, then failure, while two healthy
/// replicas had a new leader) — long enough for a sidecar to miss its node TTL. Fixed by
/// rotating past the address that failed, and shorter attempts with HTTP/2 keep-alive.
#[test]
fn metad_client_reaches_the_new_leader_when_the_old_one_is_partitioned() {
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let observer = Arc::new(NsRuntime::new(&topo.bridge_ns, 1).unwrap());
    let cluster = Cluster::start(
        &topo,
        MetadProgram::built(),
        observer.clone(),
        History::new(),
        3,
    )
    .unwrap();
    let leader = cluster.wait_leader(Duration::from_secs(20)).unwrap();
    let s1 = NsRuntime::new(&topo.host("s1").unwrap().ns, 1).unwrap();
    // The leader first in the list, as any order puts some replica there.
    let mut addrs = vec![cluster.replica(leader).unwrap().grpc()];
    addrs.extend(
        cluster
            .member_ids()
            .into_iter()
            .filter(|id| *id != leader)
            .map(|id| cluster.replica(id).unwrap().grpc()),
    );
    let mut cfg = ClientConfig::new(addrs);
    cfg.token = Some(cluster.token().to_string());
    let client = MetadClient::new(cfg).unwrap();
    let c = client.clone();
    s1.run(async move { c.stats().await.unwrap() });
    let leader_host = cluster.replica(leader).unwrap().host.clone();
    firewall::install(&leader_host, &topo.dir, "isolate", &[Rule::DropAll]).unwrap();
    let started = Instant::now();
    let r = s1.run(async move { client.stats().await.map(|s| s.leader_id) });
    let took = started.elapsed();
    assert!(
        matches!(r, Ok(id) if id != leader) && took < Duration::from_secs(12),
        "with metad {leader} partitioned, the call took {took:?} and returned {r:?}"
    );
}

/// A leader paused past the election timeout, resumed (cut off from the other replicas) with
/// requests queued on its socket, must not answer them from its stale state: a key removed
/// and a key written by the new leader meanwhile are never "found" and "not found" there
/// (design section 5: the lease is measured at read time).
#[test]
fn a_resumed_deposed_leader_serves_no_stale_reads() {
    use nix::sys::signal::Signal;
    use regolith_proto::metad as pb;
    init_logs();
    let topo = Topology::build(&netns::standard_hosts()).unwrap();
    let observer = Arc::new(NsRuntime::new(&topo.bridge_ns, 1).unwrap());
    let mut cluster = Cluster::start(
        &topo,
        MetadProgram::built(),
        observer.clone(),
        History::new(),
        3,
    )
    .unwrap();
    let old = cluster.wait_leader(Duration::from_secs(20)).unwrap();
    let old_addr = cluster.replica(old).unwrap().grpc();
    let s1 = NsRuntime::new(&topo.host("s1").unwrap().ns, 2).unwrap();
    let mut cfg = ClientConfig::new(cluster.metad_addrs());
    cfg.token = Some(cluster.token().to_string());
    cfg.request_timeout = Duration::from_secs(1);
    cfg.retry_deadline = Duration::from_secs(10);
    let client = MetadClient::new(cfg).unwrap();

    // A segment, and "gone" stored through the old leader.
    let c = client.clone();
    let node = s1.run(async move {
        let m = c
            .mount(pb::MountSegmentRequest {
                node_name: "s1".into(),
                node_id: 0,
                capacity: 1 << 30,
                data_addrs: vec!["10.77.0.21:7600".into()],
            })
            .await
            .unwrap();
        put_until_stored(&c, m.node_id, m.generation, "gone").await;
        (m.node_id, m.generation)
    });

    cluster.signal(old, Signal::SIGSTOP).unwrap();
    let new = cluster.wait_leader(Duration::from_secs(15)).unwrap();
    assert_ne!(new, old);
    // Through the new leader: remove "gone", store "fresh".
    let c = client.clone();
    s1.run(async move {
        put_until_stored(&c, node.0, node.1, "fresh").await;
        let r = c.remove(vec!["gone".into()]).await.unwrap();
        assert_eq!(r.codes, vec![pb::Code::Ok as i32]);
    });

    // Reads sent to the paused old leader, after the remove and the put completed, answered
    // when it resumes.
    // Each answer is Ok(true) when the old leader claimed the key exists, Ok(false) when it
    // claimed it does not.
    let queued: Vec<_> = ["gone", "fresh"]
        .iter()
        .flat_map(|k| [(*k, false), (*k, false), (*k, true), (*k, true)])
        .map(|(key, exists)| {
            let c = client.clone();
            let addr = old_addr.clone();
            s1.spawn(async move {
                let mut stub = c.stub(&addr).unwrap();
                let keys = vec![key.to_string()];
                let fut = async {
                    if exists {
                        let r = stub.exists(pb::ExistsRequest { keys }).await?;
                        Ok::<_, tonic::Status>(r.into_inner().exists.first().copied())
                    } else {
                        let req = pb::GetRequest {
                            keys,
                            requester_node_id: 0,
                        };
                        let code = stub
                            .get(req)
                            .await?
                            .into_inner()
                            .status
                            .unwrap_or_default()
                            .code;
                        Ok(if code == pb::Code::Ok as i32 {
                            Some(true)
                        } else if code == pb::Code::NotFound as i32 {
                            Some(false)
                        } else {
                            None
                        })
                    }
                };
                let r = tokio::time::timeout(Duration::from_secs(8), fut).await;
                (key, if exists { "exists" } else { "get" }, r)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // It resumes cut off from the other replicas (clients still reach it), so only its own
    // lease check can tell it that it may no longer answer.
    let old_host = cluster.replica(old).unwrap().host.clone();
    let peers: Vec<std::net::Ipv4Addr> = cluster
        .member_ids()
        .into_iter()
        .filter(|id| *id != old)
        .map(|id| cluster.replica(id).unwrap().host.addr())
        .collect();
    let cut = [Rule::DropFrom(peers.clone()), Rule::DropTo(peers)];
    firewall::install(&old_host, &topo.dir, "peers", &cut).unwrap();
    cluster.signal(old, Signal::SIGCONT).unwrap();
    for q in queued {
        let (key, op, r) = s1.handle().block_on(q).unwrap();
        tracing::info!("old leader {old} answered {op} {key}: {r:?}");
        let stale = match (key, &r) {
            ("gone", Ok(Ok(Some(present)))) => *present,
            ("fresh", Ok(Ok(Some(present)))) => !*present,
            _ => false,
        };
        assert!(!stale, "deposed leader {old} answered {op} {key}: {r:?}");
    }
}

/// Reserve + commit until acknowledged (heartbeating first: a new leader places nothing on a
/// segment before its sidecar has heartbeated to it).
async fn put_until_stored(c: &MetadClient, node: u64, generation: u64, key: &str) {
    use regolith_proto::metad as pb;
    for _ in 0..50 {
        let _ = c
            .heartbeat(pb::HeartbeatRequest {
                node_id: node,
                generation,
                ..Default::default()
            })
            .await;
        let req = pb::ReserveRequest {
            key: key.into(),
            size: 4096,
            options: None,
            requester_node_id: node,
        };
        if let Ok((r, addr)) = c.reserve(req).await {
            if let Some(res) = r
                .reservation
                .filter(|_| r.status.unwrap_or_default().code == 0)
            {
                let commit = pb::CommitRequest {
                    version: res.version,
                    checksum: 1,
                };
                if let Ok(cr) = c.commit_at(&addr, commit).await {
                    if cr.status.unwrap_or_default().code == 0 {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not store {key}");
}

/// The `byzantine-client` fault alone (issue 14): hostile clients on every sidecar host send
/// garbage to the sidecars' sockets, slices without grants to their data ports, forged Votes
/// and half-open connections to metad, while the workload runs. The checker must find nothing,
/// the workload must keep being served during the fault, and the heal must show that the
/// daemons answered the hostile traffic (refusals, not silence).
#[test]
fn a_byzantine_client_changes_no_verdict() {
    init_logs();
    let _one = one_profile_at_a_time();
    let seed = seed();
    let mut cfg = HarnessConfig::new(MetadProgram::built());
    cfg.workload.seed = seed;
    let fault = Fault::ByzantineClient;
    let steps = vec![Step {
        hold: schedule::default_hold(&fault),
        fault,
    }];
    let started = Instant::now();
    let workload = SidecarWorkload::new(SidecarConfig::new(SidecarProgram::built()));
    let outcome = run_profile(cfg, workload, steps, None).expect("the harness ran");
    print_outcome("byzantine client alone (sidecars)", seed, started, &outcome);
    assert!(
        outcome.passed(),
        "the hostile client changed a verdict (seed {seed}):\n{outcome}"
    );
    let row = outcome
        .report
        .rows
        .iter()
        .find(|r| r.kind == "byzantine-client")
        .expect("a row for the fault");
    assert!(
        row.ok > 0,
        "no workload operation succeeded under the hostile client: {row:?}"
    );
    let healed = outcome
        .recorded
        .events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::FaultHealed { fault, detail } if fault == "byzantine-client" => {
                Some(detail.clone())
            }
            _ => None,
        })
        .expect("the fault was healed");
    for answer in [
        "FORBIDDEN",
        "error INVALID_ARGUMENT",
        "BadToken",
        "forged vote refused",
    ] {
        assert!(healed.contains(answer), "no {answer:?} in: {healed}");
    }
}
