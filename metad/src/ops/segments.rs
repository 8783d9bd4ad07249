//! Segments (design §3, §6): mount, graceful unmount, heartbeats (liveness and the
//! reservations a sidecar still has in flight), drain, and the listing with each segment's
//! silence.

use crate::command::{Command, Outcome};
use crate::config::{
    MAX_ADDR_LEN, MAX_DATA_ADDRS, MAX_HEARTBEAT_LIST, MAX_NODE_NAME, MAX_SEGMENT_BYTES,
};
use crate::error::{Error, Result};
use crate::leader::{Heartbeat, HeartbeatReply};
use crate::ops::Ops;
use crate::types::{NodeId, Segment, SegmentId, UnmountReason};

/// A sidecar's request to mount its segment.
#[derive(Clone, Debug, Default)]
pub struct Mount {
    pub node_name: String,
    /// The node id the sidecar had before (0: none); apply assigns ids by name.
    pub node_id_hint: u64,
    pub capacity: u64,
    pub data_addrs: Vec<String>,
}

/// What a mount was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mounted {
    pub node_id: u64,
    pub generation: u64,
    /// The term of the leader that mounted it.
    pub term: u64,
}

/// A segment as `ListSegments` shows it.
#[derive(Clone, Debug)]
pub struct SegmentView {
    pub segment: Segment,
    /// Since this leader last heard from the segment's sidecar.
    pub silence_ms: u64,
    /// Heard from within `node_ttl`.
    pub alive: bool,
}

/// A name, size and addresses a mount may carry.
pub fn validate_mount(m: &Mount) -> Result<()> {
    let bad = |m: String| Err(Error::InvalidArgument(m));
    if m.node_name.is_empty()
        || m.node_name.len() > MAX_NODE_NAME
        || m.node_name.chars().any(|c| c.is_control())
    {
        return bad(format!(
            "node name {:?} must be 1..={MAX_NODE_NAME} printable characters",
            m.node_name
        ));
    }
    if m.capacity > MAX_SEGMENT_BYTES {
        return bad(format!(
            "segment of {} bytes for {:?} is implausibly large",
            m.capacity, m.node_name
        ));
    }
    if m.data_addrs.len() > MAX_DATA_ADDRS {
        return bad(format!("more than {MAX_DATA_ADDRS} data-plane addresses"));
    }
    for a in &m.data_addrs {
        if a.len() > MAX_ADDR_LEN || !a.contains(':') {
            return bad(format!("data-plane address {a:?} must be HOST:PORT"));
        }
    }
    Ok(())
}

/// The lengths of a heartbeat's lists, checked before they are read.
pub fn check_heartbeat_lists(in_flight: usize, released: usize) -> Result<()> {
    if in_flight > MAX_HEARTBEAT_LIST || released > MAX_HEARTBEAT_LIST {
        return Err(Error::InvalidArgument("heartbeat lists too long".into()));
    }
    Ok(())
}

/// When a drain asked at `now_ms` with `timeout_ms` gives up waiting (wall clock). The timeout
/// comes from the request: one too large to add (up to `u64::MAX`) saturates, and the drain
/// then waits for the segment to empty.
pub fn drain_deadline_ms(now_ms: u64, timeout_ms: u64) -> u64 {
    now_ms.saturating_add(timeout_ms)
}

impl Ops {
    pub async fn mount(&self, m: Mount) -> Result<Mounted> {
        validate_mount(&m)?;
        self.leader().await?;
        let cmd = Command::MountSegment {
            node_name: m.node_name.clone(),
            node_id_hint: m.node_id_hint,
            capacity: m.capacity,
            data_addrs: m.data_addrs,
            now_ms: self.clock.now().wall_ms,
        };
        match self.propose(cmd).await? {
            Outcome::Mounted {
                node_id,
                generation,
                dropped,
            } => {
                tracing::info!(node = %m.node_name, node_id, generation, capacity = m.capacity, dropped, "segment mounted");
                Ok(Mounted {
                    node_id,
                    generation,
                    term: self.gate.observed().term,
                })
            }
            other => Err(Error::Internal(format!("mount answered {other:?}"))),
        }
    }

    /// Graceful unmount; the objects that lost their last replica with it (0 when the segment
    /// was gone already).
    pub async fn unmount(&self, segment: SegmentId) -> Result<u64> {
        self.leader().await?;
        match self
            .propose(Command::UnmountSegment {
                segment,
                reason: UnmountReason::Graceful,
            })
            .await?
        {
            Outcome::Unmounted { dropped } => Ok(dropped),
            Outcome::Ignored(_) => Ok(0),
            other => Err(Error::Internal(format!("unmount answered {other:?}"))),
        }
    }

    /// A sidecar's heartbeat; the term of this leader and its reply.
    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<(u64, HeartbeatReply)> {
        self.heartbeat_with(hb, &[]).await
    }

    /// A heartbeat that also reports the keys its node read through its index (eviction's
    /// recency, design §5).
    pub async fn heartbeat_with(
        &self,
        hb: &Heartbeat,
        accessed: &[String],
    ) -> Result<(u64, HeartbeatReply)> {
        // Only a leader a quorum still follows takes heartbeats. A leader cut off from its peers
        // but not from the sidecars (one-way loss) stays leader in its own eyes until it hears
        // of the new term; answering heartbeats meanwhile kept every sidecar talking to it while
        // the new leader, hearing none, declared them all dead and dropped their objects (the
        // chaos suite, issue 17). Refused here, a sidecar's client tries the other replicas.
        self.read().await?;
        let obs = self.leader().await?;
        let now = self.clock.now();
        let mut core = self.core.lock();
        let (l, sm) = core.leader_parts().ok_or(Error::NoLeaderState)?;
        let touched = l.touch(sm, accessed, now);
        self.metrics.accesses_reported.inc_by(touched as u64);
        Ok((obs.term, l.heartbeat(sm, hb, now)))
    }

    /// Stops placing on `node_name`; it is unmounted when empty or after `timeout_ms` (0: the
    /// configured drain timeout). The segment and the objects it holds now.
    pub async fn drain(&self, node_name: &str, timeout_ms: u64) -> Result<(SegmentId, u64)> {
        self.leader().await?;
        let (segment, objects, timeout) = {
            let core = self.core.lock();
            let sm = core.sm();
            let node = sm
                .node_by_name(node_name)
                .ok_or_else(|| Error::NoSuch(format!("no node named {node_name:?}")))?;
            let seg = sm.node_segment(node).ok_or_else(|| {
                Error::NoSuch(format!("node {node_name:?} has no mounted segment"))
            })?;
            (
                seg.id,
                seg.objects,
                if timeout_ms == 0 {
                    core.config().drain_timeout_ms
                } else {
                    timeout_ms
                },
            )
        };
        let deadline_ms = drain_deadline_ms(self.clock.now().wall_ms, timeout);
        match self
            .propose(Command::DrainSegment {
                segment,
                deadline_ms,
            })
            .await?
        {
            Outcome::DrainSet => {
                tracing::info!(node = %node_name, %segment, timeout_ms = timeout, "draining");
                Ok((segment, objects))
            }
            other => Err(Error::Precondition(format!("drain answered {other:?}"))),
        }
    }

    /// The name node `node` mounted under (none for a node this replica never saw mount).
    pub fn node_name(&self, node: NodeId) -> Option<String> {
        self.core.lock().sm().node_name(node).map(str::to_string)
    }

    pub async fn list_segments(&self) -> Result<Vec<SegmentView>> {
        self.read().await?;
        let now = self.clock.now();
        let core = self.core.lock();
        let l = core.leader().ok_or(Error::NoLeaderState)?;
        let ttl = l.config().node_ttl_ms;
        Ok(core
            .sm()
            .segments()
            .map(|s| {
                let silence_ms = l.silence_ms(&s.id, now);
                SegmentView {
                    segment: s.clone(),
                    silence_ms,
                    alive: silence_ms <= ttl,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(name: &str, capacity: u64, addrs: &[&str]) -> Mount {
        Mount {
            node_name: name.into(),
            capacity,
            data_addrs: addrs.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn mounts_with_bad_names_sizes_or_addresses_are_refused() {
        assert!(validate_mount(&mount("node-a", 1 << 30, &["10.0.0.1:7600"])).is_ok());
        for (m, why) in [
            (mount("", 1, &[]), "node name"),
            (mount(&"n".repeat(MAX_NODE_NAME + 1), 1, &[]), "node name"),
            (mount("a\nb", 1, &[]), "node name"),
            (mount("a", MAX_SEGMENT_BYTES + 1, &[]), "implausibly large"),
            (mount("a", 1, &["no-port"]), "HOST:PORT"),
            (
                mount("a", 1, &vec!["h:1"; MAX_DATA_ADDRS + 1]),
                "data-plane addresses",
            ),
        ] {
            match validate_mount(&m) {
                Err(Error::InvalidArgument(msg)) => assert!(msg.contains(why), "{msg}"),
                other => panic!("{m:?}: {other:?}"),
            }
        }
        assert!(check_heartbeat_lists(MAX_HEARTBEAT_LIST, 0).is_ok());
        assert!(check_heartbeat_lists(0, MAX_HEARTBEAT_LIST + 1).is_err());
    }
}
