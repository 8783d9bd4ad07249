//! A rolling upgrade of the metad trio (issue 16): each replica in turn stopped with SIGTERM
//! and started again (the same binary stands in for the new one) while a client puts and gets
//! in a loop through a sidecar. A leader hands its office over before it exits
//! (`--leader-handover-timeout`), so the cluster has a leader throughout: when a stopping
//! leader's process has exited, another replica already leads a later term. No client call
//! fails, and every acknowledged put reads back byte-exact. `regolith metad transfer-leader
//! --to ID` hands over on request.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regolith_client::ReplicateConfig;
use regolith_e2e::{regolith_bin, value, wait_until, Cluster};

fn size(n: usize) -> usize {
    [4_096, 40_000, 200_000][n % 3] + n
}

/// Puts new keys and gets acknowledged ones in a loop through sidecar 0.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, usize)>>>,
    failures: Arc<Mutex<Vec<String>>>,
    gets: Arc<AtomicU64>,
    task: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(c: &Cluster) -> Self {
        let cl = c.client(0);
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let gets = Arc::new(AtomicU64::new(0));
        let (s, a, f, g) = (stop.clone(), acked.clone(), failures.clone(), gets.clone());
        let task = std::thread::spawn(move || {
            let cfg = ReplicateConfig::default();
            let mut n = 0;
            while !s.load(Ordering::Relaxed) {
                let k = format!("roll-{n}");
                match cl.put(&k, &value(&k, size(n)), &cfg) {
                    Ok(_) => a.lock().unwrap().push((k, size(n))),
                    Err(e) => f.lock().unwrap().push(format!("put {k}: {e}")),
                }
                // Read back an earlier acknowledged key (a different one each time).
                let earlier = {
                    let a = a.lock().unwrap();
                    (!a.is_empty()).then(|| a[(n * 7) % a.len()].clone())
                };
                if let Some((k, len)) = earlier {
                    match cl.get(&k) {
                        Ok(v) if v == value(&k, len) => {
                            g.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => f.lock().unwrap().push(format!("get {k}: wrong bytes")),
                        Err(e) => f.lock().unwrap().push(format!("get {k}: {e}")),
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self {
            stop,
            acked,
            failures,
            gets,
            task: Some(task),
        }
    }

    fn puts(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn finish(mut self) -> (Vec<(String, usize)>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.take().unwrap().join().unwrap();
        let acked = std::mem::take(&mut *self.acked.lock().unwrap());
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        (acked, failures)
    }
}

/// Replica `i`'s role and term by its `/status` (None when it does not answer).
fn role_term(c: &Cluster, i: usize) -> Option<(String, u64)> {
    let s = c.metad_status(i)?;
    Some((s["role"].as_str()?.to_string(), s["term"].as_u64()?))
}

fn wait_exit(c: &mut Cluster, i: usize, within: Duration) -> std::process::ExitStatus {
    let child = c.metad[i].proc.child.as_mut().expect("running");
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            c.metad[i].proc.child = None;
            return st;
        }
        assert!(
            Instant::now() < end,
            "metad {i} still running after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Replica `i` has caught up: it follows a leader and has applied what the leader had applied
/// when asked.
fn wait_caught_up(c: &Cluster, i: usize) {
    let leader = c.wait_leader(Duration::from_secs(20));
    let target = c.metad_status(leader).expect("leader status")["last_applied"]
        .as_u64()
        .unwrap();
    wait_until(
        &format!("metad {i} catches up to index {target}"),
        Duration::from_secs(30),
        || {
            c.metad_status(i).is_some_and(|s| {
                s["last_applied"].as_u64().unwrap_or(0) >= target && s["leader_id"].is_u64()
            })
        },
    );
}

#[test]
fn a_rolling_restart_of_the_trio_keeps_a_leader_and_every_put() {
    let mut c = Cluster::start(&["128MiB"]);
    let first = c.wait_leader(Duration::from_secs(20));
    let load = Load::start(&c);
    wait_until("puts flow", Duration::from_secs(20), || load.puts() > 20);

    // The leader first (so at least one stop is a leader's), then the others; whoever leads
    // when its turn comes hands over.
    let order = [first, (first + 1) % 3, (first + 2) % 3];
    let mut handovers = 0;
    for &i in &order {
        let (role, term) = role_term(&c, i).expect("status before the stop");
        let puts_before = load.puts();
        c.metad[i].proc.signal(nix::sys::signal::Signal::SIGTERM);
        let st = wait_exit(&mut c, i, Duration::from_secs(30));
        assert!(st.success(), "metad {i} exits 0 on SIGTERM: {st:?}");
        if role == "leader" {
            // No waiting here: the hand-over is over before the process exits.
            let leaders: Vec<(usize, u64)> = (0..3)
                .filter(|&j| j != i)
                .filter_map(|j| role_term(&c, j).map(|(r, t)| (j, r, t)))
                .filter(|(_, r, _)| r == "leader")
                .map(|(j, _, t)| (j, t))
                .collect();
            assert!(
                leaders.len() == 1 && leaders[0].1 > term,
                "when stopped leader {i} (term {term}) had exited, another replica led a later \
                 term: {leaders:?}"
            );
            let log = std::fs::read_to_string(&c.metad[i].proc.log).unwrap();
            assert!(log.contains("handed over; stopping"), "metad {i}'s log");
            handovers += 1;
        }
        let launch = c.metad_launch(i);
        c.spawn_metad(i, &launch, &[]);
        wait_caught_up(&c, i);
        wait_until(
            &format!("puts go on after metad {i}'s restart"),
            Duration::from_secs(20),
            || load.puts() > puts_before + 10,
        );
    }
    assert!(handovers >= 1);

    // On request, to a named voter.
    let leader = c.wait_leader(Duration::from_secs(20));
    let to = (leader + 1) % 3;
    let (_, term) = role_term(&c, leader).unwrap();
    let out = Command::new(regolith_bin())
        .args(["--metad", &c.metad_addrs(), "--cluster-token-file"])
        .arg(&c.token_file)
        .args([
            "metad",
            "transfer-leader",
            "--to",
            &c.metad[to].id.to_string(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "transfer-leader: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("-> node {}", c.metad[to].id)),
        "{stdout}"
    );
    let (role, new_term) = role_term(&c, to).unwrap();
    assert!(role == "leader" && new_term > term, "{role} {new_term}");
    // Asking for the impossible fails with a reason and changes nothing.
    let out = Command::new(regolith_bin())
        .args(["--metad", &c.metad_addrs(), "--cluster-token-file"])
        .arg(&c.token_file)
        .args(["metad", "transfer-leader", "--to", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a voter"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(role_term(&c, to).unwrap(), ("leader".to_string(), new_term));

    std::thread::sleep(Duration::from_millis(300));
    let gets = load.gets.load(Ordering::Relaxed);
    let (acked, failures) = load.finish();
    eprintln!(
        "{} puts acknowledged, {gets} gets, {handovers} hand-overs",
        acked.len()
    );
    assert!(failures.is_empty(), "client calls failed: {failures:?}");
    let cl = c.client(0);
    for (k, len) in &acked {
        let got = cl
            .get(k)
            .unwrap_or_else(|e| panic!("acknowledged {k} after the upgrade: {e}"));
        assert!(got == value(k, *len), "{k}: wrong bytes");
    }
}
