//! Measures the heap sled keeps for a Raft log: entries of `entry_kib` KiB appended in batches
//! of one with a flush each (as the log store does), with the entries older than a window of
//! `window_mib` MiB deleted one key at a time (as the purge thread does), until `total_mib` MiB
//! were written.
//! `cargo run --release -p regolith-raft-log --example sled_memory -- <total MiB> <window MiB> <cache MiB> [entry KiB]`
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

fn main() {
    let mut args = std::env::args().skip(1).map(|s| s.parse::<u64>().ok());
    let total_mib = args.next().flatten().unwrap_or(2400);
    let window_mib = args.next().flatten().unwrap_or(1200);
    let cache_mib = args.next().flatten().unwrap_or(32);
    let entry_kib = args.next().flatten().unwrap_or(16);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(cache_mib << 20)
        .flush_every_ms(None)
        .open()
        .expect("open");
    let tree = db.open_tree("log").expect("tree");
    let before = rss_mib();
    let value = vec![7u8; (entry_kib << 10) as usize];
    let n = (total_mib << 20) / value.len() as u64;
    let window = (window_mib << 20) / value.len() as u64;
    for i in 0..n {
        let mut b = sled::Batch::default();
        b.insert(&i.to_be_bytes(), value.as_slice());
        tree.apply_batch(b).expect("insert");
        db.flush().expect("flush");
        if i >= window {
            tree.remove((i - window).to_be_bytes()).expect("remove");
        }
        if (i + 1) % (n / 6).max(1) == 0 {
            println!(
                "{} MiB written: RSS +{} MiB",
                (i + 1) * entry_kib / 1024,
                rss_mib().saturating_sub(before)
            );
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    println!(
        "window {window_mib} MiB, cache {cache_mib} MiB: RSS +{} MiB",
        rss_mib().saturating_sub(before)
    );
}
