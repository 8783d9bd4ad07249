//! Sans-I/O tests of the leader's logic, named after the hardening findings they cover
//! (issue 14).

use super::*;
use crate::command::Outcome;
use crate::core::Core;

const CAP: u64 = 1 << 20;

fn at(mono_ms: u64, wall_ms: u64) -> Now {
    Now { mono_ms, wall_ms }
}

fn mount(name: &str, now: Now) -> Command {
    Command::MountSegment {
        node_name: name.into(),
        node_id_hint: 0,
        capacity: CAP,
        data_addrs: vec![],
        now_ms: now.wall_ms,
    }
}

fn put(key: &str, ttl_ms: u64) -> PutRequest {
    PutRequest {
        key: key.into(),
        size: 4096,
        replicas: 1,
        ttl_ms,
        ..Default::default()
    }
}

/// Reserves and commits `req` on `core`'s leader, applying the `CommitPut`; returns it.
fn put_and_commit(core: &mut Core, req: &PutRequest, now: Now) -> Command {
    let (l, sm) = core.leader_parts().expect("leader");
    let r = l.reserve(sm, req, now).expect("reserve");
    let CommitStep::Propose(cmd) = l.commit(r.version, 7, now).expect("commit") else {
        panic!("first commit of {:?} proposes", req.key);
    };
    assert_eq!(core.apply(&cmd, now), Outcome::Committed);
    cmd
}

/// Heartbeats every mounted segment, then runs the leader's tick and applies what it proposes.
fn heartbeat_and_tick(core: &mut Core, now: Now) {
    let segs: Vec<SegmentId> = core.sm().segments().map(|s| s.id).collect();
    let (l, sm) = core.leader_parts().expect("leader");
    for s in segs {
        l.heartbeat(
            sm,
            &Heartbeat {
                segment: s,
                ..Default::default()
            },
            now,
        );
    }
    let cmds = l.tick(sm, now, true);
    for c in cmds {
        core.apply(&c, now);
    }
}

// ---------------------------------------------------------------- finding 9

#[test]
fn finding_9_ttl_u64_max_never_expires() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);

    let cmd = put_and_commit(&mut core, &put("forever", u64::MAX), t0);
    let Command::CommitPut { expires_ms, .. } = cmd else {
        panic!("commit of \"forever\" is a CommitPut, got {cmd:?}");
    };
    assert_eq!(expires_ms, u64::MAX, "a TTL too large to add saturates");
    // A control with an ordinary TTL, which does expire.
    put_and_commit(&mut core, &put("short", 1_000), t0);

    // Long after (a day, then ten years): the huge TTL is still there, the short one is gone.
    for later_s in [86_400u64, 10 * 365 * 86_400] {
        let later = at(t0.mono_ms + later_s * 1000, t0.wall_ms + later_s * 1000);
        heartbeat_and_tick(&mut core, later);
        assert!(
            core.sm().contains("forever"),
            "gone {later_s} s after commit"
        );
        assert!(!core.sm().contains("short"), "the 1 s TTL expired");
    }
    // Even an expiry pass at the end of time keeps it.
    core.apply(
        &Command::ExpirePins {
            now_ms: u64::MAX - 1,
        },
        t0,
    );
    assert!(core.sm().contains("forever"));
}

#[test]
fn finding_9_huge_soft_pin_ttl_and_clock_near_max_saturate() {
    // Times near the end of the clock range: nothing a request adds may wrap (debug builds
    // panic on overflow, release builds would compute a time in the past).
    let t0 = at(u64::MAX - 10, u64::MAX - 10);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    let req = PutRequest {
        pin: PinKind::Soft,
        soft_pin_ttl_ms: u64::MAX,
        ..put("pinned", 5_000)
    };
    let cmd = put_and_commit(&mut core, &req, t0);
    let Command::CommitPut {
        expires_ms, pin, ..
    } = cmd
    else {
        panic!("commit of \"pinned\" is a CommitPut, got {cmd:?}");
    };
    assert_eq!(expires_ms, u64::MAX);
    assert_eq!(pin, Pin::Soft { until_ms: u64::MAX });
    // Gets grant leases, ticks expire reservations and leases: none of it wraps.
    let (l, sm) = core.leader_parts().expect("leader");
    assert!(l.get(sm, &["pinned".into()], 1, t0)[0].is_some());
    heartbeat_and_tick(&mut core, t0);
    assert!(core.sm().contains("pinned"));
}

#[test]
fn finding_9_drain_with_huge_timeout_waits_for_the_segment_to_empty() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    put_and_commit(&mut core, &put("k", 0), t0);
    let seg = core.sm().segments().map(|s| s.id).next().expect("segment");
    let deadline_ms = crate::ops::segments::drain_deadline_ms(t0.wall_ms, u64::MAX);
    assert_eq!(deadline_ms, u64::MAX);
    core.apply(
        &Command::DrainSegment {
            segment: seg,
            deadline_ms,
        },
        t0,
    );
    let later = at(t0.mono_ms + 3_600_000, t0.wall_ms + 3_600_000);
    heartbeat_and_tick(&mut core, later);
    assert!(
        core.sm().segment(&seg).is_some(),
        "a drain with a huge timeout unmounted a segment that still holds an object"
    );
    assert!(core.sm().contains("k"));
}

// ---------------------------------------------------------------- finding 11

fn heartbeat(core: &mut Core, seg: SegmentId, now: Now) {
    let (l, sm) = core.leader_parts().expect("leader");
    l.heartbeat(
        sm,
        &Heartbeat {
            segment: seg,
            ..Default::default()
        },
        now,
    );
}

#[test]
fn finding_11_fresh_leader_before_heartbeats_answers_retryable_not_no_space() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    // Mounted under an earlier leader; this node now leads a new term: no heartbeat yet.
    core.apply(&mount("a", t0), t0);
    core.apply(&mount("b", t0), t0);
    core.become_leader(2, t0);
    let segs: Vec<SegmentId> = core.sm().segments().map(|s| s.id).collect();

    let (l, sm) = core.leader_parts().expect("leader");
    let err = l.reserve(sm, &put("k", 0), t0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SegmentsNotReady {
                waiting: 2,
                term: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        crate::grpc::convert::code_of(&err),
        regolith_proto::metad::Code::NotReady,
        "a retryable code, not NO_SPACE / NOT_ENOUGH_NODES"
    );
    assert!(err.to_string().contains("\"k\""), "{err}");

    // One segment heartbeats: the put is placed there.
    heartbeat(&mut core, segs[0], t0);
    let (l, sm) = core.leader_parts().expect("leader");
    let r = l
        .reserve(sm, &put("k", 0), t0)
        .expect("placed once a heartbeat arrived");
    assert_eq!(r.replicas.len(), 1);
    assert_eq!(r.replicas[0].segment, segs[0]);

    // The ready segment is full, the other still has not heartbeated: retryable again, not a
    // definite NO_SPACE.
    let big = PutRequest {
        size: CAP,
        ..put("big", 0)
    };
    let err = l.reserve(sm, &big, t0).unwrap_err();
    assert!(
        matches!(err, Error::SegmentsNotReady { waiting: 1, .. }),
        "{err:?}"
    );
    heartbeat(&mut core, segs[1], t0);
    let (l, sm) = core.leader_parts().expect("leader");
    let r = l
        .reserve(sm, &big, t0)
        .expect("placed on the second segment");
    assert_eq!(r.replicas[0].segment, segs[1]);

    // Every segment ready and full: the definite NO_SPACE as before.
    let err = l.reserve(sm, &big_again(), t0).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err:?}");
}

fn big_again() -> PutRequest {
    PutRequest {
        size: CAP,
        ..put("big2", 0)
    }
}

#[test]
fn finding_11_no_segments_at_all_is_still_not_enough_nodes() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    let seg = core.sm().segments().map(|s| s.id).next().expect("segment");
    core.apply(
        &Command::DrainSegment {
            segment: seg,
            deadline_ms: u64::MAX,
        },
        t0,
    );
    // The only segment drains (a definite refusal), whether or not it has heartbeated.
    let (l, sm) = core.leader_parts().expect("leader");
    let err = l.reserve(sm, &put("k", 0), t0).unwrap_err();
    assert!(matches!(err, Error::NoSegments { .. }), "{err:?}");
}

// ---------------------------------------------------------------- upserts (issue 13)

fn upsert(key: &str) -> PutRequest {
    PutRequest {
        upsert: true,
        ..put(key, 0)
    }
}

/// The extents of `key`'s only replica.
fn extents_of(core: &Core, key: &str) -> (SegmentId, Vec<Extent>) {
    let obj = core.sm().object(key).expect("object");
    let r = obj.replicas.to_vec().remove(0);
    (r.segment, r.extents)
}

#[test]
fn an_upsert_replaces_the_object_and_old_extents_wait_for_their_leases() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    put_and_commit(&mut core, &put("k", 0), t0);
    let old_version = core.sm().object("k").expect("put").version;
    let (seg, old_extents) = extents_of(&core, "k");

    let (l, sm) = core.leader_parts().expect("leader");
    assert!(
        matches!(
            l.reserve(sm, &put("k", 0), t0),
            Err(Error::AlreadyExists { .. })
        ),
        "a plain put of an existing key is still refused"
    );
    // A reader holds a lease on the old version while the upsert lands.
    let reader = sm.segments().next().map_or(0, |s| s.id.node);
    assert!(l.get(sm, &["k".to_string()], reader, t0)[0].is_some());

    let cmd = put_and_commit(&mut core, &upsert("k"), t0);
    assert!(matches!(cmd, Command::UpsertPut { .. }), "got {cmd:?}");
    let new = core.sm().object("k").expect("the key is still there");
    assert!(
        new.version > old_version,
        "the new version replaced the old"
    );
    let (_, new_extents) = extents_of(&core, "k");
    assert!(new_extents
        .iter()
        .all(|n| old_extents.iter().all(|o| !o.overlaps(n))));
    assert_eq!(core.sm().key_count(), 1);

    let shadow_free = |core: &Core| {
        let l = core.leader().expect("leader");
        let s = l.shadow.get(&seg).expect("segment");
        old_extents.iter().all(|e| s.alloc.is_free(e))
    };
    assert!(!shadow_free(&core), "leased extents are not reused");
    let later = at(t0.mono_ms + 3_600_000, t0.wall_ms + 3_600_000);
    heartbeat_and_tick(&mut core, later);
    assert!(shadow_free(&core), "freed once the lease is over");
}

#[test]
fn an_upsert_of_a_key_being_written_is_busy_and_a_refused_one_keeps_the_old_object() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    put_and_commit(&mut core, &put("k", 0), t0);
    let before = core.sm().object("k").expect("put").clone();
    let (seg, old_extents) = extents_of(&core, "k");

    let (l, sm) = core.leader_parts().expect("leader");
    let first = l.reserve(sm, &upsert("k"), t0).expect("upsert reserves");
    assert!(
        matches!(l.reserve(sm, &upsert("k"), t0), Err(Error::KeyBusy { .. })),
        "a second writer of the key waits"
    );
    assert!(matches!(
        l.reserve(sm, &upsert("fresh"), t0),
        Ok(Reserved { .. })
    ));
    l.abort(&[first.version]);

    // An upsert whose extents are taken (here: the old object's own) is refused at apply,
    // and the old object stays as it was.
    let mut fx = Vec::new();
    let mut sm = core.sm().clone();
    let out = sm.apply(
        &Command::UpsertPut {
            key: "k".into(),
            size: 4096,
            replicas: vec![Replica {
                segment: seg,
                extents: old_extents,
            }],
            checksum: 1,
            version: Version { term: 1, id: 999 },
            pin: Pin::None,
            expires_ms: 0,
        },
        &mut fx,
    );
    assert!(matches!(out, Outcome::Conflict(_)), "got {out:?}");
    assert_eq!(sm.object("k"), Some(&before));
    assert!(
        !fx.iter()
            .any(|e| matches!(e, Effect::Freed { .. } | Effect::Removed { .. })),
        "nothing freed or removed: {fx:?}"
    );
}

#[test]
fn an_applied_upsert_tells_watchers_of_the_new_object_only() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    put_and_commit(&mut core, &put("k", 0), t0);
    let (l, sm) = core.leader_parts().expect("leader");
    let r = l.reserve(sm, &upsert("k"), t0).expect("reserve");
    let CommitStep::Propose(cmd) = l.commit(r.version, 7, t0).expect("commit") else {
        panic!("an upsert's commit proposes");
    };
    let mut sm = core.sm().clone();
    let mut fx = Vec::new();
    assert_eq!(sm.apply(&cmd, &mut fx), Outcome::Committed);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Removed { .. })),
        "the key never disappears: {fx:?}"
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::Freed { .. })));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Committed { version, .. } if *version == r.version)));
}

// ---------------------------------------------------------------- issue 17, item 4

fn extents_overlap(a: &Extent, b: &Extent) -> bool {
    a.offset < b.offset + b.len && b.offset < a.offset + a.len
}

/// `RemoveAll` costs what the leases and reservations cost, not the objects: it must still
/// keep a leased object's extents from reuse until the lease ends (invariant 5) and keep a
/// reservation in flight, and free everything else at once.
#[test]
fn remove_all_holds_leased_and_reserved_extents_and_frees_the_rest() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    for k in ["leased", "b", "c", "d"] {
        put_and_commit(&mut core, &put(k, 60_000), t0);
    }
    let seg = core.sm().segments().map(|s| s.id).next().expect("segment");
    let (l, sm) = core.leader_parts().expect("leader");
    let leased = l.get(sm, &["leased".into()], 1, t0)[0]
        .clone()
        .expect("leased is there");
    let pending = l.reserve(sm, &put("pending", 0), t0).expect("reserve");

    assert_eq!(core.apply(&Command::RemoveAll, t0), Outcome::RemovedAll(4));
    let sm = core.sm();
    assert_eq!(sm.key_count(), 0);
    assert_eq!(sm.next_expiry(), None, "the TTL index is empty too");
    let s = sm.segment(&seg).expect("still mounted");
    assert_eq!((s.used, s.objects), (0, 0));
    assert_eq!(sm.free_space(&seg).expect("allocator").free_bytes(), CAP);

    // Fill the leader's free space: nothing placed may touch the leased or reserved extents.
    let keep: Vec<Extent> = leased.replicas[0]
        .extents
        .iter()
        .chain(pending.replicas[0].extents.iter())
        .copied()
        .collect();
    let held: u64 = keep.iter().map(|e| e.len).sum();
    let (l, sm) = core.leader_parts().expect("leader");
    let mut placed = 0u64;
    while let Ok(r) = l.reserve(sm, &put(&format!("fill{placed}"), 0), t0) {
        for e in &r.replicas[0].extents {
            assert!(
                !keep.iter().any(|k| extents_overlap(k, e)),
                "{e:?} was handed out while held ({keep:?})"
            );
            placed += e.len;
        }
        l.abort(&[r.version]);
        // Aborted reservations are freed at once; keep them held instead, to fill the space.
        l.shadow.take_overlapping(&seg, &r.replicas[0].extents[0]);
    }
    assert_eq!(
        placed,
        CAP - held,
        "everything but the held extents is free"
    );

    // Once the lease has ended, the leased extents are free again.
    let later = at(
        t0.mono_ms + CacheConfig::default().lease_ttl_ms + 1,
        t0.wall_ms,
    );
    let (l, sm) = core.leader_parts().expect("leader");
    l.tick(sm, later, true);
    let free_after: u64 = l.shadow.usage().1;
    assert_eq!(
        free_after,
        leased.replicas[0]
            .extents
            .iter()
            .map(|e| e.len)
            .sum::<u64>()
    );
}

/// The one-step `RemoveAll` leaves the state a removal of each key would have left.
#[test]
fn remove_all_equals_removing_every_key() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    core.apply(&mount("b", t0), t0);
    let mut keys = Vec::new();
    for i in 0..40 {
        let k = format!("k{i}");
        let req = PutRequest {
            replicas: 1 + (i % 2),
            pin: if i % 5 == 0 {
                PinKind::Hard
            } else {
                PinKind::None
            },
            ..put(&k, if i % 3 == 0 { 60_000 } else { 0 })
        };
        put_and_commit(&mut core, &req, t0);
        keys.push(k);
    }
    let mut one_by_one = core.sm().clone();
    let mut fx = Vec::new();
    one_by_one.apply(&Command::Remove { keys }, &mut fx);
    let mut at_once = core.sm().clone();
    fx.clear();
    assert_eq!(
        at_once.apply(&Command::RemoveAll, &mut fx),
        Outcome::RemovedAll(40)
    );
    assert_eq!(fx, vec![Effect::RemovedAll]);
    assert_eq!(at_once.removed_object("k3").map(|o| o.size), Some(4096));
    assert!(at_once.take_removed_table().is_some());
    assert_eq!(at_once.snapshot_bytes(), one_by_one.snapshot_bytes());
    for s in one_by_one.segments() {
        let t = at_once.segment(&s.id).expect("segment");
        assert_eq!((t.used, t.objects), (s.used, s.objects));
        assert_eq!(
            at_once.free_space(&s.id).map(|a| a.free_bytes()),
            one_by_one.free_space(&s.id).map(|a| a.free_bytes())
        );
    }
    assert_eq!(at_once.next_expiry(), one_by_one.next_expiry());
}

// ---------------------------------------------------------------- disk tier (issue 12)

fn heartbeat_with_disk(core: &mut Core, now: Now) -> Vec<offload::Order> {
    let segs: Vec<SegmentId> = core.sm().segments().map(|s| s.id).collect();
    let (l, sm) = core.leader_parts().expect("leader");
    let mut orders = Vec::new();
    for s in segs {
        let r = l.heartbeat(
            sm,
            &Heartbeat {
                segment: s,
                disk: offload::DiskTier {
                    disks: 1,
                    capacity: 64 << 20,
                    used: 0,
                    max_object: 0,
                },
                ..Default::default()
            },
            now,
        );
        orders.extend(r.offload);
    }
    orders
}

#[test]
fn above_the_offload_watermark_nodes_with_disks_move_objects_out_of_memory() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    assert!(heartbeat_with_disk(&mut core, t0).is_empty());
    // 220 of 256 pages: 86 % used, above the 80 % offload watermark, below eviction's 90 %.
    for i in 0..220 {
        put_and_commit(&mut core, &put(&format!("k{i}"), 0), t0);
    }
    let used_before = core.sm().bytes_used();
    let t1 = at(2_000, t0.wall_ms + 1_000);
    {
        let (l, sm) = core.leader_parts().unwrap();
        let cmds = l.tick(sm, t1, true);
        assert!(
            !cmds.iter().any(|c| matches!(c, Command::Evict { .. })),
            "nothing is dropped while offload can make room: {cmds:?}"
        );
    }
    let orders = heartbeat_with_disk(&mut core, t1);
    // Down to 75 %: 220 - 192 = 28 pages at least.
    assert!(orders.len() >= 28, "{} orders", orders.len());
    assert!(orders
        .iter()
        .all(|o| o.size == 4096 && o.extents.len() == 1));
    // Ordered keys are not ordered again while their copy is under way.
    {
        let (l, sm) = core.leader_parts().unwrap();
        l.tick(sm, at(2_100, t1.wall_ms), true);
    }
    assert!(heartbeat_with_disk(&mut core, t1).is_empty());

    let node = core.sm().segments().next().unwrap().id.node;
    let items: Vec<crate::command::DiskMove> = orders
        .iter()
        .map(|o| crate::command::DiskMove {
            key: o.key.clone(),
            version: o.version,
            disk: 0,
        })
        .collect();
    let out = core.apply(&Command::MoveToDisk { node, items }, t1);
    assert_eq!(out, Outcome::MovedToDisk(vec![true; orders.len()]));
    let freed = orders.len() as u64 * 4096;
    assert_eq!(core.sm().bytes_used(), used_before - freed);
    let seg = core.sm().segments().next().unwrap().clone();
    assert_eq!(seg.used, used_before - freed);
    let k = &orders[0].key;
    let o = core.sm().object(k).unwrap();
    assert_eq!(o.footprint(), 0);
    assert!(o.replicas.has_disk());
    assert!(o.replicas.to_vec()[0].segment.is_disk());
    // A second move of the same version (a report sent again) changes nothing and holds.
    let again = Command::MoveToDisk {
        node,
        items: vec![crate::command::DiskMove {
            key: k.clone(),
            version: o.version,
            disk: 0,
        }],
    };
    let used = core.sm().bytes_used();
    assert_eq!(core.apply(&again, t1), Outcome::MovedToDisk(vec![true]));
    assert_eq!(core.sm().bytes_used(), used);

    // The node's disk drops one: the object had no other replica and is gone (an eviction).
    let evicted = core.sm().counters().evicted_objects;
    let v = core.sm().object(k).unwrap().version;
    let out = core.apply(
        &Command::DropFromDisk {
            node,
            items: vec![(k.clone(), v)],
        },
        t1,
    );
    assert_eq!(
        out,
        Outcome::DroppedFromDisk {
            dropped: 1,
            removed: 1
        }
    );
    assert!(core.sm().object(k).is_none());
    assert_eq!(core.sm().counters().evicted_objects, evicted + 1);

    // A restart of the node's sidecar (a new generation) keeps its disk replicas...
    let k2 = orders[1].key.clone();
    core.apply(&mount("a", t1), t1);
    assert!(core.sm().object(&k2).is_some_and(|o| o.replicas.has_disk()));
    // ...a node declared dead loses them, counted as the node's losses.
    let seg = core.sm().segments().next().unwrap().id;
    let dead = core.sm().counters().dead_node_dropped_objects;
    core.apply(
        &Command::UnmountSegment {
            segment: seg,
            reason: UnmountReason::Dead,
        },
        t1,
    );
    assert!(core.sm().object(&k2).is_none());
    assert!(core.sm().counters().dead_node_dropped_objects >= dead + orders.len() as u64 - 1);
}

/// A node reports its moves done before the leader commits them: until the commit frees the
/// memory, those bytes are still on their way out, and ordering more for them would offload
/// far below the target (the bench's disk rows lost their objects to the disks' eviction so).
#[test]
fn moves_reported_but_not_yet_committed_are_not_ordered_again() {
    offload_stops_at_the_target(false);
}

/// The memory of a moved object that a reader leases is held until the lease ends; it frees
/// itself, and ordering more for it would offload below the target (a reader polling the
/// objects being offloaded leases all of them).
#[test]
fn memory_held_for_leases_of_moved_objects_is_not_offloaded_twice() {
    offload_stops_at_the_target(true);
}

/// A leader with one segment "a" of 256 pages whose node has a disk, holding `objects`
/// committed 4 KiB objects `k0`, `k1`, ...
fn leader_with_disk_holding(cfg: CacheConfig, objects: usize, t0: Now) -> Core {
    let mut core = Core::new(cfg);
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    heartbeat_with_disk(&mut core, t0);
    for i in 0..objects {
        put_and_commit(&mut core, &put(&format!("k{i}"), 0), t0);
    }
    core
}

/// 220 of 256 pages used; offload to 75 %, with the ordered objects leased when `leased`.
fn offload_stops_at_the_target(leased: bool) {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = leader_with_disk_holding(CacheConfig::default(), 220, t0);
    let t1 = at(2_000, t0.wall_ms + 1_000);
    {
        let (l, sm) = core.leader_parts().unwrap();
        l.tick(sm, t1, true);
    }
    let orders = heartbeat_with_disk(&mut core, t1);
    assert!(!orders.is_empty());
    let ordered = orders.len() as u64;
    // The node reports every move done; `disk_report` notes it before it proposes them.
    let t2 = at(2_100, t1.wall_ms + 100);
    {
        let (l, sm) = core.leader_parts().unwrap();
        if leased {
            let keys: Vec<String> = orders.iter().map(|o| o.key.clone()).collect();
            let reader = sm.segments().next().map_or(0, |s| s.id.node);
            assert!(l.get(sm, &keys, reader, t2).iter().all(Option::is_some));
        }
        l.offloads.on_report(&[], t2.mono_ms);
        assert_eq!(l.offloads.in_flight_bytes(), ordered * 4096);
        l.plan_offloads(sm, t2);
        l.tick(sm, t2, true);
    }
    assert!(
        heartbeat_with_disk(&mut core, t2).is_empty(),
        "the reported moves still count as on their way out"
    );
    let node = core.sm().segments().next().unwrap().id.node;
    let items: Vec<crate::command::DiskMove> = orders
        .iter()
        .map(|o| crate::command::DiskMove {
            key: o.key.clone(),
            version: o.version,
            disk: 0,
        })
        .collect();
    core.apply(&Command::MoveToDisk { node, items }, t2);
    let t3 = at(2_200, t2.wall_ms + 100);
    {
        let (l, sm) = core.leader_parts().unwrap();
        assert_eq!(
            l.offloads.in_flight_bytes(),
            0,
            "applied moves end their orders"
        );
        let held = if leased { ordered * 4096 } else { 0 };
        assert_eq!(l.leases.waiting_bytes(), held);
        l.plan_offloads(sm, t3);
        l.tick(sm, t3, true);
    }
    assert!(
        heartbeat_with_disk(&mut core, t3).is_empty(),
        "at the offload target once the moves are committed"
    );
    let s = core.sm().segments().next().unwrap();
    assert!(
        s.used as f64 >= s.capacity as f64 * 0.74,
        "offloaded down to the target, not below it: {} of {}",
        s.used,
        s.capacity
    );
}

#[test]
fn without_disks_nothing_is_ordered_and_eviction_drops_as_before() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    heartbeat_and_tick(&mut core, t0);
    for i in 0..240 {
        put_and_commit(&mut core, &put(&format!("k{i}"), 0), t0);
    }
    let (l, sm) = core.leader_parts().unwrap();
    let cmds = l.tick(sm, at(2_000, t0.wall_ms + 1_000), true);
    assert!(cmds.iter().any(|c| matches!(c, Command::Evict { .. })));
    assert!(l.offloads.is_idle());
}

/// A leader of term 1 over node "a" with a disk tier, holding `key` (4 KiB) on disk only.
fn disk_only(cfg: CacheConfig, key: &str, now: Now) -> Core {
    let mut core = Core::new(cfg);
    core.become_leader(1, now);
    core.apply(&mount("a", now), now);
    heartbeat_with_disk(&mut core, now);
    put_and_commit(&mut core, &put(key, 0), now);
    let node = core.sm().segments().next().unwrap().id.node;
    let version = core.sm().object(key).unwrap().version;
    let moved = core.apply(
        &Command::MoveToDisk {
            node,
            items: vec![crate::command::DiskMove {
                key: key.into(),
                version,
                disk: 0,
            }],
        },
        now,
    );
    assert_eq!(moved, Outcome::MovedToDisk(vec![true]));
    assert_eq!(core.sm().object(key).unwrap().footprint(), 0);
    core
}

/// The promotions the node's next heartbeat reply carries.
fn promotions(core: &mut Core, now: Now) -> Vec<offload::Promotion> {
    let seg = core.sm().segments().next().unwrap().id;
    let (l, sm) = core.leader_parts().unwrap();
    l.heartbeat(
        sm,
        &Heartbeat {
            segment: seg,
            disk: offload::DiskTier {
                disks: 1,
                capacity: 64 << 20,
                used: 4096,
                max_object: 0,
            },
            ..Default::default()
        },
        now,
    )
    .promote
}

fn get(core: &mut Core, key: &str, now: Now) -> Option<Placement> {
    let (l, sm) = core.leader_parts().unwrap();
    let reader = sm.segments().next().map_or(0, |s| s.id.node);
    l.get(sm, &[key.to_string()], reader, now).pop().flatten()
}

#[test]
fn a_get_of_a_disk_only_object_promotes_it_into_its_nodes_memory_keeping_the_disk_copy() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = disk_only(CacheConfig::default(), "k", t0);
    let used = core.sm().bytes_used();
    let p = get(&mut core, "k", t0).expect("found");
    assert!(p.replicas.iter().all(|r| r.segment.is_disk()));
    // A second get while the promotion is under way orders no second one.
    get(&mut core, "k", t0).expect("found");
    let orders = promotions(&mut core, t0);
    assert_eq!(orders.len(), 1, "{orders:?}");
    let o = &orders[0];
    assert_eq!((o.key.as_str(), o.version, o.disk), ("k", p.version, 0));
    assert_eq!(o.extents.iter().map(|e| e.len).sum::<u64>(), 4096);
    // The extents are held: no put is placed on them.
    let (l, sm) = core.leader_parts().unwrap();
    let other = l.reserve(sm, &put("other", 0), t0).unwrap();
    assert!(other.replicas[0]
        .extents
        .iter()
        .all(|e| o.extents.iter().all(|x| !x.overlaps(e))));
    // The node reports it done: the commit adds the memory replica, the disk copy stays.
    let CommitStep::Propose(cmd) = l.commit(o.reservation, 0, t0).unwrap() else {
        panic!("a promotion commits through a proposal");
    };
    assert!(matches!(cmd, Command::PromoteToMemory { .. }), "{cmd:?}");
    assert_eq!(core.apply(&cmd, t0), Outcome::Committed);
    let obj = core.sm().object("k").unwrap();
    assert_eq!(obj.footprint(), 4096);
    assert_eq!(obj.replicas.disk_on(1), Some(0));
    assert_eq!(core.sm().bytes_used(), used + 4096);
    let (l, _) = core.leader_parts().unwrap();
    assert!(l.reservations().get(&o.reservation).is_none(), "ended");
    // Now in memory: a get promotes nothing more, and offers both replicas.
    let p = get(&mut core, "k", t0).unwrap();
    assert_eq!(p.replicas.len(), 2);
    assert!(promotions(&mut core, t0).is_empty());
}

#[test]
fn objects_with_a_disk_copy_are_offloaded_by_freeing_memory_without_a_copy_order() {
    let t0 = at(1_000, 1_700_000_000_000);
    let cfg = CacheConfig {
        write_through: true,
        ..CacheConfig::default()
    };
    let mut core = Core::new(cfg);
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    heartbeat_with_disk(&mut core, t0);
    let node = core.sm().segments().next().unwrap().id.node;
    // Write-through: every put is ordered copied to disk, keeping its memory.
    for i in 0..220 {
        put_and_commit(&mut core, &put(&format!("k{i}"), 0), t0);
    }
    let copies = heartbeat_with_disk(&mut core, t0);
    assert_eq!(copies.len(), 220);
    assert!(copies.iter().all(|o| o.copy && o.size == 4096));
    let items: Vec<crate::command::DiskMove> = copies
        .iter()
        .map(|o| crate::command::DiskMove {
            key: o.key.clone(),
            version: o.version,
            disk: 0,
        })
        .collect();
    let used = core.sm().bytes_used();
    let out = core.apply(
        &Command::CopyToDisk {
            node,
            items: items.clone(),
        },
        t0,
    );
    assert_eq!(out, Outcome::CopiedToDisk(vec![true; 220]));
    assert_eq!(core.sm().bytes_used(), used, "a copy frees no memory");
    let o = core.sm().object("k0").unwrap();
    assert!(o.footprint() == 4096 && o.replicas.disk_on(node) == Some(0));
    // Sent again (a lost answer): holds, changes nothing.
    let again = Command::CopyToDisk {
        node,
        items: items[..1].to_vec(),
    };
    assert_eq!(core.apply(&again, t0), Outcome::CopiedToDisk(vec![true]));
    // Above the offload watermark (86 %): the leader frees memory itself, no copy ordered.
    let t1 = at(2_000, t0.wall_ms + 1_000);
    let (l, sm) = core.leader_parts().unwrap();
    let cmds = l.tick(sm, t1, true);
    let moves: Vec<&Command> = cmds
        .iter()
        .filter(|c| matches!(c, Command::MoveToDisk { .. }))
        .collect();
    assert_eq!(moves.len(), 1, "{cmds:?}");
    for c in cmds {
        core.apply(&c, t1);
    }
    assert!(
        heartbeat_with_disk(&mut core, t1).is_empty(),
        "nothing to copy"
    );
    let (total, _) = {
        let (l, _) = core.leader_parts().unwrap();
        l.shadow().usage()
    };
    assert!(
        core.sm().bytes_used() <= (total as f64 * 0.75) as u64,
        "down to the offload target: {} of {total}",
        core.sm().bytes_used()
    );
}

#[test]
fn a_placement_asked_for_by_no_node_promotes_nothing() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = disk_only(CacheConfig::default(), "k", t0);
    let (l, sm) = core.leader_parts().unwrap();
    assert!(l.get(sm, &["k".to_string()], 0, t0)[0].is_some());
    assert!(promotions(&mut core, t0).is_empty());
    get(&mut core, "k", t0).expect("found");
    assert_eq!(promotions(&mut core, t0).len(), 1);
}

#[test]
fn a_placement_asked_for_by_no_node_neither_leases_nor_refreshes_recency() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    put_and_commit(&mut core, &put("old", 0), t0);
    let t1 = at(5_000, t0.wall_ms + 4_000);
    put_and_commit(&mut core, &put("new", 0), t1);
    let t2 = at(9_000, t0.wall_ms + 8_000);
    let (l, sm) = core.leader_parts().unwrap();
    let looked = l.get(sm, &["old".to_string()], 0, t2)[0]
        .clone()
        .expect("found");
    assert_eq!(looked.lease_ms, 0, "a look grants no lease");
    assert_eq!(l.leases().len(), 0);
    let access = |sm: &StateMachine, k: &str| sm.object(k).map(|o| o.access_s);
    assert_eq!(
        access(sm, "old"),
        Some(1),
        "a look keeps the object's recency"
    );
    assert!(access(sm, "old") < access(sm, "new"));
    let read = get(&mut core, "old", t2).expect("found");
    assert!(read.lease_ms > 0, "a node's read is leased");
    assert_eq!(access(core.sm(), "old"), Some(9), "and refreshes recency");
}

#[test]
fn no_promotion_when_it_is_off_or_the_pool_has_no_room() {
    let t0 = at(1_000, 1_700_000_000_000);
    let off = CacheConfig {
        promote_on_hit: false,
        ..CacheConfig::default()
    };
    let mut core = disk_only(off, "k", t0);
    get(&mut core, "k", t0).expect("found");
    assert!(promotions(&mut core, t0).is_empty());

    // On, but the pool is at the offload target (75 %): a promotion would start an offload.
    let mut core = disk_only(CacheConfig::default(), "k", t0);
    for i in 0..192 {
        put_and_commit(&mut core, &put(&format!("f{i}"), 0), t0);
    }
    get(&mut core, "k", t0).expect("found");
    assert!(promotions(&mut core, t0).is_empty());
    // Room again: promoted.
    let cmd = Command::Remove {
        keys: (0..8).map(|i| format!("f{i}")).collect(),
    };
    core.apply(&cmd, t0);
    let t1 = at(10_000, t0.wall_ms + 9_000);
    heartbeat_with_disk(&mut core, t1);
    get(&mut core, "k", t1).expect("found");
    assert_eq!(promotions(&mut core, t1).len(), 1);
}

#[test]
fn a_promotion_overtaken_by_a_remove_is_refused_and_its_memory_freed() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = disk_only(CacheConfig::default(), "k", t0);
    let free_before = core.leader_parts().unwrap().0.shadow().usage().1;
    get(&mut core, "k", t0).expect("found");
    let o = promotions(&mut core, t0).pop().expect("ordered");
    assert_eq!(
        core.leader_parts().unwrap().0.shadow().usage().1,
        free_before - 4096
    );
    core.apply(
        &Command::Remove {
            keys: vec!["k".into()],
        },
        t0,
    );
    let (l, _) = core.leader_parts().unwrap();
    let CommitStep::Propose(cmd) = l.commit(o.reservation, 0, t0).unwrap() else {
        panic!("proposes");
    };
    assert!(matches!(core.apply(&cmd, t0), Outcome::Conflict(_)));
    let (l, _) = core.leader_parts().unwrap();
    assert_eq!(
        l.shadow().usage().1,
        free_before,
        "the reservation's memory is free again"
    );
    assert!(core.sm().object("k").is_none());
}

#[test]
fn a_promotion_the_node_could_not_carry_out_is_quarantined_then_released() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = disk_only(CacheConfig::default(), "k", t0);
    let free_before = core.leader_parts().unwrap().0.shadow().usage().1;
    get(&mut core, "k", t0).expect("found");
    let o = promotions(&mut core, t0).pop().expect("ordered");
    let seg = core.sm().segments().next().unwrap().id;
    let (l, sm) = core.leader_parts().unwrap();
    l.abort(&[o.reservation]);
    let r = l.heartbeat(
        sm,
        &Heartbeat {
            segment: seg,
            ..Default::default()
        },
        t0,
    );
    assert_eq!(r.quarantined, vec![o.reservation]);
    l.heartbeat(
        sm,
        &Heartbeat {
            segment: seg,
            released: vec![o.reservation],
            ..Default::default()
        },
        t0,
    );
    assert_eq!(l.shadow().usage().1, free_before);
    // The object is still disk-only: the next hit orders a promotion again.
    let t1 = at(2_000, t0.wall_ms + 1_000);
    heartbeat_with_disk(&mut core, t1);
    get(&mut core, "k", t1).expect("found");
    assert_eq!(promotions(&mut core, t1).len(), 1);
}

#[test]
fn objects_a_disk_cannot_hold_are_not_ordered_and_failed_orders_wait_before_another() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = Core::new(CacheConfig::default());
    core.become_leader(1, t0);
    core.apply(&mount("a", t0), t0);
    let seg = core.sm().segments().next().unwrap().id;
    let tier = |max_object| offload::DiskTier {
        disks: 1,
        capacity: 64 << 20,
        used: 0,
        max_object,
    };
    let beat = |core: &mut Core, max_object, now| {
        let (l, sm) = core.leader_parts().unwrap();
        l.heartbeat(
            sm,
            &Heartbeat {
                segment: seg,
                disk: tier(max_object),
                ..Default::default()
            },
            now,
        )
        .offload
    };
    beat(&mut core, 2048, t0);
    for i in 0..220 {
        put_and_commit(&mut core, &put(&format!("k{i}"), 0), t0);
    }
    // Every object (4 KiB) is larger than the disks hold: none is ordered, tick after tick.
    for t in 0..3 {
        let now = at(2_000 + t * 100, t0.wall_ms);
        let (l, sm) = core.leader_parts().unwrap();
        l.tick(sm, now, true);
        assert!(beat(&mut core, 2048, now).is_empty());
    }
    // Room on disk: ordered. The node fails them all: not ordered again for a while.
    let t1 = at(3_000, t0.wall_ms + 2_000);
    beat(&mut core, 0, t1);
    let (l, sm) = core.leader_parts().unwrap();
    l.tick(sm, t1, true);
    let orders = beat(&mut core, 0, t1);
    assert!(orders.len() >= 28, "{} orders", orders.len());
    let (l, sm) = core.leader_parts().unwrap();
    for o in &orders {
        l.offloads.failed(&o.key, t1.mono_ms);
    }
    let t2 = at(3_100, t1.wall_ms + 100);
    l.tick(sm, t2, true);
    let again = beat(&mut core, 0, t2);
    assert!(
        again.iter().all(|o| orders.iter().all(|p| p.key != o.key)),
        "a failed order was given again at once"
    );
    // Past the backoff, and past the orders of t2 (never reported): ordered again.
    let t3 = at(t2.mono_ms + offload::ORDER_TTL_MS + 1, t1.wall_ms + 31_000);
    beat(&mut core, 0, t3);
    let (l, sm) = core.leader_parts().unwrap();
    l.tick(sm, t3, true);
    let later = beat(&mut core, 0, t3);
    assert!(later.iter().any(|o| orders.iter().any(|p| p.key == o.key)));
}

#[test]
fn a_put_that_finds_no_space_evicts_objects_being_offloaded_rather_than_fail() {
    let t0 = at(1_000, 1_700_000_000_000);
    // Offload everything (target 0): every object is ordered to disk and none reported yet.
    let cfg = CacheConfig {
        offload_watermark: 0.05,
        eviction_ratio: 0.05,
        ..CacheConfig::default()
    };
    let mut core = leader_with_disk_holding(cfg, 256, t0);
    let t1 = at(2_000, t0.wall_ms + 1_000);
    {
        let (l, sm) = core.leader_parts().unwrap();
        l.tick(sm, t1, true);
    }
    let orders = heartbeat_with_disk(&mut core, t1);
    assert_eq!(orders.len(), 256, "every object ordered");
    let (l, sm) = core.leader_parts().unwrap();
    assert!(matches!(
        l.reserve(sm, &put("new", 0), t1),
        Err(Error::NoSpace { .. })
    ));
    let Some(Command::Evict { keys }) = l.eviction_due(sm, t1, 4096) else {
        panic!("the put's space must come from somewhere");
    };
    assert!(!keys.is_empty());
    // Without a put waiting, objects on their way to disk are left to the offload.
    l.evicting.clear();
    assert!(l
        .eviction_due(sm, at(5_000, t1.wall_ms + 3_000), 0)
        .is_none());
}

#[test]
fn puts_that_find_no_space_while_an_eviction_is_in_flight_each_get_victims_of_their_own() {
    let t0 = at(1_000, 1_700_000_000_000);
    let mut core = leader_with_disk_holding(CacheConfig::default(), 256, t0);
    let t1 = at(2_000, t0.wall_ms + 1_000);
    let (l, sm) = core.leader_parts().unwrap();
    // The watermark's eviction (the pool is full) goes out first.
    let Some(Command::Evict { keys: first }) = l.eviction_due(sm, t1, 0) else {
        panic!("a full pool is evicted");
    };
    assert!(l.eviction_in_flight());
    // The watermark plans nothing more while it is in flight...
    assert!(l.eviction_due(sm, t1, 0).is_none());
    // ...but each put that found no space meanwhile gets its own, disjoint, victims.
    let mut taken: BTreeSet<String> = first.iter().cloned().collect();
    for _ in 0..3 {
        let Some(Command::Evict { keys }) = l.eviction_due(sm, t1, 4096) else {
            panic!("a put waiting for space gets victims of its own");
        };
        assert_eq!(keys.len(), 1, "its own size, not the watermark's: {keys:?}");
        for k in keys {
            assert!(taken.insert(k.clone()), "{k} evicted twice");
        }
    }
    // Once they are applied, nothing is in flight.
    let all: Vec<String> = taken.into_iter().collect();
    core.apply(&Command::Evict { keys: all }, t1);
    let (l, _) = core.leader_parts().unwrap();
    assert!(!l.eviction_in_flight());
}
