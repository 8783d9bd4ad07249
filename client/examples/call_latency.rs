//! Latency of small blocking calls through one sidecar (the path the Python binding takes):
//! `cargo run -p regolith-client --example call_latency -- SOCKET [N]`.
//! Prints p50 / p99 of exists, batch_exists (64) and a 4 KiB get, in µs; `REGOLITH_CLIENT_SPIN_US`
//! compares spin settings (docs/lmcache.md).

use std::time::Instant;

use regolith_client::{Client, ClientConfig, ReplicateConfig};

fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

fn time<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let us = (0..n)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    percentiles(us)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let socket = args.next().ok_or("usage: call_latency SOCKET [N]")?;
    let n: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let c = Client::connect(ClientConfig::new(socket))?;
    let key = format!("call-latency-{}", std::process::id());
    c.put(&key, &vec![7u8; 4096], &ReplicateConfig::default())?;
    let keys: Vec<String> = (0..64).map(|i| format!("{key}-{i}")).collect();
    for k in &keys {
        c.put(k, b"x", &ReplicateConfig::default())?;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (name, (p50, p99)) in [
        ("exists", time(n, || c.exists(&key))),
        ("batch_exists(64)", time(n / 4, || c.batch_exists(&refs))),
        ("get 4KiB", time(n, || c.get(&key))),
    ] {
        println!("{name:<17} p50 {p50:7.1} µs  p99 {p99:7.1} µs");
    }
    c.remove(&key)?;
    c.batch_remove(&refs)?;
    Ok(())
}
