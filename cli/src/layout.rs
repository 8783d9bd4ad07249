//! Where `regolith up` puts every process: addresses and ports (pure; no I/O).
//!
//! | | default | `--base-port P` |
//! |---|---|---|
//! | metad i (0-based) gRPC | `127.0.0.1:50051+i` | `127.0.0.1:P+i` |
//! | metad i HTTP metadata KV | `127.0.0.1:8080+i` | `127.0.0.1:P+10+i` |
//! | metad i metrics (`/status`) | `127.0.0.1:9003+i` | `127.0.0.1:P+20+i` |
//! | sidecar i metrics | `127.0.0.1:9300+i` | `127.0.0.1:P+30+i` |
//! | sidecar i data plane | `127.0.(10+i).1` and `.2`, port `7600+i` | same IPs, port `P+40+i` |
//!
//! So `--base-port P` keeps everything inside `P..P+49`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::error::{Error, Result};

/// Ports `--base-port` reserves: `P..P+BLOCK`.
pub const BLOCK: u16 = 50;
/// At most this many processes of each kind (one slot of ten per kind in the block).
pub const MAX_METAD: u8 = 9;
pub const MAX_SIDECARS: u8 = 10;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub metad: Vec<MetadAddrs>,
    pub sidecars: Vec<SidecarAddrs>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadAddrs {
    /// Raft id, 1-based.
    pub id: u64,
    pub grpc: SocketAddr,
    pub http_metadata: SocketAddr,
    pub metrics: SocketAddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidecarAddrs {
    pub name: String,
    pub nics: Vec<IpAddr>,
    pub data_port: u16,
    pub metrics: SocketAddr,
}

struct Ports {
    grpc: u16,
    http_metadata: u16,
    metrics: u16,
    sidecar_metrics: u16,
    data: u16,
}

fn ports(base: Option<u16>) -> Result<Ports> {
    Ok(match base {
        None => Ports {
            grpc: 50051,
            http_metadata: 8080,
            metrics: 9003,
            sidecar_metrics: 9300,
            data: 7600,
        },
        Some(p) if p == 0 || p > u16::MAX - BLOCK => {
            return Err(Error::usage(format!(
                "--base-port {p}: must be 1..={} (the cluster takes ports P..P+{})",
                u16::MAX - BLOCK,
                BLOCK - 1
            )))
        }
        Some(p) => Ports {
            grpc: p,
            http_metadata: p + 10,
            metrics: p + 20,
            sidecar_metrics: p + 30,
            data: p + 40,
        },
    })
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// The name of sidecar `i`: also its socket's (`DIR/<name>.sock`) and state dir's name.
pub fn sidecar_name(i: usize) -> String {
    format!("node-{i}")
}

/// The two loopback NIC addresses of sidecar `i`.
pub fn sidecar_nics(i: usize) -> Vec<IpAddr> {
    let b = 10 + i as u8;
    vec![
        IpAddr::V4(Ipv4Addr::new(127, 0, b, 1)),
        IpAddr::V4(Ipv4Addr::new(127, 0, b, 2)),
    ]
}

pub fn plan(metad: u8, sidecars: u8, base_port: Option<u16>) -> Result<Layout> {
    if !(1..=MAX_METAD).contains(&metad) {
        return Err(Error::usage(format!("--metad {metad}: 1..={MAX_METAD}")));
    }
    if !(1..=MAX_SIDECARS).contains(&sidecars) {
        return Err(Error::usage(format!(
            "--sidecars {sidecars}: 1..={MAX_SIDECARS}"
        )));
    }
    let p = ports(base_port)?;
    let metad = (0..metad as u16)
        .map(|i| MetadAddrs {
            id: i as u64 + 1,
            grpc: loopback(p.grpc + i),
            http_metadata: loopback(p.http_metadata + i),
            metrics: loopback(p.metrics + i),
        })
        .collect();
    let sidecars = (0..sidecars as u16)
        .map(|i| SidecarAddrs {
            name: sidecar_name(i as usize),
            nics: sidecar_nics(i as usize),
            data_port: p.data + i,
            metrics: loopback(p.sidecar_metrics + i),
        })
        .collect();
    Ok(Layout { metad, sidecars })
}

impl Layout {
    /// `(1, "127.0.0.1:50051"), (2, ...)`: the initial metad members.
    pub fn members(&self) -> Vec<(u64, String)> {
        self.metad
            .iter()
            .map(|m| (m.id, m.grpc.to_string()))
            .collect()
    }

    /// `1=127.0.0.1:50051,2=...`: metad's `--peers`.
    pub fn peers(&self) -> String {
        regolith_proto::launch::peers_arg(&self.members())
    }

    /// `127.0.0.1:50051,...`: the sidecars' `--metad`.
    pub fn metad_list(&self) -> String {
        self.metad_addrs().join(",")
    }

    pub fn metad_addrs(&self) -> Vec<String> {
        self.metad.iter().map(|m| m.grpc.to_string()).collect()
    }

    /// Every TCP address some process will listen on, with what it is for.
    pub fn listeners(&self) -> Vec<(SocketAddr, String)> {
        let mut out = Vec::new();
        for m in &self.metad {
            out.push((m.grpc, format!("metad {} gRPC", m.id)));
            out.push((m.http_metadata, format!("metad {} HTTP metadata", m.id)));
            out.push((m.metrics, format!("metad {} metrics", m.id)));
        }
        for s in &self.sidecars {
            out.push((s.metrics, format!("{} metrics", s.name)));
            for ip in &s.nics {
                out.push((
                    SocketAddr::new(*ip, s.data_port),
                    format!("{} data plane", s.name),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn default_ports_are_the_well_known_ones() {
        let l = plan(3, 2, None).unwrap();
        assert_eq!(l.metad[0].grpc.to_string(), "127.0.0.1:50051");
        assert_eq!(l.metad[2].grpc.to_string(), "127.0.0.1:50053");
        assert_eq!(l.metad[0].http_metadata.to_string(), "127.0.0.1:8080");
        assert_eq!(l.metad[1].metrics.to_string(), "127.0.0.1:9004");
        assert_eq!(l.sidecars[1].metrics.to_string(), "127.0.0.1:9301");
        assert_eq!(l.sidecars[1].nics[1].to_string(), "127.0.11.2");
        assert_eq!(l.sidecars[0].data_port, 7600);
        assert_eq!(
            l.peers(),
            "1=127.0.0.1:50051,2=127.0.0.1:50052,3=127.0.0.1:50053"
        );
    }

    #[test]
    fn base_port_keeps_everything_in_its_block_without_collisions() {
        let l = plan(MAX_METAD, MAX_SIDECARS, Some(20000)).unwrap();
        let all = l.listeners();
        let distinct: HashSet<_> = all.iter().map(|(a, _)| *a).collect();
        assert_eq!(distinct.len(), all.len());
        assert!(all
            .iter()
            .all(|(a, _)| (20000..20000 + BLOCK).contains(&a.port())));
        let d = plan(MAX_METAD, MAX_SIDECARS, None).unwrap().listeners();
        let distinct: HashSet<_> = d.iter().map(|(a, _)| *a).collect();
        assert_eq!(distinct.len(), d.len());
    }

    #[test]
    fn bad_counts_and_ports_are_usage_errors() {
        for (m, s, p) in [
            (0, 2, None),
            (3, 0, None),
            (3, 11, None),
            (3, 2, Some(65500)),
        ] {
            let e = plan(m, s, p).unwrap_err();
            assert!(matches!(e, Error::Usage(_)), "{e}");
        }
    }
}
