//! Picking a free loopback port for a process about to be started (test harnesses, the metad
//! bench).
//!
//! A port from `bind(0)` comes out of the kernel's ephemeral range, the range outgoing
//! connections draw their source ports from: between the harness releasing it and the child
//! binding it, any connection on the machine may be handed that port (seen in CI: a metad
//! replica's own Raft connection took the gRPC port picked for it). Ports below the ephemeral
//! range are never handed out that way, so they are picked from there.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Lowest port handed out: clear of the well-known and the usual service ports.
const FLOOR: u32 = 10_000;
/// Ports from here up to the ephemeral range are left to blocks of ports that the harnesses
/// reserve for `regolith up --base-port` (e2e and Python tests: 20000..32000).
const CEIL: u32 = 20_000;
/// With fewer ports than this between FLOOR and the ephemeral range, fall back to `bind(0)`.
const MIN_SPAN: u32 = 1_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port that was free a moment ago and that the kernel does not hand out as a
/// connection's source port.
pub fn free_loopback_port() -> u16 {
    let top = ephemeral_low().unwrap_or(32_768).min(CEIL);
    if top < FLOOR + MIN_SPAN {
        return bind_any();
    }
    let span = top - FLOOR;
    // A per-process start, so harnesses in parallel processes rarely try the same ports.
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = FLOOR + (start + NEXT.fetch_add(1, Relaxed)) % span;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    bind_any()
}

/// The first port of the ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_low() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn bind_any() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_distinct() {
        let top = ephemeral_low().unwrap_or(32_768).min(CEIL);
        let ports: Vec<u16> = (0..50).map(|_| free_loopback_port()).collect();
        for p in &ports {
            assert!(*p != 0);
            if top >= FLOOR + MIN_SPAN {
                assert!(
                    u32::from(*p) >= FLOOR && u32::from(*p) < top,
                    "{p} vs {top}"
                );
            }
        }
        let mut uniq = ports.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), ports.len(), "handed out twice: {ports:?}");
        // What it hands out can be bound.
        TcpListener::bind(("127.0.0.1", ports[0])).unwrap();
    }
}
