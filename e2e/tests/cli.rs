//! The `regolith` CLI end to end: `regolith up` (real metad and sidecar processes), put through
//! one sidecar and get through the other, status, ls, rm, the socket files, a clean SIGTERM
//! stop; and the exit codes of bad flags and failed operations.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use regolith_e2e::{metad_bin, regolith_bin, sidecar_bin};

/// `regolith up --base-port P` takes P..P+49 on 127.0.0.1 and the sidecars' NIC addresses.
fn block_is_free(base: u16, sidecars: u8) -> bool {
    let mut addrs: Vec<String> = (0..50).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    for i in 0..sidecars {
        for nic in 1..=2 {
            addrs.push(format!("127.0.{}.{nic}:{}", 10 + i, base + 40 + i as u16));
        }
    }
    addrs.iter().all(|a| TcpListener::bind(a.as_str()).is_ok())
}

/// A free block of ports below the ephemeral range (where other tests' free ports come from).
fn free_base_port() -> u16 {
    for _ in 0..200 {
        let base = 20_000 + 50 * (rand::random::<u16>() % 240);
        if block_is_free(base, 2) {
            return base;
        }
    }
    panic!("no free block of 50 ports in 20000..32000");
}

/// A `regolith` command with a clean environment (no REGOLITH_* of the caller).
fn regolith(dir: &Path) -> Command {
    let mut c = Command::new(regolith_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("REGOLITH_") {
            c.env_remove(k);
        }
    }
    c.arg("--dir").arg(dir);
    c
}

fn run(mut c: Command, stdin: Option<&[u8]>) -> Output {
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn regolith");
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(bytes).expect("write stdin");
    }
    child.wait_with_output().expect("regolith output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "regolith failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[track_caller]
fn fails_with(out: &Output, code: i32, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}, got {}; stderr: {err}",
        out.status
    );
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "stderr should mention {needle:?}: {err}"
    );
    assert!(!err.contains("panicked"), "a panic: {err}");
}

/// `regolith up` running in the background; killed (with its children, by their parent-death
/// signal) if the test fails before stopping it.
struct Up {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
}

impl Up {
    fn start(dir: &Path, base: u16) -> Up {
        Self::start_with(dir, base, &[])
    }

    fn start_with(dir: &Path, base: u16, extra: &[&str]) -> Up {
        let mut c = regolith(dir);
        c.args(["up", "--base-port", &base.to_string()])
            .args(extra)
            .arg("--metad-bin")
            .arg(metad_bin())
            .arg("--sidecar-bin")
            .arg(sidecar_bin())
            .args(["--segment-size", "64MiB", "--ready-timeout", "90s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().expect("spawn regolith up");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut up = Up {
            child: Some(child),
            lines,
            stdout: Vec::new(),
        };
        up.wait_ready(dir, Duration::from_secs(120));
        up
    }

    fn wait_ready(&mut self, dir: &Path, timeout: Duration) {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => {
                    let ready = l.starts_with("ready:");
                    self.stdout.push(l);
                    if ready {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        dump_logs(dir);
        panic!(
            "regolith up did not print ready; its stdout:\n{}",
            self.stdout.join("\n")
        );
    }

    fn output(&self) -> String {
        self.stdout.join("\n")
    }

    fn terminate_and_wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > end {
                let _ = child.kill();
                panic!("regolith up did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn dump_logs(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir.join("logs")) else {
        return;
    };
    for e in rd.flatten() {
        let t = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        eprintln!("----- {} -----", e.path().display());
        for l in &lines[lines.len().saturating_sub(30)..] {
            eprintln!("{l}");
        }
    }
}

/// Every socket file and every symbolic link under `dir`.
fn sockets_and_links(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut socks, mut links) = (Vec::new(), Vec::new());
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let ft = e.file_type().expect("file type");
            if ft.is_symlink() {
                links.push(e.path());
            } else if ft.is_socket() {
                socks.push(e.path());
            } else if ft.is_dir() {
                todo.push(e.path());
            }
        }
    }
    socks.sort();
    (socks, links)
}

fn value(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 29) as u8)
        .collect()
}

#[test]
fn up_put_get_status_ls_rm_and_a_clean_stop() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    let base = free_base_port();
    let mut up = Up::start(&dir, base);
    let dir = dir.canonicalize().expect("dir");
    let shown = up.output();
    let sock0 = dir.join("node-0.sock");
    let sock1 = dir.join("node-1.sock");
    for s in [&sock0, &sock1] {
        assert!(
            shown.contains(&s.display().to_string()),
            "up names {}:\n{shown}",
            s.display()
        );
    }
    assert!(
        shown.contains(&format!("127.0.0.1:{base}")),
        "up names the metad addresses:\n{shown}"
    );
    assert!(shown.contains("NODE") && shown.contains("ALIVE"), "{shown}");
    let metad_list = format!(
        "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        base,
        base + 1,
        base + 2
    );
    assert!(
        shown.contains(&format!("export REGOLITH_METAD={metad_list}")),
        "{shown}"
    );

    // Put a file through sidecar 0, get it through sidecar 1, byte for byte.
    let v = value(3 << 20 | 777);
    let input = tmp.path().join("in.bin");
    std::fs::write(&input, &v).unwrap();
    let mut c = regolith(&dir);
    c.arg("--socket").arg(&sock0);
    c.args(["put", "chunk/1"]).arg(&input).arg("--prefer-local");
    let said = ok(&run(c, None));
    assert!(said.contains("node-0"), "{said}");
    let output = tmp.path().join("out.bin");
    let mut c = regolith(&dir);
    c.args(["get", "chunk/1"])
        .arg(&output)
        .arg("--socket")
        .arg(&sock1);
    ok(&run(c, None));
    assert!(
        std::fs::read(&output).unwrap() == v,
        "the bytes got through node-1 differ"
    );
    // Through stdin and stdout as well.
    let mut c = regolith(&dir);
    c.arg("--socket").arg(&sock1).args(["put", "chunk/2", "-"]);
    ok(&run(c, Some(b"hello regolith")));
    let mut c = regolith(&dir);
    c.arg("--socket").arg(&sock0).args(["get", "chunk/2"]);
    let out = run(c, None);
    ok(&out);
    assert_eq!(out.stdout, b"hello regolith");
    // An existing key: refused, exit 1.
    let mut c = regolith(&dir);
    c.arg("--socket").arg(&sock0).args(["put", "chunk/2", "-"]);
    fails_with(&run(c, Some(b"other")), 1, "already exists");

    // status --json, found through --dir (cluster.json and the token) ...
    let mut c = regolith(&dir);
    c.args(["status", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&ok(&run(c, None))).expect("status JSON");
    assert_eq!(st["members"].as_array().map(Vec::len), Some(3), "{st}");
    let live = st["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .filter(|s| s["alive"] == true)
        .count();
    assert_eq!(live, 2, "{st}");
    assert!(st["leader_id"].as_u64().is_some(), "{st}");
    assert_eq!(st["keys"], 2, "{st}");
    // ... and through the printed export lines, from another directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let mut c = Command::new(regolith_bin());
    c.current_dir(elsewhere.path())
        .env("REGOLITH_METAD", &metad_list)
        .env("REGOLITH_CLUSTER_TOKEN_FILE", dir.join("token"))
        .env("REGOLITH_SOCKET", &sock1)
        .arg("status");
    let table = ok(&run(c, None));
    assert!(table.contains("leader: metad"), "{table}");
    assert!(
        table.contains("node-0") && table.contains("node-1"),
        "{table}"
    );

    // ls, with and without a prefix.
    let mut c = regolith(&dir);
    c.arg("ls");
    assert_eq!(ok(&run(c, None)), "chunk/1\nchunk/2\n");
    let mut c = regolith(&dir);
    c.args(["ls", "chunk/1", "-l"]);
    let long = ok(&run(c, None));
    assert!(long.starts_with("chunk/1\t3.0 MiB\t1\t"), "{long}");
    let mut c = regolith(&dir);
    c.args(["ls", "nothing-here"]);
    assert_eq!(ok(&run(c, None)), "");

    // A missing key: exit 1, saying so.
    let mut c = regolith(&dir);
    c.args(["get", "no/such/key"]);
    fails_with(&run(c, None), 1, "not found");

    // members and segments.
    let mut c = regolith(&dir);
    c.args(["members", "list"]);
    let m = ok(&run(c, None));
    assert!(
        m.contains("leader") && m.contains(&format!("127.0.0.1:{}", base + 2)),
        "{m}"
    );
    let mut c = regolith(&dir);
    c.args(["segments", "list"]);
    assert!(ok(&run(c, None)).contains("node-1"));
    let mut c = regolith(&dir);
    c.args(["segments", "drain", "no-such-node"]);
    let out = run(c, None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    // rm, then the key is gone.
    let mut c = regolith(&dir);
    c.args(["rm", "chunk/1"]);
    ok(&run(c, None));
    let mut c = regolith(&dir);
    c.args(["get", "chunk/1"]).arg("--socket").arg(&sock1);
    fails_with(&run(c, None), 1, "not found");
    let mut c = regolith(&dir);
    c.args(["rm", "chunk/1"]);
    fails_with(&run(c, None), 1, "not found");
    let mut c = regolith(&dir);
    c.arg("ls");
    assert_eq!(ok(&run(c, None)), "chunk/2\n");

    // Exactly two sockets per sidecar under --dir (its clients' socket and the hand-over socket a
    // `--takeover` successor connects to), no links.
    let handover = |s: &PathBuf| {
        let mut p = s.clone().into_os_string();
        p.push(".handover");
        PathBuf::from(p)
    };
    let (socks, links) = sockets_and_links(&dir);
    assert_eq!(
        socks,
        vec![
            sock0.clone(),
            handover(&sock0),
            sock1.clone(),
            handover(&sock1)
        ]
    );
    assert!(links.is_empty(), "links under --dir: {links:?}");

    // SIGTERM: up stops every child and exits 0.
    let cluster: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let pids: Vec<u64> = cluster["metad"]
        .as_array()
        .unwrap()
        .iter()
        .chain(cluster["sidecars"].as_array().unwrap())
        .map(|p| p["pid"].as_u64().expect("pid"))
        .collect();
    assert_eq!(pids.len(), 5);
    for pid in &pids {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} runs"
        );
    }
    let st = up.terminate_and_wait(Duration::from_secs(60));
    if !st.success() {
        dump_logs(&dir);
    }
    assert!(st.success(), "regolith up exited with {st}");
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} outlived regolith up"
        );
    }
    let (socks, _) = sockets_and_links(&dir);
    assert!(socks.is_empty(), "sockets left after the stop: {socks:?}");
}

#[test]
fn bad_flags_exit_2_and_failures_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (args, needle) in [
        (vec!["up", "--segment-size", "lots"], "segment-size"),
        (vec!["up", "--metad", "0"], "--metad"),
        (vec!["up", "--base-port", "65530"], "--base-port"),
        (vec!["up", "--metad-bin", "/no/such/metad"], "--metad-bin"),
        (vec!["--metad", "127.0.0.1:1", "up"], "--metad"),
        (vec!["frobnicate"], "frobnicate"),
        (vec!["put"], "KEY"),
        (vec!["status", "--timeout", "forever"], "timeout"),
        (vec!["status", "--metad", "nohost"], "--metad"),
        (vec!["members", "add", "x", "h:1"], "ID"),
    ] {
        let mut c = regolith(dir);
        c.args(&args);
        let out = run(c, None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?} should mention {needle}: {err}"
        );
    }
    // Help and version are not errors.
    let mut c = regolith(dir);
    c.arg("--help");
    assert!(ok(&run(c, None)).contains("up"));

    // No sidecar at the socket: exit 1 with the path.
    let missing = dir.join("nobody.sock");
    let mut c = regolith(dir);
    c.arg("--socket").arg(&missing).args(["get", "k"]);
    fails_with(&run(c, None), 1, "cannot connect");
    // An unreadable input file: exit 1 naming it.
    let mut c = regolith(dir);
    c.arg("--socket")
        .arg(&missing)
        .args(["put", "k", "/no/such/file"]);
    fails_with(&run(c, None), 1, "/no/such/file");
    // No metad: exit 1 after the timeout.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = regolith(dir);
    c.args(["status", "--timeout", "300ms", "--metad"])
        .arg(format!("127.0.0.1:{port}"));
    fails_with(&run(c, None), 1, "metad");
}

/// Runs `regolith bench --json` for one row; returns the exit status and the parsed report.
fn bench_row(
    dir: &Path,
    filter: &str,
    corrupt: bool,
) -> (std::process::ExitStatus, serde_json::Value) {
    let mut c = regolith(dir);
    c.args(["bench", "--json", "--duration", "300ms", "--filter", filter]);
    if corrupt {
        c.arg("--corrupt-for-test");
    }
    let out = run(c, None);
    let stdout = text(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "bench stdout is not one JSON object ({e}):\n{stdout}\nstderr: {}",
            text(&out.stderr)
        )
    });
    (out.status, report)
}

#[track_caller]
fn the_row<'a>(
    report: &'a serde_json::Value,
    mode: &str,
    size: u64,
    op: &str,
) -> &'a serde_json::Value {
    let rows = report["results"].as_array().expect("results array");
    assert_eq!(rows.len(), 1, "one row for the filter: {report}");
    let r = &rows[0];
    assert_eq!(
        (r["mode"].as_str(), r["size"].as_u64(), r["op"].as_str()),
        (Some(mode), Some(size), Some(op)),
        "{r}"
    );
    r
}

#[test]
fn bench_verifies_every_byte_and_reports_a_wrong_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    let mut up = Up::start(&dir, free_base_port());
    let dir = dir.canonicalize().expect("dir");

    for (filter, mode, size, op) in [
        ("local/4KiB/get", "local", 4096, "get"),
        ("remote/64KiB/get_into", "remote", 65536, "get_into"),
    ] {
        // Honest bytes: no error, a measured rate, the ceilings beside it.
        let (st, report) = bench_row(&dir, filter, false);
        let r = the_row(&report, mode, size, op);
        assert!(st.success(), "{filter}: bench failed: {report}");
        assert_eq!(r["errors"].as_u64(), Some(0), "{r}");
        assert!(r["ops_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["p50_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(report["data_plane_tls"], false, "{report}");
        assert!(
            report.get("disk").is_none(),
            "no disks, no disk rows: {report}"
        );
        for c in ["memcpy_gbps", "tcp_gbps", "tcp_rtt_us", "tls_gbps"] {
            assert!(
                report["ceilings"][c].as_f64().unwrap_or(0.0) > 0.0,
                "{c}: {report}"
            );
        }
        // One wrong byte in what the bench expects: every verified get is an error, and the run fails.
        let (st, report) = bench_row(&dir, filter, true);
        let r = the_row(&report, mode, size, op);
        assert!(
            !st.success(),
            "{filter}: a wrong byte must fail the bench: {report}"
        );
        assert!(
            r["errors"].as_u64().unwrap_or(0) > 0,
            "{filter}: a wrong byte must be counted: {r}"
        );
    }
    let st = up.terminate_and_wait(Duration::from_secs(30));
    assert!(st.success(), "regolith up exited with {st}");
}

/// `regolith bench` against `regolith up --disk-size`: disk-tier rows — get_into of objects
/// only on a disk, through the node that owns it (local) and through the other (remote), at
/// 4 KiB, 256 KiB and 16 MiB — beside the disks' ceilings measured in the same run, every byte
/// verified and read from the disk; the offload row under eviction pressure; a wrong byte
/// fails a disk row as it fails a memory row. `bench --hit-ratio` runs its trace against the
/// same cluster and reports against the ideal LRU. Nothing the bench put is left.
#[test]
fn bench_disk_rows_and_hit_ratio_against_a_cluster_with_disks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    let mut up = Up::start_with(&dir, free_base_port(), &["--disk-size", "256MiB"]);
    let dir = dir.canonicalize().expect("dir");

    let (st, report) = bench_row(&dir, "disk", false);
    assert!(st.success(), "bench failed: {report}");
    assert_eq!(
        report["results"].as_array().map(Vec::len),
        Some(0),
        "`disk` keeps no memory row: {report}"
    );
    let d = &report["disk"];
    let ceilings = d["ceilings"].as_array().expect("disk ceilings");
    assert_eq!(ceilings.len(), 2, "{d}");
    for (i, c) in ceilings.iter().enumerate() {
        assert_eq!(c["node"], format!("node-{i}"), "{c}");
        assert_eq!(c["direct_io"], true, "{c}");
        assert!(c["bytes"].as_u64().unwrap_or(0) >= 64 << 20, "{c}");
        for f in ["write_gbps", "read_gbps"] {
            assert!(c[f].as_f64().unwrap_or(0.0) > 0.0, "{f}: {c}");
        }
    }
    let rows = d["results"].as_array().expect("disk rows");
    let mut seen = Vec::new();
    for r in rows {
        let (mode, size) = (
            r["mode"].as_str().unwrap_or(""),
            r["size"].as_u64().unwrap_or(0),
        );
        seen.push((mode.to_string(), size));
        assert_eq!(r["op"], "get_into", "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        let owner = if mode == "local" { "node-0" } else { "node-1" };
        assert_eq!(r["owner"], owner, "{r}");
        for f in ["ops_per_s", "gbps", "ratio", "ceiling_gbps", "p50_us"] {
            assert!(r[f].as_f64().unwrap_or(0.0) > 0.0, "{f}: {r}");
        }
        // The bytes came from the owner's disk: at least one object's worth per row.
        assert!(r["disk_read_bytes"].as_u64().unwrap_or(0) >= size, "{r}");
    }
    let mut want: Vec<(String, u64)> = ["local", "remote"]
        .iter()
        .flat_map(|m| [4096u64, 256 << 10, 16 << 20].map(|s| (m.to_string(), s)))
        .collect();
    want.sort();
    seen.sort();
    assert_eq!(seen, want, "{d}");
    let o = &d["offload"];
    assert!(o["offloaded_objects"].as_u64().unwrap_or(0) > 0, "{o}");
    for f in ["offload_gbps", "ceiling_gbps", "ratio", "seconds"] {
        assert!(o[f].as_f64().unwrap_or(0.0) > 0.0, "{f}: {o}");
    }
    assert!(o["pool_use_max"].as_f64().unwrap_or(0.0) >= 0.8, "{o}");

    // One wrong byte expected: every disk read is an error, and the run fails.
    let (st, report) = bench_row(&dir, "disk/local/4KiB", true);
    assert!(!st.success(), "a wrong byte must fail the bench: {report}");
    let rows = report["disk"]["results"].as_array().expect("disk rows");
    assert_eq!(rows.len(), 1, "{report}");
    assert!(rows[0]["errors"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(report["disk"].get("offload").is_none(), "{report}");

    // The hit-ratio mode: 4 x the 128 MiB of memory in 1 MiB objects, a short trace.
    let mut c = regolith(&dir);
    c.args([
        "bench",
        "--hit-ratio",
        "--json",
        "--accesses",
        "600",
        "--depth",
        "4",
    ]);
    let out = run(c, None);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let h = &doc["hit_ratio"];
    let n = |f: &str| h[f].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("dram_bytes"), 128 << 20, "{h}");
    assert_eq!(n("disk_bytes"), 512 << 20, "{h}");
    assert_eq!((n("objects"), n("accesses")), (512, 600), "{h}");
    assert_eq!(n("errors"), 0, "{h}");
    assert_eq!(n("hits") + n("misses"), 600, "{h}");
    // A key's first access cannot hit: at least one miss per distinct object.
    assert!(n("distinct") <= 512 && n("misses") >= n("distinct"), "{h}");
    assert!(n("hits") > 0, "a skewed trace repeats objects: {h}");
    // The working set is 4 x memory: some hits were served by the disks.
    assert!(n("disk_reads") > 0, "{h}");
    let f = |k: &str| h[k].as_f64().unwrap_or(-1.0);
    assert!((0.0..=1.0).contains(&f("hit_ratio")), "{h}");
    assert!(
        f("ideal_hit_ratio") > 0.0 && f("ideal_hit_ratio") <= 1.0,
        "{h}"
    );
    assert!(f("ideal_dram_hit_ratio") <= f("ideal_hit_ratio"), "{h}");
    assert!(
        (f("ratio") - f("hit_ratio") / f("ideal_hit_ratio")).abs() < 1e-9,
        "{h}"
    );

    // Every key the bench put is removed again.
    let mut c = regolith(&dir);
    c.args(["ls", "bench/"]);
    assert_eq!(ok(&run(c, None)).trim(), "", "keys left behind");
    let st = up.terminate_and_wait(Duration::from_secs(30));
    assert!(st.success(), "regolith up exited with {st}");
}

/// `regolith up --tls`: a CA and a certificate per process in DIR/tls, every daemon on mutual
/// TLS; the other subcommands find the client certificate in cluster.json, `bench` reports
/// the TLS data plane, and a call in clear is refused.
#[test]
fn up_tls_runs_every_daemon_over_mutual_tls() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    let base = free_base_port();
    let mut up = Up::start_with(&dir, base, &["--tls"]);
    let dir = dir.canonicalize().expect("dir");
    let shown = up.output();
    for f in ["ca.crt", "client.crt", "client.key"] {
        let p = dir.join("tls").join(f);
        assert!(p.exists(), "{}", p.display());
        assert!(
            shown.contains(&format!("{}", p.display())),
            "up prints the export line of {f}:\n{shown}"
        );
    }
    let mode = std::fs::metadata(dir.join("tls/client.key")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);

    // Found through --dir: the cluster's CA and client certificate.
    let mut c = regolith(&dir);
    c.args(["status", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&ok(&run(c, None))).expect("status JSON");
    assert_eq!(st["members"].as_array().map(Vec::len), Some(3), "{st}");

    // Bytes cross the TLS data plane: put through node-0 onto node-1's segment, read back.
    let input = tmp.path().join("in.bin");
    let v = value(1 << 20 | 5);
    std::fs::write(&input, &v).unwrap();
    let mut c = regolith(&dir);
    c.arg("--socket").arg(dir.join("node-1.sock"));
    c.args(["put", "tls/1"]).arg(&input).arg("--prefer-local");
    ok(&run(c, None));
    let out = tmp.path().join("out.bin");
    let mut c = regolith(&dir);
    c.args(["get", "tls/1"])
        .arg(&out)
        .arg("--socket")
        .arg(dir.join("node-0.sock"));
    ok(&run(c, None));
    assert!(std::fs::read(&out).unwrap() == v, "wrong bytes over TLS");

    // bench says the data plane runs TLS.
    let (st, report) = bench_row(&dir, "remote/64KiB/get_into", false);
    assert!(st.success(), "{report}");
    assert_eq!(report["data_plane_tls"], true, "{report}");
    assert!(report["ceilings"]["tls_gbps"].as_f64().unwrap_or(0.0) > 0.0);

    // Without the CA (an explicit other CA file): refused, saying why.
    let other = tmp.path().join("other-ca.crt");
    std::fs::copy(dir.join("tls/client.crt"), &other).unwrap();
    let mut c = regolith(&dir);
    c.args(["status", "--timeout", "1s", "--tls-ca"])
        .arg(&other);
    fails_with(&run(c, None), 1, "metad");

    let st = up.terminate_and_wait(Duration::from_secs(30));
    assert!(st.success(), "regolith up exited with {st}");
}

/// `regolith up --disk-size SIZE`: each sidecar has a disk tier of SIZE under its state
/// directory, reported healthy in its `/status`; `regolith status` shows each node's memory
/// and disk, and the objects offloaded to the disks once the pool fills.
#[test]
fn up_disk_size_gives_each_sidecar_a_disk_and_status_shows_the_tiers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("cluster");
    let base = free_base_port();
    let mut up = Up::start_with(&dir, base, &["--disk-size", "64MiB"]);
    let dir = dir.canonicalize().expect("dir");
    for i in 0..2u16 {
        let disk = dir.join(format!("node-{i}")).join("disk");
        assert!(
            disk.join("regolith-disk.json").exists(),
            "{} is not a disk",
            disk.display()
        );
        let (_, body) =
            regolith_e2e::http_get(&format!("127.0.0.1:{}", base + 30 + i), "/status").unwrap();
        let st: serde_json::Value = serde_json::from_str(&body).unwrap();
        let d = &st["disks"][0];
        assert_eq!(d["path"].as_str(), disk.to_str(), "{st}");
        assert_eq!(d["healthy"], true, "{d}");
        assert_eq!(d["capacity_bytes"], 64u64 << 20, "{d}");
    }

    // Above the offload watermark (0.8 of the 128 MiB pool) the leader moves the least
    // recently used objects to the disks: status counts them there.
    let tiers = |up_dir: &Path| -> serde_json::Value {
        let mut c = regolith(up_dir);
        c.args(["status", "--json"]);
        let st: serde_json::Value = serde_json::from_str(&ok(&run(c, None))).expect("JSON");
        st["tiers"].clone()
    };
    let t = tiers(&dir);
    let nodes = t.as_array().expect("tiers array");
    assert_eq!(nodes.len(), 2, "{t}");
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["node_name"], format!("node-{i}"), "{t}");
        assert_eq!(n["memory"]["total"], 64u64 << 20, "{n}");
        assert_eq!(n["error"], serde_json::Value::Null, "{n}");
        let d = &n["disks"][0];
        let path = dir.join(format!("node-{i}")).join("disk");
        assert_eq!(d["path"].as_str(), path.to_str(), "{n}");
        assert_eq!(d["healthy"], true, "{n}");
        assert_eq!(d["capacity_bytes"], 64u64 << 20, "{n}");
        assert_eq!(d["objects"], 0, "nothing offloaded yet: {n}");
    }
    // 4 MiB objects: a 64 MiB disk has buckets of 8 MiB, and a record is at most a bucket.
    let input = tmp.path().join("chunk.bin");
    std::fs::write(&input, value(4 << 20)).unwrap();
    for k in 0..28 {
        let mut c = regolith(&dir);
        c.args(["put", &format!("chunk/{k}")]).arg(&input);
        ok(&run(c, None));
    }
    let disk_objects = |t: &serde_json::Value| -> u64 {
        t.as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| n["disks"].as_array().cloned().unwrap_or_default())
            .map(|d| d["objects"].as_u64().unwrap_or(0))
            .sum()
    };
    let end = Instant::now() + Duration::from_secs(30);
    let mut t = tiers(&dir);
    while disk_objects(&t) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        t = tiers(&dir);
    }
    assert!(disk_objects(&t) > 0, "no object offloaded: {t}");
    let used: u64 = t
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| n["disks"][0]["used_bytes"].as_u64().unwrap_or(0))
        .sum();
    assert!(used >= disk_objects(&t) * (4 << 20), "{t}");
    // The table: a memory row and a disk row per node.
    let mut c = regolith(&dir);
    c.arg("status");
    let table = ok(&run(c, None));
    for i in 0..2 {
        let disk = dir.join(format!("node-{i}")).join("disk");
        let row = table
            .lines()
            .find(|l| l.contains(disk.to_str().unwrap()))
            .unwrap_or_else(|| panic!("no row for {}:\n{table}", disk.display()));
        assert!(
            row.starts_with(&format!("node-{i}")) && row.contains("disk 0"),
            "{row}"
        );
        assert!(row.contains("healthy") && row.contains("64.0 MiB"), "{row}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&format!("node-{i}")) && l.contains("memory")),
            "{table}"
        );
    }
    assert!(up.terminate_and_wait(Duration::from_secs(60)).success());
}
