//! Puts through one sidecar, gets through another: real metad and sidecar processes.

use std::time::Duration;

use regolith_client::{Dest, ReplicateConfig, Source};
use regolith_e2e::{value, Cluster};

#[test]
fn put_on_a_get_on_b_byte_exact() {
    let c = Cluster::start(&["256MiB", "256MiB"]);
    let a = c.client(0);
    let b = c.client(1);
    assert_eq!(a.node_name().unwrap(), "node-a");
    let cfg = ReplicateConfig {
        prefer_local: true,
        ..Default::default()
    };
    for (key, len) in [
        ("small", 4096),
        ("one-mib", 1 << 20),
        ("lmcache-chunk", 32 << 20),
        ("many-slices", 40 << 20 | 12345),
    ] {
        let v = value(key, len);
        let info = a
            .put(key, &v, &cfg)
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        assert_eq!(info.replicas.len(), 1);
        assert!(
            info.replicas[0].local,
            "prefer_local put of {key} landed on {:?}",
            info.replicas
        );
        let got = b.get(key).unwrap_or_else(|e| panic!("get {key}: {e}"));
        assert!(got == v, "bytes of {key} differ after a remote get");
        let mut buf = vec![0u8; len + 10];
        let n = b.get_into(key, Dest::Bytes(&mut buf)).unwrap();
        assert_eq!(n, len);
        assert!(buf[..len] == v[..]);
        // And locally on A (a memcpy out of the mapped segment).
        assert!(a.get(key).unwrap() == v);
    }
    // An existing key answers already-exists and moves no bytes.
    let before = c.sidecar_metrics(0);
    let err = a.put("small", &value("other", 4096), &cfg).unwrap_err();
    assert!(
        matches!(err, regolith_client::Error::AlreadyExists { .. }),
        "{err}"
    );
    assert!(b.get("small").unwrap() == value("small", 4096));
    let after = c.sidecar_metrics(0);
    let put_bytes =
        |t: &str| regolith_e2e::metric(t, "regolith_sidecar_put_bytes_total").unwrap_or(0.0);
    assert_eq!(
        put_bytes(&before),
        put_bytes(&after),
        "a put of an existing key moved bytes"
    );
    // Missing keys.
    assert!(matches!(
        b.get("nope").unwrap_err(),
        regolith_client::Error::NotFound { .. }
    ));
    assert!(!b.exists("nope").unwrap());
    assert!(b.exists("small").unwrap());
    assert_eq!(b.get_size("one-mib").unwrap(), 1 << 20);
    let _ = Duration::from_secs(0);
}

#[test]
fn batches_replicas_and_shared_buffers() {
    let c = Cluster::start(&["128MiB", "128MiB", "128MiB"]);
    let a = c.client(0);
    let b = c.client(1);
    // Batch put from A with two replicas: distinct nodes.
    let keys: Vec<String> = (0..16).map(|i| format!("batch-{i}")).collect();
    let vals: Vec<Vec<u8>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| value(k, 1000 + i * 70_000))
        .collect();
    let items: Vec<(&str, Source)> = keys
        .iter()
        .zip(&vals)
        .map(|(k, v)| (k.as_str(), Source::Bytes(v)))
        .collect();
    let cfg = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    for (k, r) in keys.iter().zip(a.batch_put_from(&items, &cfg)) {
        let info = r.unwrap_or_else(|e| panic!("batch put {k}: {e}"));
        assert_eq!(info.replicas.len(), 2, "{k}: {:?}", info.replicas);
        assert_ne!(
            info.replicas[0].node_id, info.replicas[1].node_id,
            "{k}: replicas on one node"
        );
    }
    let mut bufs: Vec<Vec<u8>> = vals.iter().map(|v| vec![0u8; v.len()]).collect();
    let dests: Vec<(&str, Dest)> = keys
        .iter()
        .zip(bufs.iter_mut())
        .map(|(k, b)| (k.as_str(), Dest::Bytes(b.as_mut_slice())))
        .collect();
    for (k, r) in keys.iter().zip(b.batch_get_into(dests)) {
        r.unwrap_or_else(|e| panic!("batch get {k}: {e}"));
    }
    assert!(bufs == vals, "batch get bytes differ");
    let keys_ref: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    assert!(b.batch_exists(&keys_ref).unwrap().iter().all(|e| *e));
    // A registered buffer: put from it and get into it without staging.
    let buf = b.alloc_buffer(4 << 20).unwrap();
    let v = value("shm", 3 << 20);
    buf.write(0, &v).unwrap();
    b.put_from(
        "shm-key",
        Source::Shm {
            buf: &buf,
            offset: 0,
            len: v.len(),
        },
        &ReplicateConfig {
            preferred_segments: vec!["node-c".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let out = a.alloc_buffer(4 << 20).unwrap();
    let n = a
        .get_into(
            "shm-key",
            Dest::Shm {
                buf: &out,
                offset: 4096,
                len: 3 << 20,
            },
        )
        .unwrap();
    assert_eq!(n, v.len());
    let mut back = vec![0u8; v.len()];
    out.read(4096, &mut back).unwrap();
    assert!(back == v);
    // Removes.
    let removed = a.batch_remove(&keys_ref[..4]).unwrap();
    assert!(removed.iter().all(|r| r.is_ok()));
    assert!(matches!(
        a.get("batch-0").unwrap_err(),
        regolith_client::Error::NotFound { .. }
    ));
    assert!(a.remove("batch-0").is_err());
    let segs = a.list_segments().unwrap();
    assert_eq!(segs.len(), 3);
    assert!(segs.iter().any(|s| s.local && s.node_name == "node-a"));
}

#[test]
fn consumer_only_node_sigterm_unmount_and_remount_after_being_declared_dead() {
    use nix::sys::signal::Signal;
    let mut c = Cluster::start_with(&["64MiB", "0", "64MiB"], &["--node-ttl", "2s"], &[]);
    // A consumer-only node (segment size 0) puts to and gets from the others.
    let consumer = c.client(1);
    let v = value("from-consumer", 2 << 20);
    let info = consumer
        .put("from-consumer", &v, &ReplicateConfig::default())
        .unwrap();
    assert!(!info.replicas[0].local);
    assert!(consumer.get("from-consumer").unwrap() == v);
    assert!(
        c.client(0).get("from-consumer").unwrap() == v
            || c.client(2).get("from-consumer").unwrap() == v
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mc = c.metad_client();
    let gen_of = |name: &str| {
        rt.block_on(mc.list_segments())
            .unwrap()
            .into_iter()
            .find(|s| s.node_name == name)
            .map(|s| s.generation)
    };
    // Paused past node_ttl: declared dead; resumed: told to remount, mounts generation + 1.
    let g0 = gen_of("node-c").unwrap();
    c.sidecars[2].proc.signal(Signal::SIGSTOP);
    let end = std::time::Instant::now() + Duration::from_secs(15);
    while gen_of("node-c").is_some() {
        assert!(
            std::time::Instant::now() < end,
            "node-c never declared dead"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.sidecars[2].proc.signal(Signal::SIGCONT);
    let end = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(g) = gen_of("node-c") {
            assert!(g > g0, "remounted with generation {g} after {g0}");
            break;
        }
        assert!(std::time::Instant::now() < end, "node-c never remounted");
        std::thread::sleep(Duration::from_millis(200));
    }
    let w = value("after-remount", 100_000);
    c.client(2)
        .put(
            "after-remount",
            &w,
            &ReplicateConfig {
                prefer_local: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(consumer.get("after-remount").unwrap() == w);
    // SIGTERM: a clean exit that unmounts the segment.
    c.sidecars[0].proc.signal(Signal::SIGTERM);
    let status = c.sidecars[0].proc.child.as_mut().unwrap().wait().unwrap();
    assert!(status.success(), "sidecar exit after SIGTERM: {status:?}");
    assert!(
        gen_of("node-a").is_none(),
        "node-a still mounted after a clean shutdown"
    );
    assert!(!c.sidecars[0].socket.exists(), "socket file left behind");
}
