//! deploy/systemd/sidecar.toml, the example config of the systemd unit, loads with the
//! sidecar's own loader (`--config`), and agrees with deploy/systemd/regolith-sidecar.service:
//! a renamed or mistyped key, or a unit whose directories or stop timeout do not fit the
//! config, fails here. Likewise the Kubernetes DaemonSet's flags and `REGOLITH_*` variables.

use std::path::{Path, PathBuf};
use std::time::Duration;

use regolith_sidecar::args::{Args, FileConfig};

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
fn the_example_sidecar_config_loads_and_matches_the_unit() {
    let rel = "deploy/systemd/sidecar.toml";
    let path = repo().join(rel);
    // Every key is one the sidecar knows (the loader denies unknown keys), of its type.
    let file: FileConfig =
        toml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} does not load: {e}"));
    assert_eq!(
        file.cluster_token_file.as_deref(),
        Some(Path::new("/etc/regolith/token"))
    );

    // The whole resolution; the token file is the only path it reads (a flag wins over the
    // file, so a temporary one stands in for /etc/regolith/token).
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "deploy-config-token\n").expect("token");
    let argv = [
        "regolith-sidecar".to_string(),
        "--config".into(),
        path.display().to_string(),
        "--cluster-token-file".into(),
        token.display().to_string(),
    ];
    let s = regolith_proto::daemon::parse_argv::<Args>(argv)
        .expect("argv")
        .resolve()
        .unwrap_or_else(|e| panic!("{rel} does not resolve: {e}"));
    assert_eq!(s.node_name, "gpu-node-7");
    assert_eq!(s.metad.len(), 3);
    assert_eq!(s.segment_size, 20 << 30);
    assert_eq!(s.nics.len(), 2);
    assert_eq!(s.data_port, 7600);
    assert!(s.drain_on_exit);

    let unit = read("deploy/systemd/regolith-sidecar.service");
    assert_eq!(
        unit_value(&unit, "ExecStart"),
        "/usr/bin/regolith-sidecar --config /etc/regolith/sidecar.toml"
    );
    assert_eq!(
        Some(
            Path::new("/run")
                .join(unit_value(&unit, "RuntimeDirectory"))
                .as_path()
        ),
        s.socket.parent(),
        "the socket must be in the unit's RuntimeDirectory"
    );
    assert_eq!(
        Path::new("/var/lib").join(unit_value(&unit, "StateDirectory")),
        s.state_dir,
        "state_dir must be the unit's StateDirectory"
    );
    // Stopping drains for up to drain_timeout, then unmounts (at most 5 s): systemd must not
    // kill the sidecar before.
    let stop: u64 = unit_value(&unit, "TimeoutStopSec")
        .parse()
        .expect("seconds");
    assert!(
        Duration::from_secs(stop) > s.drain_timeout + Duration::from_secs(5),
        "TimeoutStopSec={stop} leaves no room for drain_timeout {:?} and the unmount",
        s.drain_timeout
    );
    // Upgrades that keep the cache: reload → SIGUSR2 → a --takeover successor, which systemd
    // adopts through MAINPID= (only with NotifyAccess=all: it is not the process systemd
    // started) before the old process exits; the hand-over socket lives in the runtime dir.
    assert_eq!(unit_value(&unit, "Type"), "notify");
    assert_eq!(unit_value(&unit, "NotifyAccess"), "all");
    assert_eq!(unit_value(&unit, "ExecReload"), "/bin/kill -USR2 $MAINPID");
    assert_eq!(s.handover_socket.parent(), s.socket.parent());
}

/// The sidecar DaemonSet sets only flags and `REGOLITH_*` variables the sidecar has, with
/// values it takes; the upgrade that keeps the cache is on (a surge pod takes over, the old
/// one waits for its SIGTERM), with the rolling update that lets the new pod start first.
#[test]
fn the_daemonset_sets_only_settings_the_sidecar_has_and_keeps_the_cache_on_update() {
    use clap::CommandFactory;
    let rel = "deploy/kubernetes/base/sidecar-daemonset.yaml";
    let ds = read(rel);
    let cmd = Args::command();
    let lines: Vec<&str> = ds.lines().map(str::trim).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "deploy-config-token\n").expect("token");
    // What the kubelet substitutes.
    let subst = |v: &str| {
        v.replace("$(HOST_IP)", "10.0.0.7")
            .replace("$(POD_NAMESPACE)", "regolith")
    };
    let mut argv = vec!["regolith-sidecar".to_string()];
    let mut in_args = false;
    let mut token_flag = false;
    for (i, l) in lines.iter().enumerate() {
        if *l == "args:" {
            in_args = true;
            continue;
        }
        if in_args {
            match l.strip_prefix("- --") {
                Some(flag) => {
                    let long = flag.split('=').next().unwrap();
                    assert!(
                        cmd.get_arguments().any(|a| a.get_long() == Some(long)),
                        "{rel}: --{long} is not a sidecar flag"
                    );
                    if long == "cluster-token-file" {
                        token_flag = true;
                    } else {
                        argv.push(subst(&format!("--{flag}")));
                    }
                    continue;
                }
                None => in_args = false,
            }
        }
        let Some(name) = l.strip_prefix("- name: REGOLITH_") else {
            continue;
        };
        let env = format!("REGOLITH_{name}");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == env.as_str()))
            .unwrap_or_else(|| panic!("{rel}: {env} is no sidecar setting"));
        let Some(value) = lines
            .get(i + 1)
            .and_then(|v| v.strip_prefix("value: "))
            .map(|v| subst(v.trim_matches('"')))
        else {
            continue; // valueFrom: the node's name
        };
        let long = arg.get_long().expect("a long flag");
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else {
            assert_eq!(value, "true", "{env}");
            argv.push(format!("--{long}"));
        }
    }
    // The token is a mounted Secret there; a file here.
    assert!(token_flag, "{rel}: no --cluster-token-file");
    argv.push(format!("--cluster-token-file={}", token.display()));
    let s = regolith_proto::daemon::parse_argv::<Args>(argv.clone())
        .unwrap_or_else(|e| panic!("{rel}: {argv:?}: {e:?}"))
        .resolve()
        .unwrap_or_else(|e| panic!("{rel} does not resolve: {e}"));
    assert_eq!(s.segment_size, 8 << 30);
    assert_eq!(s.metad.len(), 3);
    assert!(s.takeover_if_running && !s.takeover);
    assert_eq!(
        s.after_handover,
        regolith_sidecar::args::AfterHandover::Wait
    );
    assert_eq!(
        s.handover_socket.parent(),
        Some(Path::new("/run/regolith")),
        "the hand-over socket is in the hostPath both pods mount"
    );
    // The new pod starts before the old one goes, and nothing keeps it off the node.
    assert!(ds.contains("maxSurge: 1") && ds.contains("maxUnavailable: 0"));
    assert!(
        !ds.contains("containerPort:"),
        "on the host network containerPorts are host ports: no surge pod fits beside"
    );
}
