//! Property tests of the sans-I/O core (design §3 invariants 1 and 2, §6 eviction).

use std::collections::BTreeMap;

use proptest::prelude::*;
use regolith_metad::command::{Command, Outcome};
use regolith_metad::config::{CacheConfig, Now};
use regolith_metad::core::Core;
use regolith_metad::leader::reservations::ResState;
use regolith_metad::leader::{CommitStep, Heartbeat, PinKind, PutRequest};
use regolith_metad::state::StateMachine;
use regolith_metad::types::{Extent, Pin, Replica, SegmentId, UnmountReason, Version};

const NAMES: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];
const CAP: u64 = 64 * 1024;

/// Builds a concrete command from a random seed, against the current state (so segment ids and
/// keys are mostly real, sometimes not).
fn concrete(sm: &StateMachine, op: u8, a: u64, b: u64, c: u64) -> Command {
    let segs: Vec<SegmentId> = sm.segments().map(|s| s.id).collect();
    let key = format!("k{}", a % 24);
    // The disk tier's commands (issue 12) on objects that exist, mostly.
    let version = sm
        .object(&key)
        .map(|o| o.version)
        .unwrap_or(Version { term: 1, id: b });
    match op % 13 {
        10 if !segs.is_empty() => Command::MoveToDisk {
            node: segs[(b as usize) % segs.len()].node,
            items: vec![regolith_metad::command::DiskMove {
                key,
                version,
                disk: (c % 2) as u32,
            }],
        },
        11 if !segs.is_empty() => {
            let size = sm.object(&key).map_or(1 + b % 9000, |o| o.size);
            let off = (b.wrapping_mul(17) % CAP) / 64 * 64;
            Command::PromoteToMemory {
                key,
                version,
                reservation: Version { term: 9, id: c },
                replica: Replica {
                    segment: segs[(c as usize) % segs.len()],
                    extents: vec![Extent::new(off, size.div_ceil(64) * 64)],
                },
            }
        }
        12 if !segs.is_empty() => Command::CopyToDisk {
            node: segs[(b as usize) % segs.len()].node,
            items: vec![regolith_metad::command::DiskMove {
                key,
                version,
                disk: (c % 2) as u32,
            }],
        },
        0 => Command::MountSegment {
            node_name: NAMES[(a % 4) as usize].into(),
            node_id_hint: b % 3,
            capacity: CAP,
            data_addrs: vec![format!("127.0.0.1:{}", 7600 + a % 4)],
            now_ms: c,
        },
        1..=3 if !segs.is_empty() => {
            let size = 1 + b % 9000;
            let n = 1 + (c % 2) as usize;
            let replicas = (0..n)
                .map(|i| {
                    let seg = segs[((a + i as u64) as usize) % segs.len()];
                    let off = (b
                        .wrapping_mul(31)
                        .wrapping_add(c.wrapping_mul(7))
                        .wrapping_add(i as u64 * 4096)
                        % CAP)
                        / 64
                        * 64;
                    Replica {
                        segment: seg,
                        extents: vec![Extent::new(off, size.div_ceil(64) * 64)],
                    }
                })
                .collect();
            Command::CommitPut {
                key,
                size,
                replicas,
                checksum: a ^ b,
                version: Version {
                    term: 1 + c % 3,
                    id: a.wrapping_mul(1000).wrapping_add(b),
                },
                pin: match c % 5 {
                    0 => Pin::Hard,
                    1 => Pin::Soft { until_ms: b % 5000 },
                    _ => Pin::None,
                },
                expires_ms: if a.is_multiple_of(3) { b % 5000 } else { 0 },
            }
        }
        4 => Command::Remove {
            keys: vec![key, format!("k{}", b % 24)],
        },
        5 => Command::Evict { keys: vec![key] },
        6 => Command::ExpirePins { now_ms: b % 6000 },
        7 => Command::MetaPut {
            key: format!("m{}", a % 5),
            value: b.to_le_bytes().to_vec(),
        },
        8 if !segs.is_empty() => Command::UnmountSegment {
            segment: segs[(a as usize) % segs.len()],
            reason: if b.is_multiple_of(2) {
                UnmountReason::Dead
            } else {
                UnmountReason::Graceful
            },
        },
        9 if !segs.is_empty() && a.is_multiple_of(7) => Command::RemoveAll,
        9 if !segs.is_empty() => Command::DrainSegment {
            segment: segs[(a as usize) % segs.len()],
            deadline_ms: c,
        },
        _ => Command::MetaDelete {
            key: format!("m{}", a % 5),
        },
    }
}

/// Concrete commands from random seeds, each built against the state the ones before it made.
fn commands(ops: Vec<(u8, u64, u64, u64)>) -> Vec<Command> {
    let mut scratch = StateMachine::new();
    let mut cmds = Vec::new();
    for (op, a, b, c) in ops {
        let cmd = concrete(&scratch, op, a, b, c);
        scratch.apply(&cmd, &mut Vec::new());
        cmds.push(cmd);
    }
    cmds
}

fn restore(sm: &StateMachine) -> StateMachine {
    StateMachine::read_snapshot(&mut sm.snapshot_bytes().as_slice()).expect("restore")
}

fn check_no_overlap_in_sm(sm: &StateMachine) -> Result<(), TestCaseError> {
    let mut by_seg: BTreeMap<SegmentId, Vec<Extent>> = BTreeMap::new();
    let mut memory = 0u64;
    for (_, o) in sm.objects() {
        memory += o.replicas.memory_bytes();
        // Disk replicas name a disk, not a segment: one record per object, `(0, size)`.
        for r in o.replicas.to_vec().iter().filter(|r| !r.segment.is_disk()) {
            by_seg
                .entry(r.segment)
                .or_default()
                .extend(r.extents.iter().copied());
        }
    }
    for (seg, mut v) in by_seg {
        prop_assert!(
            sm.segment(&seg).is_some(),
            "object on unmounted segment {seg}"
        );
        if let Some(free) = sm.free_space(&seg) {
            for e in free.free_ranges() {
                v.push(e);
            }
        }
        let held: u64 = v.iter().map(|e| e.len).sum::<u64>()
            - sm.free_space(&seg)
                .map_or(0, |f| f.free_ranges().map(|e| e.len).sum());
        prop_assert_eq!(
            sm.segment(&seg).map(|s| s.used),
            Some(held),
            "used bytes of {}",
            seg
        );
        v.sort();
        for w in v.windows(2) {
            prop_assert!(
                w[0].end() <= w[1].offset,
                "overlap on {seg}: {:?} {:?}",
                w[0],
                w[1]
            );
        }
    }
    prop_assert_eq!(
        sm.bytes_used(),
        memory,
        "bytes used over all objects' memory"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Invariant 1: replay and snapshot-restore-then-replay give identical state and outcomes.
    #[test]
    fn apply_is_deterministic(ops in prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>(), any::<u64>()), 1..120), cut in any::<prop::sample::Index>()) {
        let cmds = commands(ops);
        let k = cut.index(cmds.len() + 1);
        let mut replay = StateMachine::new();
        let mut outs_a = Vec::new();
        for c in &cmds {
            outs_a.push(replay.apply(c, &mut Vec::new()));
        }
        let mut restored = StateMachine::new();
        let mut outs_b = Vec::new();
        for c in &cmds[..k] {
            outs_b.push(restored.apply(c, &mut Vec::new()));
        }
        let mut restored = restore(&restored);
        for c in &cmds[k..] {
            outs_b.push(restored.apply(c, &mut Vec::new()));
        }
        prop_assert_eq!(outs_a, outs_b);
        prop_assert_eq!(replay.snapshot_bytes(), restored.snapshot_bytes());
        prop_assert_eq!(replay.bytes_used(), restored.bytes_used());
        prop_assert_eq!(replay.hard_pinned_bytes(), restored.hard_pinned_bytes());
        check_no_overlap_in_sm(&replay)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Invariant 1 through the snapshot path replicas use: a snapshot begun after `cut`
    /// commands and written shard by shard while the rest are applied (each shard taken at
    /// some point of that stream, as the writer thread does) restores exactly the state after
    /// `cut`, and the restored replica then applies the rest with the live one's outcomes.
    #[test]
    fn a_snapshot_written_while_applies_go_on_restores_the_state_it_began_from(
        ops in prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>(), any::<u64>()), 1..120),
        cut in any::<prop::sample::Index>(),
    ) {
        let cmds = commands(ops);
        let k = cut.index(cmds.len() + 1);
        let mut live = StateMachine::new();
        for c in &cmds[..k] {
            live.apply(c, &mut Vec::new());
        }
        let expected = live.snapshot_bytes();
        let (start, objects) = live.begin_snapshot();
        let shards = regolith_metad::objects::SHARDS;
        let mut taken = Vec::with_capacity(shards);
        let rest = &cmds[k..];
        let mut live_outs = Vec::new();
        for (j, c) in rest.iter().enumerate() {
            live_outs.push(live.apply(c, &mut Vec::new()));
            // What `Core` does after each entry: a table a RemoveAll set aside gives the
            // snapshots being written what they still need before it goes.
            if let Some(mut t) = live.take_removed_table() {
                t.detach_snapshots();
            }
            // The writer takes the shards in order, spread over the stream.
            let upto = shards * (j + 1) / (rest.len() + 1);
            while taken.len() < upto {
                taken.push(objects.take_shard(live.objects_table(), taken.len()).unwrap());
            }
        }
        while taken.len() < shards {
            taken.push(objects.take_shard(live.objects_table(), taken.len()).unwrap());
        }
        let mut taken = taken.into_iter();
        let view = regolith_metad::state::StateView {
            start,
            take: Box::new(move |_| Ok(taken.next().unwrap_or_default())),
        };
        let mut bytes = Vec::new();
        view.write_to(&mut bytes).unwrap();
        let mut restored = StateMachine::read_snapshot(&mut bytes.as_slice()).expect("restore");
        prop_assert_eq!(restored.snapshot_bytes(), expected);
        let outs: Vec<Outcome> = rest.iter().map(|c| restored.apply(c, &mut Vec::new())).collect();
        prop_assert_eq!(outs, live_outs);
        prop_assert_eq!(restored.snapshot_bytes(), live.snapshot_bytes());
    }
}

// ---------------------------------------------------------------------- leader simulation

struct Sim {
    core: Core,
    now: Now,
    term: u64,
    /// Every reservation handed out and not known to have ended: version → extents per segment.
    issued: BTreeMap<Version, Vec<Replica>>,
    quarantined: BTreeMap<SegmentId, Vec<Version>>,
    /// Upserts applied over an existing object of their key.
    replaced: u64,
}

impl Sim {
    fn new() -> Self {
        let mut core = Core::new(CacheConfig {
            put_timeout_ms: 500,
            lease_ttl_ms: 300,
            node_ttl_ms: 2_000,
            ..Default::default()
        });
        let now = Now {
            mono_ms: 1_000,
            wall_ms: 1_000_000,
        };
        core.become_leader(1, now);
        Self {
            core,
            now,
            term: 1,
            issued: BTreeMap::new(),
            quarantined: BTreeMap::new(),
            replaced: 0,
        }
    }

    fn apply_all(&mut self, cmds: Vec<Command>) {
        for c in cmds {
            self.core.apply(&c, self.now);
        }
    }

    fn segs(&self) -> Vec<SegmentId> {
        self.core.sm().segments().map(|s| s.id).collect()
    }

    fn heartbeat(&mut self, seg: SegmentId, release: bool) {
        // The sidecar reports every reservation it may still have bytes in flight for.
        let in_flight = self
            .issued
            .iter()
            .filter_map(|(v, reps)| {
                reps.iter()
                    .find(|r| r.segment == seg)
                    .map(|r| (*v, r.extents.clone()))
            })
            .collect();
        let released = if release {
            self.quarantined.remove(&seg).unwrap_or_default()
        } else {
            Vec::new()
        };
        for v in &released {
            if let Some(reps) = self.issued.get_mut(v) {
                reps.retain(|r| r.segment != seg);
            }
        }
        let hb = Heartbeat {
            segment: seg,
            highest_term_seen: self.term,
            in_flight,
            released,
            ..Default::default()
        };
        let now = self.now;
        if let Some((l, sm)) = self.core.leader_parts() {
            let reply = l.heartbeat(sm, &hb, now);
            self.quarantined.insert(seg, reply.quarantined);
        }
    }

    fn existing_key(&self, a: u64) -> Option<String> {
        let n = self.core.sm().key_count();
        (n > 0).then(|| {
            let (k, _) = self.core.sm().objects().nth((a % n as u64) as usize)?;
            Some(k.to_string())
        })?
    }

    fn step(&mut self, op: u8, a: u64, b: u64) {
        let segs = self.segs();
        match op % 12 {
            0 => {
                let cmd = Command::MountSegment {
                    node_name: NAMES[(a % 4) as usize].into(),
                    node_id_hint: 0,
                    capacity: CAP,
                    data_addrs: vec![],
                    now_ms: self.now.wall_ms,
                };
                self.core.apply(&cmd, self.now);
            }
            1 | 2 => {
                // Some replace an object that exists (upserts); the others are puts of any key.
                let upsert = b % 5 == 3;
                let existing = upsert.then(|| self.existing_key(a)).flatten();
                let req = PutRequest {
                    key: existing.unwrap_or_else(|| format!("k{}", a % 32)),
                    size: 1 + b % 12_000,
                    replicas: 1 + (a % 2) as u32,
                    prefer_local: b.is_multiple_of(2),
                    requester: 1 + a % 4,
                    pin: match b % 7 {
                        0 => PinKind::Hard,
                        1 => PinKind::Soft,
                        _ => PinKind::None,
                    },
                    upsert,
                    ..Default::default()
                };
                let now = self.now;
                if let Some((l, sm)) = self.core.leader_parts() {
                    if let Ok(r) = l.reserve(sm, &req, now) {
                        let reps = r
                            .replicas
                            .iter()
                            .map(|p| Replica {
                                segment: p.segment,
                                extents: p.extents.clone(),
                            })
                            .collect();
                        self.issued.insert(r.version, reps);
                    }
                }
            }
            3 | 4 => {
                // Mostly live reservations; sometimes any version ever issued (stale, expired).
                let live: Vec<Version> = self
                    .core
                    .leader()
                    .map(|l| {
                        l.reservations()
                            .iter()
                            .filter(|r| r.state == ResState::Live)
                            .map(|r| r.version)
                            .collect()
                    })
                    .unwrap_or_default();
                let v = if !b.is_multiple_of(4) && !live.is_empty() {
                    live[(a as usize) % live.len()]
                } else {
                    match pick(&self.issued, a) {
                        Some(v) => v,
                        None => return,
                    }
                };
                let now = self.now;
                let step = self.core.leader_parts().map(|(l, _)| l.commit(v, b, now));
                if let Some(Ok(CommitStep::Propose(cmd))) = step {
                    if b.is_multiple_of(5) {
                        // The proposal is lost (leader deposed before replication).
                        if let Some((l, _)) = self.core.leader_parts() {
                            l.commit_failed(v)
                        }
                    } else {
                        let replacing = match &cmd {
                            Command::UpsertPut { key, .. } => self.core.sm().contains(key),
                            _ => false,
                        };
                        let out = self.core.apply(&cmd, self.now);
                        if out == Outcome::Committed {
                            self.issued.remove(&v);
                            self.replaced += u64::from(replacing);
                        }
                    }
                }
            }
            5 => {
                if let Some(v) = pick(&self.issued, a) {
                    if let Some((l, _)) = self.core.leader_parts() {
                        l.abort(&[v])
                    }
                }
            }
            6 => {
                let cmd = Command::Remove {
                    keys: vec![format!("k{}", a % 32)],
                };
                self.core.apply(&cmd, self.now);
            }
            7 => {
                let now = self.now;
                if let Some((l, sm)) = self.core.leader_parts() {
                    l.get(sm, &[format!("k{}", a % 32)], 0, now);
                }
            }
            8 => {
                self.now.mono_ms += a % 300;
                self.now.wall_ms += a % 300;
            }
            9 => {
                let now = self.now;
                let cmds = match self.core.leader_parts() {
                    Some((l, sm)) => {
                        let mut c = l.tick(sm, now, true);
                        if b.is_multiple_of(4) {
                            c.extend(l.eviction_due(sm, now, b % 20_000));
                        }
                        c
                    }
                    None => vec![],
                };
                self.apply_all(cmds);
            }
            10 => {
                // Every sidecar heartbeats; some of them are not done fencing yet.
                for (i, seg) in segs.into_iter().enumerate() {
                    self.heartbeat(seg, !(b >> i).is_multiple_of(3));
                }
            }
            11 => {
                // A new leader: builds its shadow allocator from the applied state; sidecars then
                // report what they have in flight.
                self.term += 1;
                self.core.step_down();
                self.core.become_leader(self.term, self.now);
                self.quarantined.clear();
                if a.is_multiple_of(2) {
                    for seg in segs {
                        self.heartbeat(seg, false);
                    }
                }
            }
            _ => {}
        }
    }

    /// Invariant 2: objects, reservations and lease holds never share a byte, and the shadow
    /// allocator's free space is exactly what none of them holds.
    fn check(&self) -> Result<(), TestCaseError> {
        let sm = self.core.sm();
        check_no_overlap_in_sm(sm)?;
        let Some(l) = self.core.leader() else {
            return Ok(());
        };
        let mut by_seg: BTreeMap<SegmentId, Vec<(Extent, String)>> = BTreeMap::new();
        for (k, o) in sm.objects() {
            for r in &o.replicas.to_vec() {
                for e in &r.extents {
                    by_seg
                        .entry(r.segment)
                        .or_default()
                        .push((*e, format!("object {k}")));
                }
            }
        }
        for r in l.reservations().iter() {
            for rep in &r.replicas {
                for e in &rep.extents {
                    by_seg
                        .entry(rep.segment)
                        .or_default()
                        .push((*e, format!("reservation {}", r.version)));
                }
            }
        }
        for (seg, e) in l.leases().waiting_extents() {
            by_seg
                .entry(seg)
                .or_default()
                .push((e, "lease hold".into()));
        }
        for (seg, s) in l.shadow().segments() {
            let held: u64 = by_seg
                .get(seg)
                .map(|v| v.iter().map(|(e, _)| e.len).sum())
                .unwrap_or(0);
            prop_assert_eq!(
                s.alloc.free_bytes() + held,
                s.alloc.capacity(),
                "accounting on {}",
                seg
            );
            for e in s.alloc.free_ranges() {
                by_seg
                    .entry(*seg)
                    .or_default()
                    .push((e, "shadow free".into()));
            }
        }
        for (seg, mut v) in by_seg {
            v.sort();
            for w in v.windows(2) {
                prop_assert!(
                    w[0].0.end() <= w[1].0.offset,
                    "overlap on {}: {:?} ({}) and {:?} ({})",
                    seg,
                    w[0].0,
                    w[0].1,
                    w[1].0,
                    w[1].1
                );
            }
        }
        Ok(())
    }
}

fn pick(m: &BTreeMap<Version, Vec<Replica>>, a: u64) -> Option<Version> {
    if m.is_empty() {
        return None;
    }
    m.keys().nth((a as usize) % m.len()).copied()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    /// Invariant 2 across random command sequences and leader changes.
    #[test]
    fn no_overlapping_extents(ops in prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..250)) {
        let mut sim = Sim::new();
        for n in NAMES.iter().take(3) {
            let cmd = Command::MountSegment { node_name: n.to_string(), node_id_hint: 0, capacity: CAP, data_addrs: vec![], now_ms: 0 };
            sim.core.apply(&cmd, sim.now);
        }
        for (op, a, b) in ops {
            sim.step(op, a, b);
            sim.check()?;
        }
    }

    /// Eviction never picks a leased, hard-pinned or reserved object.
    #[test]
    fn eviction_skips_protected(objs in prop::collection::vec((0u8..4, any::<bool>()), 1..80), extra in 1u64..200_000) {
        let mut core = Core::new(CacheConfig::default());
        let now = Now { mono_ms: 10_000, wall_ms: 10_000 };
        core.apply(&Command::MountSegment { node_name: "a".into(), node_id_hint: 0, capacity: 1 << 20, data_addrs: vec![], now_ms: 0 }, now);
        core.become_leader(1, now);
        let seg = core.sm().segments().next().unwrap().id;
        core.apply(&Command::MountSegment { node_name: "b".into(), node_id_hint: 0, capacity: 1 << 20, data_addrs: vec![], now_ms: 0 }, now);
        let hb = Heartbeat { segment: seg, ..Default::default() };
        { let (l, sm) = core.leader_parts().unwrap(); l.heartbeat(sm, &hb, now); }
        let mut protected = Vec::new();
        let mut reserved = Vec::new();
        for (i, (pin, leased)) in objs.iter().enumerate() {
            let key = format!("o{i}");
            let (l, sm) = core.leader_parts().unwrap();
            let pin_kind = match pin { 0 => PinKind::Hard, 1 => PinKind::Soft, _ => PinKind::None };
            let Ok(r) = l.reserve(sm, &PutRequest { key: key.clone(), size: 4096, pin: pin_kind, ..Default::default() }, now) else { continue };
            if i % 9 == 8 {
                // Left uncommitted: a reservation, not an object.
                reserved.push(key);
                continue;
            }
            let Ok(CommitStep::Propose(cmd)) = l.commit(r.version, 0, now) else { panic!("commit") };
            prop_assert_eq!(core.apply(&cmd, now), Outcome::Committed);
            let (l, sm) = core.leader_parts().unwrap();
            if *leased {
                // A node reads it (a get naming no node only looks, and leases nothing).
                l.get(sm, std::slice::from_ref(&key), seg.node, now);
                protected.push(key);
            } else if *pin == 0 {
                protected.push(key);
            }
        }
        let (l, sm) = core.leader_parts().unwrap();
        if let Some(Command::Evict { keys }) = l.eviction_due(sm, now, extra) {
            for k in &keys {
                prop_assert!(!protected.contains(k), "evicted protected {}", k);
                prop_assert!(!reserved.contains(k), "evicted reserved {}", k);
                prop_assert!(sm.contains(k));
            }
            // Unpinned objects go before soft-pinned ones.
            let soft = |k: &String| matches!(sm.object(k).map(|o| o.pin()), Some(Pin::Soft { .. }));
            if let Some(first_soft) = keys.iter().position(soft) {
                prop_assert!(keys[first_soft..].iter().all(soft));
            }
        }
    }
}

/// Mounts a segment of `CAP` bytes for node `name`.
fn mount_named(sm: &mut StateMachine, name: &str) -> Outcome {
    sm.apply(
        &Command::MountSegment {
            node_name: name.into(),
            node_id_hint: 0,
            capacity: CAP,
            data_addrs: vec![],
            now_ms: 0,
        },
        &mut Vec::new(),
    )
}

#[test]
fn unmounting_a_dead_node_drops_its_replicas_and_counts_orphans() {
    let mut sm = StateMachine::new();
    for n in ["a", "b"] {
        mount_named(&mut sm, n);
    }
    let segs: Vec<SegmentId> = sm.segments().map(|s| s.id).collect();
    let rep = |s: SegmentId, off: u64| Replica {
        segment: s,
        extents: vec![Extent::new(off, 64)],
    };
    let put = |key: &str, replicas: Vec<Replica>, id: u64| Command::CommitPut {
        key: key.into(),
        size: 10,
        replicas,
        checksum: 0,
        version: Version { term: 1, id },
        pin: Pin::None,
        expires_ms: 0,
    };
    assert_eq!(
        sm.apply(&put("one", vec![rep(segs[0], 0)], 1), &mut Vec::new()),
        Outcome::Committed
    );
    assert_eq!(
        sm.apply(
            &put("two", vec![rep(segs[0], 64), rep(segs[1], 0)], 2),
            &mut Vec::new()
        ),
        Outcome::Committed
    );
    assert!(
        matches!(
            sm.apply(&put("three", vec![rep(segs[1], 0)], 3), &mut Vec::new()),
            Outcome::Conflict(_)
        ),
        "overlap refused at apply"
    );
    let out = sm.apply(
        &Command::UnmountSegment {
            segment: segs[0],
            reason: UnmountReason::Dead,
        },
        &mut Vec::new(),
    );
    assert_eq!(out, Outcome::Unmounted { dropped: 1 });
    assert!(!sm.contains("one"));
    assert_eq!(sm.object("two").unwrap().replicas.count(), 1);
    assert_eq!(sm.counters().dead_node_dropped_objects, 1);
    // Remounting node a gets generation 2; commits naming generation 1 are refused.
    let out = mount_named(&mut sm, "a");
    assert!(matches!(out, Outcome::Mounted { generation: 2, .. }));
    assert!(matches!(
        sm.apply(&put("four", vec![rep(segs[0], 128)], 4), &mut Vec::new()),
        Outcome::Conflict(_)
    ));
}

/// A snapshot whose objects overlap on a segment is refused, naming them (the allocators are
/// rebuilt in one pass over each segment's sorted extents).
#[test]
fn snapshot_with_overlapping_objects_is_refused() {
    let mut sm = StateMachine::new();
    mount_named(&mut sm, "a");
    let seg = sm.segments().next().unwrap().id;
    let rep = |off: u64| Replica {
        segment: seg,
        extents: vec![Extent::new(off, 64)],
    };
    for (i, key) in ["one", "two"].iter().enumerate() {
        let put = Command::CommitPut {
            key: key.to_string(),
            size: 10,
            replicas: vec![rep(i as u64 * 64)],
            checksum: 0,
            version: Version {
                term: 1,
                id: i as u64 + 1,
            },
            pin: Pin::None,
            expires_ms: 0,
        };
        assert_eq!(sm.apply(&put, &mut Vec::new()), Outcome::Committed);
    }
    let restored = StateMachine::read_snapshot(&mut sm.snapshot_bytes().as_slice()).unwrap();
    assert_eq!(restored.snapshot_bytes(), sm.snapshot_bytes());
    // Forged: "two" moved half over "one".
    sm.object_mut("two").unwrap().replicas =
        regolith_metad::types::Replicas::from_replicas(&[rep(32)]).unwrap();
    let err = StateMachine::read_snapshot(&mut sm.snapshot_bytes().as_slice()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("overlap"), "{msg}");
    assert!(msg.contains("\"one\"") && msg.contains("\"two\""), "{msg}");
}

#[test]
fn snapshot_with_unknown_version_is_refused() {
    let sm = StateMachine::new();
    let mut bytes = sm.snapshot_bytes();
    bytes[4] = 99;
    let err = StateMachine::read_snapshot(&mut bytes.as_slice()).unwrap_err();
    assert!(err.to_string().contains("format 99"), "{err}");
    assert!(StateMachine::read_snapshot(&mut &b"garbage!"[..]).is_err());
}

#[test]
fn simulation_exercises_the_interesting_paths() {
    // Guards the property test above against silently testing nothing.
    let mut rng = 12345u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut sim = Sim::new();
    for n in NAMES.iter().take(3) {
        let cmd = Command::MountSegment {
            node_name: n.to_string(),
            node_id_hint: 0,
            capacity: CAP,
            data_addrs: vec![],
            now_ms: 0,
        };
        sim.core.apply(&cmd, sim.now);
    }
    let (mut max_objects, mut max_quarantined) = (0, 0);
    for _ in 0..3000 {
        sim.step((next() % 256) as u8, next(), next());
        sim.check().unwrap();
        max_objects = max_objects.max(sim.core.sm().key_count());
        if let Some(l) = sim.core.leader() {
            max_quarantined = max_quarantined.max(l.reservations().quarantined());
        }
    }
    let c = sim.core.sm().counters();
    assert!(max_objects >= 5, "objects: {max_objects}");
    assert!(max_quarantined >= 1, "quarantined: {max_quarantined}");
    assert!(
        sim.replaced >= 3,
        "upserts over existing objects: {}",
        sim.replaced
    );
    assert!(
        c.committed_objects >= 20 && c.evicted_objects + c.removed_objects >= 5,
        "{c:?}"
    );
}

#[test]
fn drained_generation_is_told_to_stay_unmounted_and_a_dead_one_to_remount() {
    let mut core = Core::new(CacheConfig::default());
    let now = Now {
        mono_ms: 1_000,
        wall_ms: 1_000,
    };
    core.become_leader(1, now);
    for n in ["a", "b"] {
        core.apply(
            &Command::MountSegment {
                node_name: n.into(),
                node_id_hint: 0,
                capacity: CAP,
                data_addrs: vec![],
                now_ms: 0,
            },
            now,
        );
    }
    let segs: Vec<SegmentId> = core.sm().segments().map(|s| s.id).collect();
    core.apply(
        &Command::UnmountSegment {
            segment: segs[0],
            reason: UnmountReason::Graceful,
        },
        now,
    );
    core.apply(
        &Command::UnmountSegment {
            segment: segs[1],
            reason: UnmountReason::Dead,
        },
        now,
    );
    let (l, sm) = core.leader_parts().unwrap();
    let r = l.heartbeat(
        sm,
        &Heartbeat {
            segment: segs[0],
            ..Default::default()
        },
        now,
    );
    assert!(r.unmounted && !r.remount, "{r:?}");
    let r = l.heartbeat(
        sm,
        &Heartbeat {
            segment: segs[1],
            ..Default::default()
        },
        now,
    );
    assert!(r.remount && !r.unmounted, "{r:?}");
    // A snapshot keeps the distinction.
    let restored = StateMachine::read_snapshot(&mut core.sm().snapshot_bytes().as_slice()).unwrap();
    assert!(restored.retired(&segs[0]) && !restored.retired(&segs[1]));
}
