//! Leader-only logic (design §4–6), all in the leader's memory and all sans-I/O: every method
//! takes the time it needs as an argument.
//!
//! * [`shadow`] — free space minus reservations and lease holds.
//! * [`reservations`] — `(term, id)` reservations, expiry, quarantine, adoption.
//! * [`leases`] — read leases and the extents waiting for them.
//! * [`placement`] — which segments a put goes to.
//! * [`eviction`] — approximate-LRU victim choice.
//! * [`liveness`] — heartbeat timers and dead-node declarations.
//!
//! Why this file is a little over 600 lines: `Leader` is the one place that combines the parts
//! below under one `now` (reserve, commit, get, heartbeat, tick); each part lives in its own
//! file.

pub mod eviction;
pub mod leases;
pub mod liveness;
pub mod offload;
pub mod placement;
pub mod reservations;
pub mod shadow;

use std::collections::{BTreeSet, HashSet};

use crate::command::Command;
use crate::config::{CacheConfig, Now};
use crate::error::{Error, Result};
use crate::state::{Effect, StateMachine};
use crate::types::{
    Extent, NodeId, Object, Pin, Replica, SegmentId, SegmentState, UnmountReason, Version,
};

use leases::Leases;
use liveness::Liveness;
use reservations::{ResState, Reservation, Reservations};
use shadow::Shadow;

/// Pin asked for by a put.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum PinKind {
    #[default]
    None,
    Soft,
    Hard,
}

#[derive(Clone, Debug, Default)]
pub struct PutRequest {
    pub key: String,
    pub size: u64,
    pub replicas: u32,
    pub preferred: Vec<String>,
    pub prefer_local: bool,
    pub pin: PinKind,
    pub soft_pin_ttl_ms: u64,
    pub ttl_ms: u64,
    pub requester: NodeId,
    /// Replace an existing object under the key instead of answering `AlreadyExists`.
    pub upsert: bool,
}

/// A replica with what a reader or writer needs to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedReplica {
    pub segment: SegmentId,
    pub node_name: String,
    pub data_addrs: Vec<String>,
    pub extents: Vec<Extent>,
    /// The mount generation whose key signs this replica's grants: the segment's own, or for
    /// a disk replica its node's current segment (the key its sidecar verifies with).
    pub key_generation: u64,
}

#[derive(Clone, Debug)]
pub struct Reserved {
    pub version: Version,
    pub key: String,
    pub size: u64,
    pub replicas: Vec<PlacedReplica>,
    pub expires_in_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Placement {
    pub key: String,
    pub size: u64,
    pub checksum: u64,
    pub version: Version,
    pub replicas: Vec<PlacedReplica>,
    pub lease_ms: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Heartbeat {
    pub segment: SegmentId,
    pub highest_term_seen: u64,
    pub in_flight: Vec<(Version, Vec<Extent>)>,
    pub released: Vec<Version>,
    /// The node's disk tier (none: no disks in service).
    pub disk: offload::DiskTier,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub remount: bool,
    /// The generation was unmounted gracefully (drained): do not mount another.
    pub unmounted: bool,
    pub quarantined: Vec<Version>,
    pub draining: bool,
    /// Objects for the node to copy to its disk tier.
    pub offload: Vec<offload::Order>,
    /// Disk-only objects for the node to copy back into its memory.
    pub promote: Vec<offload::Promotion>,
}

/// What a commit turned into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitStep {
    /// Replicate this command.
    Propose(Command),
    /// The same commit already succeeded (a re-sent request).
    AlreadyCommitted,
}

/// Retry interval for proposals that did not come back applied.
const REPROPOSE_MS: u64 = 3_000;

#[derive(Debug)]
pub struct Leader {
    pub term: u64,
    /// When this leader started (leader-memory seconds): no object counts as used earlier.
    access_floor: u32,
    cfg: CacheConfig,
    shadow: Shadow,
    res: Reservations,
    leases: Leases,
    live: Liveness,
    evict_cursor: crate::objects::Cursor,
    /// Keys in an `Evict` proposal not yet applied, and when it was made.
    evicting: HashSet<String>,
    evict_proposed_ms: u64,
    expire_proposed_ms: Option<u64>,
    drain_proposed: BTreeSet<SegmentId>,
    /// Offload orders to nodes with a disk tier.
    pub offloads: offload::Offloads,
}

impl Leader {
    /// Starts leading `term`. Call only once this leader has applied its term's first entry, so
    /// the state machine holds everything committed before the term.
    pub fn start(term: u64, cfg: CacheConfig, sm: &mut StateMachine, now: Now) -> Self {
        Self {
            // Access times live in leader memory only: every object counts as just used, through
            // this floor rather than a walk of every object (failover must not cost O(objects)).
            access_floor: access_s(now),
            term,
            cfg,
            shadow: Shadow::build(sm),
            res: Reservations::default(),
            leases: Leases::default(),
            live: Liveness::start(now.mono_ms),
            evict_cursor: Default::default(),
            evicting: HashSet::new(),
            evict_proposed_ms: 0,
            expire_proposed_ms: None,
            drain_proposed: BTreeSet::new(),
            offloads: offload::Offloads::default(),
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn shadow(&self) -> &Shadow {
        &self.shadow
    }

    pub fn reservations(&self) -> &Reservations {
        &self.res
    }

    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    pub fn silence_ms(&self, seg: &SegmentId, now: Now) -> u64 {
        self.live.silence_ms(seg, now.mono_ms)
    }

    fn alive(&self, seg: &SegmentId, now: Now) -> bool {
        self.live.silence_ms(seg, now.mono_ms) <= self.cfg.node_ttl_ms
    }

    // ------------------------------------------------------------------ writes

    /// Validates a key (non-empty, bounded, no NUL).
    pub fn check_key(&self, key: &str) -> Result<()> {
        if key.is_empty() {
            return Err(Error::InvalidArgument("empty key".into()));
        }
        if key.len() > self.cfg.max_key_len {
            return Err(Error::InvalidArgument(format!(
                "key of {} bytes is longer than the limit of {} (starts {:?})",
                key.len(),
                self.cfg.max_key_len,
                &key[..key
                    .char_indices()
                    .nth(32)
                    .map(|(i, _)| i)
                    .unwrap_or(key.len())]
            )));
        }
        if key.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "key {key:?} contains a NUL byte"
            )));
        }
        Ok(())
    }

    /// Picks extents for a put and holds them, without a Raft round (design §4 step 2).
    pub fn reserve(&mut self, sm: &StateMachine, req: &PutRequest, now: Now) -> Result<Reserved> {
        self.check_key(&req.key)?;
        let replicas = req.replicas.max(1);
        if replicas > self.cfg.max_replicas {
            return Err(Error::InvalidArgument(format!(
                "{replicas} replicas asked for {:?}; at most {}",
                req.key, self.cfg.max_replicas
            )));
        }
        if req.size == 0 {
            return Err(Error::InvalidArgument(format!(
                "zero-size put of {:?}",
                req.key
            )));
        }
        let largest = self
            .shadow
            .segments()
            .map(|(_, s)| s.alloc.capacity())
            .max()
            .unwrap_or(0);
        if req.size > largest {
            return Err(Error::InvalidArgument(format!(
                "put of {:?}: {} bytes is larger than any segment ({largest} bytes)",
                req.key, req.size
            )));
        }
        if req.upsert && self.res.key_reserved(&req.key) {
            return Err(Error::KeyBusy {
                key: req.key.clone(),
            });
        }
        if !req.upsert && (sm.contains(&req.key) || self.res.key_reserved(&req.key)) {
            return Err(Error::AlreadyExists {
                key: req.key.clone(),
            });
        }
        if req.pin == PinKind::Hard {
            self.check_hard_pin_quota(sm, &req.key, req.size * replicas as u64)?;
        }
        let order = placement::candidates(
            sm,
            &self.shadow,
            req.requester,
            req.prefer_local,
            &req.preferred,
            |s| self.alive(s, now),
        );
        if order.is_empty() {
            return Err(self.not_ready_or(req, now, 0, |key| Error::NoSegments { key }));
        }
        let distinct_nodes = order.iter().map(|s| s.node).collect::<BTreeSet<_>>().len();
        let count = (replicas as usize).min(distinct_nodes);
        let Some(placed) = placement::allocate(
            &mut self.shadow,
            &order,
            req.size,
            count,
            self.cfg.max_extents_per_replica,
        ) else {
            return Err(self.not_ready_or(req, now, req.size, |key| Error::NoSpace {
                key,
                size: req.size,
                replicas,
            }));
        };
        let version = self.res.next_version(self.term);
        let pin = match req.pin {
            PinKind::None => Pin::None,
            PinKind::Hard => Pin::Hard,
            PinKind::Soft => Pin::Soft { until_ms: 0 },
        };
        self.res.insert(Reservation {
            version,
            key: req.key.clone(),
            size: req.size,
            replicas: placed.clone(),
            pin,
            ttl_ms: req.ttl_ms,
            soft_pin_ttl_ms: if req.soft_pin_ttl_ms == 0 {
                self.cfg.soft_pin_ttl_ms
            } else {
                req.soft_pin_ttl_ms
            },
            deadline_ms: now.mono_ms.saturating_add(self.cfg.put_timeout_ms),
            state: ResState::Live,
            upsert: req.upsert,
            promote: None,
        });
        Ok(Reserved {
            version,
            key: req.key.clone(),
            size: req.size,
            replicas: placed.iter().map(|r| placed_replica(sm, r)).collect(),
            expires_in_ms: self.cfg.put_timeout_ms,
        })
    }

    /// A placement failed: answers [`Error::SegmentsNotReady`] (retryable) when some live,
    /// non-draining segment with at least `min_free` free bytes could have taken the put but has
    /// not heartbeated to this leader yet (a new leader places nothing there before that, design
    /// §4), else the definite error `otherwise` makes from the key.
    fn not_ready_or(
        &self,
        req: &PutRequest,
        now: Now,
        min_free: u64,
        otherwise: impl FnOnce(String) -> Error,
    ) -> Error {
        let waiting = self
            .shadow
            .segments()
            .filter(|(id, s)| {
                !s.ready
                    && !s.draining
                    && s.alloc.capacity() > 0
                    && s.alloc.free_bytes() >= min_free
                    && self.alive(id, now)
            })
            .count();
        if waiting == 0 {
            return otherwise(req.key.clone());
        }
        Error::SegmentsNotReady {
            key: req.key.clone(),
            waiting,
            term: self.term,
        }
    }

    fn check_hard_pin_quota(&self, sm: &StateMachine, key: &str, bytes: u64) -> Result<()> {
        let (total, _) = self.shadow.usage();
        let limit = (total as f64 * self.cfg.hard_pin_max_ratio) as u64;
        let pinned = sm.hard_pinned_bytes() + self.res.hard_pinned_bytes();
        if pinned.saturating_add(bytes) > limit {
            return Err(Error::QuotaExceeded {
                key: key.to_string(),
                pinned,
                limit,
            });
        }
        Ok(())
    }

    /// Turns a live reservation into its `CommitPut` (design §4 step 4).
    pub fn commit(&mut self, version: Version, checksum: u64, now: Now) -> Result<CommitStep> {
        if version.term != self.term {
            return Err(Error::StaleReservation { version });
        }
        if self.res.recently_committed(&version) {
            return Ok(CommitStep::AlreadyCommitted);
        }
        let Some(r) = self.res.get_mut(&version) else {
            return Err(Error::StaleReservation { version });
        };
        match r.state {
            ResState::Quarantined => return Err(Error::Expired { version }),
            ResState::Committing => {
                return Err(Error::InvalidArgument(format!(
                    "reservation {version} is already being committed"
                )))
            }
            ResState::Live if now.mono_ms > r.deadline_ms => {
                self.res.quarantine(&version);
                return Err(Error::Expired { version });
            }
            ResState::Live => {}
        }
        r.state = ResState::Committing;
        let pin = match r.pin {
            Pin::Soft { .. } => Pin::Soft {
                until_ms: now.wall_ms.saturating_add(r.soft_pin_ttl_ms),
            },
            p => p,
        };
        let key = r.key.clone();
        if let Some(object) = r.promote {
            let Some(replica) = r.replicas.first().cloned() else {
                return Err(Error::Internal(format!(
                    "promotion {version} of {key:?} holds no memory"
                )));
            };
            return Ok(CommitStep::Propose(Command::PromoteToMemory {
                key,
                version: object,
                reservation: version,
                replica,
            }));
        }
        let (size, replicas) = (r.size, r.replicas.clone());
        // A TTL too large to add (up to u64::MAX) saturates: the object never expires.
        let expires_ms = if r.ttl_ms == 0 {
            0
        } else {
            now.wall_ms.saturating_add(r.ttl_ms)
        };
        Ok(CommitStep::Propose(if r.upsert {
            Command::UpsertPut {
                key,
                size,
                replicas,
                checksum,
                version,
                pin,
                expires_ms,
            }
        } else {
            Command::CommitPut {
                key,
                size,
                replicas,
                checksum,
                version,
                pin,
                expires_ms,
            }
        }))
    }

    /// The proposal of a commit failed (timeout, lost leadership): it may still be applied later,
    /// so its extents stay held as quarantined; an apply would end the quarantine.
    pub fn commit_failed(&mut self, version: Version) {
        if self
            .res
            .get(&version)
            .is_some_and(|r| r.state == ResState::Committing)
        {
            self.res.quarantine(&version);
        }
    }

    /// The writer gave up: its extents are quarantined until the owners release them (slices may
    /// still be in flight towards them).
    pub fn abort(&mut self, versions: &[Version]) {
        for v in versions {
            if v.term == self.term && self.res.get(v).is_some_and(|r| r.state == ResState::Live) {
                self.res.quarantine(v);
            }
        }
    }

    // ------------------------------------------------------------------ heartbeats

    /// A sidecar's heartbeat: restarts its timer; the first one to this leader adopts the
    /// reservations it still has in flight and makes the segment ready for placements.
    pub fn heartbeat(&mut self, sm: &StateMachine, hb: &Heartbeat, now: Now) -> HeartbeatReply {
        let Some(seg) = sm.segment(&hb.segment) else {
            let retired = sm.retired(&hb.segment);
            return HeartbeatReply {
                remount: !retired,
                unmounted: retired,
                ..Default::default()
            };
        };
        self.live.heard(hb.segment, now.mono_ms);
        let first = self.shadow.get(&hb.segment).is_some_and(|s| !s.ready);
        if first {
            for (v, extents) in &hb.in_flight {
                if v.term == self.term && self.res.get(v).is_some() {
                    continue;
                }
                let mut held = Vec::new();
                for e in extents {
                    held.extend(self.shadow.take_overlapping(&hb.segment, e));
                }
                tracing::info!(segment = %hb.segment, version = %v, extents = held.len(), "adopted in-flight reservation as quarantined");
                self.res.adopt(*v, hb.segment, held);
            }
            self.shadow.set_ready(&hb.segment);
        }
        for v in &hb.released {
            let extents = self.res.release(v, &hb.segment);
            self.shadow.free(&hb.segment, &extents);
        }
        self.offloads.heard(hb.segment.node, hb.disk);
        HeartbeatReply {
            remount: false,
            unmounted: false,
            quarantined: self.res.quarantined_on(&hb.segment),
            draining: matches!(seg.state, SegmentState::Draining { .. }),
            offload: self.offloads.take_orders(hb.segment.node),
            promote: self.offloads.take_promotions(hb.segment.node),
        }
    }

    // ------------------------------------------------------------------ reads

    /// Placements for a get. A node's get (`requester` not 0) is a read: it refreshes the
    /// object's recency, takes a read lease and may promote it. A tool asking metad directly
    /// (no requester) only looks: an operator's or a benchmark's poll must neither keep the
    /// objects it watches hot for eviction and offload nor hold the memory of those that
    /// move (answered `lease_ms` 0).
    pub fn get(
        &mut self,
        sm: &mut StateMachine,
        keys: &[String],
        requester: NodeId,
        now: Now,
    ) -> Vec<Option<Placement>> {
        let until = now.mono_ms.saturating_add(self.cfg.lease_ttl_ms);
        let access = access_s(now);
        let reads = requester != 0;
        keys.iter()
            .map(|k| {
                let obj = if reads {
                    sm.touch_object(k, access)?.clone()
                } else {
                    sm.object(k)?.clone()
                };
                if reads {
                    self.leases.grant(obj.version, k, until);
                    self.promote_on_hit(sm, k, &obj, now);
                }
                let mut replicas: Vec<PlacedReplica> = obj
                    .replicas
                    .to_vec()
                    .iter()
                    .map(|r| placed_replica(sm, r))
                    .collect();
                // The requester's own replica first, then the ones heard from most recently.
                replicas.sort_by_key(|r| {
                    (
                        r.segment.node != requester,
                        self.live.silence_ms(&r.segment, now.mono_ms),
                    )
                });
                Some(Placement {
                    key: k.clone(),
                    size: obj.size,
                    checksum: obj.checksum,
                    version: obj.version,
                    replicas,
                    lease_ms: if reads { self.cfg.lease_ttl_ms } else { 0 },
                })
            })
            .collect()
    }

    /// A get hit an object held only on disk: when promotion is on and the pool has room
    /// below the offload target (so a promotion never starts an offload), reserves memory on
    /// the disk's node and orders the node to copy the object there (design §6 "Tiers").
    fn promote_on_hit(&mut self, sm: &StateMachine, key: &str, obj: &Object, now: Now) {
        if !self.cfg.promote_on_hit || obj.footprint() != 0 {
            return;
        }
        let res = &self.res;
        let live = |v: &Version| res.get(v).is_some_and(|r| r.state != ResState::Quarantined);
        if self.offloads.is_promoting(key, live) {
            return;
        }
        let Some((node, disk)) = obj.replicas.pieces().iter().find_map(|p| {
            let node = p.segment().node;
            p.is_disk()
                .then(|| obj.replicas.disk_on(node).map(|d| (node, d)))
                .flatten()
        }) else {
            return;
        };
        if !self.offloads.tiers.contains_key(&node) {
            return;
        }
        let Some(seg) = sm.node_segment(node).map(|s| s.id) else {
            return;
        };
        let usable = self
            .shadow
            .get(&seg)
            .is_some_and(|s| s.ready && !s.draining && s.alloc.capacity() > 0);
        if !usable || !self.alive(&seg, now) {
            return;
        }
        let (total, free) = self.shadow.usage();
        let room =
            (total as f64 * (self.cfg.offload_watermark - self.cfg.eviction_ratio).max(0.0)) as u64;
        if (total - free).saturating_add(obj.size) > room {
            return;
        }
        let Some(placed) = placement::allocate(
            &mut self.shadow,
            &[seg],
            obj.size,
            1,
            self.cfg.max_extents_per_replica,
        ) else {
            return;
        };
        let extents = placed
            .first()
            .map(|r| r.extents.clone())
            .unwrap_or_default();
        let reservation = self.res.next_version(self.term);
        self.res.insert(Reservation {
            version: reservation,
            key: key.to_string(),
            size: obj.size,
            replicas: placed,
            pin: Pin::None,
            ttl_ms: 0,
            soft_pin_ttl_ms: 0,
            deadline_ms: now.mono_ms.saturating_add(self.cfg.put_timeout_ms),
            state: ResState::Live,
            upsert: false,
            promote: Some(obj.version),
        });
        self.offloads.promote(
            node,
            offload::Promotion {
                key: key.to_string(),
                version: obj.version,
                size: obj.size,
                checksum: obj.checksum,
                disk,
                reservation,
                extents,
            },
        );
    }

    /// Refreshes the access time of objects a sidecar read through its own index (the leader
    /// saw no get for them); unknown keys are skipped. Answers how many were known.
    pub fn touch(&self, sm: &mut StateMachine, keys: &[String], now: Now) -> usize {
        let access = access_s(now);
        let mut known = 0;
        for k in keys {
            if sm.touch_object(k, access).is_some() {
                known += 1;
            }
        }
        known
    }

    // ------------------------------------------------------------------ applies

    /// Follows one apply's effects.
    pub fn on_effect(&mut self, sm: &mut StateMachine, fx: &Effect, now: Now) {
        match fx {
            Effect::Committed { version, key } => {
                sm.touch_object(key, access_s(now));
                let promoted = self
                    .res
                    .remove(version)
                    .is_some_and(|r| r.promote.is_some());
                if promoted {
                    self.offloads.promotion_ended(key, version);
                } else if self.cfg.write_through {
                    self.offloads.order_copies(sm, key);
                }
                self.res.remember_commit(
                    *version,
                    now.mono_ms.saturating_add(self.cfg.put_timeout_ms),
                );
            }
            Effect::CommitRejected { version } => {
                if let Some(r) = self.res.remove(version) {
                    if r.promote.is_some() {
                        self.offloads.promotion_ended(&r.key, version);
                    }
                    for rep in &r.replicas {
                        self.shadow.free(&rep.segment, &rep.extents);
                    }
                }
            }
            Effect::Freed {
                segment,
                version,
                extents,
            } => {
                if let Some(ex) =
                    self.leases
                        .hold_if_leased(version, *segment, extents.clone(), now.mono_ms)
                {
                    self.shadow.free(segment, &ex);
                }
            }
            Effect::Mounted { segment } => {
                let cap = sm.segment(segment).map(|s| s.capacity).unwrap_or(0);
                // Mounted in this term: a fresh generation has no earlier in-flight writes.
                self.shadow.add_segment(*segment, cap, true);
                self.live.heard(*segment, now.mono_ms);
            }
            Effect::Unmounted { segment } => {
                self.offloads.forget_node(segment.node);
                self.shadow.remove_segment(segment);
                self.res.drop_segment(segment);
                self.leases.drop_segment(segment);
                self.live.forget(segment);
                self.drain_proposed.remove(segment);
            }
            Effect::RemovedAll => self.on_removed_all(sm, now),
            // What the watch feed follows; the leader's bookkeeping needs none of it.
            Effect::Removed { .. } | Effect::Shrunk { .. } => {}
        }
    }

    /// Every object was removed: the leader keeps holding the extents of the leased ones (until
    /// their leases end), its reservations, and what already waits for a lease; the rest of
    /// each segment is free. The cost follows the leases and reservations, not the objects.
    fn on_removed_all(&mut self, sm: &StateMachine, now: Now) {
        for (version, key) in self.leases.active_keys(now.mono_ms) {
            let Some(obj) = sm.removed_object(&key).filter(|o| o.version == version) else {
                continue;
            };
            for r in obj.replicas.to_vec() {
                // Leased now, so held (never handed back).
                let _ = self
                    .leases
                    .hold_if_leased(&version, r.segment, r.extents, now.mono_ms);
            }
        }
        let held = self
            .res
            .iter()
            .flat_map(|r| {
                r.replicas
                    .iter()
                    .flat_map(|rep| rep.extents.iter().map(move |e| (rep.segment, *e)))
            })
            .chain(self.leases.waiting_extents())
            .collect::<Vec<_>>();
        self.shadow.reset_to(sm, &held);
        self.evicting.clear();
        self.evict_cursor = Default::default();
    }

    /// Whether an eviction this leader proposed is not applied yet.
    pub fn eviction_in_flight(&self) -> bool {
        !self.evicting.is_empty()
    }

    /// Notes that a proposal of this leader's was applied (clears its in-flight marker).
    pub fn on_applied_command(&mut self, cmd: &Command, sm: &StateMachine) {
        match cmd {
            Command::Evict { keys } => {
                for k in keys {
                    self.evicting.remove(k);
                }
            }
            Command::ExpirePins { .. } => self.expire_proposed_ms = None,
            Command::MoveToDisk { items, .. } => {
                for it in items {
                    self.offloads.reported(&it.key);
                }
            }
            Command::DrainSegment { segment, .. } if sm.segment(segment).is_some() => {
                self.shadow.set_draining(segment);
            }
            _ => {}
        }
    }

    /// Periodic work; returns the commands to propose.
    pub fn tick(&mut self, sm: &StateMachine, now: Now, lease_ok: bool) -> Vec<Command> {
        let mut out = Vec::new();
        self.res.expire(now.mono_ms, self.cfg.put_timeout_ms);
        self.res.forget_old_commits(now.mono_ms);
        for (seg, extents) in self.leases.expire(now.mono_ms) {
            self.shadow.free(&seg, &extents);
        }
        self.live.observe_lease(lease_ok, now.mono_ms);
        let mounted: BTreeSet<SegmentId> = sm.segments().map(|s| s.id).collect();
        for seg in self
            .live
            .due(&mounted, now.mono_ms, self.cfg.node_ttl_ms, REPROPOSE_MS)
        {
            tracing::warn!(segment = %seg, ttl_ms = self.cfg.node_ttl_ms, "no heartbeat within node_ttl: declaring the node dead");
            out.push(Command::UnmountSegment {
                segment: seg,
                reason: UnmountReason::Dead,
            });
        }
        out.extend(self.drains_done(sm, now));
        if let Some(c) = self.expiry_due(sm, now) {
            out.push(c);
        }
        self.offloads.expire(now.mono_ms);
        let res = &self.res;
        self.offloads.forget_dead_promotions(|v| {
            res.get(v).is_some_and(|r| r.state != ResState::Quarantined)
        });
        self.plan_offloads(sm, now);
        for (node, items) in self.offloads.take_frees() {
            out.push(Command::MoveToDisk { node, items });
        }
        if let Some(c) = self.eviction_due(sm, now, 0) {
            out.push(c);
        }
        out
    }

    /// Orders offloads when usage is above the offload watermark (nothing to propose: the
    /// nodes copy, then report, and the leader commits the moves).
    pub fn plan_offloads(&mut self, sm: &StateMachine, now: Now) {
        if self.offloads.is_idle() {
            return;
        }
        let (total, free) = self.shadow.usage();
        if total == 0 {
            return;
        }
        // Memory held for a lease on an object already moved or dropped frees itself when the
        // lease ends: offloading more for it would go below the target (readers polling the
        // objects being offloaded hold all of them).
        let used = (total - free).saturating_sub(self.leases.waiting_bytes());
        let target =
            (total as f64 * (self.cfg.offload_watermark - self.cfg.eviction_ratio).max(0.0)) as u64;
        // Hysteresis: offload starts above the watermark and goes on down to the target.
        if used <= target {
            self.offloads.active = false;
            return;
        }
        if !self.offloads.active && used <= (total as f64 * self.cfg.offload_watermark) as u64 {
            return;
        }
        self.offloads.active = true;
        let need = used
            .saturating_sub(target)
            .saturating_sub(self.offloads.in_flight_bytes());
        if need == 0 {
            return;
        }
        let offloads = &self.offloads;
        let p = eviction::plan(
            sm,
            self.offloads.cursor,
            need,
            self.access_floor,
            &self.evicting,
            |k, o| {
                offloads.is_ordered(k)
                    || offloads.backing_off(k, now.mono_ms)
                    || offloads.target(sm, o).is_none()
            },
        );
        self.offloads.cursor = p.cursor;
        let mut n = 0;
        for k in &p.keys {
            n += self.offloads.order(sm, k, now.mono_ms) as usize;
        }
        if n > 0 {
            tracing::info!(
                objects = n,
                bytes = p.bytes,
                used,
                total,
                "offloading to disk tiers"
            );
        }
    }

    fn drains_done(&mut self, sm: &StateMachine, now: Now) -> Vec<Command> {
        let mut out = Vec::new();
        for s in sm.segments() {
            let SegmentState::Draining { deadline_ms } = s.state else {
                continue;
            };
            let empty =
                s.objects == 0 && !self.res.holds_on(&s.id) && !self.leases.waiting_on(&s.id);
            if (empty || now.wall_ms >= deadline_ms) && self.drain_proposed.insert(s.id) {
                out.push(Command::UnmountSegment {
                    segment: s.id,
                    reason: UnmountReason::Graceful,
                });
            }
        }
        out
    }

    fn expiry_due(&mut self, sm: &StateMachine, now: Now) -> Option<Command> {
        let next = sm.next_expiry()?;
        if next > now.wall_ms {
            return None;
        }
        if self
            .expire_proposed_ms
            .is_some_and(|t| now.mono_ms < t.saturating_add(REPROPOSE_MS))
        {
            return None;
        }
        self.expire_proposed_ms = Some(now.mono_ms);
        Some(Command::ExpirePins {
            now_ms: now.wall_ms,
        })
    }

    /// An `Evict` batch when usage is above the high watermark, or when `extra` more bytes are
    /// needed (a reservation found no space).
    ///
    /// While an eviction is in flight the watermark plans nothing more (the bytes it frees are
    /// not free yet, and a second plan would count them again), but a reservation that found
    /// no space still gets victims of its own, `extra` bytes, among the objects not being
    /// evicted already: puts arriving together on a full pool each evict for themselves
    /// rather than all but one being refused.
    pub fn eviction_due(&mut self, sm: &StateMachine, now: Now, extra: u64) -> Option<Command> {
        let in_flight = !self.evicting.is_empty()
            && now.mono_ms < self.evict_proposed_ms.saturating_add(REPROPOSE_MS);
        if in_flight && extra == 0 {
            return None;
        }
        if !in_flight {
            self.evicting.clear();
        }
        let (total, free) = self.shadow.usage();
        if total == 0 {
            return None;
        }
        // Bytes being offloaded, and bytes held only for the lease of an object already gone,
        // will be free soon: only a reservation that finds no space (`extra`) evicts before.
        let used = (total - free)
            .saturating_sub(self.offloads.in_flight_bytes())
            .saturating_sub(self.leases.waiting_bytes());
        let high = (total as f64 * self.cfg.eviction_high_watermark) as u64;
        let target =
            (total as f64 * (self.cfg.eviction_high_watermark - self.cfg.eviction_ratio)) as u64;
        let need = if in_flight {
            extra
        } else {
            if used > high { used - target } else { 0 }.max(extra)
        };
        if need == 0 {
            return None;
        }
        let leases = &self.leases;
        let offloads = &self.offloads;
        let now_ms = now.mono_ms;
        // Objects only on disk free no memory; objects being offloaded soon free theirs,
        // unless a reservation needs the space now (a put must not fail because offload is
        // slower than the puts: the object is dropped, and its move, when reported, finds
        // it gone).
        let spare_ordered = extra == 0;
        let p = eviction::plan(
            sm,
            self.evict_cursor,
            need,
            self.access_floor,
            &self.evicting,
            |k, o| {
                leases.active(&o.version, now_ms)
                    || o.footprint() == 0
                    || (spare_ordered && offloads.is_ordered(k))
            },
        );
        self.evict_cursor = p.cursor;
        if p.keys.is_empty() {
            return None;
        }
        tracing::info!(
            victims = p.keys.len(),
            bytes = p.bytes,
            used,
            total,
            "evicting"
        );
        self.evicting.extend(p.keys.iter().cloned());
        self.evict_proposed_ms = now.mono_ms;
        Some(Command::Evict { keys: p.keys })
    }
}

fn placed_replica(sm: &StateMachine, r: &Replica) -> PlacedReplica {
    // A disk replica is served by its node's sidecar, at its current segment's addresses.
    let seg = if r.segment.is_disk() {
        sm.node_segment(r.segment.node)
    } else {
        sm.segment(&r.segment)
    };
    PlacedReplica {
        segment: r.segment,
        node_name: seg.map(|s| s.name.clone()).unwrap_or_default(),
        data_addrs: seg.map(|s| s.data_addrs.clone()).unwrap_or_default(),
        extents: r.extents.clone(),
        key_generation: seg.map_or(r.segment.generation, |s| s.id.generation),
    }
}

/// Leader-memory access time in seconds (wraps after 136 years).
fn access_s(now: Now) -> u32 {
    (now.mono_ms / 1000) as u32
}

#[cfg(test)]
mod tests;
