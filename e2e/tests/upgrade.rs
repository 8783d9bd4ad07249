//! Sidecar upgrades that keep the cache (issue 16 item 6), with real processes: a new process
//! of the same binary started with `--takeover` takes the running sidecar's segment memfd,
//! listeners and state over its hand-over socket; the node's objects stay readable, byte-exact,
//! in the same generation. A hand-over refused or broken half way leaves the old process
//! serving.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_client::ReplicateConfig;
use regolith_e2e::{rt, value, wait_until, Cluster, Proc};

const N: usize = 120;

fn key(i: usize) -> String {
    format!("up-{i}")
}

/// Sizes from a few bytes to ~600 KB (inline values, one slice, several slices).
fn size(i: usize) -> usize {
    [17, 4096, 70_000, 300_000, 600_001][i % 5] + i
}

fn put_all(c: &Cluster) {
    let a = c.client(0);
    let local = ReplicateConfig {
        prefer_local: true,
        ..Default::default()
    };
    for i in 0..N {
        a.put(&key(i), &value(&key(i), size(i)), &local)
            .unwrap_or_else(|e| panic!("put {}: {e}", key(i)));
    }
}

fn check_all(c: &Cluster, i: usize, what: &str) {
    let cl = c.client(i);
    for k in 0..N {
        let got = cl
            .get(&key(k))
            .unwrap_or_else(|e| panic!("{what}: get {} through node {i}: {e}", key(k)));
        assert!(
            got == value(&key(k), size(k)),
            "{what}: {} read through node {i} differs from what was put",
            key(k)
        );
    }
}

/// node-a's (node id, generation) as metad has it.
fn segment_of_a(c: &Cluster) -> (u64, u64) {
    let st = c.sidecar_status(0);
    let id = st["node_id"].as_u64().expect("node id");
    let segs = rt().block_on(c.metad_client().list_segments()).unwrap();
    let s = segs
        .iter()
        .find(|s| s.node_id == id)
        .unwrap_or_else(|| panic!("node-a not mounted: {segs:?}"));
    (s.node_id, s.generation)
}

fn handover_socket(c: &Cluster) -> PathBuf {
    let mut p = c.socket(0).as_os_str().to_owned();
    p.push(".handover");
    PathBuf::from(p)
}

fn wait_exit(p: &mut Proc, within: Duration) -> std::process::ExitStatus {
    let child = p.child.as_mut().expect("a process");
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            Instant::now() < end,
            "process still running after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every key in a loop through node `i`, counting good reads, errors and wrong bytes.
struct Reader {
    stop: Arc<AtomicBool>,
    good: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    task: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(c: &Cluster, i: usize) -> Self {
        let cl = c.client(i);
        let (stop, good, errors, wrong) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, g, e, w) = (stop.clone(), good.clone(), errors.clone(), wrong.clone());
        let task = std::thread::spawn(move || {
            let mut k = 0;
            while !s.load(Ordering::Relaxed) {
                match cl.get(&key(k % N)) {
                    Ok(v) if v == value(&key(k % N), size(k % N)) => {
                        g.fetch_add(1, Ordering::Relaxed)
                    }
                    Ok(_) => w.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        e.fetch_add(1, Ordering::Relaxed)
                    }
                };
                k += 1;
            }
        });
        Self {
            stop,
            good,
            errors,
            wrong,
            task: Some(task),
        }
    }

    fn good(&self) -> u64 {
        self.good.load(Ordering::Relaxed)
    }

    /// Stops; returns (good, errors), asserting no read ever returned a wrong byte.
    fn finish(mut self, what: &str) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.join().unwrap();
        }
        let (g, e, w) = (
            self.good(),
            self.errors.load(Ordering::Relaxed),
            self.wrong.load(Ordering::Relaxed),
        );
        eprintln!("{what}: {g} good reads, {e} errors, {w} wrong");
        assert_eq!(w, 0, "{what}: a read returned bytes other than those put");
        (g, e)
    }
}

/// Puts new keys in a loop through node `i` (onto node-a: its local segment, or over the data
/// plane from node-b), keeping those acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    task: Option<std::thread::JoinHandle<(Vec<String>, u64)>>,
}

impl Writer {
    fn start(c: &Cluster, i: usize) -> Self {
        let cl = c.client(i);
        let cfg = ReplicateConfig {
            prefer_local: i == 0,
            preferred_segments: vec!["node-a".into()],
            ..Default::default()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = std::thread::spawn(move || {
            let (mut acked, mut errors) = (Vec::new(), 0u64);
            let mut n = 0;
            // At most 60 puts (~7 MiB) each: nothing may be evicted, so a key that is not
            // found is a lost put.
            while !s.load(Ordering::Relaxed) && n < 60 {
                let k = format!("w{i}-{n}");
                match cl.put(&k, &value(&k, wsize(n)), &cfg) {
                    Ok(_) => acked.push(k),
                    Err(_) => {
                        errors += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                n += 1;
            }
            (acked, errors)
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    fn finish(mut self) -> (Vec<String>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.take().unwrap().join().unwrap()
    }
}

fn wsize(n: usize) -> usize {
    [5_000, 60_000, 300_000][n % 3] + n
}

#[test]
fn an_upgrade_hands_the_segment_over_and_keeps_every_object_in_the_same_generation() {
    let mut c = Cluster::start_with(&["128MiB", "64MiB"], &["--node-ttl", "3s"], &[]);
    put_all(&c);
    let before = segment_of_a(&c);
    let old_instance = c.sidecar_status(0)["instance_id"].clone();
    // A client connected before the upgrade, reading through node-a all along; another
    // reading node-a's objects from node-b over the data plane.
    let kept = c.client(0);
    let local = Reader::start(&c, 0);
    let remote = Reader::start(&c, 1);
    wait_until("reads before the upgrade", Duration::from_secs(10), || {
        local.good() > 50 && remote.good() > 20
    });

    // Puts in flight across the switch: each either fails to its writer or is acknowledged
    // and then readable, byte-exact.
    let writers = [Writer::start(&c, 0), Writer::start(&c, 1)];
    std::thread::sleep(Duration::from_millis(300));
    let mut old = c.upgrade_sidecar(0, &[]);
    let st = wait_exit(&mut old, Duration::from_secs(40));
    assert!(
        st.success(),
        "the old sidecar exits 0 once it handed over: {st:?}"
    );
    assert!(c.sidecars[0].proc.is_running(), "the new sidecar serves");
    wait_until(
        "the new process answers /status",
        Duration::from_secs(10),
        || {
            let s = c.sidecar_status(0);
            !s.is_null() && s["instance_id"] != old_instance
        },
    );
    let (l0, r0) = (local.good(), remote.good());
    wait_until(
        "reads go on after the upgrade",
        Duration::from_secs(20),
        || local.good() > l0 + 50 && remote.good() > r0 + 20,
    );
    std::thread::sleep(Duration::from_millis(500));
    let stats = rt().block_on(c.metad_client().stats()).unwrap();
    assert_eq!(
        (stats.evicted_objects, stats.dead_node_dropped_objects),
        (0, 0),
        "nothing evicted or dropped: every acknowledged put must be there"
    );
    for (i, w) in writers.into_iter().enumerate() {
        let (acked, errors) = w.finish();
        eprintln!(
            "writer through node {i}: {} puts acknowledged, {errors} failed",
            acked.len()
        );
        assert!(acked.len() > 5, "puts went on through node {i}");
        for k in &acked {
            let n: usize = k.rsplit('-').next().unwrap().parse().unwrap();
            for j in 0..2 {
                let got = c
                    .client(j)
                    .get(k)
                    .unwrap_or_else(|e| panic!("acknowledged {k} read through node {j}: {e}"));
                assert!(
                    got == value(k, wsize(n)),
                    "{k} through node {j}: wrong bytes"
                );
            }
        }
    }
    let (lg, _) = local.finish("node-a's client");
    let (rg, _) = remote.finish("node-b's client");
    assert!(lg > 100 && rg > 40);

    let log = std::fs::read_to_string(&c.sidecars[0].proc.log).unwrap();
    assert!(
        log.contains("handed over to the successor"),
        "the old process handed over"
    );
    assert!(
        log.contains("segment taken over from the running sidecar (no remount)"),
        "the new process took the segment over"
    );
    assert_eq!(
        segment_of_a(&c),
        before,
        "no remount: same node id and generation"
    );
    assert_eq!(
        c.sidecar_status(0)["generation"].as_u64(),
        Some(before.1),
        "the new process serves the same generation"
    );
    check_all(&c, 0, "after the upgrade, a new client of node-a");
    check_all(&c, 1, "after the upgrade, node-b over the data plane");
    // The client connected before the upgrade reconnected by itself.
    assert!(kept.get(&key(3)).unwrap() == value(&key(3), size(3)));
    // Past metad's node TTL (3 s here): the new process heartbeats the same generation.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(segment_of_a(&c), before, "still mounted after the node TTL");
    // Writes into the taken-over segment (local copy and data plane, with the handed-over
    // grant key) work as before.
    let local_put = ReplicateConfig {
        prefer_local: true,
        ..Default::default()
    };
    let on_a = ReplicateConfig {
        preferred_segments: vec!["node-a".into()],
        ..Default::default()
    };
    kept.put("after-a", &value("after-a", 333_333), &local_put)
        .unwrap();
    c.client(1)
        .put("after-b", &value("after-b", 444_444), &on_a)
        .unwrap();
    for (k, n) in [("after-a", 333_333), ("after-b", 444_444)] {
        assert!(c.client(1).get(k).unwrap() == value(k, n), "{k}");
        assert!(c.client(0).get(k).unwrap() == value(k, n), "{k}");
    }
    // A second upgrade of the upgraded process works too (it offers the hand-over again).
    let mut old = c.upgrade_sidecar(0, &[]);
    assert!(wait_exit(&mut old, Duration::from_secs(40)).success());
    wait_until("the third process serves", Duration::from_secs(10), || {
        c.client(0).get(&key(7)).is_ok()
    });
    assert_eq!(segment_of_a(&c), before);
    check_all(&c, 0, "after a second upgrade");
    // And a plain SIGTERM still shuts the upgraded sidecar down cleanly (unmounting).
    c.sidecars[0].proc.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(wait_exit(&mut c.sidecars[0].proc, Duration::from_secs(30)).success());
    assert!(!c.socket(0).exists(), "the socket is removed at shutdown");
    assert!(!handover_socket(&c).exists());
}

fn hello(node: &str) -> Vec<u8> {
    let body = format!("{{\"node_name\":\"{node}\",\"pid\":1}}");
    let mut m = b"RGHO".to_vec();
    m.extend_from_slice(&1u16.to_le_bytes());
    m.extend_from_slice(&1u16.to_le_bytes());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body.as_bytes());
    m
}

/// Runs `f` on another thread; panics (rather than hang) if it is not done within `d`: a
/// sidecar that stopped accepting would make a client's hello wait forever.
fn within<T: Send + 'static>(d: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(d)
        .unwrap_or_else(|_| panic!("{what}: no answer within {d:?} (the sidecar does not serve)"))
}

fn serving_the_same(c: &Cluster, before: (u64, u64), what: &str) {
    let (s0, s1) = (c.socket(0).to_path_buf(), c.socket(1).to_path_buf());
    let served = within(Duration::from_secs(30), what, move || {
        let connect =
            |p: &PathBuf| regolith_client::Client::connect(regolith_client::ClientConfig::new(p));
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            let a = connect(&s0).and_then(|cl| cl.get(&key(1)));
            let b = connect(&s1).and_then(|cl| cl.get(&key(2)));
            if a.is_ok() && b.is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    assert!(served, "{what}: node-a and node-b serve");
    check_all(c, 0, what);
    check_all(c, 1, what);
    assert_eq!(segment_of_a(c), before, "{what}: same generation");
}

#[test]
fn a_refused_or_broken_handover_leaves_the_old_sidecar_serving() {
    let mut c = Cluster::start_with(&["64MiB", "64MiB"], &["--node-ttl", "3s"], &[]);
    put_all(&c);
    let before = segment_of_a(&c);
    let path = handover_socket(&c);
    let mode = std::fs::metadata(&path).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600,
        "the hand-over socket is owner-only"
    );
    let reader = Reader::start(&c, 0);

    // Garbage, a silent peer, a huge announced length, a wrong node name: refused before
    // anything changes.
    let mut g = UnixStream::connect(&path).unwrap();
    let junk: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
    let _ = g.write_all(&junk);
    let mut silent = UnixStream::connect(&path).unwrap();
    let mut huge = UnixStream::connect(&path).unwrap();
    let mut h = hello("node-a");
    h[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let _ = huge.write_all(&h[..12]);
    let mut wrong = UnixStream::connect(&path).unwrap();
    wrong.write_all(&hello("node-z")).unwrap();
    let mut answer = Vec::new();
    wrong
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = wrong.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("node-z"), "refused with the reason: {text:?}");
    drop((g, huge));
    std::thread::sleep(Duration::from_secs(3));
    let _ = silent.write_all(b"late");
    assert!(c.sidecars[0].proc.is_running());
    serving_the_same(&c, before, "after garbage on the hand-over socket");

    // A successor that dies half way: it says HELLO, is sent the state and the descriptors,
    // and vanishes before READY. The old process serves again (same generation, heartbeats
    // resumed past the node TTL).
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&hello("node-a")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[..4], b"RGHO");
    assert_eq!(u16::from_le_bytes([head[6], head[7]]), 2, "STATE");
    drop(s);
    std::thread::sleep(Duration::from_secs(5));
    serving_the_same(&c, before, "after a successor died before READY");
    let failed = |c: &Cluster| {
        std::fs::read_to_string(&c.sidecars[0].proc.log)
            .unwrap()
            .matches("hand-over failed: serving again as before")
            .count()
    };
    assert_eq!(failed(&c), 1, "the old process paused, then served again");

    // A successor that speaks the protocol and then garbage instead of READY.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&hello("node-a")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.read_exact(&mut head).unwrap();
    s.write_all(b"this is not READY, not even a header")
        .unwrap();
    let _ = s.read_to_end(&mut Vec::new());
    drop(s);
    serving_the_same(&c, before, "after garbage instead of READY");
    assert_eq!(failed(&c), 2);

    // A real successor whose flags do not match (another segment size): it refuses, exits
    // with a clear error, and the old one serves on.
    c.sidecars[0].segment_size = "32MiB".into();
    let mut bad = c.spawn_sidecar(0, &["--takeover"]);
    c.sidecars[0].segment_size = "64MiB".into();
    let end = Instant::now() + Duration::from_secs(40);
    let st = loop {
        if let Some(st) = bad.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < end, "the refused successor did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!st.success(), "a failed takeover exits with an error");
    let log = std::fs::read_to_string(&c.sidecars[0].proc.log).unwrap();
    assert!(
        log.contains("--segment-size") && log.contains("hand-over"),
        "the error says why"
    );
    assert!(c.sidecars[0].proc.is_running());
    std::thread::sleep(Duration::from_secs(4));
    serving_the_same(&c, before, "after a successor refused");
    assert_eq!(failed(&c), 3);

    // A successor with --takeover and nothing to take over fails clearly.
    let other = c.dir.path().join("nothing.handover");
    let mut none = c.spawn_sidecar(
        0,
        &["--takeover", "--handover-socket", other.to_str().unwrap()],
    );
    let st = none.wait().unwrap();
    assert!(!st.success());
    assert!(std::fs::read_to_string(&c.sidecars[0].proc.log)
        .unwrap()
        .contains("no running sidecar to take over"));

    reader.finish("node-a's client during the failed hand-overs");
    // After all that, a real upgrade still works.
    let mut old = c.upgrade_sidecar(0, &[]);
    assert!(wait_exit(&mut old, Duration::from_secs(40)).success());
    serving_the_same(&c, before, "after the upgrade that followed");
}

/// One notification, as systemd reads it: its text and the descriptors it carried.
fn receive_notification(
    sock: &std::os::unix::net::UnixDatagram,
) -> (String, Vec<std::os::fd::OwnedFd>) {
    regolith_proto::sdnotify::receive(sock).expect("a notification within the read timeout")
}

/// Processes this test started indirectly (successors of a SIGUSR2), killed when it ends,
/// however it ends: the harness only knows its own children.
struct Reap(Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !ended(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Whether process `pid` has ended (gone, or a zombie not yet reaped by whoever adopted it).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The next `MAINPID=` a successor sends: its pid, once it has sent `READY=1` with it and a
/// barrier, whose descriptor is returned (the successor's predecessor exits only once it is
/// closed, as systemd closes it once it has read the messages before).
fn adopted(notify: &std::os::unix::net::UnixDatagram) -> (u32, Vec<std::os::fd::OwnedFd>) {
    let (text, _) = receive_notification(notify);
    let mut lines = text.lines();
    let pid: u32 = lines
        .next()
        .and_then(|l| l.strip_prefix("MAINPID="))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("MAINPID= first: {text:?}"));
    assert_eq!(lines.next(), Some("READY=1"), "{text:?}");
    let (text, fds) = receive_notification(notify);
    assert_eq!((text.as_str(), fds.len()), ("BARRIER=1", 1));
    (pid, fds)
}

/// `systemctl reload` of the shipped unit (`ExecReload=/bin/kill -USR2 $MAINPID`, `Type=notify`,
/// `NotifyAccess=all`) with a real notification socket standing in for systemd's: the sidecar
/// says `READY=1` when it serves; SIGUSR2 makes it start its own successor (its binary, its
/// flags plus `--takeover`), which takes the segment over, says `MAINPID=` (its pid) and
/// `READY=1`, and waits on a barrier; the old process exits 0 only after the barrier's
/// descriptor is closed, so systemd adopts the successor before the main process it knew ends.
/// The objects stay readable in the same generation, and a second reload upgrades the successor.
#[test]
fn a_reload_starts_a_successor_that_systemd_adopts_before_the_old_process_exits() {
    let mut c = Cluster::start_with(&["128MiB", "64MiB"], &["--node-ttl", "3s"], &[]);
    let notify_path = c.dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    // node-a again, now under the stand-in (stopped cleanly first: a new generation).
    c.sidecars[0].proc.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(wait_exit(&mut c.sidecars[0].proc, Duration::from_secs(30)).success());
    let child = c.spawn_sidecar_env(0, &[], &[("NOTIFY_SOCKET", notify_path.as_os_str())]);
    c.sidecars[0].proc.child = Some(child);
    assert_eq!(receive_notification(&notify).0, "READY=1");
    c.wait_sidecar(0, Duration::from_secs(10));
    put_all(&c);
    let before = segment_of_a(&c);
    let local = Reader::start(&c, 0);
    let remote = Reader::start(&c, 1);
    wait_until("reads before the reload", Duration::from_secs(10), || {
        local.good() > 50 && remote.good() > 20
    });

    let old_pid = c.sidecars[0].proc.pid().unwrap();
    c.sidecars[0].proc.signal(nix::sys::signal::Signal::SIGUSR2);
    let (new_pid, barrier) = adopted(&notify);
    let mut reap = Reap(vec![new_pid]);
    assert_ne!(new_pid, old_pid);
    // The barrier is held: the old process must still be there.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        c.sidecars[0].proc.is_running(),
        "the old process exited before the supervisor confirmed the new main pid"
    );
    drop(barrier);
    let st = wait_exit(&mut c.sidecars[0].proc, Duration::from_secs(10));
    assert!(
        st.success(),
        "the old sidecar exits 0 once it handed over: {st:?}"
    );
    assert!(!ended(new_pid), "the successor serves");
    let (l0, r0) = (local.good(), remote.good());
    wait_until(
        "reads go on after the reload",
        Duration::from_secs(20),
        || local.good() > l0 + 50 && remote.good() > r0 + 20,
    );
    assert_eq!(
        segment_of_a(&c),
        before,
        "no remount: same node id and generation"
    );
    check_all(&c, 0, "after the reload, a new client of node-a");

    // The successor reloads in turn (its own argv already holds --takeover).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new_pid as i32),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .unwrap();
    let (third, barrier) = adopted(&notify);
    reap.0.push(third);
    assert!(third != new_pid && third != old_pid);
    drop(barrier);
    wait_until("the first successor exits", Duration::from_secs(10), || {
        ended(new_pid)
    });
    wait_until(
        "reads go on after the second reload",
        Duration::from_secs(20),
        || local.good() > l0 + 120,
    );
    assert_eq!(segment_of_a(&c), before, "still the same generation");
    local.finish("node-a's client");
    remote.finish("node-b's client");
    check_all(&c, 1, "after two reloads, node-b over the data plane");

    // SIGTERM to the last one: it stops like any sidecar (STOPPING=1, unmounts).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(third as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(receive_notification(&notify).0, "STOPPING=1");
    wait_until("the last successor stops", Duration::from_secs(30), || {
        ended(third)
    });
}

/// The DaemonSet's rolling update (`maxSurge: 1`, `deploy/kubernetes/base`): its pods run the
/// sidecar with `--takeover-if-running --after-handover wait`. One started when no sidecar runs
/// on the node (first start, or after a crash left a stale hand-over socket) mounts; one
/// started beside the running one takes the node over, and the old process stays, idle, until
/// the SIGTERM of its pod's deletion (a container that ended would be restarted), then exits 0
/// without unmounting: the generation serves on.
#[test]
fn a_surge_pod_takes_the_node_over_and_the_old_process_waits_for_its_sigterm() {
    const POD: [&str; 3] = ["--takeover-if-running", "--after-handover", "wait"];
    let mut c = Cluster::start_with(&["128MiB", "64MiB"], &["--node-ttl", "3s"], &[]);
    // node-a as the DaemonSet runs it (stopped cleanly first: nothing to take over).
    c.sidecars[0].proc.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(wait_exit(&mut c.sidecars[0].proc, Duration::from_secs(30)).success());
    let child = c.spawn_sidecar(0, &POD);
    c.sidecars[0].proc.child = Some(child);
    c.wait_sidecar(0, Duration::from_secs(10));
    let mounting = "no running sidecar to take over: mounting";
    let log_path = c.sidecars[0].proc.log.clone();
    let log = || std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log().matches(mounting).count(), 1, "the first pod mounts");
    put_all(&c);
    let before = segment_of_a(&c);
    let local = Reader::start(&c, 0);
    let remote = Reader::start(&c, 1);
    wait_until("reads before the update", Duration::from_secs(10), || {
        local.good() > 50 && remote.good() > 20
    });

    // The surge pod.
    let child = c.spawn_sidecar(0, &POD);
    let mut old = Proc {
        child: c.sidecars[0].proc.child.replace(child),
        log: c.sidecars[0].proc.log.clone(),
    };
    wait_until("the surge pod takes over", Duration::from_secs(30), || {
        log().contains("segment taken over from the running sidecar (no remount)")
    });
    let (l0, r0) = (local.good(), remote.good());
    wait_until(
        "reads go on through the new process",
        Duration::from_secs(20),
        || local.good() > l0 + 50 && remote.good() > r0 + 20,
    );
    assert!(old.is_running(), "the old process waits for its SIGTERM");
    assert!(log().contains("handed over: idle until SIGTERM"));
    // The old pod is deleted.
    old.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(wait_exit(&mut old, Duration::from_secs(10)).success());
    // Past the node TTL: the same generation, heartbeated by the new process.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(segment_of_a(&c), before, "no unmount, no remount");
    local.finish("node-a's client");
    remote.finish("node-b's client");
    check_all(&c, 1, "after the update, node-b over the data plane");

    // A crash leaves the hand-over socket's file behind: the next pod mounts anew.
    c.sidecars[0].proc.kill();
    assert!(handover_socket(&c).exists(), "a stale hand-over socket");
    let child = c.spawn_sidecar(0, &POD);
    c.sidecars[0].proc.child = Some(child);
    c.wait_sidecar(0, Duration::from_secs(10));
    assert_eq!(
        log().matches(mounting).count(),
        2,
        "the pod after a crash mounts"
    );
    wait_until("a new generation", Duration::from_secs(10), || {
        segment_of_a(&c).1 > before.1
    });
}
