//! The transport a real sidecar chooses (`--transport`, docs/rdma.md), and, where the machine
//! has an RDMA device, puts and gets between two sidecar processes over RDMA.
//!
//! The `#[ignore]`d test needs a device with an active port and the sidecar built with the
//! feature (`cargo build -p regolith-sidecar --features rdma`, then
//! `cargo test -p regolith-e2e --test rdma -- --ignored`).

use std::time::Duration;

use regolith_client::ReplicateConfig;
use regolith_e2e::{value, wait_until, Cluster};

/// Whether this machine lists any RDMA device (then the no-device checks do not apply).
fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// Sum of the samples of `name` whose labels contain `label`.
fn sum_metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn without_a_device_auto_serves_over_tcp_and_says_why_and_rdma_refuses_to_start() {
    if has_rdma_device() {
        eprintln!("this machine has an RDMA device: the no-device case cannot be checked here");
        return;
    }
    // The default transport is auto.
    let mut c = Cluster::start(&["64MiB", "0"]);
    for i in 0..2 {
        let st = c.sidecar_status(i);
        let t = &st["transport"];
        assert_eq!(t["mode"], "auto", "{st}");
        assert_eq!(t["rdma_ports"], serde_json::json!([]), "{st}");
        assert!(
            t["tcp_only_because"]
                .as_str()
                .is_some_and(|w| !w.is_empty()),
            "{st}"
        );
        let m = c.sidecar_metrics(i);
        assert_eq!(
            regolith_e2e::metric(&m, "regolith_sidecar_rdma_enabled"),
            Some(0.0)
        );
    }
    // Transfers between the two nodes work over TCP.
    let v = value("over-tcp", 3 << 20);
    c.client(1)
        .put("over-tcp", &v, &ReplicateConfig::default())
        .unwrap();
    assert!(c.client(1).get("over-tcp").unwrap() == v);

    // `--transport rdma` on a machine without a device: the process exits with an error that
    // says what is missing, and the running sidecar keeps serving.
    // It fails before mounting or taking anything over, so it is started with node b's own
    // flags beside the running node b.
    let mut child = c.spawn_sidecar(1, &["--transport", "rdma"]);
    let mut status = None;
    wait_until(
        "--transport rdma without a device to exit",
        Duration::from_secs(20),
        || {
            status = child.try_wait().unwrap();
            status.is_some()
        },
    );
    assert!(!status.unwrap().success());
    let log = std::fs::read_to_string(&c.sidecars[1].proc.log).unwrap();
    assert!(log.contains("--transport rdma"), "{log}");
    assert!(c.client(1).get("over-tcp").unwrap() == v);
    c.wait_sidecar(1, Duration::from_secs(5));
}

#[test]
#[ignore = "needs an RDMA device with an active port and the sidecar built with --features rdma (docs/rdma.md)"]
fn puts_and_gets_between_two_sidecars_move_over_rdma() {
    let c = Cluster::start_with(&["256MiB", "0"], &[], &["--transport", "rdma"]);
    for i in 0..2 {
        let st = c.sidecar_status(i);
        assert!(
            st["transport"]["rdma_ports"]
                .as_array()
                .is_some_and(|p| !p.is_empty()),
            "{st}"
        );
    }
    // Node b holds nothing: its puts are RDMA WRITEs to a, its gets RDMA READs from a.
    let b = c.client(1);
    for (key, len) in [
        ("small", 4096),
        ("chunk", 16 << 20),
        ("odd", (32 << 20) + 12345),
    ] {
        let v = value(key, len);
        b.put(key, &v, &ReplicateConfig::default()).unwrap();
        assert!(b.get(key).unwrap() == v, "{key}: bytes differ over RDMA");
        assert!(
            c.client(0).get(key).unwrap() == v,
            "{key}: bytes differ at the holder"
        );
    }
    let mb = c.sidecar_metrics(1);
    let ma = c.sidecar_metrics(0);
    assert!(
        sum_metric(&mb, "regolith_sidecar_rdma_ops", "op=\"read\"") > 0.0,
        "{mb}"
    );
    assert!(
        sum_metric(&mb, "regolith_sidecar_rdma_ops", "op=\"write\"") > 0.0,
        "{mb}"
    );
    assert!(
        sum_metric(&ma, "regolith_sidecar_rdma_ops", "op=\"commit\"") > 0.0,
        "{ma}"
    );
    assert_eq!(
        regolith_e2e::metric(&mb, "regolith_sidecar_rdma_fallbacks"),
        Some(0.0)
    );
}
