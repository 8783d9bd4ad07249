//! The disk tier on a real sidecar (docs/ssd.md): `--disk` directories are opened and
//! reported in `/status` and the metrics, and each disk fails alone (one that cannot be
//! opened, one whose directory disappears, one whose file system turns read-only) while the
//! node keeps serving its memory; objects offloaded to a disk are read locally and remotely
//! and survive a `kill -9`; the warm-restart bench (`disk-restart-bench`) runs and reports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use regolith_client::ReplicateConfig;
use regolith_e2e::{metric, value, wait_until, Cluster};

fn disk_status<'a>(st: &'a serde_json::Value, path: &Path) -> &'a serde_json::Value {
    st["disks"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|d| d["path"].as_str() == Some(path.to_str().unwrap()))
        })
        .unwrap_or_else(|| panic!("no disk {} in /status: {st}", path.display()))
}

fn healthy_metric(c: &Cluster, path: &Path) -> Option<f64> {
    metric(
        &c.sidecar_metrics(0),
        &format!(
            "regolith_sidecar_disk_healthy{{disk=\"{}\"}}",
            path.display()
        ),
    )
}

/// A read-only bind mount of `dir` onto itself (root only; None where mounts are refused).
fn make_read_only(dir: &Path) -> Option<()> {
    let ok = |args: &[&str]| {
        Command::new("mount")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let d = dir.to_str()?;
    (ok(&["--bind", d, d]) && ok(&["-o", "remount,bind,ro", d])).then_some(())
}

#[test]
fn a_sidecars_disks_are_reported_and_each_fails_alone() {
    let mut c = Cluster::start(&["64MiB"]);
    let root = c.dir.path().to_path_buf();
    let good: PathBuf = root.join("disk-good");
    let unlabelled = root.join("disk-unlabelled");
    let vanishing = root.join("disk-vanishing");
    let read_only = root.join("disk-ro");
    std::fs::create_dir_all(&unlabelled).unwrap();
    std::fs::write(unlabelled.join("bucket-000000.rgl"), b"not ours").unwrap();
    c.sidecars[0].proc.kill();
    c.sidecars[0].extra = vec![
        "--disk".into(),
        format!("{}:64MiB", good.display()),
        "--disk".into(),
        unlabelled.display().to_string(),
        "--disk".into(),
        format!("{}:32MiB", vanishing.display()),
        "--disk".into(),
        format!("{}:16MiB", read_only.display()),
    ];
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));

    let st = c.sidecar_status(0);
    assert_eq!(st["disks"].as_array().map(|a| a.len()), Some(4), "{st}");
    let g = disk_status(&st, &good);
    assert_eq!(g["healthy"], true, "{g}");
    assert_eq!(g["capacity_bytes"], 64u64 << 20, "{g}");
    assert_eq!(g["objects"], 0);
    assert!(
        good.join("regolith-disk.json").exists(),
        "the disk is labelled"
    );
    let u = disk_status(&st, &unlabelled);
    assert_eq!(u["healthy"], false, "{u}");
    assert!(
        u["failure"]
            .as_str()
            .unwrap_or("")
            .contains("without a label"),
        "{u}"
    );
    assert_eq!(healthy_metric(&c, &good), Some(1.0));
    assert_eq!(healthy_metric(&c, &unlabelled), Some(0.0));
    assert_eq!(healthy_metric(&c, &vanishing), Some(1.0));

    // A disk whose directory disappears is taken out at the next probe; the others stay.
    std::fs::remove_dir_all(&vanishing).unwrap();
    let ro = make_read_only(&read_only);
    wait_until(
        "the vanished disk taken out",
        Duration::from_secs(20),
        || healthy_metric(&c, &vanishing) == Some(0.0),
    );
    if ro.is_some() {
        wait_until(
            "the read-only disk taken out",
            Duration::from_secs(20),
            || healthy_metric(&c, &read_only) == Some(0.0),
        );
        let st = c.sidecar_status(0);
        let r = disk_status(&st, &read_only);
        assert!(
            r["failure"].as_str().unwrap_or("").contains("read-only"),
            "{r}"
        );
        let _ = Command::new("umount").arg(&read_only).status();
    } else {
        eprintln!("mount refused here: the read-only case is not exercised");
    }
    assert_eq!(healthy_metric(&c, &good), Some(1.0));
    let st = c.sidecar_status(0);
    assert_eq!(disk_status(&st, &good)["healthy"], true);

    // The node still serves its memory.
    let client = c.client(0);
    let v = value("after-disk-failure", 100_000);
    client
        .put("after-disk-failure", &v, &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get("after-disk-failure").unwrap(), v);
    drop(client);

    // And shuts down cleanly on SIGTERM.
    c.sidecars[0].proc.signal(nix::sys::signal::Signal::SIGTERM);
    wait_until("the sidecar to exit", Duration::from_secs(20), || {
        !c.sidecars[0].proc.is_running()
    });
}

fn disk_objects(c: &Cluster, i: usize) -> u64 {
    c.sidecar_status(i)["disks"][0]["objects"]
        .as_u64()
        .unwrap_or(0)
}

/// A working set four times the node's memory, put through another node: above the offload
/// watermark the node copies its least recently used objects to its disk and frees their
/// memory; every object is then read back — through the node that owns the disk (a local disk
/// read) and through the other one (the owner serves the bytes over the data plane) — never
/// other bytes than those put. After a `kill -9` and a restart the node keeps its disk tier:
/// the objects on disk are readable again.
#[test]
fn objects_offloaded_to_disk_are_read_locally_and_remotely_and_survive_a_restart() {
    let mut c = Cluster::start(&["16MiB", "0"]);
    let disk = c.dir.path().join("disk-a");
    c.sidecars[0].proc.kill();
    c.sidecars[0].extra = vec!["--disk".into(), format!("{}:256MiB", disk.display())];
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    let (a, b) = (c.client(0), c.client(1));
    let on_a = ReplicateConfig {
        preferred_segments: vec!["node-a".into()],
        ..Default::default()
    };
    const N: usize = 64;
    const LEN: usize = 1 << 20;
    let key = |i: usize| format!("chunk-{i:03}");
    let mut put_ok = 0;
    for i in 0..N {
        let k = key(i);
        // Paced as a prefill of a few requests a second: offload runs beside the puts.
        for attempt in 0..50 {
            match b.put(&k, &value(&k, LEN), &on_a) {
                Ok(_) => {
                    put_ok += 1;
                    break;
                }
                Err(e) if attempt < 49 => {
                    eprintln!("{k}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{k}: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(120));
    }
    assert_eq!(put_ok, N);
    wait_until("objects on node-a's disk", Duration::from_secs(20), || {
        disk_objects(&c, 0) >= (N as u64) / 2
    });
    let check = |client: &regolith_client::Client, who: &str| -> usize {
        let mut hits = 0;
        for i in 0..N {
            let k = key(i);
            match client.get(&k) {
                Ok(v) => {
                    assert!(v == value(&k, LEN), "{who}: {k}: wrong bytes");
                    hits += 1;
                }
                Err(e) => assert!(e.is_miss(), "{who}: {k}: {e}"),
            }
        }
        hits
    };
    let hits_a = check(&a, "node-a");
    let hits_b = check(&b, "node-b");
    let offloaded = metric(
        &c.sidecar_metrics(0),
        "regolith_sidecar_disk_offloads_total",
    )
    .unwrap_or(0.0);
    eprintln!("hits: node-a {hits_a}/{N}, node-b {hits_b}/{N}; offloaded {offloaded}");
    assert!(hits_a * 100 >= N * 95, "node-a read {hits_a} of {N}");
    assert!(hits_b * 100 >= N * 95, "node-b read {hits_b} of {N}");
    let reads = metric(
        &c.sidecar_metrics(0),
        &format!("regolith_sidecar_disk_reads{{disk=\"{}\"}}", disk.display()),
    )
    .unwrap_or(0.0);
    assert!(reads > 0.0, "no read came from the disk");
    // A removed object's record leaves the disk (the node's watch stream says so).
    let before = disk_objects(&c, 0);
    b.remove(&key(0)).unwrap();
    wait_until(
        "the removed object's record deleted",
        Duration::from_secs(10),
        || disk_objects(&c, 0) + 1 == before,
    );
    let on_disk = disk_objects(&c, 0);
    drop((a, b));

    // kill -9 and restart: the disk tier comes back with the node.
    c.sidecars[0].proc.kill();
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    let st = c.sidecar_status(0);
    assert!(
        disk_objects(&c, 0) + 1 >= on_disk,
        "{on_disk} objects on disk before, after: {st}"
    );
    let b = c.client(1);
    assert!(
        b.get(&key(0)).unwrap_err().is_miss(),
        "a removed key came back"
    );
    let mut back = 0;
    let mut wrong = 0;
    wait_until(
        "disk objects readable again",
        Duration::from_secs(20),
        || {
            back = 0;
            for i in 0..N {
                let k = key(i);
                if let Ok(v) = b.get(&k) {
                    if v == value(&k, LEN) {
                        back += 1;
                    } else {
                        wrong += 1;
                    }
                }
            }
            back as u64 * 100 >= on_disk * 99
        },
    );
    assert_eq!(wrong, 0, "wrong bytes after the restart");
}

/// `disk-restart-bench` (the warm-restart measurement, docs/benchmarks.md) runs on real
/// processes and reports what it measured consistently: the objects on disk at the kill are
/// each read back once after the restart (readable, missing or wrong, never a wrong byte), and
/// the times are in order (socket, first read, serving).
#[test]
fn the_restart_bench_kills_and_restarts_a_node_and_reads_its_disk_back() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_disk-restart-bench"))
        .args([
            "--objects",
            "3000",
            "--segment-size",
            "8MiB",
            "--disk-size",
            "256MiB",
        ])
        .arg("--json")
        .output()
        .expect("run disk-restart-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let n = |f: &str| r[f].as_u64().unwrap_or(u64::MAX);
    let t = |f: &str| r[f].as_f64().unwrap_or(-1.0);
    assert!(n("on_disk") >= 3000, "{r}");
    assert_eq!(
        n("on_disk") + n("in_memory") + n("gone"),
        n("objects"),
        "{r}"
    );
    assert_eq!(
        n("readable") + n("missing") + n("wrong"),
        n("on_disk"),
        "{r}"
    );
    assert_eq!(n("wrong"), 0, "{r}");
    assert!(n("readable") > 0, "{r}");
    assert!(
        (t("readable_fraction") - n("readable") as f64 / n("on_disk") as f64).abs() < 1e-9,
        "{r}"
    );
    assert!(t("socket_s") > 0.0, "{r}");
    assert!(
        t("socket_s") <= t("first_read_s") && t("first_read_s") <= t("serving_s"),
        "{r}"
    );
    assert!(
        r["scan_ms"].is_u64() && r["reconcile_ms"].is_u64(),
        "node-a's log names both: {r}"
    );
}

/// Where metad places `key`: (memory replicas, disk replicas), by node name.
fn tiers_of(c: &Cluster, key: &str) -> (Vec<String>, Vec<String>) {
    let metad = c.metad_client();
    let r = regolith_e2e::rt()
        .block_on(metad.batch_get(vec![key.to_string()], 0))
        .expect("placements");
    let mut mem = Vec::new();
    let mut disk = Vec::new();
    for rep in r
        .items
        .first()
        .map(|p| p.replicas.clone())
        .unwrap_or_default()
    {
        if regolith_proto::disk_tier::is_disk_generation(rep.generation) {
            disk.push(rep.node_name);
        } else {
            mem.push(rep.node_name);
        }
    }
    (mem, disk)
}

/// A node with a 16 MiB segment and a disk, and a consumer node; `N` objects of 1 MiB put on
/// the first through the second, offloaded as memory fills. Answers the cluster and the keys
/// whose objects are on the disk only.
fn offloaded_cluster(metad_extra: &[&str], n: usize) -> (Cluster, PathBuf, Vec<String>) {
    let mut c = Cluster::start_with(&["16MiB", "0"], metad_extra, &[]);
    let disk = c.dir.path().join("disk-a");
    c.sidecars[0].proc.kill();
    c.sidecars[0].extra = vec!["--disk".into(), format!("{}:256MiB", disk.display())];
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    let b = c.client(1);
    let on_a = ReplicateConfig {
        preferred_segments: vec!["node-a".into()],
        ..Default::default()
    };
    for i in 0..n {
        let k = format!("chunk-{i:03}");
        let mut tries = 0;
        while let Err(e) = b.put(&k, &value(&k, 1 << 20), &on_a) {
            tries += 1;
            assert!(tries < 50, "{k}: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut disk_only = Vec::new();
    wait_until(
        "objects only on node-a's disk",
        Duration::from_secs(20),
        || {
            disk_only = (0..n)
                .map(|i| format!("chunk-{i:03}"))
                .filter(|k| {
                    let (mem, disk) = tiers_of(&c, k);
                    mem.is_empty() && disk == ["node-a"]
                })
                .collect();
            disk_only.len() >= 4
        },
    );
    (c, disk, disk_only)
}

/// Promotion on a hit: once the pool has room again, a get of an object held only on disk —
/// through the node that owns the disk or through another — copies it back into the owner's
/// memory, keeping the disk copy; the next reads come from memory, and every read returns the
/// bytes put. Off (`--promote-on-hit=false`), hits stay on disk.
#[test]
fn a_disk_hit_is_promoted_back_to_memory_when_the_pool_has_room() {
    let (c, disk, disk_only) = offloaded_cluster(&[], 20);
    let (a, b) = (c.client(0), c.client(1));
    // Make room: every object still in memory goes.
    for i in 0..20 {
        let k = format!("chunk-{i:03}");
        if !disk_only.contains(&k) {
            // Some may have been evicted already.
            let _ = b.remove(&k);
        }
    }
    let reads = || {
        metric(
            &c.sidecar_metrics(0),
            &format!("regolith_sidecar_disk_reads{{disk=\"{}\"}}", disk.display()),
        )
        .unwrap_or(0.0)
    };
    for (client, who, k) in [(&b, "remote", &disk_only[0]), (&a, "local", &disk_only[1])] {
        // Hits until the pool has room (the removed objects' extents wait for the read
        // leases this test's placement checks took).
        wait_until(
            &format!("{who} hit {k} promoted"),
            Duration::from_secs(15),
            || {
                assert!(client.get(k).unwrap() == value(k, 1 << 20), "{who}: {k}");
                std::thread::sleep(Duration::from_millis(200));
                tiers_of(&c, k) == (vec!["node-a".to_string()], vec!["node-a".to_string()])
            },
        );
        let before = reads();
        for _ in 0..3 {
            assert!(client.get(k).unwrap() == value(k, 1 << 20), "{who}: {k}");
        }
        assert_eq!(
            reads(),
            before,
            "{who}: reads of a promoted object touch no disk"
        );
    }
    let promoted = metric(
        &c.sidecar_metrics(0),
        "regolith_sidecar_disk_promotions_total",
    )
    .unwrap_or(0.0);
    assert!(promoted >= 2.0, "{promoted} promotions");
    drop((a, b, c));

    let (c, disk, disk_only) = offloaded_cluster(&["--promote-on-hit=false"], 20);
    let b = c.client(1);
    for i in 0..20 {
        let k = format!("chunk-{i:03}");
        if !disk_only.contains(&k) {
            // Some may have been evicted already.
            let _ = b.remove(&k);
        }
    }
    let k = &disk_only[0];
    for _ in 0..3 {
        assert!(b.get(k).unwrap() == value(k, 1 << 20));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(tiers_of(&c, k), (vec![], vec!["node-a".to_string()]));
    let reads = metric(
        &c.sidecar_metrics(0),
        &format!("regolith_sidecar_disk_reads{{disk=\"{}\"}}", disk.display()),
    )
    .unwrap_or(0.0);
    assert!(reads >= 3.0, "every hit read the disk: {reads}");
}

/// Write-through (`metad --write-through`): every put also lands on the disk of the node that
/// holds it, its memory copy kept, with no memory pressure at all; after a `kill -9` and a
/// restart of that node (its memory gone) every object is still readable, from the disk.
#[test]
fn write_through_copies_every_put_to_disk_and_a_restart_loses_none() {
    let mut c = Cluster::start_with(&["64MiB", "0"], &["--write-through"], &[]);
    let disk = c.dir.path().join("disk-a");
    c.sidecars[0].proc.kill();
    c.sidecars[0].extra = vec!["--disk".into(), format!("{}:256MiB", disk.display())];
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    let b = c.client(1);
    let on_a = ReplicateConfig {
        preferred_segments: vec!["node-a".into()],
        ..Default::default()
    };
    const N: usize = 8;
    let key = |i: usize| format!("wt-{i}");
    // The heartbeat that reports the disk comes before any copy can be ordered.
    wait_until("node-a's disk reported", Duration::from_secs(10), || {
        c.sidecar_status(0)["disks"][0]["healthy"] == true
    });
    std::thread::sleep(Duration::from_millis(1500));
    for i in 0..N {
        b.put(&key(i), &value(&key(i), 256 << 10), &on_a).unwrap();
    }
    wait_until("every put copied to disk", Duration::from_secs(15), || {
        (0..N).all(|i| {
            tiers_of(&c, &key(i)) == (vec!["node-a".to_string()], vec!["node-a".to_string()])
        })
    });
    assert_eq!(disk_objects(&c, 0), N as u64);
    drop(b);
    c.sidecars[0].proc.kill();
    c.start_sidecar(0);
    c.wait_sidecar(0, Duration::from_secs(20));
    let b = c.client(1);
    wait_until(
        "every object readable after the restart",
        Duration::from_secs(20),
        || (0..N).all(|i| b.get(&key(i)).is_ok_and(|v| v == value(&key(i), 256 << 10))),
    );
}

/// An in-place upgrade (`--takeover`) carries the disks: the successor opens them once its
/// predecessor let go, and every object that was only on disk is still there and readable.
#[test]
fn an_upgrade_in_place_keeps_the_disk_tier() {
    let (mut c, _disk, disk_only) = offloaded_cluster(&["--promote-on-hit=false"], 20);
    let before = disk_objects(&c, 0);
    let old_instance = c.sidecar_status(0)["instance_id"].clone();
    let mut old = c.upgrade_sidecar(0, &[]);
    let end = std::time::Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(st) = old.child.as_mut().and_then(|ch| ch.try_wait().unwrap()) {
            break st;
        }
        assert!(
            std::time::Instant::now() < end,
            "the old sidecar did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "the old sidecar exits 0 once it handed over: {status:?}"
    );
    wait_until(
        "the successor serves its disk",
        Duration::from_secs(20),
        || {
            let st = c.sidecar_status(0);
            st["instance_id"] != old_instance && st["disks"][0]["healthy"] == true
        },
    );
    assert!(
        disk_objects(&c, 0) >= before,
        "{before} objects on disk before the upgrade, {} after",
        disk_objects(&c, 0)
    );
    let b = c.client(1);
    for k in &disk_only {
        assert!(
            b.get(k).unwrap() == value(k, 1 << 20),
            "{k} after the upgrade"
        );
        assert_eq!(tiers_of(&c, k), (vec![], vec!["node-a".to_string()]), "{k}");
    }
}
