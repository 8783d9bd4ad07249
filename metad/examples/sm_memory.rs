//! Measures the state machine's memory for N objects of 64-byte keys (RSS delta).
use regolith_metad::command::Command;
use regolith_metad::state::StateMachine;
use regolith_metad::types::{Extent, Pin, Replica, Version};

// The daemon's allocator, so the figure is the daemon's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The daemon's jemalloc options (metad/src/main.rs): freed pages go back after a second.
#[repr(transparent)]
pub struct MallocConf(*const std::ffi::c_char);
// SAFETY: a pointer to an immutable, NUL-terminated static string.
unsafe impl Sync for MallocConf {}
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: MallocConf =
    MallocConf(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000".as_ptr());

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let random = std::env::args().nth(2).is_some();
    let mut sm = StateMachine::new();
    let mut fx = Vec::new();
    sm.apply(
        &Command::MountSegment {
            node_name: "a".into(),
            node_id_hint: 0,
            capacity: 1 << 40,
            data_addrs: vec![],
            now_ms: 0,
        },
        &mut fx,
    );
    let seg = sm.segments().next().unwrap().id;
    let before = rss_kib();
    for i in 0..n {
        let key = if random {
            format!("{:016x}{:048}", (i.wrapping_mul(0x9E3779B97F4A7C15)), i)
        } else {
            format!("{:064}", i)
        };
        let cmd = Command::CommitPut {
            key,
            size: 64,
            replicas: vec![Replica {
                segment: seg,
                extents: vec![Extent::new(i * 64, 64)],
            }],
            checksum: i,
            version: Version { term: 1, id: i },
            pin: Pin::None,
            expires_ms: 0,
        };
        fx.clear();
        sm.apply(&cmd, &mut fx);
    }
    // As the daemon's steady state: freed pages returned.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let after = rss_kib();
    let (entries, index, keys) = sm.objects_footprint();
    println!(
        "table: arrays {:.1} MB, hash tables {:.1} MB, keys {:.1} MB ({} bytes per object record)",
        entries as f64 / 1e6,
        index as f64 / 1e6,
        keys as f64 / 1e6,
        std::mem::size_of::<regolith_metad::types::Object>(),
    );
    println!(
        "{n} objects: {:.1} MB ({:.0} bytes/object)",
        (after - before) as f64 / 1024.0,
        (after - before) as f64 * 1024.0 / n as f64
    );
}
