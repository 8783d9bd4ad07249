//! Hosts made of network namespaces: a bridge namespace with one Linux bridge per subnet, and
//! host namespaces joined to it by veth pairs.
//!
//! Every name starts with a per-run prefix `rgc<pid>n<k>` (`k` counts runs inside one process,
//! so parallel tests do not collide), which is how [`sweep_stale`] recognises what a dead run
//! left behind. [`Topology`] removes everything it made when dropped (also while unwinding from a
//! failed test), and [`install_signal_cleanup`] does the same on SIGINT/SIGTERM.
//!
//! Interfaces are created directly inside their namespaces, so their short names (`eth0`, and
//! `m1e0` on the bridge side) only need to be unique per namespace, not on the machine.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};

/// Prefix of every name a chaos run creates.
pub const PREFIX: &str = "rgc";

/// When set, a run keeps its directory (metad logs and data, nft scripts) for inspection;
/// namespaces and processes are removed all the same.
pub const KEEP_ENV: &str = "REGOLITH_CHAOS_KEEP";

/// Subnet of NIC `i` (`10.77.i.0/24`); the bridge namespace holds `.254` on each, which is
/// where the observer (status sampler, admin calls) lives.
pub fn subnet_addr(nic: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, nic, host)
}

/// The observer's address on NIC subnet `nic`.
pub fn observer_addr(nic: u8) -> Ipv4Addr {
    subnet_addr(nic, 254)
}

// ---------------------------------------------------------------------------- preconditions

/// Fails (never skips) when the suite cannot run here: not root, or `ip` / `nft` missing.
pub fn check_preconditions() -> Result<()> {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)".to_string());
    }
    for (tool, arg, package) in [("ip", "-V", "iproute2"), ("nft", "--version", "nftables")] {
        let ok = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            missing.push(format!("`{tool}` (apt-get install -y {package})"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Precondition(format!(
            "missing: {}",
            missing.join(", ")
        )))
    }
}

// ---------------------------------------------------------------------------- commands

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub fn run_cmd(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(shown.clone(), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

fn ip(args: &[&str]) -> Result<String> {
    run_cmd(Command::new("ip").args(args))
}

/// Runs `program args…` inside namespace `ns` and waits for it.
pub fn exec_in(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    run_cmd(
        Command::new("ip")
            .args(["netns", "exec", ns, program])
            .args(args),
    )
}

/// Applies an nftables script inside namespace `ns`.
pub fn nft_apply(ns: &str, dir: &Path, name: &str, script: &str) -> Result<()> {
    let path = dir.join(format!("{name}.nft"));
    std::fs::write(&path, script).map_err(|e| Error::io(path.display().to_string(), e))?;
    exec_in(ns, "nft", &["-f", &path.to_string_lossy()])?;
    Ok(())
}

/// Deletes nftables table `inet NAME` in `ns`; absent is fine (heal is idempotent).
pub fn nft_delete_table(ns: &str, table: &str) -> Result<()> {
    let listed = exec_in(ns, "nft", &["list", "tables"])?;
    if listed
        .lines()
        .any(|l| l.trim() == format!("table inet {table}"))
    {
        exec_in(ns, "nft", &["delete", "table", "inet", table])?;
    }
    Ok(())
}

/// Spawns `program args…` inside namespace `ns` (through `ip netns exec`, which execs the program
/// itself, so the child's pid is the daemon's). The child gets SIGKILL if this thread dies, so an
/// interrupted run leaves no daemon behind.
pub fn spawn_in(
    ns: &str,
    program: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
    log: &Path,
) -> Result<Child> {
    spawn_in_env(ns, program, args, log, &[])
}

/// [`spawn_in`] with `env` set for the program.
pub fn spawn_in_env(
    ns: &str,
    program: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
    log: &Path,
    env: &[(String, String)],
) -> Result<Child> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::io(log.display().to_string(), e))?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .envs(env.iter().map(|(k, v)| (k, v)));
    // SAFETY: pre_exec runs in the forked child before exec; prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .map_err(|e| Error::io(format!("spawn {} in {ns}", program.display()), e))
}

// ---------------------------------------------------------------------------- run ids

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh run id `rgc<pid>n<k>`.
pub fn new_run_id() -> String {
    format!(
        "{PREFIX}{}n{}",
        std::process::id(),
        RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid in a name made by this module (`rgc<pid>n…`), if it is one.
pub fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() || !rest[digits.len()..].starts_with('n') {
        return None;
    }
    digits.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    // Signal 0 checks existence; EPERM would mean "exists, not ours" (we are root: not seen).
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Where runs keep their data directories and logs.
pub fn runs_root() -> PathBuf {
    std::env::temp_dir().join("regolith-chaos")
}

// ---------------------------------------------------------------------------- namespaces

fn list_netns() -> Result<Vec<String>> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// Kills every process inside namespace `ns` (SIGKILL also ends stopped ones) and deletes it.
fn destroy_netns(ns: &str) -> Result<()> {
    if let Ok(pids) = ip(&["netns", "pids", ns]) {
        for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    ip(&["netns", "del", ns]).map(|_| ())
}

/// Removes what dead runs left behind: namespaces and run directories whose owner pid is gone.
/// Returns the names removed.
pub fn sweep_stale() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for ns in list_netns()? {
        if let Some(pid) = owner_pid(&ns) {
            if !pid_alive(pid) {
                tracing::warn!(%ns, pid, "removing a namespace left by a dead chaos run");
                // Another run may be sweeping the same leftovers at once: not fatal.
                match destroy_netns(&ns) {
                    Ok(()) => removed.push(ns),
                    Err(e) => tracing::warn!(%ns, error = %e, "could not remove leftover"),
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(runs_root()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if owner_pid(&name).is_some_and(|pid| !pid_alive(pid)) {
                let _ = std::fs::remove_dir_all(e.path());
                removed.push(name);
            }
        }
    }
    Ok(removed)
}

// ---------------------------------------------------------------------------- signal hook

/// What a live run must remove if the process is interrupted.
#[derive(Debug, Default)]
struct LiveRun {
    namespaces: Vec<String>,
    dir: Option<PathBuf>,
}

fn live_runs() -> &'static Mutex<BTreeMap<String, LiveRun>> {
    static LIVE: OnceLock<Mutex<BTreeMap<String, LiveRun>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn register_live(run_id: &str, run: LiveRun) {
    if let Ok(mut live) = live_runs().lock() {
        live.insert(run_id.to_string(), run);
    }
}

fn unregister_live(run_id: &str) {
    if let Ok(mut live) = live_runs().lock() {
        live.remove(run_id);
    }
}

/// Set by the signal handler before it cleans up: the process's exit is then its decision.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a SIGINT/SIGTERM arrived (its handler is removing the live runs and will exit the
/// process with 128+signal).
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// What a program's `main` returns through: after a signal the handler decides the exit
/// status (128+signal, once the namespaces and directories are gone), so a `main` that
/// finished meanwhile — its run failing because its namespaces were going away under it —
/// waits for the handler's exit instead of exiting 1 before the cleanup is done.
pub fn exit_after_cleanup(code: std::process::ExitCode) -> std::process::ExitCode {
    while interrupted() {
        std::thread::park_timeout(std::time::Duration::from_secs(1));
    }
    code
}

/// Installs (once per process) a SIGINT/SIGTERM handler that removes every live run's
/// namespaces and directories, then exits with 128+signal. Daemons die with their namespaces
/// (and by their parent-death signal).
pub fn install_signal_cleanup() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            use signal_hook::consts::{SIGINT, SIGTERM};
            let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
                .map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("chaos-signal-cleanup".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
                        eprintln!("regolith-chaos: signal {sig}: removing namespaces and exiting");
                        cleanup_all_live();
                        std::process::exit(128 + sig);
                    }
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| Error::Precondition(format!("cannot install the signal hook: {e}")))
}

fn cleanup_all_live() {
    let runs = match live_runs().lock() {
        Ok(mut live) => std::mem::take(&mut *live),
        Err(_) => return,
    };
    for run in runs.values() {
        for ns in &run.namespaces {
            let _ = destroy_netns(ns);
        }
        if let Some(dir) = &run.dir {
            remove_run_dir(dir);
        }
    }
}

/// Removes an interrupted run's directory. The run's own threads go on while this one
/// cleans up (a fault's heal may be creating a disk directory in it, a sidecar killed a moment
/// ago may still be finishing a write), so one `remove_dir_all` can fail or be followed by a
/// new entry: it is done again until the directory stays gone (2 s at most).
fn remove_run_dir(dir: &std::path::Path) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < end {
        let _ = std::fs::remove_dir_all(dir);
        std::thread::sleep(std::time::Duration::from_millis(50));
        if !dir.exists() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------- topology

/// One interface of a host: its name inside the host, its address, its subnet (bridge) index.
#[derive(Clone, Debug)]
pub struct Nic {
    pub ifname: String,
    pub addr: Ipv4Addr,
    pub subnet: u8,
}

/// A host: a network namespace with one or more NICs on the bridges.
#[derive(Clone, Debug)]
pub struct Host {
    /// Logical name (`m1`, `s2`).
    pub name: String,
    /// Namespace name (`rgc123n0-m1`).
    pub ns: String,
    pub nics: Vec<Nic>,
}

impl Host {
    /// The address on the first NIC (where daemons listen by default).
    pub fn addr(&self) -> Ipv4Addr {
        self.nics[0].addr
    }
}

/// What to build: host name → number of NICs and the last octet of its addresses.
#[derive(Clone, Debug)]
pub struct HostSpec {
    pub name: String,
    pub nics: u8,
    pub octet: u8,
}

/// The standard chaos cluster: four metad hosts (`m1`..`m4`, one NIC; the fourth is the spare
/// for membership changes) and three sidecar hosts (`s1`..`s3`, two NICs each).
pub fn standard_hosts() -> Vec<HostSpec> {
    let mut hosts = Vec::new();
    for i in 1..=4u8 {
        hosts.push(HostSpec {
            name: format!("m{i}"),
            nics: 1,
            octet: 10 + i,
        });
    }
    for i in 1..=3u8 {
        hosts.push(HostSpec {
            name: format!("s{i}"),
            nics: 2,
            octet: 20 + i,
        });
    }
    hosts
}

/// A built topology. Dropping it removes every namespace (their veths and nftables tables go
/// with them; processes inside are killed first) and the run directory.
#[derive(Debug)]
pub struct Topology {
    pub run_id: String,
    pub bridge_ns: String,
    pub hosts: BTreeMap<String, Host>,
    /// Run directory: data dirs, logs, nft scripts.
    pub dir: PathBuf,
    created: Vec<String>,
}

impl Topology {
    /// Checks preconditions, sweeps leftovers of dead runs, installs the signal hook, then builds
    /// the hosts.
    pub fn build(specs: &[HostSpec]) -> Result<Self> {
        check_preconditions()?;
        let swept = sweep_stale()?;
        if !swept.is_empty() {
            tracing::info!(?swept, "removed leftovers of dead chaos runs");
        }
        install_signal_cleanup()?;
        let run_id = new_run_id();
        let dir = runs_root().join(&run_id);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        let mut topo = Topology {
            bridge_ns: format!("{run_id}-br"),
            run_id,
            hosts: BTreeMap::new(),
            dir,
            created: Vec::new(),
        };
        // Register before creating anything, so an interrupt mid-build still cleans up.
        topo.sync_live();
        topo.build_bridges(specs)?;
        for spec in specs {
            topo.build_host(spec)?;
        }
        tracing::info!(run = %topo.run_id, hosts = topo.hosts.len(), "topology up");
        Ok(topo)
    }

    fn sync_live(&self) {
        let mut namespaces = self.created.clone();
        // Names about to be created are listed too: deleting an absent one is harmless.
        namespaces.push(self.bridge_ns.clone());
        register_live(
            &self.run_id,
            LiveRun {
                namespaces,
                dir: Some(self.dir.clone()),
            },
        );
    }

    fn add_netns(&mut self, ns: &str) -> Result<()> {
        self.created.push(ns.to_string());
        self.sync_live();
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    fn build_bridges(&mut self, specs: &[HostSpec]) -> Result<()> {
        let br = self.bridge_ns.clone();
        self.add_netns(&br)?;
        let subnets = specs.iter().map(|s| s.nics).max().unwrap_or(1);
        for i in 0..subnets {
            let name = format!("br{i}");
            ip(&["-n", &br, "link", "add", &name, "type", "bridge"])?;
            ip(&[
                "-n",
                &br,
                "addr",
                "add",
                &format!("{}/24", observer_addr(i)),
                "dev",
                &name,
            ])?;
            ip(&["-n", &br, "link", "set", &name, "up"])?;
        }
        Ok(())
    }

    fn build_host(&mut self, spec: &HostSpec) -> Result<()> {
        let ns = format!("{}-{}", self.run_id, spec.name);
        self.add_netns(&ns)?;
        let br = self.bridge_ns.clone();
        let mut nics = Vec::new();
        for i in 0..spec.nics {
            let ifname = format!("eth{i}");
            let peer = format!("{}e{i}", spec.name);
            let addr = subnet_addr(i, spec.octet);
            ip(&[
                "-n", &ns, "link", "add", &ifname, "type", "veth", "peer", "name", &peer, "netns",
                &br,
            ])?;
            ip(&["-n", &br, "link", "set", &peer, "master", &format!("br{i}")])?;
            ip(&["-n", &br, "link", "set", &peer, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &ifname,
            ])?;
            ip(&["-n", &ns, "link", "set", &ifname, "up"])?;
            nics.push(Nic {
                ifname,
                addr,
                subnet: i,
            });
        }
        self.hosts.insert(
            spec.name.clone(),
            Host {
                name: spec.name.clone(),
                ns,
                nics,
            },
        );
        Ok(())
    }

    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts
            .get(name)
            .ok_or_else(|| Error::Config(format!("no host {name} in the topology")))
    }

    /// Removes everything now (Drop does the same; calling both is harmless).
    pub fn teardown(&mut self) {
        for ns in self.created.drain(..).rev() {
            if let Err(e) = destroy_netns(&ns) {
                tracing::warn!(%ns, error = %e, "could not delete namespace");
            }
        }
        if std::env::var_os(KEEP_ENV).is_some() {
            eprintln!("regolith-chaos: kept run directory {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        unregister_live(&self.run_id);
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

// ---------------------------------------------------------------------------- threads in a namespace

/// An open handle on a named namespace, to move threads into it.
#[derive(Clone, Debug)]
pub struct NetnsHandle {
    name: String,
    file: Arc<File>,
    inode: u64,
}

impl NetnsHandle {
    pub fn open(ns: &str) -> Result<Self> {
        let path = Path::new("/run/netns").join(ns);
        let file = File::open(&path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let inode = file
            .metadata()
            .map_err(|e| Error::io(path.display().to_string(), e))?
            .ino();
        Ok(Self {
            name: ns.to_string(),
            file: Arc::new(file),
            inode,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves the calling thread into this namespace. Only sockets created afterwards on this
    /// thread (or on threads it spawns) belong to it.
    pub fn enter(&self) -> Result<()> {
        nix::sched::setns(&*self.file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::sys(format!("setns into {}", self.name), e))?;
        Ok(())
    }

    /// Whether the calling thread is in this namespace.
    pub fn is_current(&self) -> bool {
        std::fs::metadata("/proc/thread-self/ns/net")
            .map(|m| m.ino() == self.inode)
            .unwrap_or(false)
    }
}

/// A tokio runtime whose every thread lives in one network namespace, so the sockets its tasks
/// open are that host's. Run work with [`NsRuntime::run`] (never `block_on` a future that opens
/// sockets: `block_on` polls on the calling thread, which is in the root namespace).
pub struct NsRuntime {
    rt: tokio::runtime::Runtime,
    ns: NetnsHandle,
}

impl std::fmt::Debug for NsRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsRuntime")
            .field("ns", &self.ns.name)
            .finish()
    }
}

impl NsRuntime {
    pub fn new(ns: &str, threads: usize) -> Result<Self> {
        let handle = NetnsHandle::open(ns)?;
        let on_start = handle.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(format!("ns-{ns}"))
            .on_thread_start(move || {
                if let Err(e) = on_start.enter() {
                    // Checked right below (and the thread's sockets would be in the wrong place).
                    tracing::error!(error = %e, "runtime thread could not enter its namespace");
                }
            })
            .enable_all()
            .build()
            .map_err(|e| Error::io(format!("runtime for {ns}"), e))?;
        let me = Self { rt, ns: handle };
        let probe = me.ns.clone();
        if !me.run(async move { probe.is_current() }) {
            return Err(Error::Precondition(format!(
                "runtime threads are not inside namespace {ns}"
            )));
        }
        Ok(me)
    }

    pub fn ns(&self) -> &str {
        self.ns.name()
    }

    /// Runs `fut` on one of the runtime's threads and waits for it.
    pub fn run<F>(&self, fut: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.rt.spawn(fut);
        match self.rt.block_on(task) {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("task of runtime {} cancelled: {e}", self.ns.name()),
        }
    }

    /// Spawns `fut` on the runtime without waiting.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(fut)
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.rt.handle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("rgc1234n0-m1"), Some(1234));
        assert_eq!(owner_pid("rgc1234n12"), Some(1234));
        assert_eq!(owner_pid("rgcx-m1"), None);
        assert_eq!(owner_pid("rgc12-m1"), None);
        assert_eq!(owner_pid("other"), None);
    }

    #[test]
    fn run_ids_are_distinct_and_parse_back() {
        let a = new_run_id();
        let b = new_run_id();
        assert_ne!(a, b);
        assert_eq!(owner_pid(&a), Some(std::process::id() as i32));
    }
}
