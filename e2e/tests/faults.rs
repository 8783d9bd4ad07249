//! Failure behaviour with real processes: sidecar and client crashes, metad leader loss during
//! puts, corruption, and multi-NIC loss.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regolith_client::{Error, ReplicateConfig};
use regolith_e2e::{metric, rt, value, wait_until, Cluster};
use regolith_proto::metad as mpb;

const CLIENT: &str = env!("CARGO_BIN_EXE_e2e-client");

#[test]
fn sidecar_kill_keeps_replicated_objects_and_never_returns_wrong_bytes() {
    let mut c = Cluster::start_with(&["64MiB", "64MiB", "64MiB"], &["--node-ttl", "3s"], &[]);
    let a = c.client(0);
    let r2 = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["node-a".into(), "node-c".into()],
        ..Default::default()
    };
    let r1 = ReplicateConfig {
        prefer_local: true,
        ..Default::default()
    };
    for i in 0..8 {
        a.put(&format!("r2-{i}"), &value(&format!("r2-{i}"), 300_000), &r2)
            .unwrap();
        a.put(&format!("r1-{i}"), &value(&format!("r1-{i}"), 300_000), &r1)
            .unwrap();
    }
    c.sidecars[0].proc.kill();
    let b = c.client(1);
    for i in 0..8 {
        let k = format!("r2-{i}");
        assert!(
            b.get(&k)
                .unwrap_or_else(|e| panic!("{k} with a replica on node-c: {e}"))
                == value(&k, 300_000)
        );
        let k = format!("r1-{i}");
        match b.get(&k) {
            Ok(v) => panic!("{k} lived only on the killed node, yet a get returned {} bytes (equal to the put: {})", v.len(), v == value(&k, 300_000)),
            Err(e) => assert!(e.is_miss() || matches!(e, Error::Server { .. }), "{k}: {e}"),
        }
    }
    // Past node_ttl the node is declared dead: its sole replicas become clean misses.
    wait_until("node-a declared dead", Duration::from_secs(15), || {
        matches!(b.get("r1-0"), Err(Error::NotFound { .. }))
    });
    let mc = c.metad_client();
    let st = rt().block_on(mc.stats()).unwrap();
    assert!(st.dead_node_dropped_objects >= 8, "{st:?}");
    for i in 0..8 {
        let k = format!("r2-{i}");
        assert!(b.get(&k).unwrap() == value(&k, 300_000));
    }
}

#[test]
fn client_killed_mid_put_leaves_nothing_and_restarted_clients_see_earlier_puts() {
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let sock = c.socket(0).to_str().unwrap().to_string();
    // A worker process puts, then exits; a new process (a restarted worker) gets it.
    let st = Command::new(CLIENT)
        .args(["put", &sock, "kept", "200000"])
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new(CLIENT)
        .args(["get", &sock, "kept", "200000"])
        .status()
        .unwrap();
    assert!(st.success(), "a restarted client lost the cache: {st:?}");
    let sock_b = c.socket(1).to_str().unwrap().to_string();
    assert!(Command::new(CLIENT)
        .args(["get", &sock_b, "kept", "200000"])
        .status()
        .unwrap()
        .success());
    // A client killed in the middle of a put.
    let mut child = Command::new(CLIENT)
        .args(["hang-put", &sock, "torn", "4000000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "reserved");
    let rt = rt();
    let mc = c.metad_client();
    let stats = || rt.block_on(mc.stats()).unwrap();
    assert!(stats().reservations >= 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let a = c.client(0);
    assert!(!a.exists("torn").unwrap(), "a torn put became visible");
    // Its reservation is aborted (quarantined), fenced and released by the owning sidecar.
    wait_until(
        "the torn put's reservation to be released",
        Duration::from_secs(10),
        || {
            let s = stats();
            s.reservations == 0 && s.quarantined == 0
        },
    );
    a.put(
        "torn",
        &value("torn", 4_000_000),
        &ReplicateConfig::default(),
    )
    .unwrap();
    assert!(c.client(1).get("torn").unwrap() == value("torn", 4_000_000));
}

#[test]
fn puts_resume_after_metad_leader_kill_and_every_acked_put_is_readable() {
    let mut c = Cluster::start(&["128MiB", "128MiB"]);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        let a = c.client(0);
        std::thread::spawn(move || {
            let mut i = 0;
            let mut last_err = None;
            while !stop.load(Ordering::Relaxed) {
                let k = format!("stream-{i}");
                match a.put(
                    &k,
                    &value(&k, 64 * 1024 + i),
                    &ReplicateConfig {
                        replica_num: 2,
                        ..Default::default()
                    },
                ) {
                    Ok(_) => acked.lock().unwrap().push((k, 64 * 1024 + i)),
                    Err(e) => last_err = Some(e.to_string()),
                }
                i += 1;
            }
            last_err
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    let leader = c.wait_leader(Duration::from_secs(5));
    let before = acked.lock().unwrap().len();
    c.metad[leader].proc.kill();
    let killed = Instant::now();
    wait_until(
        "puts to resume after the election",
        Duration::from_secs(15),
        || acked.lock().unwrap().len() > before + 5,
    );
    eprintln!(
        "puts resumed {:?} after kill -9 of the leader",
        killed.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join().unwrap();
    let b = c.client(1);
    for (k, len) in acked.lock().unwrap().iter() {
        let got = b
            .get(k)
            .unwrap_or_else(|e| panic!("acknowledged {k} not readable: {e}"));
        assert!(got == value(k, *len), "{k}: wrong bytes");
    }
}

/// Opens a sidecar's segment memfd through /proc (root) to damage stored bytes.
fn segment_file(pid: u32) -> std::fs::File {
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        if target.to_string_lossy().contains("regolith-segment-") {
            return std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(e.path())
                .unwrap();
        }
    }
    panic!("no segment memfd in /proc/{pid}/fd");
}

#[test]
fn corruption_is_a_miss_and_is_counted() {
    use std::os::unix::fs::FileExt;
    let c = Cluster::start(&["64MiB", "64MiB"]);
    let a = c.client(0);
    let v = value("victim", 1 << 20);
    a.put(
        "victim",
        &v,
        &ReplicateConfig {
            prefer_local: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mc = c.metad_client();
    let p = rt().block_on(mc.get("victim", 0)).unwrap();
    let ext = &p.replicas[0].extents[0];
    let f = segment_file(c.sidecars[0].proc.pid().unwrap());
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, ext.offset + 777).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, ext.offset + 777).unwrap();
    let mismatches = |i: usize| {
        metric(
            &c.sidecar_metrics(i),
            "regolith_sidecar_checksum_mismatches_total",
        )
        .unwrap_or(0.0)
    };
    let (a0, b0) = (mismatches(0), mismatches(1));
    // Local reader (copies out of the mapped segment, verifies, reports) and remote reader.
    for (who, client) in [("local", &a), ("remote", &c.client(1))] {
        match client.get("victim") {
            Ok(got) => panic!(
                "{who} get returned {} bytes of a corrupted object (equal: {})",
                got.len(),
                got == v
            ),
            Err(e) => assert!(e.is_miss(), "{who}: {e}"),
        }
    }
    assert!(mismatches(0) > a0, "local mismatch not counted");
    assert!(mismatches(1) > b0, "remote mismatch not counted");
}

#[test]
fn leader_change_mid_put_leaves_no_overlap_and_in_flight_reports_are_adopted() {
    let mut c = Cluster::start(&["512MiB", "512MiB", "512MiB"]);
    let a = c.client(0);
    let big = value("big", 160 << 20);
    let rt = rt();
    let mc = c.metad_client();
    let mut saw_quarantine = false;
    for round in 0..3 {
        let leader = c.wait_leader(Duration::from_secs(15));
        let put = {
            let a = a.clone();
            let big = big.clone();
            let key = format!("big-{round}");
            std::thread::spawn(move || {
                a.put(
                    &key,
                    &big,
                    &ReplicateConfig {
                        replica_num: 2,
                        preferred_segments: vec!["node-b".into(), "node-c".into()],
                        ..Default::default()
                    },
                )
            })
        };
        std::thread::sleep(Duration::from_millis(40));
        c.metad[leader].proc.kill();
        let r = put.join().unwrap();
        eprintln!(
            "round {round}: put during leader kill -> {:?}",
            r.as_ref().map(|_| ())
        );
        // Watch the new leader adopt in-flight reports as quarantined.
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            if let Ok(st) = rt.block_on(mc.stats()) {
                saw_quarantine |= st.quarantined > 0;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // More puts right after the election, then the overlap check.
        for i in 0..20 {
            let k = format!("after-{round}-{i}");
            a.put(
                &k,
                &value(&k, 1 << 20),
                &ReplicateConfig {
                    replica_num: 2,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        assert_no_overlap(&rt, &mc);
        let idx = c.metad.iter().position(|m| m.proc.child.is_none()).unwrap();
        restart_metad(&mut c, idx);
    }
    eprintln!("quarantined in-flight reservations observed: {saw_quarantine}");
}

fn restart_metad(c: &mut Cluster, idx: usize) {
    let launch = c.metad_launch(idx);
    c.spawn_metad(idx, &launch, &[]);
}

/// Invariant 2 from outside: no two live objects share a byte of a segment.
fn assert_no_overlap(rt: &tokio::runtime::Runtime, mc: &regolith_proto::client::MetadClient) {
    let mut keys = Vec::new();
    let mut start = String::new();
    loop {
        let page = rt
            .block_on(mc.list_keys(mpb::ListKeysRequest {
                prefix: String::new(),
                start_after: start.clone(),
                limit: 1000,
            }))
            .unwrap();
        keys.extend(page.keys.into_iter().map(|k| k.key));
        if page.next_start_after.is_empty() {
            break;
        }
        start = page.next_start_after;
    }
    let placements = rt.block_on(mc.batch_get(keys.clone(), 0)).unwrap();
    // (node, generation) -> (offset, len, key) of every extent in that segment.
    type Extents = Vec<(u64, u64, String)>;
    let mut by_seg: BTreeMap<(u64, u64), Extents> = BTreeMap::new();
    for (k, p) in keys.iter().zip(&placements.items) {
        for r in &p.replicas {
            for e in &r.extents {
                by_seg.entry((r.node_id, r.generation)).or_default().push((
                    e.offset,
                    e.offset + e.len,
                    k.clone(),
                ));
            }
        }
    }
    for (seg, mut v) in by_seg {
        v.sort();
        for w in v.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "segment {seg:?}: {} [{}, {}) overlaps {} [{}, {})",
                w[0].2,
                w[0].0,
                w[0].1,
                w[1].2,
                w[1].0,
                w[1].1
            );
        }
    }
}

#[test]
fn a_32mib_transfer_uses_both_nics_and_survives_losing_one() {
    let c = Cluster::start_with(&["256MiB", "256MiB"], &[], &["--test-hooks"]);
    let a = c.client(0);
    let b = c.client(1);
    let v = value("striped", 32 << 20);
    a.put(
        "striped",
        &v,
        &ReplicateConfig {
            prefer_local: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(b.get("striped").unwrap() == v);
    let m = c.sidecar_metrics(1);
    for nic in &c.sidecars[1].nics {
        let got = metric(
            &m,
            &format!("regolith_sidecar_nic_bytes_in{{nic=\"{nic}\"}}"),
        )
        .unwrap_or(0.0);
        assert!(
            got > 1e6,
            "NIC {nic} of node-b carried {got} bytes of a 32 MiB get:\n{m}"
        );
    }
    // Drop one of node-a's addresses while a large get is in flight from node-b.
    let big = value("big-striped", 200 << 20);
    a.put(
        "big-striped",
        &big,
        &ReplicateConfig {
            prefer_local: true,
            ..Default::default()
        },
    )
    .unwrap();
    let getter = {
        let b = b.clone();
        std::thread::spawn(move || b.get("big-striped"))
    };
    std::thread::sleep(Duration::from_millis(30));
    let nic = c.sidecars[0].nics[1].clone();
    let mut s = std::net::TcpStream::connect(&c.sidecars[0].http).unwrap();
    use std::io::{Read, Write};
    write!(s, "POST /debug/close-nic?ip={nic} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let got = getter.join().unwrap().expect("get across the NIC loss");
    assert!(got == big, "bytes differ after losing a NIC mid-transfer");
    // The remaining NIC keeps serving.
    assert!(b.get("striped").unwrap() == v);
}
