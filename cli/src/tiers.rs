//! Tiers per node: each node's memory (from metad's segments) and its disks (from the
//! sidecar's own `GET /status`, `disks`: metad keeps per-node disk totals only in its leader's
//! memory). `status` shows them and `bench` finds the disks it measures with them.
//!
//! A sidecar's status address is its `--metrics-addr`: the ones of the `regolith up` cluster in
//! `--dir` (cluster.json), and any named with `--sidecar-metrics`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::{Error, Result};

/// How long one sidecar's `/status` may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// One node's tiers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeTiers {
    pub node_name: String,
    /// Where the sidecar's `/status` was read; null when no address is known for the node.
    pub status_addr: Option<String>,
    /// Why the node's disks are not known (no address, no answer); null when they are.
    pub error: Option<String>,
    pub memory: MemoryTier,
    pub disks: Vec<DiskView>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct MemoryTier {
    pub used: u64,
    pub total: u64,
}

/// A disk as the sidecar reports it (docs/ssd.md "Operations"); `index` is its place in the
/// sidecar's list, the number its disk replicas carry (`disk_tier::disk_generation`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct DiskView {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub healthy: bool,
    #[serde(default)]
    pub failure: Option<String>,
    #[serde(default)]
    pub direct_io: bool,
    #[serde(default)]
    pub capacity_bytes: u64,
    #[serde(default)]
    pub used_bytes: u64,
    #[serde(default)]
    pub objects: u64,
}

/// What one sidecar's `/status` said (the parts tiers need).
#[derive(Debug, Clone, PartialEq)]
pub struct SidecarStatus {
    pub addr: SocketAddr,
    pub node_name: String,
    pub segment_size: u64,
    pub segment_used: u64,
    pub disks: Vec<DiskView>,
}

/// The status addresses to ask: `--sidecar-metrics` values, then the `regolith up` cluster's.
pub fn status_addrs(ctx: &Ctx, named: &[String]) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for a in named {
        let addr = a
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .ok_or_else(|| Error::usage(format!("--sidecar-metrics {a}: not a HOST:PORT")))?;
        out.push(addr);
    }
    if let Some(c) = ctx.cluster() {
        for s in &c.sidecars {
            match s.metrics.parse::<SocketAddr>() {
                Ok(a) if !out.contains(&a) => out.push(a),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(sidecar = %s.name, error = %e, "cluster.json: bad metrics address")
                }
            }
        }
    }
    Ok(out)
}

/// Each address's `/status`, or why it gave none.
pub fn fetch_statuses(
    addrs: &[SocketAddr],
) -> Vec<(SocketAddr, std::result::Result<SidecarStatus, String>)> {
    let asks: Vec<_> = addrs
        .iter()
        .map(|a| {
            let a = *a;
            std::thread::spawn(move || crate::http::get_json(a, "/status", STATUS_TIMEOUT))
        })
        .collect();
    addrs
        .iter()
        .zip(asks)
        .map(|(a, t)| {
            let got = t.join().ok().flatten();
            let st = match got {
                Some(v) => parse_status(*a, &v),
                None => Err(format!("no answer from {a}/status")),
            };
            (*a, st)
        })
        .collect()
}

/// The parts of a sidecar's `/status` document tiers use; a document without a node name is
/// refused (it is not a sidecar's).
pub fn parse_status(
    addr: SocketAddr,
    v: &serde_json::Value,
) -> std::result::Result<SidecarStatus, String> {
    let node_name = v["node_name"]
        .as_str()
        .ok_or_else(|| format!("{addr}/status has no node_name"))?
        .to_string();
    let disks = match v.get("disks") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(d) => {
            let mut disks: Vec<DiskView> = serde_json::from_value(d.clone())
                .map_err(|e| format!("{addr}/status: disks: {e}"))?;
            for (i, d) in disks.iter_mut().enumerate() {
                d.index = i as u32;
            }
            disks
        }
    };
    Ok(SidecarStatus {
        addr,
        node_name,
        segment_size: v["segment_size"].as_u64().unwrap_or(0),
        segment_used: v["segment_used"].as_u64().unwrap_or(0),
        disks,
    })
}

/// One node per segment metad lists (memory from metad: what the pool counts) and per sidecar
/// that answered; disks from the sidecars, by node name. Sorted by node name.
pub fn join(
    segments: &[(String, u64, u64)],
    statuses: &[(SocketAddr, std::result::Result<SidecarStatus, String>)],
) -> Vec<NodeTiers> {
    let mut nodes: Vec<NodeTiers> = segments
        .iter()
        .map(|(name, used, total)| NodeTiers {
            node_name: name.clone(),
            status_addr: None,
            error: Some("no status address known (--sidecar-metrics ADDR)".into()),
            memory: MemoryTier {
                used: *used,
                total: *total,
            },
            disks: Vec::new(),
        })
        .collect();
    let mut unreachable = Vec::new();
    for (addr, st) in statuses {
        let st = match st {
            Ok(st) => st,
            Err(e) => {
                unreachable.push((*addr, e.clone()));
                continue;
            }
        };
        let pos = match nodes.iter().position(|n| n.node_name == st.node_name) {
            Some(p) => p,
            None => {
                nodes.push(NodeTiers {
                    node_name: st.node_name.clone(),
                    status_addr: None,
                    error: None,
                    memory: MemoryTier {
                        used: st.segment_used,
                        total: st.segment_size,
                    },
                    disks: Vec::new(),
                });
                nodes.len() - 1
            }
        };
        let n = &mut nodes[pos];
        n.status_addr = Some(addr.to_string());
        n.error = None;
        n.disks = st.disks.clone();
    }
    // A sidecar that did not answer is shown by its address (its name is not known).
    for (addr, e) in unreachable {
        nodes.push(NodeTiers {
            node_name: format!("? ({addr})"),
            status_addr: Some(addr.to_string()),
            error: Some(e),
            memory: MemoryTier::default(),
            disks: Vec::new(),
        });
    }
    nodes.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn a_sidecars_status_gives_its_disks_numbered_in_order() {
        let v = serde_json::json!({
            "node_name": "node-0", "segment_size": 100, "segment_used": 7,
            "disks": [
                {"path": "/a", "disk_id": "x", "healthy": true, "failure": null, "direct_io": true,
                 "bucket_size": 1, "capacity_bytes": 1000, "used_bytes": 10, "allocated_bytes": 20,
                 "objects": 3},
                {"path": "/b", "healthy": false, "failure": "gone"}
            ]
        });
        let st = parse_status(addr(1), &v).unwrap();
        assert_eq!(st.node_name, "node-0");
        assert_eq!(st.disks.len(), 2);
        assert_eq!((st.disks[0].index, st.disks[0].objects), (0, 3));
        assert_eq!(st.disks[1].index, 1);
        assert_eq!(st.disks[1].failure.as_deref(), Some("gone"));
        assert!(!st.disks[1].healthy);
        assert!(parse_status(addr(1), &serde_json::json!({"disks": []})).is_err());
        let bad = serde_json::json!({"node_name": "n", "disks": "no"});
        assert!(parse_status(addr(1), &bad).is_err());
    }

    #[test]
    fn nodes_join_metad_memory_with_sidecar_disks() {
        let st = SidecarStatus {
            addr: addr(1),
            node_name: "node-1".into(),
            segment_size: 50,
            segment_used: 5,
            disks: vec![DiskView {
                path: "/d".into(),
                healthy: true,
                capacity_bytes: 9,
                ..Default::default()
            }],
        };
        let nodes = join(
            &[("node-1".into(), 10, 100), ("node-0".into(), 1, 100)],
            &[(addr(1), Ok(st)), (addr(2), Err("no answer".into()))],
        );
        let names: Vec<&str> = nodes.iter().map(|n| n.node_name.as_str()).collect();
        assert_eq!(names, ["? (127.0.0.1:2)", "node-0", "node-1"]);
        let n1 = &nodes[2];
        assert_eq!(
            n1.memory,
            MemoryTier {
                used: 10,
                total: 100
            },
            "metad's view of memory"
        );
        assert_eq!(n1.disks.len(), 1);
        assert_eq!(n1.error, None);
        assert!(nodes[1].error.is_some(), "node-0 has no known address");
        assert_eq!(nodes[0].error.as_deref(), Some("no answer"));
    }
}
