//! How a follower names the leader: gRPC status `FAILED_PRECONDITION` with message `NOT_LEADER`
//! and the metadata `regolith-leader-id` / `regolith-leader-addr` when the leader is known.

use tonic::{Code, Status};

pub const NOT_LEADER: &str = "NOT_LEADER";
pub const LEADER_ID_KEY: &str = "regolith-leader-id";
pub const LEADER_ADDR_KEY: &str = "regolith-leader-addr";

/// A leader named by a follower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderHint {
    pub id: u64,
    pub addr: String,
}

/// The status a follower answers with.
pub fn not_leader(hint: Option<&LeaderHint>) -> Status {
    let mut s = Status::new(
        Code::FailedPrecondition,
        match hint {
            Some(h) => format!("{NOT_LEADER}: leader is {} at {}", h.id, h.addr),
            None => format!("{NOT_LEADER}: no leader known yet"),
        },
    );
    if let Some(h) = hint {
        if let (Ok(id), Ok(addr)) = (h.id.to_string().parse(), h.addr.parse()) {
            s.metadata_mut().insert(LEADER_ID_KEY, id);
            s.metadata_mut().insert(LEADER_ADDR_KEY, addr);
        }
    }
    s
}

/// Whether `s` is a `NOT_LEADER` answer.
pub fn is_not_leader(s: &Status) -> bool {
    s.code() == Code::FailedPrecondition && s.message().starts_with(NOT_LEADER)
}

/// The leader named in a `NOT_LEADER` answer, if any.
pub fn hint_of(s: &Status) -> Option<LeaderHint> {
    if !is_not_leader(s) {
        return None;
    }
    let id = s
        .metadata()
        .get(LEADER_ID_KEY)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    let addr = s
        .metadata()
        .get(LEADER_ADDR_KEY)?
        .to_str()
        .ok()?
        .to_string();
    Some(LeaderHint { id, addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_round_trips() {
        let h = LeaderHint {
            id: 3,
            addr: "127.0.0.1:50053".into(),
        };
        let s = not_leader(Some(&h));
        assert!(is_not_leader(&s));
        assert_eq!(hint_of(&s), Some(h));
        let s = not_leader(None);
        assert!(is_not_leader(&s));
        assert_eq!(hint_of(&s), None);
        assert!(!is_not_leader(&Status::unavailable("x")));
    }
}
