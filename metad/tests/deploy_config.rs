//! deploy/systemd/metad.toml, the example config of the systemd unit, loads with metad's own
//! loader (`--config`), and agrees with deploy/systemd/regolith-metad.service: a renamed or
//! mistyped key, or a unit that starts metad on another file or data directory, fails here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use regolith_metad::args::{Args, FileConfig};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The value of `key=` in a unit file (the last one, as systemd takes it).
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .next_back()
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
}

#[test]
fn the_example_metad_config_loads_and_matches_the_unit() {
    let rel = "deploy/systemd/metad.toml";
    let path = repo().join(rel);
    // Every key is one metad knows (the loader denies unknown keys), of the type it expects.
    let file: FileConfig =
        toml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} does not load: {e}"));
    assert_eq!(
        file.cluster_token_file.as_deref(),
        Some(Path::new("/etc/regolith/token"))
    );
    assert_eq!(
        file.peer_token_file.as_deref(),
        Some(Path::new("/etc/regolith/peer-token"))
    );

    // The whole resolution (sizes, durations, addresses, peers, bootstrap, the cache policy's
    // checks). The token files are the only paths it reads: temporary ones stand in for
    // /etc/regolith's, given as flags (a flag wins over the file).
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    let peer = dir.path().join("peer-token");
    std::fs::write(&token, "deploy-config-token\n").expect("token");
    std::fs::write(&peer, "deploy-config-peer\n").expect("peer token");
    let argv = [
        "regolith-metad".to_string(),
        "--config".into(),
        path.display().to_string(),
        "--cluster-token-file".into(),
        token.display().to_string(),
        "--peer-token-file".into(),
        peer.display().to_string(),
    ];
    let s = regolith_proto::daemon::parse_argv::<Args>(argv)
        .expect("argv")
        .resolve()
        .unwrap_or_else(|e| panic!("{rel} does not resolve: {e}"));
    assert_eq!(s.id, 1);
    assert_eq!(s.listen.to_string(), "10.0.0.1:50051");
    assert_eq!(
        s.advertise, "10.0.0.1:50051",
        "advertised: its own --peers entry"
    );
    assert_eq!(s.peers.len(), 3);
    assert!(s.bootstrap);
    assert_eq!(s.metrics_addr.to_string(), "10.0.0.1:9003");
    assert_eq!(
        s.http_metadata_addr.map(|a| a.to_string()).as_deref(),
        Some("10.0.0.1:8080")
    );
    assert_eq!(s.cache.node_ttl_ms, 10_000);
    assert_eq!(s.leader_handover_timeout, Duration::from_secs(5));

    // The unit starts metad on this file (installed at /etc/regolith) and owns its data dir.
    let unit = read("deploy/systemd/regolith-metad.service");
    assert_eq!(
        unit_value(&unit, "ExecStart"),
        "/usr/bin/regolith-metad --config /etc/regolith/metad.toml"
    );
    assert_eq!(
        Path::new("/var/lib").join(unit_value(&unit, "StateDirectory")),
        s.data_dir,
        "data_dir must be the unit's StateDirectory (the only writable path it gets)"
    );
    // A stopping leader's hand-over fits in the stop timeout, with the gRPC drain after it.
    let stop: u64 = unit_value(&unit, "TimeoutStopSec").parse().unwrap();
    assert!(Duration::from_secs(stop) >= s.leader_handover_timeout + Duration::from_secs(10));
}
