//! `regolith up`: a whole cluster on this machine, in the foreground.
//!
//! It starts `--metad` replicas of `regolith-metad` (one Raft group, bootstrapped together) and
//! `--sidecars` sidecars, each with its own socket `DIR/node-<i>.sock`, state dir and two
//! loopback NICs (`127.0.(10+i).1` and `.2`), all sharing a cluster token `DIR/token` (made on
//! the first start, kept after). Ports: [`crate::layout`]. It waits until a leader is ready and
//! every sidecar serves, prints the sockets, the metad addresses, a status table and the
//! `export REGOLITH_...` lines for other shells (also written to `DIR/env`), and then waits for
//! Ctrl-C or SIGTERM: sidecars get SIGTERM first (they unmount from the leader), then the metad
//! replicas; whatever outlives `--stop-timeout` (or a second Ctrl-C) is killed.
//!
//! `DIR` keeps the cluster between runs: `regolith up` again in the same `DIR` restarts it with
//! its data and token (the same `--metad` and `--base-port` are needed: Raft membership is
//! stored). Remove `DIR` to start afresh.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::args::{UpArgs, DEFAULT_DIR};
use crate::cluster_file::{self, ClusterFile, MetadEntry, SidecarEntry, TlsEntry};
use crate::cmd::status;
use crate::ctx::{Ctx, Metad};
use crate::error::{Error, Result};
use crate::format::Table;
use crate::layout::{self, Layout};
use crate::procs::{self, Proc, Spec};
use regolith_proto::launch::{MetadLaunch, SidecarLaunch, TlsLaunch};

const METAD_BIN: &str = "regolith-metad";
const SIDECAR_BIN: &str = "regolith-sidecar";
/// How often start-up and the foreground loop look at the children and at signals.
const POLL: Duration = Duration::from_millis(100);
/// The line that says the cluster serves (scripts and tests wait for it).
pub const READY: &str = "ready: Ctrl-C or SIGTERM stops the cluster";

pub fn run(ctx: &Ctx, args: &UpArgs) -> Result<()> {
    if args.segment_size == 0 {
        return Err(Error::usage(
            "--segment-size must be more than 0 (each sidecar contributes memory)",
        ));
    }
    let layout = layout::plan(args.metad, args.sidecars, args.base_port)?;
    let bins = Binaries::find(args)?;
    let mut interrupt = Interrupt::install()?;
    let dir = prepare_dir(&ctx.global.dir)?;
    check_previous_cluster(&dir, &layout)?;
    check_ports(&layout)?;
    clear_stale_sockets(&dir)?;
    let token_file = ensure_token(&dir)?;
    let tls = if args.tls {
        Some(make_tls(&dir, &layout)?)
    } else {
        None
    };
    let mut up = Up::new(dir, layout, token_file, bins, args, ctx.global.verbose);
    up.tls = tls;
    up.default_dir = ctx.global.dir == Path::new(DEFAULT_DIR);
    up.describe().save(&up.dir)?;
    tracing::info!(dir = %up.dir.display(), metad = args.metad, sidecars = args.sidecars, "starting the cluster");
    let started = up.start(&mut interrupt);
    let result = match started {
        Ok(true) => {
            up.print_ready()?;
            up.supervise(&mut interrupt)
        }
        Ok(false) => {
            tracing::info!("interrupted before the cluster was ready");
            Ok(())
        }
        Err(e) => Err(e),
    };
    let stopped = up.stop(&mut interrupt);
    result.and(stopped)
}

// ------------------------------------------------------------------ binaries

struct Binaries {
    metad: PathBuf,
    sidecar: PathBuf,
}

impl Binaries {
    fn find(args: &UpArgs) -> Result<Self> {
        Ok(Self {
            metad: find_binary(METAD_BIN, "--metad-bin", args.metad_bin.as_deref())?,
            sidecar: find_binary(SIDECAR_BIN, "--sidecar-bin", args.sidecar_bin.as_deref())?,
        })
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `given` (a path, or a bare name looked up on `$PATH`), else `name` next to this executable,
/// else on `$PATH`.
fn find_binary(name: &'static str, flag: &'static str, given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        let bare = p.components().count() == 1;
        return match (is_executable(p), bare) {
            (true, _) => Ok(p.to_path_buf()),
            (false, true) => on_path(&p.to_string_lossy())
                .ok_or_else(|| Error::usage(format!("{flag} {}: not found on $PATH", p.display()))),
            (false, false) => Err(Error::usage(format!(
                "{flag} {}: no such executable file",
                p.display()
            ))),
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)));
    if let Some(p) = beside.as_ref().filter(|p| is_executable(p)) {
        return Ok(p.clone());
    }
    on_path(name).ok_or_else(|| Error::MissingBinary {
        name,
        looked: match beside.as_ref().and_then(|p| p.parent()) {
            Some(d) => format!("in {} and on $PATH", d.display()),
            None => "on $PATH".into(),
        },
        flag,
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

// ------------------------------------------------------------------ signals

/// SIGINT, SIGTERM and SIGHUP (the terminal went away), counted: a second one during the
/// stop kills what is left.
struct Interrupt {
    signals: Signals,
    count: usize,
}

impl Interrupt {
    fn install() -> Result<Self> {
        let signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
        Ok(Self { signals, count: 0 })
    }

    /// Signals received so far.
    fn poll(&mut self) -> usize {
        for sig in self.signals.pending() {
            tracing::info!(signal = sig, "signal received");
            self.count += 1;
        }
        self.count
    }
}

// ------------------------------------------------------------------ the directory

fn prepare_dir(dir: &Path) -> Result<PathBuf> {
    let create_err = |source| Error::File {
        what: "cannot create",
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir.join("logs")).map_err(create_err)?;
    dir.canonicalize().map_err(|source| Error::File {
        what: "cannot resolve",
        path: dir.to_path_buf(),
        source,
    })
}

/// A `DIR` used before must be restarted with the same metad addresses: Raft keeps them.
fn check_previous_cluster(dir: &Path, layout: &Layout) -> Result<()> {
    let Some(prev) = ClusterFile::load(dir)? else {
        return Ok(());
    };
    let has_data = prev.metad.iter().any(|m| m.data_dir.exists());
    if has_data && prev.metad_addrs() != layout.metad_addrs() {
        return Err(Error::usage(format!(
            "{} holds a cluster of {} metad replicas at {} (Raft keeps its members): start it with the same --metad and --base-port, or remove {} to start afresh",
            dir.display(),
            prev.metad.len(),
            prev.metad_addrs().join(","),
            dir.display()
        )));
    }
    Ok(())
}

fn check_ports(layout: &Layout) -> Result<()> {
    for (addr, what) in layout.listeners() {
        if let Err(e) = TcpListener::bind(addr) {
            return Err(Error::Startup(format!(
                "cannot listen on {addr} ({what}): {e}; is another `regolith up` running? --base-port PORT moves the cluster's ports"
            )));
        }
    }
    Ok(())
}

/// Removes sockets a killed `regolith up` left behind (`node-<i>.sock` that nobody serves), so
/// that `DIR` holds exactly one socket per running sidecar. A socket that answers means another
/// cluster serves this `DIR`.
fn clear_stale_sockets(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !(name.starts_with("node-") && name.ends_with(".sock")) {
            continue;
        }
        if UnixStream::connect(&path).is_ok() {
            return Err(Error::Startup(format!(
                "{} is served by a running sidecar: is another `regolith up` using {}?",
                path.display(),
                dir.display()
            )));
        }
        tracing::info!(socket = %path.display(), "removing a stale socket");
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

/// `DIR/token`: kept when it holds a valid token, else a new random one (mode 0600).
fn ensure_token(dir: &Path) -> Result<PathBuf> {
    ensure_secret(dir, cluster_file::TOKEN)
}

/// `DIR/NAME`: kept when it holds a valid secret, else a new random one (mode 0600).
fn ensure_secret(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.exists() && regolith_proto::auth::read_token_file(&path).is_ok() {
        return Ok(path);
    }
    let token: String = (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    let write_err = |source| Error::File {
        what: "cannot write",
        path: path.clone(),
        source,
    };
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(write_err)?;
    writeln!(f, "{token}").map_err(write_err)?;
    Ok(path)
}

/// `regolith up --tls`: a CA and one certificate per process in `DIR/tls`, made afresh at every
/// start (the CA's key is not kept: nothing can issue into the cluster afterwards).
struct UpTls {
    dir: PathBuf,
    ca: PathBuf,
}

impl UpTls {
    fn files(&self, name: &str) -> TlsLaunch {
        TlsLaunch {
            ca: self.ca.clone(),
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        }
    }

    fn client(&self) -> TlsLaunch {
        self.files(TLS_CLIENT)
    }

    fn load_client(&self) -> Result<regolith_proto::tls::Tls> {
        let c = self.client();
        regolith_proto::tls::TlsArgs {
            tls_ca: Some(c.ca),
            tls_cert: Some(c.cert),
            tls_key: Some(c.key),
            ..Default::default()
        }
        .load(false)
        .map_err(|e| Error::Failed(e.to_string()))?
        .ok_or_else(|| Error::Failed("TLS material missing".into()))
    }
}

/// The certificate the CLI presents to metad.
const TLS_CLIENT: &str = "client";

fn make_tls(dir: &Path, layout: &Layout) -> Result<UpTls> {
    use regolith_proto::pki::{write_pem, Ca};
    let tls_dir = dir.join("tls");
    std::fs::create_dir_all(&tls_dir).map_err(|source| Error::File {
        what: "cannot create",
        path: tls_dir.clone(),
        source,
    })?;
    let pki = |e: regolith_proto::Error| Error::Failed(format!("regolith up --tls: {e}"));
    let ca = Ca::new("Regolith local cluster CA").map_err(pki)?;
    let ca_path = tls_dir.join("ca.crt");
    write_pem(&ca_path, ca.cert_pem(), false).map_err(pki)?;
    let local = ["localhost".to_string(), "127.0.0.1".to_string()];
    for m in &layout.metad {
        let mut sans = local.to_vec();
        sans.push(m.grpc.ip().to_string());
        sans.dedup();
        let name = format!("metad-{}", m.id);
        ca.issue(&name, &sans)
            .and_then(|c| c.write(&tls_dir, &name, &ca_path))
            .map_err(pki)?;
    }
    for s in &layout.sidecars {
        // The node name too: metad runs with --tls-node-identity.
        let mut sans = vec![s.name.clone()];
        sans.extend(local.iter().cloned());
        sans.extend(s.nics.iter().map(|ip| ip.to_string()));
        ca.issue(&s.name, &sans)
            .and_then(|c| c.write(&tls_dir, &s.name, &ca_path))
            .map_err(pki)?;
    }
    ca.issue("regolith CLI", &["regolith-cli".to_string()])
        .and_then(|c| c.write(&tls_dir, TLS_CLIENT, &ca_path))
        .map_err(pki)?;
    Ok(UpTls {
        dir: tls_dir,
        ca: ca_path,
    })
}

// ------------------------------------------------------------------ the cluster

struct Up {
    dir: PathBuf,
    layout: Layout,
    token_file: PathBuf,
    bins: Binaries,
    segment_size: u64,
    /// `--disk-size`: each sidecar's disk tier under its state directory.
    disk_size: Option<u64>,
    /// The sidecars' object index (`--no-index` turns it off).
    index: bool,
    ready_timeout: Duration,
    stop_timeout: Duration,
    /// -v for the children when `regolith -vv up`.
    child_verbose: u8,
    /// `--dir` was left at its default.
    default_dir: bool,
    /// `--tls`: where the certificates are.
    tls: Option<UpTls>,
    metad: Vec<Proc>,
    sidecars: Vec<Proc>,
    /// Children whose unexpected exit was already reported.
    reported: Vec<String>,
}

impl Up {
    fn new(
        dir: PathBuf,
        layout: Layout,
        token_file: PathBuf,
        bins: Binaries,
        args: &UpArgs,
        verbose: u8,
    ) -> Self {
        Self {
            dir,
            layout,
            token_file,
            bins,
            segment_size: args.segment_size,
            disk_size: args.disk_size.filter(|s| *s > 0),
            index: !args.no_index,
            ready_timeout: args.ready_timeout,
            stop_timeout: args.stop_timeout,
            child_verbose: u8::from(verbose >= 2),
            default_dir: false,
            tls: None,
            metad: Vec::new(),
            sidecars: Vec::new(),
            reported: Vec::new(),
        }
    }

    /// Flags of sidecar `name` beyond its launch: the index, its disk.
    fn sidecar_extra(&self, name: &str) -> Vec<std::ffi::OsString> {
        let mut extra: Vec<std::ffi::OsString> = vec![format!("--index={}", self.index).into()];
        if let Some(size) = self.disk_size {
            let mut disk = self.dir.join(name).join("disk").into_os_string();
            disk.push(format!(":{size}"));
            extra.push("--disk".into());
            extra.push(disk);
        }
        extra
    }

    fn metad_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("metad-{id}"))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.sock"))
    }

    /// `DIR/cluster.json` for what is planned and started so far.
    fn describe(&self) -> ClusterFile {
        let pid = |procs: &[Proc], name: &str| procs.iter().find(|p| p.name == name).map(Proc::pid);
        ClusterFile {
            up_pid: std::process::id(),
            token_file: self.token_file.clone(),
            metad: self
                .layout
                .metad
                .iter()
                .map(|m| {
                    let name = format!("metad-{}", m.id);
                    MetadEntry {
                        id: m.id,
                        grpc: m.grpc.to_string(),
                        http_metadata: m.http_metadata.to_string(),
                        metrics: m.metrics.to_string(),
                        data_dir: self.metad_dir(m.id),
                        log: self.log(&name),
                        pid: pid(&self.metad, &name),
                    }
                })
                .collect(),
            sidecars: self
                .layout
                .sidecars
                .iter()
                .map(|s| SidecarEntry {
                    name: s.name.clone(),
                    socket: self.socket(&s.name),
                    nics: s.nics.iter().map(|ip| ip.to_string()).collect(),
                    data_port: s.data_port,
                    metrics: s.metrics.to_string(),
                    state_dir: self.dir.join(&s.name),
                    log: self.log(&s.name),
                    pid: pid(&self.sidecars, &s.name),
                })
                .collect(),
            tls: self.tls.as_ref().map(|t| {
                let c = t.client();
                TlsEntry {
                    ca: c.ca,
                    client_cert: c.cert,
                    client_key: c.key,
                }
            }),
        }
    }

    /// Starts everything and waits until it serves. Ok(false): interrupted first.
    fn start(&mut self, interrupt: &mut Interrupt) -> Result<bool> {
        let deadline = Instant::now() + self.ready_timeout;
        self.spawn_metads()?;
        self.describe().save(&self.dir)?;
        if !self.wait_leader(deadline, interrupt)? {
            return Ok(false);
        }
        self.spawn_sidecars()?;
        self.describe().save(&self.dir)?;
        for i in 0..self.sidecars.len() {
            if !self.wait_sidecar(i, deadline, interrupt)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn spawn_metads(&mut self) -> Result<()> {
        let peers = self.layout.members();
        for m in self.layout.metad.clone() {
            let name = format!("metad-{}", m.id);
            let launch = MetadLaunch {
                listen: Some(m.grpc.to_string()),
                advertise: Some(m.grpc.to_string()),
                peers: peers.clone(),
                bootstrap: true,
                data_dir: Some(self.metad_dir(m.id)),
                metrics_addr: Some(m.metrics.to_string()),
                cluster_token_file: Some(self.token_file.clone()),
                peer_token_file: Some(ensure_secret(&self.dir, cluster_file::PEER_TOKEN)?),
                http_metadata_addr: Some(m.http_metadata.to_string()),
                tls: self.tls.as_ref().map(|t| t.files(&name)),
                tls_node_identity: self.tls.is_some(),
                worker_threads: Some(1),
                verbose: self.child_verbose,
                ..MetadLaunch::new(m.id)
            };
            tracing::info!(%name, grpc = %m.grpc, "starting metad");
            let p = Proc::spawn(Spec {
                log: self.log(&name),
                name,
                bin: &self.bins.metad,
                args: launch.args(),
            })?;
            self.metad.push(p);
        }
        Ok(())
    }

    fn spawn_sidecars(&mut self) -> Result<()> {
        let metad = self.layout.metad_addrs();
        for s in self.layout.sidecars.clone() {
            let launch = SidecarLaunch {
                node_name: Some(s.name.clone()),
                state_dir: Some(self.dir.join(&s.name)),
                segment_size: Some(self.segment_size.to_string()),
                metad: metad.clone(),
                cluster_token_file: Some(self.token_file.clone()),
                nics: s.nics.iter().map(|ip| ip.to_string()).collect(),
                data_port: Some(s.data_port),
                socket: Some(self.socket(&s.name)),
                metrics_addr: Some(s.metrics.to_string()),
                tls: self.tls.as_ref().map(|t| t.files(&s.name)),
                verbose: self.child_verbose,
                extra: self.sidecar_extra(&s.name),
                ..SidecarLaunch::default()
            };
            tracing::info!(name = %s.name, socket = %self.socket(&s.name).display(), "starting sidecar");
            let p = Proc::spawn(Spec {
                log: self.log(&s.name),
                name: s.name.clone(),
                bin: &self.bins.sidecar,
                args: launch.args(),
            })?;
            self.sidecars.push(p);
        }
        Ok(())
    }

    /// An error naming the first child that exited, with the end of its log.
    fn check_children(&mut self) -> Result<()> {
        for p in self.metad.iter_mut().chain(self.sidecars.iter_mut()) {
            if let Some(st) = p.exited() {
                return Err(Error::Startup(format!(
                    "{} exited during start-up ({st}); the end of {}:\n{}",
                    p.name,
                    p.log.display(),
                    p.log_tail(20)
                )));
            }
        }
        Ok(())
    }

    fn timed_out(&self, what: &str, logs: &[&Proc]) -> Error {
        let tails: Vec<String> = logs
            .iter()
            .map(|p| format!("--- {} ({}):\n{}", p.name, p.log.display(), p.log_tail(10)))
            .collect();
        Error::Startup(format!(
            "{what} within --ready-timeout {:?}\n{}",
            self.ready_timeout,
            tails.join("\n")
        ))
    }

    /// Waits for a ready leader (metad's `/status`). Ok(false): interrupted.
    fn wait_leader(&mut self, deadline: Instant, interrupt: &mut Interrupt) -> Result<bool> {
        loop {
            if interrupt.poll() > 0 {
                return Ok(false);
            }
            self.check_children()?;
            let ready = self.layout.metad.iter().find_map(|m| {
                let s = crate::http::get_json(m.metrics, "/status", Duration::from_secs(1))?;
                (s["role"] == "leader" && s["leader_ready"] == true).then_some(m.id)
            });
            if let Some(id) = ready {
                tracing::info!(leader = id, "metad leader ready");
                return Ok(true);
            }
            if Instant::now() > deadline {
                let procs: Vec<&Proc> = self.metad.iter().collect();
                return Err(self.timed_out("no metad leader was elected", &procs));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until sidecar `i` accepts clients on its socket. Ok(false): interrupted.
    fn wait_sidecar(
        &mut self,
        i: usize,
        deadline: Instant,
        interrupt: &mut Interrupt,
    ) -> Result<bool> {
        let name = self.layout.sidecars[i].name.clone();
        let socket = self.socket(&name);
        loop {
            if interrupt.poll() > 0 {
                return Ok(false);
            }
            self.check_children()?;
            if UnixStream::connect(&socket).is_ok() {
                tracing::info!(%name, "sidecar serving");
                return Ok(true);
            }
            if Instant::now() > deadline {
                let p = &self.sidecars[i];
                return Err(self.timed_out(&format!("{name} did not serve"), &[p]));
            }
            std::thread::sleep(POLL);
        }
    }

    fn token(&self) -> Result<String> {
        regolith_proto::auth::read_token_file(&self.token_file)
            .map_err(|e| Error::Failed(e.to_string()))
    }

    /// The status table, once every segment is mounted and alive (or after a few seconds).
    fn status_table(&self) -> Result<String> {
        let tls = match &self.tls {
            Some(t) => Some(t.load_client()?),
            None => None,
        };
        let metad = Metad::connect(
            self.layout.metad_addrs(),
            Some(self.token()?),
            tls,
            Duration::from_secs(10),
        )?;
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let mut snap = metad.block_on(status::fetch(metad.client()))?;
            let alive = snap.segments.iter().filter(|s| s.alive).count();
            if alive >= self.sidecars.len() || Instant::now() > until {
                let addrs: Vec<_> = self.layout.sidecars.iter().map(|s| s.metrics).collect();
                status::add_tiers(&mut snap, &addrs);
                return Ok(status::render(&snap));
            }
            std::thread::sleep(POLL);
        }
    }

    fn export_lines(&self) -> Vec<String> {
        let first = self.layout.sidecars[0].name.clone();
        let mut lines = vec![
            format!("export REGOLITH_METAD={}", self.layout.metad_list()),
            format!(
                "export REGOLITH_SOCKET={}",
                shell_quote(&self.socket(&first))
            ),
            format!(
                "export REGOLITH_CLUSTER_TOKEN_FILE={}",
                shell_quote(&self.token_file)
            ),
        ];
        if let Some(t) = &self.tls {
            let c = t.client();
            lines.push(format!("export REGOLITH_TLS_CA={}", shell_quote(&c.ca)));
            lines.push(format!("export REGOLITH_TLS_CERT={}", shell_quote(&c.cert)));
            lines.push(format!("export REGOLITH_TLS_KEY={}", shell_quote(&c.key)));
        }
        lines
    }

    fn print_ready(&self) -> Result<()> {
        let env_file = self.dir.join(cluster_file::ENV);
        let exports = self.export_lines();
        std::fs::write(&env_file, exports.join("\n") + "\n").map_err(|source| Error::File {
            what: "cannot write",
            path: env_file.clone(),
            source,
        })?;
        let table = self.status_table()?;
        let mut out = String::new();
        out.push_str(&format!(
            "regolith up: {} metad replicas and {} sidecars in {}\n\n",
            self.metad.len(),
            self.sidecars.len(),
            self.dir.display()
        ));
        out.push_str(&self.metad_table().render());
        out.push('\n');
        out.push_str(&self.sidecar_table().render());
        out.push('\n');
        out.push_str(&table);
        out.push_str(&format!(
            "\nFrom another shell (or `source {}`):\n",
            shell_quote(&env_file)
        ));
        for l in &exports {
            out.push_str(&format!("  {l}\n"));
        }
        out.push_str(&self.finding_hint());
        out.push('\n');
        out.push_str(READY);
        out.push('\n');
        let mut stdout = std::io::stdout().lock();
        // A closed stdout (the operator piped us into `head`) must not stop the cluster.
        let _ = stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush());
        Ok(())
    }

    /// How the other subcommands find this cluster without the exports.
    fn finding_hint(&self) -> String {
        let how = if self.default_dir {
            format!("Run from this directory (they read {DEFAULT_DIR})")
        } else {
            let d = shell_quote(&self.dir);
            format!("With --dir {d} (or REGOLITH_DIR={d})")
        };
        format!(
            "{how}, `regolith status`, `put`, `get`, `ls`, `rm` find the cluster by themselves.\n"
        )
    }

    fn metad_table(&self) -> Table {
        let mut t = Table::new(["METAD", "GRPC", "HTTP METADATA", "METRICS", "LOG"]);
        for m in &self.layout.metad {
            t.row([
                m.id.to_string(),
                m.grpc.to_string(),
                m.http_metadata.to_string(),
                m.metrics.to_string(),
                self.log(&format!("metad-{}", m.id)).display().to_string(),
            ]);
        }
        t
    }

    fn sidecar_table(&self) -> Table {
        let mut t = Table::new(["SIDECAR", "SOCKET", "NICS", "METRICS", "LOG"]);
        for s in &self.layout.sidecars {
            let nics: Vec<String> = s
                .nics
                .iter()
                .map(|ip| format!("{ip}:{}", s.data_port))
                .collect();
            t.row([
                s.name.clone(),
                self.socket(&s.name).display().to_string(),
                nics.join(","),
                s.metrics.to_string(),
                self.log(&s.name).display().to_string(),
            ]);
        }
        t
    }

    /// The foreground: until a signal, reports children that exit; fails when none is left.
    fn supervise(&mut self, interrupt: &mut Interrupt) -> Result<()> {
        loop {
            if interrupt.poll() > 0 {
                return Ok(());
            }
            let mut running = 0;
            for p in self.metad.iter_mut().chain(self.sidecars.iter_mut()) {
                match p.exited() {
                    None => running += 1,
                    Some(st) if !self.reported.contains(&p.name) => {
                        tracing::warn!(name = %p.name, status = %st, log = %p.log.display(), "a process of the cluster exited");
                        self.reported.push(p.name.clone());
                    }
                    Some(_) => {}
                }
            }
            if running == 0 {
                return Err(Error::Failed(format!(
                    "every process of the cluster exited; see the logs in {}",
                    self.dir.join("logs").display()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Sidecars first (they unmount from the leader), then the metad replicas.
    fn stop(&mut self, interrupt: &mut Interrupt) -> Result<()> {
        let before = interrupt.poll();
        let mut hurry = || interrupt.poll() > before;
        tracing::info!("stopping the sidecars");
        let a = procs::stop(&mut self.sidecars, self.stop_timeout, &mut hurry);
        tracing::info!("stopping the metad replicas");
        let b = procs::stop(&mut self.metad, self.stop_timeout, &mut hurry);
        let killed: Vec<String> = a.killed.into_iter().chain(b.killed).collect();
        if !killed.is_empty() {
            return Err(Error::Failed(format!(
                "{} did not stop within --stop-timeout {:?} and had to be killed",
                killed.join(", "),
                self.stop_timeout
            )));
        }
        tracing::info!("cluster stopped");
        Ok(())
    }
}

/// `path` quoted for a POSIX shell when it needs it.
fn shell_quote(path: &Path) -> String {
    let s = path.display().to_string();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_found_or_named() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("my-metad");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        assert!(find_binary(METAD_BIN, "--metad-bin", Some(&bin)).is_err());
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            find_binary(METAD_BIN, "--metad-bin", Some(&bin)).unwrap(),
            bin
        );
        let e = find_binary(METAD_BIN, "--metad-bin", Some(&d.path().join("nope"))).unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        let e = find_binary("regolith-no-such-binary", "--x-bin", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cargo build --release -p regolith-metad -p regolith-sidecar"),
            "{e}"
        );
        assert!(e.contains("--x-bin"), "{e}");
    }

    #[test]
    fn tokens_are_made_once_and_private() {
        let d = tempfile::tempdir().unwrap();
        let p = ensure_token(d.path()).unwrap();
        let t1 = std::fs::read_to_string(&p).unwrap();
        assert_eq!(t1.trim().len(), 64);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        ensure_token(d.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), t1);
        let peer = ensure_secret(d.path(), cluster_file::PEER_TOKEN).unwrap();
        let t2 = std::fs::read_to_string(&peer).unwrap();
        assert_eq!(t2.trim().len(), 64);
        assert_ne!(t1, t2, "the peer credential is not the cluster token");
    }

    #[test]
    fn stale_sockets_go_and_live_ones_stop_us() {
        let d = tempfile::tempdir().unwrap();
        let stale = d.path().join("node-0.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let other = d.path().join("mine.sock");
        let _keep = std::os::unix::net::UnixListener::bind(&other).unwrap();
        clear_stale_sockets(d.path()).unwrap();
        assert!(!stale.exists());
        assert!(other.exists(), "foreign sockets are left alone");
        let live = d.path().join("node-1.sock");
        let _l = std::os::unix::net::UnixListener::bind(&live).unwrap();
        assert!(clear_stale_sockets(d.path()).is_err());
    }

    #[test]
    fn a_used_dir_needs_the_same_metad_addresses() {
        let d = tempfile::tempdir().unwrap();
        let l3 = layout::plan(3, 2, Some(30000)).unwrap();
        let up = Up::new(
            d.path().to_path_buf(),
            l3.clone(),
            d.path().join("token"),
            Binaries {
                metad: "m".into(),
                sidecar: "s".into(),
            },
            &crate::args::UpArgs {
                metad: 3,
                sidecars: 2,
                segment_size: 1,
                disk_size: None,
                base_port: Some(30000),
                metad_bin: None,
                sidecar_bin: None,
                ready_timeout: Duration::from_secs(1),
                stop_timeout: Duration::from_secs(1),
                index: false,
                no_index: false,
                tls: false,
            },
            0,
        );
        up.describe().save(d.path()).unwrap();
        std::fs::create_dir_all(d.path().join("metad-1")).unwrap();
        check_previous_cluster(d.path(), &l3).unwrap();
        check_previous_cluster(d.path(), &layout::plan(3, 4, Some(30000)).unwrap()).unwrap();
        let e = check_previous_cluster(d.path(), &layout::plan(5, 2, Some(30000)).unwrap())
            .unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        let e = check_previous_cluster(d.path(), &layout::plan(3, 2, None).unwrap()).unwrap_err();
        assert!(e.to_string().contains("--base-port"), "{e}");
    }

    #[test]
    fn paths_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(shell_quote(Path::new("/a/b-c.sock")), "/a/b-c.sock");
        assert_eq!(shell_quote(Path::new("/a b/it's")), r"'/a b/it'\''s'");
    }
}
