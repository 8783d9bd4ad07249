//! `regolith-metad` started as a Mooncake user starts `mooncake_master` (issue 13, item 6): no
//! `--id`, no `--peers`, Mooncake's flag spellings with their values. A real process, in a
//! directory of its own: it runs a single-replica cluster there, serves gRPC, metrics and the
//! metadata KV where the flags say, and keeps its state across a restart.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, http_get, http_request};

fn wait_leader(metrics: &str, child: &mut std::process::Child, log: &std::path::Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if let Ok((200, body)) = http_get(metrics, "/status") {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if v["role"] == "leader" && v["leader_ready"] == true {
                return;
            }
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "regolith-metad exited with {st}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "no leader within 30 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn a_mooncake_master_command_line_runs_a_single_replica_cluster() {
    let cwd = tempfile::tempdir().unwrap();
    let (rpc, metrics, kv) = (free_port(), free_port(), free_port());
    let log = cwd.path().join("metad.log");
    let mut child = Command::new(regolith_test_support::bins::require(
        regolith_test_support::bins::METAD,
    ))
    .current_dir(cwd.path())
    .args([
        "--enable_http_metadata_server=1",
        &format!("-rpc_port={rpc}"),
        "--metrics_port",
        &metrics.to_string(),
        "--http_metadata_server_port",
        &kv.to_string(),
        "--v=1",
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    wait_leader(&metrics_addr, &mut child, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("single-replica cluster"), "{text}");
    assert!(
        cwd.path().join("metad-1").is_dir(),
        "its data dir, named in the log"
    );

    // The metadata KV on Mooncake's port, the gRPC API on its rpc_port.
    let kv_addr = format!("127.0.0.1:{kv}");
    let (code, _) = http_request(&kv_addr, "PUT", "/metadata?key=mooncake/ram/a", b"seg").unwrap();
    assert_eq!(code, 200);
    let (code, body) = http_request(&kv_addr, "GET", "/metadata?key=mooncake/ram/a", b"").unwrap();
    assert_eq!((code, body.as_slice()), (200, &b"seg"[..]));
    let c =
        regolith_proto::client::MetadClient::new(regolith_proto::client::ClientConfig::new(vec![
            format!("127.0.0.1:{rpc}"),
        ]))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (node, _) = rt.block_on(common::mount(&c, "node-x", 1 << 20));
    assert!(node > 0);
    let segs = rt.block_on(c.list_segments()).unwrap();
    assert_eq!(segs.len(), 1);

    // Restarted the same way, it keeps its state. The client's connection stays open and
    // unserved while the replica stops (its runtime is not running): the stop must not wait
    // for it forever.
    nix_term(&mut child);
    let mut child = Command::new(regolith_test_support::bins::require(
        regolith_test_support::bins::METAD,
    ))
    .current_dir(cwd.path())
    .args([
        "--enable_http_metadata_server=true",
        "--rpc_port",
        &rpc.to_string(),
        "--metrics_port",
        &metrics.to_string(),
        "--http_metadata_server_port",
        &kv.to_string(),
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::options().append(true).open(&log).unwrap())
    .spawn()
    .unwrap();
    wait_leader(&metrics_addr, &mut child, &log);
    let (code, body) = http_request(&kv_addr, "GET", "/metadata?key=mooncake/ram/a", b"").unwrap();
    assert_eq!((code, body.as_slice()), (200, &b"seg"[..]));
    nix_term(&mut child);
}

fn nix_term(child: &mut std::process::Child) {
    unsafe extern "C" {
        #[link_name = "kill"]
        fn libc_kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc_kill(child.id() as i32, 15) };
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Ok(Some(st)) = child.try_wait() {
            assert!(st.success(), "regolith-metad exited with {st} on SIGTERM");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("regolith-metad did not stop within 20 s of SIGTERM");
}
