//! The disk tier's warm restart, measured on real processes (docs/ssd.md, "Warm restart";
//! docs/benchmarks.md): a loopback cluster (3 metad replicas, `node-a` with a small memory
//! segment and a disk, `node-b` with no memory, the client's node), small objects put through
//! node-b onto node-a until `--objects` of them are on node-a's disk (paced below metad's
//! eviction watermark, so offload moves them to the disk rather than eviction dropping them;
//! the last ones put stay in memory), then `kill -9` of node-a and a
//! restart with the same flags. Reported: the objects only on disk before the kill, the time
//! from the restart to node-a's socket accepting clients, to the first disk object read back,
//! and to "serving" (a random sample of 256 disk objects all read back byte-exact through
//! node-b), then every disk object read back once: the fraction readable, wrong reads (any
//! byte other than the object's), and what node-a's log says its scan and reconciliation took.
//!
//! `cargo run --release -p regolith-e2e --bin disk-restart-bench -- [--objects 100000]
//! [--object-size 4096] [--segment-size 16MiB] [--disk-size 2GiB] [--json]`; it uses the
//! `regolith-metad` and `regolith-sidecar` beside it (`target/<profile>`, or
//! `$REGOLITH_BIN_DIR`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use regolith_client::{Client, Dest, ReplicateConfig, Source};
use regolith_e2e::{rt, value, Cluster};
use regolith_proto::disk_tier::is_disk_generation;
use serde::Serialize;

struct Args {
    objects: u64,
    object_size: usize,
    segment_size: String,
    disk_size: String,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        objects: 100_000,
        object_size: 4096,
        segment_size: "16MiB".into(),
        disk_size: "2GiB".into(),
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--objects" => a.objects = val()?.parse().map_err(|e| format!("--objects: {e}"))?,
            "--object-size" => {
                a.object_size = val()?.parse().map_err(|e| format!("--object-size: {e}"))?
            }
            "--segment-size" => a.segment_size = val()?,
            "--disk-size" => a.disk_size = val()?,
            "--json" => a.json = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.objects == 0 || a.object_size == 0 {
        return Err("--objects and --object-size must be above 0".into());
    }
    Ok(a)
}

#[derive(Serialize, Debug)]
struct Report {
    /// Objects put (until `--objects` were on the disk).
    objects: u64,
    object_size: usize,
    put_seconds: f64,
    /// Objects whose only replica was on node-a's disk when it was killed.
    on_disk: u64,
    /// Objects still in node-a's memory (lost with it) or gone (evicted) at the kill.
    in_memory: u64,
    gone: u64,
    /// From the restart (the process spawned) on.
    socket_s: f64,
    first_read_s: f64,
    serving_s: f64,
    /// Every disk object read once after serving: readable byte-exact, missing, wrong bytes.
    readable: u64,
    missing: u64,
    wrong: u64,
    readable_fraction: f64,
    read_all_seconds: f64,
    /// From node-a's log: its disk scan, and the inventory reconciliation with metad.
    scan_ms: Option<u64>,
    reconcile_ms: Option<u64>,
}

fn key(i: u64) -> String {
    format!("restart/{i:07}")
}

/// Pool use as metad counts it, through node-b's `STATS`.
fn pool_use(c: &Client) -> f64 {
    c.stats()
        .ok()
        .filter(|s| s.bytes_total > 0)
        .map_or(1.0, |s| s.bytes_used as f64 / s.bytes_total as f64)
}

/// Puts every object through node-b onto node-a in batches of 64, waiting whenever the pool is
/// above 0.85 (offload runs above 0.8, eviction above 0.9) and putting again what failed.
fn put_range(b: &Client, a: &Args, from: u64, to: u64) -> Result<(), String> {
    let cfg = ReplicateConfig {
        preferred_segments: vec!["node-a".into()],
        ..Default::default()
    };
    let mut next = from;
    let mut retry: Vec<u64> = Vec::new();
    let mut stalled_since = Instant::now();
    while next < to || !retry.is_empty() {
        if pool_use(b) > 0.85 {
            if stalled_since.elapsed() > Duration::from_secs(120) {
                return Err("the pool stayed above 0.85 for 120 s: offload stalled".into());
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        stalled_since = Instant::now();
        let mut batch: Vec<u64> = retry.drain(..retry.len().min(64)).collect();
        while batch.len() < 64 && next < to {
            batch.push(next);
            next += 1;
        }
        let keys: Vec<String> = batch.iter().map(|i| key(*i)).collect();
        let vals: Vec<Vec<u8>> = keys.iter().map(|k| value(k, a.object_size)).collect();
        let items: Vec<(&str, Source)> = keys
            .iter()
            .zip(&vals)
            .map(|(k, v)| (k.as_str(), Source::Bytes(v)))
            .collect();
        for (i, r) in batch.iter().zip(b.batch_put_from(&items, &cfg)) {
            if r.is_err() {
                retry.push(*i);
            }
        }
        if !retry.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Objects on node-a's disk, once offload has settled (the count still for 3 s).
fn settled_disk_objects(c: &Cluster) -> u64 {
    let count = || {
        c.sidecar_status(0)["disks"][0]["objects"]
            .as_u64()
            .unwrap_or(0)
    };
    let mut last = (count(), Instant::now());
    while last.1.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(250));
        let now = count();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    last.0
}

/// Puts objects until `--objects` of them are on node-a's disk; answers how many were put.
fn fill_disk(c: &Cluster, b: &Client, a: &Args) -> Result<u64, String> {
    let mut put = 0;
    let mut on_disk = 0;
    for _ in 0..10 {
        let more = a.objects - on_disk + if put == 0 { 0 } else { 64 };
        put_range(b, a, put, put + more)?;
        put += more;
        on_disk = settled_disk_objects(c);
        if on_disk >= a.objects {
            return Ok(put);
        }
    }
    Err(format!(
        "only {on_disk} objects on the disk after {put} puts"
    ))
}

/// The keys only on a disk of node-a, per metad's placements (1000 per call).
fn disk_only(c: &Cluster, n: u64) -> (Vec<String>, u64, u64) {
    let rt = rt();
    let metad = c.metad_client();
    let (mut on_disk, mut in_memory, mut gone) = (Vec::new(), 0, 0);
    let keys: Vec<String> = (0..n).map(key).collect();
    for chunk in keys.chunks(1000) {
        let Ok(r) = rt.block_on(metad.batch_get(chunk.to_vec(), 0)) else {
            gone += chunk.len() as u64;
            continue;
        };
        for (k, p) in chunk
            .iter()
            .zip(r.items.iter().map(Some).chain(std::iter::repeat(None)))
        {
            let reps = p.map(|p| p.replicas.as_slice()).unwrap_or(&[]);
            if reps.is_empty() {
                gone += 1;
            } else if reps
                .iter()
                .all(|x| is_disk_generation(x.generation) && x.node_name == "node-a")
            {
                on_disk.push(k.clone());
            } else {
                in_memory += 1;
            }
        }
    }
    (on_disk, in_memory, gone)
}

/// Reads `keys` through `b` (batches of 64 into one registered buffer): (readable, missing,
/// wrong).
fn read_all(b: &Client, keys: &[String], size: usize) -> (u64, u64, u64) {
    let Ok(buf) = b.alloc_buffer(64 * size) else {
        return (0, keys.len() as u64, 0);
    };
    let (mut ok, mut missing, mut wrong) = (0, 0, 0);
    let mut scratch = vec![0u8; size];
    for chunk in keys.chunks(64) {
        let items: Vec<(&str, Dest)> = chunk
            .iter()
            .enumerate()
            .map(|(j, k)| {
                (
                    k.as_str(),
                    Dest::Shm {
                        buf: &buf,
                        offset: j * size,
                        len: size,
                    },
                )
            })
            .collect();
        for (j, (k, r)) in chunk.iter().zip(b.batch_get_into(items)).enumerate() {
            match r {
                Ok(_) if buf.read(j * size, &mut scratch).is_ok() && scratch == value(k, size) => {
                    ok += 1
                }
                Ok(_) => wrong += 1,
                Err(_) => missing += 1,
            }
        }
    }
    let _ = b.free_buffer(&buf);
    (ok, missing, wrong)
}

/// `name=N` of the last log line of node-a that says `what`.
fn log_field(log: &str, what: &str, name: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find(|l| l.contains(what))?
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}="))?.parse().ok())
}

fn measure(a: &Args) -> Result<Report, String> {
    let mut c = Cluster::start(&[&a.segment_size, "0"]);
    let disk = c.dir.path().join("node-a-disk");
    c.sidecars[0].proc.kill();
    c.sidecars[0].extra = vec![
        "--disk".into(),
        format!("{}:{}", disk.display(), a.disk_size),
    ];
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(30));
    let b = c.client(1);
    eprintln!(
        "putting objects of {} bytes through node-b onto node-a until {} are on its disk...",
        a.object_size, a.objects
    );
    let start = Instant::now();
    let put = fill_disk(&c, &b, a)?;
    let put_seconds = start.elapsed().as_secs_f64();
    let (on_disk, in_memory, gone) = disk_only(&c, put);
    eprintln!(
        "put in {put_seconds:.1} s: {} only on disk, {in_memory} in memory, {gone} gone; kill -9 node-a and restart",
        on_disk.len()
    );
    if on_disk.is_empty() {
        return Err("no object reached the disk".into());
    }
    let log_before = std::fs::read_to_string(&c.sidecars[0].proc.log)
        .unwrap_or_default()
        .len();
    c.sidecars[0].proc.kill();
    let t0 = Instant::now();
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(60));
    let socket_s = t0.elapsed().as_secs_f64();
    let mut sample: Vec<String> = on_disk.clone();
    sample.shuffle(&mut rand::thread_rng());
    sample.truncate(256);
    let mut first_read_s = None;
    let serving_s = loop {
        let (ok, _, wrong) = read_all(&b, &sample, a.object_size);
        if wrong > 0 {
            return Err(format!("{wrong} wrong reads after the restart"));
        }
        if ok > 0 && first_read_s.is_none() {
            first_read_s = Some(t0.elapsed().as_secs_f64());
        }
        if ok as usize == sample.len() {
            break t0.elapsed().as_secs_f64();
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "only {ok} of {} sampled objects readable after 120 s",
                sample.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let t1 = Instant::now();
    let (readable, missing, wrong) = read_all(&b, &on_disk, a.object_size);
    let read_all_seconds = t1.elapsed().as_secs_f64();
    let log = std::fs::read_to_string(&c.sidecars[0].proc.log).unwrap_or_default();
    let after = log.get(log_before..).unwrap_or("");
    Ok(Report {
        objects: put,
        object_size: a.object_size,
        put_seconds,
        on_disk: on_disk.len() as u64,
        in_memory,
        gone,
        socket_s,
        first_read_s: first_read_s.unwrap_or(serving_s),
        serving_s,
        readable,
        missing,
        wrong,
        readable_fraction: readable as f64 / on_disk.len() as f64,
        read_all_seconds,
        scan_ms: log_field(after, "disk opened", "scan_ms"),
        reconcile_ms: log_field(after, "reconciled with metad", "ms"),
    })
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("disk-restart-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match measure(&a) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("disk-restart-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "restart with {} objects on disk: socket after {:.2} s, first disk read {:.2} s, serving (256 sampled all read back) {:.2} s; readable {} of {} ({:.4}), {} missing, {} wrong (read back in {:.1} s); node-a's scan {} ms, reconciliation {} ms",
        r.on_disk,
        r.socket_s,
        r.first_read_s,
        r.serving_s,
        r.readable,
        r.on_disk,
        r.readable_fraction,
        r.missing,
        r.wrong,
        r.read_all_seconds,
        r.scan_ms.map_or("?".into(), |v| v.to_string()),
        r.reconcile_ms.map_or("?".into(), |v| v.to_string()),
    );
    if a.json {
        match serde_json::to_string(&r) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("disk-restart-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if r.wrong > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
