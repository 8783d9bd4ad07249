//! Metadata at the node (design §5), with real processes: the sidecar's index answers exists
//! and gets, a put is visible through its own sidecar at once, a read that races the reuse of
//! its extent is a miss or the right bytes, a leader change resumes the index without a full
//! resync, and the index of a sidecar restarted under load converges.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regolith_client::{Client, Error, ReplicateConfig};
use regolith_e2e::{http_post, metric, rt, value, wait_until, Cluster};

fn sidecar_metric(c: &Cluster, i: usize, name: &str) -> f64 {
    metric(&c.sidecar_metrics(i), name).unwrap_or(0.0)
}

fn wait_synced(c: &Cluster, i: usize) {
    wait_until(
        &format!("sidecar {i}'s index to sync"),
        Duration::from_secs(15),
        || sidecar_metric(c, i, "regolith_sidecar_index_synced ") == 1.0,
    );
}

fn on(node: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![node.into()],
        ..Default::default()
    }
}

const EXISTS_BY_INDEX: &str =
    "regolith_sidecar_index_answers_total{op=\"exists\",source=\"index\"}";
const EXISTS_BY_METAD: &str =
    "regolith_sidecar_index_answers_total{op=\"exists\",source=\"metad\"}";
const GETS_BY_INDEX: &str = "regolith_sidecar_index_answers_total{op=\"get\",source=\"index\"}";

#[test]
fn exists_and_gets_come_from_the_index_and_a_put_is_visible_through_its_own_sidecar_at_once() {
    let c = Cluster::start_with(&["64MiB", "64MiB"], &[], &["--index"]);
    wait_synced(&c, 0);
    wait_synced(&c, 1);
    let (a, b) = (c.client(0), c.client(1));
    // Read-your-writes through one sidecar: each answer comes right after the acknowledgement,
    // long before the stream could be relied on, over and over.
    for i in 0..40 {
        let k = format!("ryw-{i}");
        a.put(&k, &value(&k, 4096), &on("node-b")).unwrap();
        assert!(a.exists(&k).unwrap(), "{k} not visible after its put");
        assert!(a.get(&k).unwrap() == value(&k, 4096), "{k}: wrong bytes");
        a.remove(&k).unwrap();
        assert!(!a.exists(&k).unwrap(), "{k} still visible after its remove");
        assert!(
            a.get(&k).unwrap_err().is_miss(),
            "{k}: a get after the remove"
        );
    }
    // Present keys are answered by the index; an absent one asks the leader (a put made
    // through another node is never missed).
    let by_index = sidecar_metric(&c, 0, EXISTS_BY_INDEX);
    let by_metad = sidecar_metric(&c, 0, EXISTS_BY_METAD);
    assert!(by_index >= 40.0, "exists answered by the index: {by_index}");
    assert!(by_metad >= 40.0, "absent keys asked of metad: {by_metad}");
    // Another node sees a put once its stream brings it, and reads it without metad.
    a.put("shared", &value("shared", 300_000), &on("node-a"))
        .unwrap();
    wait_indexed(&c, 1, &b, "shared");
    let gets_before = sidecar_metric(&c, 1, GETS_BY_INDEX);
    for _ in 0..5 {
        assert!(b.get("shared").unwrap() == value("shared", 300_000));
    }
    assert_eq!(sidecar_metric(&c, 1, GETS_BY_INDEX), gets_before + 5.0);
    // The leader still sees those reads (eviction's recency): they are reported with the
    // heartbeats.
    let leader = c.wait_leader(Duration::from_secs(5));
    wait_until(
        "accesses reported to the leader",
        Duration::from_secs(5),
        || {
            let text = regolith_e2e::http_get(&c.metad[leader].http, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            metric(&text, "regolith_metad_accesses_reported_total").unwrap_or(0.0) >= 1.0
        },
    );
    // A batch: its present key from the index, its absent ones in one call to the leader.
    let (index_before, metad_before) = (
        sidecar_metric(&c, 1, EXISTS_BY_INDEX),
        sidecar_metric(&c, 1, EXISTS_BY_METAD),
    );
    let keys: Vec<String> = (0..64).map(|i| format!("absent-{i}")).collect();
    let mut refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    refs.push("shared");
    let found = b.batch_exists(&refs).unwrap();
    assert_eq!(found.iter().filter(|x| **x).count(), 1);
    assert!(found[64]);
    assert_eq!(sidecar_metric(&c, 1, EXISTS_BY_INDEX), index_before + 1.0);
    assert_eq!(sidecar_metric(&c, 1, EXISTS_BY_METAD), metad_before + 64.0);
}

/// Waits until sidecar `i`'s index itself holds `key` (an exists of a key the index lacks is
/// asked of the leader, so the answer alone does not say).
fn wait_indexed(c: &Cluster, i: usize, client: &Client, key: &str) {
    wait_until(
        &format!("sidecar {i}'s index to hold {key}"),
        Duration::from_secs(5),
        || {
            let before = sidecar_metric(c, i, EXISTS_BY_INDEX);
            client.exists(key).unwrap() && sidecar_metric(c, i, EXISTS_BY_INDEX) > before
        },
    );
}

/// Freezes sidecar `i`'s index: it keeps answering from what it has while metad moves on.
fn freeze(c: &Cluster, i: usize, frozen: bool) {
    let q = if frozen { "on=1" } else { "on=0" };
    let (code, body) =
        http_post(&c.sidecars[i].http, &format!("/debug/freeze-index?{q}")).expect("test hook");
    assert_eq!(code, 200, "{body}");
}

/// Thaws sidecar `i`'s index and waits for the resync that follows.
fn thaw(c: &Cluster, i: usize) {
    let resyncs = sidecar_metric(c, i, "regolith_sidecar_index_resyncs_total");
    freeze(c, i, false);
    wait_until(
        "the thawed index to resync",
        Duration::from_secs(10),
        || {
            sidecar_metric(c, i, "regolith_sidecar_index_resyncs_total") > resyncs
                && sidecar_metric(c, i, "regolith_sidecar_index_synced ") == 1.0
        },
    );
}

/// The extents of `key`'s replica on `node`, from metad.
fn extents_on(c: &Cluster, key: &str, node: &str) -> Vec<(u64, u64)> {
    let p = rt().block_on(c.metad_client().get(key, 0)).unwrap();
    p.replicas
        .iter()
        .filter(|r| r.node_name == node)
        .flat_map(|r| r.extents.iter().map(|e| (e.offset, e.offset + e.len)))
        .collect()
}

fn overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.0 < y.1 && y.0 < x.1))
}

/// Puts `victim`, lets `reader`'s index learn it, freezes that index, then removes the victim
/// and puts `thief` into the same bytes of `node`'s segment.
fn stale_placement(
    c: &Cluster,
    writer: &Client,
    reader: usize,
    node: &str,
    victim: &str,
    thief: &str,
) {
    writer
        .put(victim, &value(victim, 256 * 1024), &on(node))
        .unwrap();
    let r = c.client(reader);
    wait_indexed(c, reader, &r, victim);
    let old = extents_on(c, victim, node);
    freeze(c, reader, true);
    writer.remove(victim).unwrap();
    // Reading the extents took a read lease (the cluster's is short): let it end so the space
    // is free to reuse.
    std::thread::sleep(Duration::from_millis(400));
    writer
        .put(thief, &value(thief, 256 * 1024), &on(node))
        .unwrap();
    let new = extents_on(c, thief, node);
    assert!(
        overlap(&old, &new),
        "the test needs the thief in the victim's space: {old:?} vs {new:?}"
    );
}

#[test]
fn a_read_racing_the_reuse_of_its_extent_returns_a_miss_or_the_right_bytes_never_others() {
    let c = Cluster::start_with(
        &["16MiB", "16MiB"],
        &["--lease-ttl", "200ms"],
        &["--test-hooks", "--index"],
    );
    wait_synced(&c, 0);
    wait_synced(&c, 1);
    let a = c.client(0);
    let b = c.client(1);
    // Remote: node-b's index still points at node-a's bytes, which now hold the thief.
    stale_placement(&c, &a, 1, "node-a", "victim", "thief");
    assert!(b.exists("victim").unwrap(), "the frozen index is stale");
    match b.get("victim") {
        Err(Error::NotFound { .. }) => {}
        Ok(v) => panic!(
            "a removed key whose space was reused returned {} bytes (the thief's: {})",
            v.len(),
            v == value("thief", 256 * 1024)
        ),
        Err(e) => panic!("expected a miss: {e}"),
    }
    // The key put again (another version, in the same space): the right bytes, never the
    // thief's.
    a.remove("thief").unwrap();
    let v2 = value("victim-v2", 256 * 1024);
    a.put("victim", &v2, &on("node-a")).unwrap();
    assert!(b.get("victim").unwrap() == v2);
    // Local: node-b's own segment, copied by its client out of the mapping.
    thaw(&c, 1);
    stale_placement(&c, &a, 1, "node-b", "local-victim", "local-thief");
    match b.get("local-victim") {
        Err(Error::NotFound { .. }) => {}
        Ok(v) => panic!(
            "a local read of reused space returned {} bytes (the thief's: {})",
            v.len(),
            v == value("local-thief", 256 * 1024)
        ),
        Err(e) => panic!("expected a miss: {e}"),
    }
    let stale = sidecar_metric(
        &c,
        1,
        "regolith_sidecar_index_stale_reads_total{where=\"read\"}",
    ) + sidecar_metric(
        &c,
        1,
        "regolith_sidecar_index_stale_reads_total{where=\"client\"}",
    );
    // The remote read of the victim (dropped from the index then: the v2 read asked the
    // leader) and the client's local copy.
    let shown: Vec<String> = c
        .sidecar_metrics(1)
        .lines()
        .filter(|l| l.contains("index_") && !l.starts_with('#'))
        .map(String::from)
        .collect();
    assert!(stale >= 2.0, "stale reads counted: {stale}: {shown:#?}");
    assert_eq!(
        sidecar_metric(&c, 1, "regolith_sidecar_checksum_mismatches_total"),
        0.0,
        "a reused extent is not corruption"
    );
    // Thawed, the index resyncs and is right again.
    thaw(&c, 1);
    assert!(!b.exists("local-victim").unwrap());
    assert!(b.exists("local-thief").unwrap());
}

#[test]
fn a_sidecar_resumes_its_index_after_a_leader_change_without_a_full_resync() {
    let mut c = Cluster::start_with(&["64MiB", "64MiB"], &[], &["--index"]);
    wait_synced(&c, 1);
    let a = c.client(0);
    let b = c.client(1);
    for i in 0..20 {
        a.put(&format!("before-{i}"), &value("x", 1000), &on("node-a"))
            .unwrap();
    }
    wait_indexed(&c, 1, &b, "before-19");
    let resyncs = sidecar_metric(&c, 1, "regolith_sidecar_index_resyncs_total");
    let opened = sidecar_metric(&c, 1, "regolith_sidecar_index_reconnects_total");
    let leader = c.wait_leader(Duration::from_secs(5));
    c.metad[leader].proc.kill();
    c.wait_leader(Duration::from_secs(20));
    for i in 0..20 {
        let k = format!("after-{i}");
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            match a.put(&k, &value("y", 1000), &on("node-a")) {
                Ok(_) => break,
                Err(e) if Instant::now() < end => {
                    eprintln!("{k}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{k}: {e}"),
            }
        }
    }
    wait_until(
        "node-b to index the puts after the election",
        Duration::from_secs(10),
        || {
            b.batch_exists(
                &(0..20)
                    .map(|i| format!("after-{i}"))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            )
            .unwrap()
            .iter()
            .all(|x| *x)
                && sidecar_metric(&c, 1, "regolith_sidecar_index_synced ") == 1.0
                && sidecar_metric(&c, 1, "regolith_sidecar_index_objects ") == 40.0
        },
    );
    assert!(b.exists("before-0").unwrap());
    assert!(
        sidecar_metric(&c, 1, "regolith_sidecar_index_reconnects_total") > opened,
        "the stream was opened again with the new leader"
    );
    assert_eq!(
        sidecar_metric(&c, 1, "regolith_sidecar_index_resyncs_total"),
        resyncs,
        "the new leader resumed the stream where it was"
    );
}

#[test]
fn the_index_of_a_sidecar_restarted_under_load_converges() {
    let mut c = Cluster::start_with(&["64MiB", "64MiB"], &[], &["--index"]);
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        let a = c.client(0);
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let k = format!("load-{i}");
                if a.put(&k, &value(&k, 2048), &on("node-a")).is_ok() {
                    acked.lock().unwrap().push(k.clone());
                }
                // Some churn: the index must follow removals too.
                if i % 5 == 4 {
                    let gone = format!("load-{}", i - 2);
                    if a.remove(&gone).is_ok() {
                        acked.lock().unwrap().retain(|x| *x != gone);
                    }
                }
                i += 1;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    c.sidecars[1].proc.kill();
    std::thread::sleep(Duration::from_millis(300));
    c.start_sidecar(1);
    c.wait_sidecar(1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let keys = rt().block_on(c.metad_client().stats()).unwrap().keys;
    wait_until(
        "node-b's index to hold every key",
        Duration::from_secs(10),
        || {
            sidecar_metric(&c, 1, "regolith_sidecar_index_objects ") as u64 == keys
                && sidecar_metric(&c, 1, "regolith_sidecar_index_synced ") == 1.0
        },
    );
    let b = c.client(1);
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 20, "only {} puts under load", acked.len());
    let refs: Vec<&str> = acked.iter().map(String::as_str).collect();
    for chunk in refs.chunks(1000) {
        assert!(b.batch_exists(chunk).unwrap().iter().all(|x| *x));
    }
}

#[test]
fn a_leader_serving_watch_streams_stops_promptly_on_sigterm() {
    let mut c = Cluster::start_with(&["16MiB", "16MiB"], &[], &["--index"]);
    wait_synced(&c, 0);
    wait_synced(&c, 1);
    let leader = c.wait_leader(Duration::from_secs(5));
    let text = regolith_e2e::http_get(&c.metad[leader].http, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert_eq!(metric(&text, "regolith_metad_watch_streams "), Some(2.0));
    let asked = Instant::now();
    c.metad[leader]
        .proc
        .signal(nix::sys::signal::Signal::SIGTERM);
    wait_until("the leader to exit", Duration::from_secs(10), || {
        !c.metad[leader].proc.is_running()
    });
    eprintln!("stopped {:?} after SIGTERM", asked.elapsed());
    // The sidecars follow the new leader.
    c.wait_leader(Duration::from_secs(20));
    wait_synced(&c, 1);
}

#[test]
fn a_leader_cut_off_from_its_quorum_stops_its_watchers_answering_from_their_copies() {
    use nix::sys::signal::Signal;
    let c = Cluster::start_with(&["16MiB", "16MiB"], &[], &["--index"]);
    wait_synced(&c, 0);
    wait_synced(&c, 1);
    let (a, b) = (c.client(0), c.client(1));
    a.put("k", &value("k", 4096), &on("node-a")).unwrap();
    wait_indexed(&c, 1, &b, "k");
    let leader = c.wait_leader(Duration::from_secs(5));
    let followers: Vec<usize> = (0..c.metad.len()).filter(|i| *i != leader).collect();
    // The leader's process lives on, still streaming to its watchers, but can no longer
    // confirm that it leads: its watchers' copies must stop answering (a new leader elsewhere
    // could be acknowledging removes they would never see).
    for &f in &followers {
        c.metad[f].proc.signal(Signal::SIGSTOP);
    }
    let cut = Instant::now();
    wait_until(
        "node-b's index to stop answering",
        Duration::from_secs(8),
        || sidecar_metric(&c, 1, "regolith_sidecar_index_synced ") == 0.0,
    );
    eprintln!(
        "the index stopped answering {:?} after the cut",
        cut.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        sidecar_metric(&c, 1, "regolith_sidecar_index_synced "),
        0.0,
        "an unconfirmed leader's stream turned the index back on"
    );
    for &f in &followers {
        c.metad[f].proc.signal(Signal::SIGCONT);
    }
    wait_synced(&c, 1);
    assert!(b.exists("k").unwrap());
}
