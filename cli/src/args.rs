//! The command line (clap derive): global flags, subcommands and their flags.
//!
//! `--socket`, `--cluster-token-file`, `--dir`, `--timeout` and `-v` are clap globals, accepted
//! before or after the subcommand. `--metad` is special: for `up` it is the replica *count*
//! (`regolith up --metad 3`), everywhere else the replica *addresses*. So the address form is
//! declared twice, once before the subcommand and once on every subcommand but `up` (where it is
//! also global, for `members add` and `segments drain`); the one after the subcommand wins.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use regolith_proto::units::{parse_duration, parse_size};

/// Default of `--dir`: where `regolith up` keeps its cluster, and where the other subcommands
/// look for it.
pub const DEFAULT_DIR: &str = "./regolith-data";

/// Help heading of the flags every subcommand accepts.
const GLOBAL: &str = "Global options";

#[derive(Parser, Debug)]
#[command(
    name = "regolith",
    version,
    propagate_version = true,
    about = "Regolith: a distributed KV-cache store for LLM inference",
    long_about = "Regolith: a distributed KV-cache store for LLM inference.\n\n\
        `regolith up` starts a whole cluster on this machine (3 metad replicas, 2 sidecars) and \
        stays in the foreground; the other subcommands talk to a cluster: put/get/rm through a \
        sidecar's socket (--socket), status/ls/members/segments to metad (--metad). Run in the \
        directory where `regolith up` runs, they find its cluster by themselves (--dir).",
    after_help = "Exit codes: 0 ok, 1 the operation failed (e.g. key not found), 2 usage error."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    /// metad replicas, HOST:PORT,HOST:PORT,... [default: those of the `regolith up` cluster in
    /// --dir, else 127.0.0.1:50051]
    #[arg(
        long = "metad",
        env = "REGOLITH_METAD",
        value_name = "HOST:PORT,...",
        help_heading = GLOBAL
    )]
    pub metad: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand accepts, before or after its name (`up` uses `--dir` and `-v`).
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// The sidecar's Unix socket (put, get, rm) [default: sidecar 0 of the `regolith up`
    /// cluster in --dir, else /run/regolith/sidecar.sock]
    #[arg(long, global = true,
        help_heading = GLOBAL, env = "REGOLITH_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// File holding the cluster token for metad calls [default: DIR/token when --metad names
    /// the `regolith up` cluster of --dir or of the socket's directory]
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "REGOLITH_CLUSTER_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub cluster_token_file: Option<PathBuf>,
    /// CA bundle (PEM) metad's certificate must chain to: turns TLS on for metad calls
    /// [default: DIR/tls/ca.crt when --metad names a `regolith up --tls` cluster]
    #[arg(long, global = true, help_heading = GLOBAL, env = "REGOLITH_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to metad (it asks for one of its CA)
    #[arg(long, global = true, help_heading = GLOBAL, env = "REGOLITH_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert
    #[arg(long, global = true, help_heading = GLOBAL, env = "REGOLITH_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Check metad's certificate against this DNS name instead of the address dialled
    #[arg(long, global = true, help_heading = GLOBAL, env = "REGOLITH_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Directory of a `regolith up` cluster: `up` keeps its data there, the other subcommands
    /// read their defaults from DIR/cluster.json and DIR/token
    #[arg(long, global = true,
        help_heading = GLOBAL, env = "REGOLITH_DIR", value_name = "DIR", default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// How long a metad call keeps retrying (leader elections) before it fails, e.g. 10s
    #[arg(long, global = true,
        help_heading = GLOBAL, env = "REGOLITH_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub timeout: Duration,
    /// More logging (-v, -vv); RUST_LOG overrides
    #[arg(short = 'v', long = "verbose", global = true,
        help_heading = GLOBAL, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// `--metad` after a subcommand's name (all but `up`).
#[derive(Args, Debug, Clone, Default)]
pub struct MetadArg {
    /// metad replicas, HOST:PORT,HOST:PORT,... [default: those of the `regolith up` cluster in
    /// --dir, else 127.0.0.1:50051]
    #[arg(
        id = "sub_metad",
        long = "metad",
        global = true,
        help_heading = GLOBAL,
        env = "REGOLITH_METAD",
        value_name = "HOST:PORT,..."
    )]
    pub metad: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a whole cluster on this machine (metad replicas and sidecars on loopback) and stay
    /// in the foreground; Ctrl-C or SIGTERM stops it
    Up(UpArgs),
    /// Leader, members, segments (usage, liveness), keys and bytes
    Status(StatusArgs),
    /// Store FILE (or stdin) under KEY, through the sidecar of --socket
    Put(PutArgs),
    /// Write the value of KEY to FILE (or stdout), through the sidecar of --socket
    Get(GetArgs),
    /// List keys (with PREFIX)
    Ls(LsArgs),
    /// Remove keys, through the sidecar of --socket
    Rm(RmArgs),
    /// metad membership: list, add, remove
    Members(MembersArgs),
    /// Segments (one per sidecar): list, drain
    Segments(SegmentsArgs),
    /// metad administration: snapshot save (a backup of the replicated state), snapshot inspect
    Metad(MetadAdminArgs),
    /// Benchmark the cluster through the sidecar of --socket: local and remote puts and gets
    /// at several sizes, beside the machine's memcpy and loopback-TCP ceilings
    Bench(BenchArgs),
    /// Mutual-TLS material: a private CA and certificates it signs (for a cluster without a
    /// PKI of its own; `regolith up --tls` makes its own)
    Tls(TlsArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// Time per benchmark cell
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    pub duration: Duration,
    /// Concurrent clients (each its own connection to the sidecar)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub clients: u32,
    /// Requests in flight per client
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub depth: u32,
    /// Run only the rows matching MODE/SIZE/OP (any part may be left out; several separated by
    /// commas), e.g. `remote/16MiB/get_into`, `local`, `/4KiB/`, `exists,batch_exists`
    #[arg(long, value_name = "FILTER")]
    pub filter: Option<String>,
    /// Print one JSON object on stdout (the table and progress go to stderr)
    #[arg(long)]
    pub json: bool,
    /// A sidecar's --metrics-addr, read for its disks (the disk-tier rows); repeatable
    /// [default: the sidecars of the `regolith up` cluster in --dir]
    #[arg(long = "sidecar-metrics", value_name = "HOST:PORT")]
    pub sidecar_metrics: Vec<String>,
    /// Instead of the matrix: the hit ratio of an LMCache-like trace (each object put once on
    /// its first miss, read many times, Zipf-skewed) beside an ideal LRU over the pool's memory
    /// and disks on the same trace
    #[arg(long, help_heading = "Hit-ratio mode")]
    pub hit_ratio: bool,
    /// The working set, as a multiple of the pool's memory
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 4.0,
        help_heading = "Hit-ratio mode"
    )]
    pub working_set: f64,
    /// Size of each object of the working set
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = size, help_heading = "Hit-ratio mode")]
    pub object_size: u64,
    /// Accesses in the trace [default: 4 per object of the working set]
    #[arg(long, value_name = "N", help_heading = "Hit-ratio mode")]
    pub accesses: Option<u64>,
    /// Exponent of the Zipf law the accesses follow
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0.99,
        help_heading = "Hit-ratio mode"
    )]
    pub zipf: f64,
    /// Seed of the trace (the same seed, the same trace)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        help_heading = "Hit-ratio mode"
    )]
    pub seed: u64,
    /// Test of the bench itself: expect one wrong byte in every value read, so every get
    /// should be reported as an error
    #[arg(long, hide = true)]
    pub corrupt_for_test: bool,
}

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// metad replicas to start (3 or 5 for fault tolerance; 1 for none)
    #[arg(long = "metad", value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=9))]
    pub metad: u8,
    /// Sidecars to start, each with its own socket, two loopback NICs and a segment
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=10))]
    pub sidecars: u8,
    /// Memory each sidecar contributes, e.g. 1GiB, 256MiB
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = size)]
    pub segment_size: u64,
    /// Give each sidecar a disk tier of SIZE under its state directory (DIR/NAME/disk; e.g.
    /// 8GiB; docs/ssd.md). Default: none
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub disk_size: Option<u64>,
    /// Move every port into the block PORT..PORT+49 (metad i: gRPC PORT+i, HTTP metadata KV
    /// PORT+10+i, metrics PORT+20+i; sidecar i: metrics PORT+30+i, data PORT+40+i) [default:
    /// metad gRPC 50051.., HTTP metadata KV 8080.., metrics 9003..; sidecar metrics 9300..,
    /// data 7600..]
    #[arg(long, value_name = "PORT")]
    pub base_port: Option<u16>,
    /// The regolith-metad binary [default: next to this executable, else on $PATH]
    #[arg(long, env = "REGOLITH_METAD_BIN", value_name = "PATH")]
    pub metad_bin: Option<PathBuf>,
    /// The regolith-sidecar binary [default: next to this executable, else on $PATH]
    #[arg(long, env = "REGOLITH_SIDECAR_BIN", value_name = "PATH")]
    pub sidecar_bin: Option<PathBuf>,
    /// How long to wait for the cluster to serve before giving up
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub ready_timeout: Duration,
    /// How long each process may take to stop after SIGTERM before it is killed
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration)]
    pub stop_timeout: Duration,
    /// Start the sidecars with their object index (the default since it bounds staleness;
    /// kept so that scripts that pass it still work)
    #[arg(long, overrides_with = "no_index")]
    pub index: bool,
    /// Start the sidecars without their object index (`regolith-sidecar --index=false`: every
    /// exists and get asks metad; see docs/sidecar.md for what the index trades)
    #[arg(long)]
    pub no_index: bool,
    /// Mutual TLS everywhere: make a CA and a certificate per process in DIR/tls (new ones at
    /// every start) and run gRPC (clients and Raft) and the data plane over TLS
    #[arg(long)]
    pub tls: bool,
}

#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    #[command(subcommand)]
    pub cmd: TlsCmd,
}

#[derive(Subcommand, Debug, Clone)]
pub enum TlsCmd {
    /// Make a new CA (DIR/ca.crt) and a certificate and key for each --name (DIR/NAME.crt,
    /// DIR/NAME.key, keys 0600), valid for server and client use; the CA's key is not kept
    Init {
        /// Where to write the files (made 0700 if missing)
        dir: PathBuf,
        /// A certificate to issue, named after this (repeatable); the name is also one of its
        /// subject alternative names, so it must be a DNS name or an IP address
        #[arg(long = "name", value_name = "NAME", required = true)]
        names: Vec<String>,
        /// Another DNS name or IP address every certificate is valid for (repeatable): the
        /// addresses peers dial, unless they all use --tls-server-name NAME
        #[arg(long = "san", value_name = "NAME|IP")]
        sans: Vec<String>,
        /// Replace files that exist
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// Print JSON instead of tables
    #[arg(long)]
    pub json: bool,
    /// A sidecar's --metrics-addr, read for its disks (`GET /status`); repeatable [default:
    /// the sidecars of the `regolith up` cluster in --dir]
    #[arg(long = "sidecar-metrics", value_name = "HOST:PORT")]
    pub sidecar_metrics: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct PutArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// The key (1..=4096 bytes)
    pub key: String,
    /// The value: a file, or `-` for stdin [default: -]
    #[arg(value_name = "FILE|-")]
    pub file: Option<PathBuf>,
    /// Replicas, on distinct nodes
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub replicas: u32,
    /// Put the first replica on the sidecar of --socket when it has room
    #[arg(long)]
    pub prefer_local: bool,
    /// Place on this node first (repeatable, in order of preference)
    #[arg(long = "preferred-segment", value_name = "NODE")]
    pub preferred_segments: Vec<String>,
    /// Remove the object after this long, e.g. 10m
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub ttl: Option<Duration>,
    /// Evict this object last (until the soft pin expires)
    #[arg(long, conflicts_with = "hard_pin")]
    pub soft_pin: bool,
    /// Never evict this object
    #[arg(long)]
    pub hard_pin: bool,
    /// Replace the object if KEY exists (readers see the old value or the new one, whole)
    /// instead of failing
    #[arg(long)]
    pub upsert: bool,
}

#[derive(Args, Debug, Clone)]
pub struct GetArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// The key
    pub key: String,
    /// Where to write the value: a file, or `-` for stdout [default: -]
    #[arg(value_name = "FILE|-")]
    pub file: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct LsArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// Only keys starting with this
    pub prefix: Option<String>,
    /// Also print size, replicas and pin of each key
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Stop after this many keys
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct RmArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    /// Keys to remove
    #[arg(required = true, value_name = "KEY")]
    pub keys: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct MembersArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    #[command(subcommand)]
    pub command: MembersCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum MembersCommand {
    /// List the metad replicas and their roles
    List,
    /// Add replica ID at ADDR (started empty, without --bootstrap): a learner first, promoted
    /// to voter once it caught up
    Add {
        /// Raft id of the new replica (> 0, unused)
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
        /// Its gRPC address (its --advertise)
        #[arg(value_name = "HOST:PORT")]
        addr: String,
    },
    /// Remove replica ID (the leader too: it steps down once the change commits)
    Remove {
        /// Raft id of the replica
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
    },
}

#[derive(Args, Debug, Clone)]
pub struct MetadAdminArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    #[command(subcommand)]
    pub command: MetadAdminCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum MetadAdminCommand {
    /// Backups of the replicated state (docs/metad.md "Backup and recovery")
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Hand the leader's office to another voter without an election timeout (before
    /// stopping the leader's machine; a leader hands over by itself on SIGTERM); writes wait
    /// at most 3 s for it (docs/metad.md "Leadership hand-over")
    TransferLeader {
        /// Raft id of the voter to hand over to (default: the one holding the most of the log)
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        to: Option<u64>,
    },
}

#[derive(Subcommand, Debug, Clone)]
pub enum SnapshotCommand {
    /// Ask the metad leader for a consistent snapshot (segments, objects, the metadata KV) and
    /// write it to FILE (atomically: a temp file beside it, validated, then renamed); restore
    /// it into a new cluster with `regolith-metad --restore-from FILE`
    Save {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Check FILE (header, length, checksum) and print what it holds
    Inspect {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(Args, Debug, Clone)]
pub struct SegmentsArgs {
    #[command(flatten)]
    pub metad: MetadArg,
    #[command(subcommand)]
    pub command: SegmentsCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum SegmentsCommand {
    /// List segments with usage and liveness
    List,
    /// Stop placing on NODE; it unmounts once empty or after --drain-timeout
    Drain {
        /// Node name, as `regolith status` shows it
        #[arg(value_name = "NODE")]
        node: String,
        /// Unmount after this long even when objects remain [default: metad's, 10m]
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        drain_timeout: Option<Duration>,
        /// Wait until the segment is unmounted
        #[arg(long)]
        wait: bool,
    },
}

impl Command {
    /// The `--metad` given after the subcommand's name (never for `up`).
    pub fn metad_arg(&self) -> Option<&str> {
        let m = match self {
            Command::Up(_) | Command::Tls(_) => return None,
            Command::Status(a) => &a.metad,
            Command::Put(a) => &a.metad,
            Command::Get(a) => &a.metad,
            Command::Ls(a) => &a.metad,
            Command::Rm(a) => &a.metad,
            Command::Members(a) => &a.metad,
            Command::Segments(a) => &a.metad,
            Command::Metad(a) => &a.metad,
            Command::Bench(a) => &a.metad,
        };
        m.metad.as_deref()
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("regolith").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn globals_before_or_after_the_subcommand() {
        let c = parse(&["--socket", "/a.sock", "get", "k"]).unwrap();
        assert_eq!(c.global.socket, Some(PathBuf::from("/a.sock")));
        let c = parse(&["get", "k", "--socket", "/b.sock", "out"]).unwrap();
        assert_eq!(c.global.socket, Some(PathBuf::from("/b.sock")));
        let c = parse(&["--metad", "h:1", "status"]).unwrap();
        assert_eq!(c.metad.as_deref(), Some("h:1"));
        let c = parse(&["status", "--metad", "h:2", "--json"]).unwrap();
        assert_eq!(c.command.metad_arg(), Some("h:2"));
        let c = parse(&["members", "add", "4", "h:4", "--metad", "h:3"]).unwrap();
        assert_eq!(c.command.metad_arg(), Some("h:3"));
        let c = parse(&["segments", "drain", "node-0", "--timeout", "2s"]).unwrap();
        assert_eq!(c.global.timeout, Duration::from_secs(2));
    }

    #[test]
    fn metad_snapshot_save_and_inspect_take_a_file() {
        let c = parse(&["metad", "snapshot", "save", "/b/m.snap", "--metad", "h:1"]).unwrap();
        assert_eq!(c.command.metad_arg(), Some("h:1"));
        match c.command {
            Command::Metad(MetadAdminArgs {
                command: MetadAdminCommand::Snapshot(SnapshotCommand::Save { file }),
                ..
            }) => assert_eq!(file, PathBuf::from("/b/m.snap")),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["metad", "snapshot", "inspect", "m.snap"]).is_ok());
        assert!(
            parse(&["metad", "snapshot", "save"]).is_err(),
            "FILE is required"
        );
        assert!(parse(&["metad", "snapshot", "restore", "m.snap"]).is_err());
    }

    #[test]
    fn up_takes_counts_sizes_and_durations() {
        let c = parse(&[
            "up",
            "--metad",
            "5",
            "--sidecars",
            "3",
            "--segment-size",
            "256MiB",
            "--ready-timeout",
            "500ms",
        ])
        .unwrap();
        let Command::Up(u) = c.command else {
            panic!("not up")
        };
        assert_eq!((u.metad, u.sidecars), (5, 3));
        assert_eq!(u.segment_size, 256 << 20);
        assert_eq!(u.ready_timeout, Duration::from_millis(500));
        let Command::Up(u) = parse(&["up"]).unwrap().command else {
            panic!("not up")
        };
        assert_eq!((u.metad, u.sidecars, u.segment_size), (3, 2, 1 << 30));
        assert_eq!(c.global.dir, PathBuf::from(DEFAULT_DIR));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            vec!["up", "--segment-size", "lots"],
            vec!["up", "--metad", "0"],
            vec!["up", "--sidecars", "x"],
            vec!["status", "--timeout", "forever"],
            vec!["put"],
            vec!["rm"],
            vec!["frobnicate"],
            vec!["members", "add", "0", "h:1"],
        ] {
            let e = parse(&args).unwrap_err();
            assert!(e.use_stderr(), "{args:?}");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    /// Every flag `python/regolith/_launch.py` runs `regolith up` with is one of ours, and the
    /// Python test cluster names no flag of its own.
    #[test]
    fn the_python_test_clusters_flags_are_regolith_up_flags() {
        use clap::CommandFactory;
        use regolith_test_support::python;
        let text = std::fs::read_to_string(python::launch_file()).unwrap();
        let has = |cmd: &clap::Command, flag: &str| {
            let name = flag.strip_prefix("--").unwrap_or(flag);
            cmd.get_arguments().any(|a| a.get_long() == Some(name))
        };
        let cli = Cli::command();
        for (_, flag) in python::flag_table(&text, "CLI_GLOBAL") {
            assert!(has(&cli, &flag), "_launch.py: regolith has no flag {flag}");
        }
        let sub = python::string_const(&text, "UP_COMMAND");
        let up = cli
            .find_subcommand(&sub)
            .unwrap_or_else(|| panic!("_launch.py: regolith has no subcommand {sub}"));
        for (_, flag) in python::flag_table(&text, "UP") {
            assert!(has(up, &flag), "_launch.py: regolith up has no flag {flag}");
        }
        let dir = python::launch_file();
        let tests = dir.parent().unwrap().join("../tests/cluster.py");
        let tests = std::fs::read_to_string(tests).unwrap();
        python::assert_spells_none(
            &tests,
            "tests/cluster.py",
            up.get_arguments().filter_map(|a| a.get_long()),
        );
    }
}
