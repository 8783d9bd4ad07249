//! Many nodes (issue 17, item 5): a lightweight simulator of sidecars that mount a segment each
//! and heartbeat it every second over the real gRPC API, while the leader's CPU is sampled from
//! `/proc`. What it reports: the leader's CPU share of one core, heartbeat latency, heartbeat
//! errors, and missed liveness (a heartbeat answered "remount", or a segment no longer mounted
//! under the generation it got).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::metad as pb;

/// Connections the simulated sidecars share (each real sidecar has its own; a thousand
/// HTTP/2 connections from one process would measure this process, not the leader).
const CONNECTIONS: usize = 16;

#[derive(Debug, Default)]
pub struct Report {
    pub segments: u64,
    pub mount_secs: f64,
    pub secs: f64,
    pub heartbeats: u64,
    pub errors: u64,
    pub remounts: u64,
    pub lost: u64,
    pub leader_cpu: f64,
    pub hb_p50_us: f64,
    pub hb_p99_us: f64,
    pub hb_max_us: f64,
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

fn clients(addrs: &[String]) -> Vec<MetadClient> {
    (0..CONNECTIONS)
        .map(|_| {
            let mut cfg = ClientConfig::new(addrs.to_vec());
            cfg.retry_deadline = Duration::from_secs(10);
            MetadClient::new(cfg).expect("client")
        })
        .collect()
}

/// Mounts `n` segments, heartbeats each every second for `secs` seconds, and reports.
pub async fn run(addrs: &[String], leader_pid: u32, n: u64, secs: u64) -> Report {
    let conns = clients(addrs);
    let t = Instant::now();
    let mut mounted = Vec::with_capacity(n as usize);
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(64) {
        let calls: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let c = conns[i as usize % CONNECTIONS].clone();
                let name = format!("sim-node-{i:04}");
                tokio::spawn(async move {
                    let m = c
                        .mount(pb::MountSegmentRequest {
                            node_name: name.clone(),
                            node_id: 0,
                            capacity: 1 << 30,
                            data_addrs: vec![format!("127.0.0.1:{}", 20_000 + i)],
                        })
                        .await
                        .unwrap_or_else(|e| panic!("mount {name}: {e}"));
                    (m.node_id, m.generation)
                })
            })
            .collect();
        for c in calls {
            mounted.push(c.await.expect("mount task"));
        }
    }
    let mount_secs = t.elapsed().as_secs_f64();

    let heartbeats = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let remounts = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let cpu0 = cpu_secs(leader_pid);
    let start = Instant::now();
    let tasks: Vec<_> = mounted
        .iter()
        .enumerate()
        .map(|(i, &(node_id, generation))| {
            let c = conns[i % CONNECTIONS].clone();
            let (heartbeats, errors, remounts) =
                (heartbeats.clone(), errors.clone(), remounts.clone());
            // Spread the first beats over the first second, as sidecars started apart would.
            let offset = Duration::from_micros(1_000_000 * i as u64 / n.max(1));
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut tick = tokio::time::interval_at(
                    tokio::time::Instant::now() + offset,
                    Duration::from_secs(1),
                );
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if Instant::now() >= end {
                        return lat;
                    }
                    let t = Instant::now();
                    let hb = pb::HeartbeatRequest {
                        node_id,
                        generation,
                        ..Default::default()
                    };
                    match c.heartbeat(hb).await {
                        Ok((r, _)) => {
                            lat.push(t.elapsed());
                            heartbeats.fetch_add(1, Ordering::Relaxed);
                            if r.remount {
                                remounts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap_or_default());
    }
    let secs = start.elapsed().as_secs_f64();
    let leader_cpu = match (cpu0, cpu_secs(leader_pid)) {
        (Some(a), Some(b)) => (b - a) / secs,
        _ => f64::NAN,
    };
    lat.sort();
    let expected: HashMap<u64, u64> = mounted.iter().copied().collect();
    let listed = conns[0].list_segments().await.expect("list segments");
    let still = listed
        .iter()
        .filter(|s| expected.get(&s.node_id) == Some(&s.generation))
        .count() as u64;
    Report {
        segments: n,
        mount_secs,
        secs,
        heartbeats: heartbeats.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        remounts: remounts.load(Ordering::Relaxed),
        lost: n - still.min(n),
        leader_cpu,
        hb_p50_us: crate::percentile(&lat, 0.5),
        hb_p99_us: crate::percentile(&lat, 0.99),
        hb_max_us: lat.last().map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0),
    }
}
