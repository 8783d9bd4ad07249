//! `regolith status [--json]`: leader, members, segments (usage, liveness), keys and bytes,
//! from the metad leader; and tiers per node: memory and each disk (path, health, use,
//! objects) from the sidecars' `/status` ([`crate::tiers`]).

use regolith_proto::client::MetadClient;
use regolith_proto::metad::{Member, SegmentInfo, SegmentState, StatsResponse};
use serde::Serialize;

use crate::args::StatusArgs;
use crate::ctx::Ctx;
use crate::error::Result;
use crate::format::{self, Table};
use crate::tiers::{self, NodeTiers};

/// What `status` shows (and prints as JSON with `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// The leader's id, or null when none is known.
    pub leader_id: Option<u64>,
    pub leader_addr: Option<String>,
    pub term: u64,
    pub members: Vec<MemberView>,
    pub keys: u64,
    pub bytes_used: u64,
    pub bytes_total: u64,
    pub evicted_objects: u64,
    pub dead_node_dropped_objects: u64,
    pub segments: Vec<SegmentView>,
    /// Per node: memory (metad's segment) and disks (the sidecar's `/status`); nodes whose
    /// sidecar status address is not known have `error` set and no disks.
    pub tiers: Vec<NodeTiers>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberView {
    pub id: u64,
    pub addr: String,
    /// `leader`, `voter` or `learner`.
    pub role: &'static str,
    pub voter: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SegmentView {
    pub node_name: String,
    pub node_id: u64,
    pub generation: u64,
    /// `active` or `draining`.
    pub state: &'static str,
    pub alive: bool,
    pub capacity: u64,
    pub used: u64,
    pub objects: u64,
    pub last_heartbeat_ms_ago: u64,
    pub data_addrs: Vec<String>,
}

pub fn run(ctx: &Ctx, args: &StatusArgs) -> Result<()> {
    let metad = ctx.metad_client()?;
    let mut snap = metad.block_on(fetch(metad.client()))?;
    let addrs = tiers::status_addrs(ctx, &args.sidecar_metrics)?;
    add_tiers(&mut snap, &addrs);
    if args.json {
        let text = serde_json::to_string_pretty(&snap)
            .map_err(|e| crate::error::Error::Failed(format!("cannot encode JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(&snap));
    }
    Ok(())
}

/// Asks the leader for its stats and segments.
pub async fn fetch(metad: &MetadClient) -> Result<Snapshot> {
    let stats = metad.stats().await?;
    let segments = metad.list_segments().await?;
    Ok(snapshot(stats, segments))
}

/// Reads the sidecars' `/status` at `addrs` and joins their disks with the segments.
pub fn add_tiers(snap: &mut Snapshot, addrs: &[std::net::SocketAddr]) {
    let statuses = tiers::fetch_statuses(addrs);
    let segments: Vec<(String, u64, u64)> = snap
        .segments
        .iter()
        .map(|s| (s.node_name.clone(), s.used, s.capacity))
        .collect();
    snap.tiers = tiers::join(&segments, &statuses);
}

/// The members as `status` and `members list` show them, with the leader's role named.
pub fn member_views(members: &[Member], leader: Option<u64>) -> Vec<MemberView> {
    members
        .iter()
        .map(|m| MemberView {
            id: m.id,
            addr: m.addr.clone(),
            role: if Some(m.id) == leader {
                "leader"
            } else if m.voter {
                "voter"
            } else {
                "learner"
            },
            voter: m.voter,
        })
        .collect()
}

fn snapshot(stats: StatsResponse, segments: Vec<SegmentInfo>) -> Snapshot {
    let leader_id = (stats.leader_id != 0).then_some(stats.leader_id);
    let members = member_views(&stats.members, leader_id);
    let leader_addr = members
        .iter()
        .find(|m| Some(m.id) == leader_id)
        .map(|m| m.addr.clone());
    let mut segments: Vec<SegmentView> = segments.into_iter().map(segment_view).collect();
    segments.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    Snapshot {
        leader_id,
        leader_addr,
        term: stats.term,
        members,
        keys: stats.keys,
        bytes_used: stats.bytes_used,
        bytes_total: stats.bytes_total,
        evicted_objects: stats.evicted_objects,
        dead_node_dropped_objects: stats.dead_node_dropped_objects,
        segments,
        tiers: Vec::new(),
    }
}

fn segment_view(s: SegmentInfo) -> SegmentView {
    let state = match SegmentState::try_from(s.state) {
        Ok(SegmentState::SegmentDraining) => "draining",
        _ => "active",
    };
    SegmentView {
        node_name: s.node_name,
        node_id: s.node_id,
        generation: s.generation,
        state,
        alive: s.alive,
        capacity: s.capacity,
        used: s.used,
        objects: s.objects,
        last_heartbeat_ms_ago: s.last_heartbeat_ms_ago,
        data_addrs: s.data_addrs,
    }
}

/// The human-readable status: a summary, the members table and the segments table.
pub fn render(s: &Snapshot) -> String {
    let leader = match (s.leader_id, &s.leader_addr) {
        (Some(id), Some(addr)) => format!("metad {id} ({addr})"),
        (Some(id), None) => format!("metad {id}"),
        _ => "none".into(),
    };
    let mut out = format!(
        "leader: {leader}, term {}\nkeys: {}  bytes: {} used of {} ({})\n\n",
        s.term,
        s.keys,
        format::bytes(s.bytes_used),
        format::bytes(s.bytes_total),
        format::percent(s.bytes_used, s.bytes_total),
    );
    out.push_str(&members_table(&s.members).render());
    out.push('\n');
    out.push_str(&segments_table(&s.segments).render());
    if s.tiers.iter().any(|n| !n.disks.is_empty()) {
        out.push('\n');
        out.push_str(&tiers_table(&s.tiers).render());
    }
    out
}

/// One row per node's memory and one per disk (shown once some node has disks).
pub fn tiers_table(nodes: &[NodeTiers]) -> Table {
    let mut t = Table::new([
        "NODE", "TIER", "PATH", "STATE", "USED", "CAPACITY", "USE", "OBJECTS",
    ]);
    for n in nodes {
        t.row([
            n.node_name.clone(),
            "memory".into(),
            "-".into(),
            "-".into(),
            format::bytes(n.memory.used),
            format::bytes(n.memory.total),
            format::percent(n.memory.used, n.memory.total),
            "-".into(),
        ]);
        for d in &n.disks {
            let state = match (&d.failure, d.healthy) {
                (_, true) => "healthy".to_string(),
                (Some(why), false) => format!("FAILED: {why}"),
                (None, false) => "FAILED".to_string(),
            };
            t.row([
                n.node_name.clone(),
                format!("disk {}", d.index),
                d.path.clone(),
                state,
                format::bytes(d.used_bytes),
                format::bytes(d.capacity_bytes),
                format::percent(d.used_bytes, d.capacity_bytes),
                d.objects.to_string(),
            ]);
        }
        if let Some(e) = &n.error {
            t.row([n.node_name.clone(), "disks".into(), format!("unknown: {e}")]);
        }
    }
    t
}

pub fn members_table(members: &[MemberView]) -> Table {
    let mut t = Table::new(["MEMBER", "ADDRESS", "ROLE"]);
    for m in members {
        t.row([m.id.to_string(), m.addr.clone(), m.role.to_string()]);
    }
    t
}

pub fn segments_table(segments: &[SegmentView]) -> Table {
    let mut t = Table::new([
        "NODE",
        "ID",
        "GEN",
        "STATE",
        "ALIVE",
        "USED",
        "CAPACITY",
        "USE",
        "OBJECTS",
        "HEARTBEAT",
    ]);
    for s in segments {
        t.row([
            s.node_name.clone(),
            s.node_id.to_string(),
            s.generation.to_string(),
            s.state.to_string(),
            if s.alive { "yes" } else { "NO" }.to_string(),
            format::bytes(s.used),
            format::bytes(s.capacity),
            format::percent(s.used, s.capacity),
            s.objects.to_string(),
            format!("{} ago", format::millis(s.last_heartbeat_ms_ago)),
        ]);
    }
    if segments.is_empty() {
        t.row(["(no segments mounted)"]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use regolith_proto::metad::Member;

    #[test]
    fn snapshot_names_the_leader_and_renders() {
        let stats = StatsResponse {
            leader_id: 2,
            term: 5,
            keys: 3,
            bytes_used: 1 << 20,
            bytes_total: 4 << 20,
            members: (1..=3)
                .map(|id| Member {
                    id,
                    addr: format!("127.0.0.1:{}", 50050 + id),
                    voter: id != 3,
                })
                .collect(),
            ..Default::default()
        };
        let seg = SegmentInfo {
            node_name: "node-1".into(),
            node_id: 7,
            capacity: 4 << 20,
            used: 1 << 20,
            alive: true,
            state: SegmentState::SegmentDraining as i32,
            last_heartbeat_ms_ago: 300,
            ..Default::default()
        };
        let s = snapshot(stats, vec![seg]);
        assert_eq!(s.leader_addr.as_deref(), Some("127.0.0.1:50052"));
        let roles: Vec<_> = s.members.iter().map(|m| m.role).collect();
        assert_eq!(roles, ["voter", "leader", "learner"]);
        let text = render(&s);
        assert!(
            text.contains("leader: metad 2 (127.0.0.1:50052), term 5"),
            "{text}"
        );
        assert!(text.contains("draining"), "{text}");
        assert!(text.contains("25.0%"), "{text}");
        assert!(
            !text.contains("TIER"),
            "no tiers table without disks: {text}"
        );
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(json["segments"][0]["alive"], true);
        assert_eq!(json["members"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn tiers_show_memory_and_each_disk_of_a_node() {
        let mut s = snapshot(StatsResponse::default(), vec![]);
        s.tiers = vec![NodeTiers {
            node_name: "node-0".into(),
            status_addr: Some("127.0.0.1:9300".into()),
            error: None,
            memory: tiers::MemoryTier {
                used: 1 << 20,
                total: 4 << 20,
            },
            disks: vec![
                tiers::DiskView {
                    index: 0,
                    path: "/d0".into(),
                    healthy: true,
                    capacity_bytes: 8 << 20,
                    used_bytes: 2 << 20,
                    objects: 5,
                    ..Default::default()
                },
                tiers::DiskView {
                    index: 1,
                    path: "/d1".into(),
                    failure: Some("read-only".into()),
                    ..Default::default()
                },
            ],
        }];
        let text = render(&s);
        let line = |needle: &str| {
            text.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} in {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(line("memory"), "node-0 memory - - 1.0 MiB 4.0 MiB 25.0% -");
        assert_eq!(
            line("/d0"),
            "node-0 disk 0 /d0 healthy 2.0 MiB 8.0 MiB 25.0% 5"
        );
        assert!(line("/d1").contains("FAILED: read-only"), "{text}");
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(json["tiers"][0]["disks"][0]["objects"], 5);
        assert_eq!(json["tiers"][0]["memory"]["total"], 4 << 20);
    }
}
