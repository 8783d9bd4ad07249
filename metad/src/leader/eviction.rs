//! Approximate-LRU eviction (design §6).
//!
//! Candidates are scanned from a rotating cursor over the objects (so one pass costs a bounded
//! amount however many objects there are), then the oldest by leader-memory access time are
//! chosen, unpinned before soft-pinned. Leased, hard-pinned and already-proposed objects are never
//! chosen.

use std::collections::HashSet;

use crate::objects::Cursor;
use crate::state::StateMachine;
use crate::types::{Object, Pin};

/// Objects looked at per planning pass, at least.
pub const MIN_SCAN: usize = 1024;

pub struct Plan {
    pub keys: Vec<String>,
    pub bytes: u64,
    /// Where the next pass starts.
    pub cursor: Cursor,
}

/// Picks victims freeing at least `need` bytes, if it can. `skip(key, obj)` excludes objects
/// (leased ones, for instance). An access time below `access_floor` counts as `access_floor`
/// (the leader's start: it treats every object as used then, without walking them all).
pub fn plan(
    sm: &StateMachine,
    cursor: Cursor,
    need: u64,
    access_floor: u32,
    pending: &HashSet<String>,
    mut skip: impl FnMut(&str, &Object) -> bool,
) -> Plan {
    let n = sm.key_count();
    if n == 0 {
        return Plan {
            keys: Vec::new(),
            bytes: 0,
            cursor,
        };
    }
    let avg = (sm.bytes_used() / n as u64).max(1);
    let scan = (MIN_SCAN.max(4 * (need / avg) as usize)).min(n);
    let (seen, next) = sm.scan_objects(cursor, scan);
    let mut cands: Vec<(bool, u32, &str, u64)> = Vec::with_capacity(scan);
    for (k, o) in seen {
        if o.pin() == Pin::Hard || pending.contains(k) || skip(k, o) {
            continue;
        }
        cands.push((
            matches!(o.pin(), Pin::Soft { .. }),
            o.access_s.max(access_floor),
            k,
            o.footprint(),
        ));
    }
    cands.sort_by_key(|(soft, access, _, _)| (*soft, *access));
    let mut keys = Vec::new();
    let mut bytes = 0;
    for (_, _, k, b) in cands {
        if bytes >= need {
            break;
        }
        keys.push(k.to_string());
        bytes += b;
    }
    Plan {
        keys,
        bytes,
        cursor: next,
    }
}
