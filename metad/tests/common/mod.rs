//! Test harness: real `regolith-metad` processes on loopback.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::launch::MetadLaunch;
use regolith_proto::metad as pb;

/// A free loopback port outside the ephemeral range (see `regolith_test_support::ports`).
pub fn free_port() -> u16 {
    regolith_test_support::free_loopback_port()
}

pub struct Replica {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub kv: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub replicas: BTreeMap<u64, Replica>,
    pub token_file: PathBuf,
    /// The Raft peer credential every replica shares (`--peer-token-file`).
    pub peer_token_file: PathBuf,
    pub extra: Vec<String>,
    /// RLIMIT_NOFILE for replicas started from now on (through `sh -c 'ulimit -n'`).
    pub nofile: Option<u64>,
}

impl Cluster {
    /// Starts `n` replicas bootstrapped together.
    pub fn start(n: u64) -> Self {
        Self::start_with(n, &[])
    }

    pub fn start_with(n: u64, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "test-token-0123456789\n").unwrap();
        let peer_token_file = dir.path().join("peer-token");
        std::fs::write(&peer_token_file, "test-peer-credential-9876\n").unwrap();
        let mut c = Cluster {
            dir,
            replicas: BTreeMap::new(),
            token_file,
            peer_token_file,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            nofile: None,
        };
        for id in 1..=n {
            c.add_replica_slot(id);
        }
        let peers = c.members();
        for id in 1..=n {
            c.spawn(id, Some(&peers), true);
        }
        c
    }

    pub fn add_replica_slot(&mut self, id: u64) {
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let kv = format!("127.0.0.1:{}", free_port());
        let dir = self.dir.path().join(format!("metad-{id}"));
        let log = self.dir.path().join(format!("metad-{id}.log"));
        self.replicas.insert(
            id,
            Replica {
                id,
                grpc,
                http,
                kv,
                dir,
                child: None,
                log,
            },
        );
    }

    /// Every replica slot as `(id, gRPC address)`: the `--peers` of a bootstrap.
    pub fn members(&self) -> Vec<(u64, String)> {
        self.replicas
            .values()
            .map(|r| (r.id, r.grpc.clone()))
            .collect()
    }

    /// Starts (or restarts) replica `id`.
    pub fn spawn(&mut self, id: u64, peers: Option<&[(u64, String)]>, bootstrap: bool) {
        let token = self.token_file.clone();
        let peer_token = self.peer_token_file.clone();
        let extra = self.extra.clone();
        let nofile = self.nofile;
        let r = self.replicas.get_mut(&id).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .unwrap();
        let launch = MetadLaunch {
            listen: Some(r.grpc.clone()),
            data_dir: Some(r.dir.clone()),
            metrics_addr: Some(r.http.clone()),
            http_metadata_addr: Some(r.kv.clone()),
            cluster_token_file: Some(token),
            peer_token_file: Some(peer_token),
            advertise: Some(r.grpc.clone()),
            peers: peers.map(<[_]>::to_vec).unwrap_or_default(),
            bootstrap,
            extra: extra.iter().map(Into::into).collect(),
            ..MetadLaunch::new(id)
        };
        let bin = env!("CARGO_BIN_EXE_regolith-metad");
        let mut cmd = match nofile {
            None => Command::new(bin),
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
        };
        cmd.args(launch.args())
            .env("RUST_LOG", "info,regolith_metad=debug")
            .stdout(Stdio::null())
            .stderr(log);
        r.child = Some(cmd.spawn().expect("spawn regolith-metad"));
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.replicas.get_mut(&id).unwrap().child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn sigterm(&mut self, id: u64) -> std::process::ExitStatus {
        let mut c = self.replicas.get_mut(&id).unwrap().child.take().unwrap();
        unsafe { libc_kill(c.id() as i32, 15) };
        c.wait().unwrap()
    }

    pub fn signal(&self, id: u64, sig: i32) {
        if let Some(c) = &self.replicas[&id].child {
            unsafe { libc_kill(c.id() as i32, sig) };
        }
    }

    pub fn peer_token(&self) -> String {
        std::fs::read_to_string(&self.peer_token_file)
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(&self.token_file)
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.replicas.values().map(|r| r.grpc.clone()).collect()
    }

    pub fn client(&self) -> MetadClient {
        let mut cfg = ClientConfig::new(self.addrs());
        cfg.token = Some(self.token());
        cfg.retry_deadline = Duration::from_secs(20);
        MetadClient::new(cfg).unwrap()
    }

    /// `/status` of a replica, if it answers.
    pub fn status(&self, id: u64) -> Option<serde_json::Value> {
        http_get(&self.replicas[&id].http, "/status")
            .ok()
            .and_then(|(code, body)| {
                (code == 200)
                    .then(|| serde_json::from_str(&body).ok())
                    .flatten()
            })
    }

    /// Waits until a live replica reports itself ready leader; returns its id.
    pub fn wait_leader(&self, timeout: Duration) -> u64 {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            for (id, r) in &self.replicas {
                if r.child.is_none() {
                    continue;
                }
                if let Some(s) = self.status(*id) {
                    if s["role"] == "leader" && s["leader_ready"] == true {
                        return *id;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.dump_logs();
        panic!("no leader within {timeout:?}");
    }

    pub fn dump_logs(&self) {
        for r in self.replicas.values() {
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("----- metad {} log (last 40 lines) -----", r.id);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for r in self.replicas.values_mut() {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A minimal HTTP/1.1 request over a plain socket (no client library needed).
pub fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    http_request_with(addr, method, path, "", body)
}

/// [`http_request`] with extra header lines (each ending in `\r\n`).
pub fn http_request_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    // Generous: a write may wait its turn (5 s) and then for a Raft commit on a loaded machine.
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
    s.write_all(body)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    Ok((code, buf[head_end + 4..].to_vec()))
}

pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "GET", path, b"").map(|(c, b)| (c, String::from_utf8_lossy(&b).to_string()))
}

/// Mounts a segment as a sidecar would; returns (node_id, generation).
pub async fn mount(c: &MetadClient, name: &str, capacity: u64) -> (u64, u64) {
    let r = c
        .mount(pb::MountSegmentRequest {
            node_name: name.into(),
            node_id: 0,
            capacity,
            data_addrs: vec!["127.0.0.1:7600".into()],
        })
        .await
        .unwrap();
    (r.node_id, r.generation)
}

pub async fn heartbeat(
    c: &MetadClient,
    node: u64,
    generation: u64,
    released: Vec<pb::Version>,
) -> pb::HeartbeatResponse {
    c.heartbeat(pb::HeartbeatRequest {
        node_id: node,
        generation,
        highest_term_seen: 0,
        in_flight: vec![],
        released,
        used_bytes: 0,
        accessed: vec![],
        ..Default::default()
    })
    .await
    .unwrap()
    .0
}

/// Heartbeats the segment (a leader places nothing on a segment it has not heard from), then
/// puts `n` objects of 4 KiB named `{prefix}-{i}`, one at a time: one Raft entry each.
pub async fn put_series(c: &MetadClient, node: u64, generation: u64, prefix: &str, n: usize) {
    heartbeat(c, node, generation, vec![]).await;
    for i in 0..n {
        put(c, &format!("{prefix}-{i}"), 4096, 1).await.unwrap();
    }
}

/// Reserve + commit of one object (the bytes themselves are the sidecar's business).
pub async fn put(
    c: &MetadClient,
    key: &str,
    size: u64,
    replicas: u32,
) -> Result<pb::Reservation, String> {
    let req = pb::ReserveRequest {
        key: key.into(),
        size,
        options: Some(pb::PutOptions {
            replicas,
            ..Default::default()
        }),
        requester_node_id: 0,
    };
    let (r, addr) = c.reserve(req).await.map_err(|e| e.to_string())?;
    let st = r.status.unwrap_or_default();
    if st.code != 0 {
        return Err(format!(
            "reserve {key}: {:?} {}",
            pb::Code::try_from(st.code),
            st.message
        ));
    }
    let res = r.reservation.unwrap();
    let cr = c
        .commit_at(
            &addr,
            pb::CommitRequest {
                version: res.version,
                checksum: 42,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    let st = cr.status.unwrap_or_default();
    if st.code != 0 {
        return Err(format!(
            "commit {key}: {:?} {}",
            pb::Code::try_from(st.code),
            st.message
        ));
    }
    Ok(res)
}
