//! Backup and restore with the whole stack (docs/metad.md "Backup and recovery"): objects put
//! through sidecars, a snapshot saved with the `regolith` CLI, the whole metad cluster lost with
//! its data, a new one restored from the file at the same addresses. The sidecars, never
//! restarted, keep their segments (same node ids and generations), so every object of the
//! snapshot is read back with its bytes; what was written after the save is gone, and new puts
//! work.

use std::process::Command;
use std::time::Duration;

use regolith_client::{Error, ReplicateConfig};
use regolith_e2e::{regolith_bin, rt, value, wait_until, Cluster};
use regolith_proto::launch::MetadLaunch;

const SIZE: usize = 200_000;

#[test]
fn restored_metad_cluster_serves_what_the_surviving_sidecars_hold() {
    let ttl = ["--node-ttl", "4s"];
    let mut c = Cluster::start_with(&["64MiB", "64MiB"], &ttl, &[]);
    let a = c.client(0);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let keys: Vec<String> = (0..12).map(|i| format!("chunk-{i}")).collect();
    for k in &keys {
        a.put(k, &value(k, SIZE), &two).unwrap();
    }
    // One runtime: a client's connections live on the runtime that made them.
    let rt = rt();
    let mc = c.metad_client();
    rt.block_on(mc.meta_put("mooncake/ram/node-a", b"{\"segment\":1}".to_vec()))
        .unwrap();
    let term_before = rt.block_on(mc.stats()).unwrap().term;

    let file = c.dir.path().join("metad.snap");
    let st = Command::new(regolith_bin())
        .args(["--metad", &c.metad_addrs(), "--cluster-token-file"])
        .arg(&c.token_file)
        .args(["metad", "snapshot", "save"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(st.success(), "snapshot save: {st:?}");
    a.put("after-save", &value("after-save", SIZE), &two)
        .unwrap();

    // The whole metad cluster is lost, data and all.
    for m in &mut c.metad {
        m.proc.kill();
        std::fs::remove_dir_all(&m.dir).unwrap();
    }
    // A new one at the same addresses, every initial member restored from the file.
    let peers: Vec<(u64, String)> = c.metad.iter().map(|m| (m.id, m.grpc.clone())).collect();
    for i in 0..c.metad.len() {
        let mut extra: Vec<std::ffi::OsString> = vec!["--restore-from".into(), file.clone().into()];
        extra.extend(ttl.iter().map(Into::into));
        let launch = MetadLaunch {
            peers: peers.clone(),
            bootstrap: true,
            extra,
            ..c.metad_launch(i)
        };
        c.spawn_metad(i, &launch, &[("RUST_LOG", "info,regolith_metad=debug")]);
    }
    c.wait_leader(Duration::from_secs(20));
    let b = c.client(1);
    wait_until(
        "gets served by the restored cluster",
        Duration::from_secs(30),
        || b.get(&keys[0]).is_ok(),
    );
    // Past node_ttl: the sidecars heartbeat the new cluster with their old ids and
    // generations, so no segment was declared dead and nothing was dropped.
    std::thread::sleep(Duration::from_secs(5));
    let mc = c.metad_client();
    let st = rt.block_on(mc.stats()).unwrap();
    assert_eq!(st.dead_node_dropped_objects, 0, "{st:?}");
    assert_eq!(st.segments, 2, "{st:?}");
    assert!(st.term > term_before, "{st:?}");
    for k in &keys {
        for client in [&a, &b] {
            let got = client.get(k).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert!(got == value(k, SIZE), "{k}: wrong bytes");
        }
    }
    match b.get("after-save") {
        Err(Error::NotFound { .. }) => {}
        other => panic!(
            "a key put after the save came back: {:?}",
            other.map(|v| v.len())
        ),
    }
    assert_eq!(
        rt.block_on(mc.meta_get("mooncake/ram/node-a"))
            .unwrap()
            .as_deref(),
        Some(&b"{\"segment\":1}"[..])
    );
    // New puts go through, into the space the lost key held among others.
    for i in 0..6 {
        let k = format!("new-{i}");
        b.put(&k, &value(&k, SIZE), &two).unwrap();
        assert!(a.get(&k).unwrap() == value(&k, SIZE));
    }
    for k in &keys {
        assert!(a.get(k).unwrap() == value(k, SIZE), "{k} after new puts");
    }
}
