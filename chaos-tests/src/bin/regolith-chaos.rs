//! `regolith-chaos`: the long chaos profile.
//!
//! `cargo run -p regolith-chaos -- --duration 10m --seed N` runs seeded random faults for the
//! duration against three metad replicas and three sidecars in network namespaces (as root),
//! then checks the history and prints the table. It starts the real `regolith-metad` and
//! `regolith-sidecar` found beside it (or in `$REGOLITH_BIN_DIR`, or `--metad-bin` /
//! `--sidecar-bin`): build them first, `cargo build -p regolith-metad -p regolith-sidecar`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use regolith_chaos::cluster::MetadProgram;
use regolith_chaos::metad_only::{MetadOnly, MetadOnlyConfig};
use regolith_chaos::run::{run_profile, HarnessConfig};
use regolith_chaos::schedule::{self, Step};
use regolith_chaos::sidecars::{SidecarConfig, SidecarProgram, SidecarWorkload};

#[derive(Parser, Debug)]
#[command(
    name = "regolith-chaos",
    about = "Regolith's chaos suite, long profile"
)]
struct Args {
    /// How long to inject faults (e.g. 10m, 90s).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule and of the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run the quick profile (every fault once) instead.
    #[arg(long)]
    quick: bool,
    /// Keys in the key space (default: 64 with real sidecars, whose working set must exceed
    /// their memory so that objects move to their disks; 40 with metad only).
    #[arg(long)]
    keys: Option<usize>,
    /// Clients per sidecar host.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Only faults whose name starts with one of these (comma-separated), e.g.
    /// `pause-leader,split`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// metad binary to run (default: `regolith-metad` beside this binary).
    #[arg(long)]
    metad_bin: Option<std::path::PathBuf>,
    /// sidecar binary to run (default: `regolith-sidecar` beside this binary).
    #[arg(long)]
    sidecar_bin: Option<std::path::PathBuf>,
    /// Objects loaded before the first fault (by a node no fault touches), so that faults meet
    /// a large state: snapshots, installs, failovers and restarts at that size. Needs
    /// `--workload metad-only`.
    #[arg(long, default_value_t = 0)]
    preload: u64,
    /// `sidecar` (real sidecars, bytes over the data plane) or `metad-only` (fake sidecars:
    /// metadata faults only, plus the extent-overlap and premature-death checks).
    #[arg(long, default_value = "sidecar", value_parser = ["sidecar", "metad-only"])]
    workload: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    regolith_proto::units::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // A panic of the run after a signal (its namespaces removed under it) waits for the
    // signal handler's exit too.
    let code = std::panic::catch_unwind(run_main).unwrap_or(ExitCode::from(101));
    regolith_chaos::netns::exit_after_cleanup(code)
}

fn run_main() -> ExitCode {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let metad = args
        .metad_bin
        .clone()
        .map_or_else(MetadProgram::built, MetadProgram::new);
    let mut cfg = HarnessConfig::new(metad);
    cfg.workload.seed = args.seed;
    cfg.workload.clients_per_host = args.clients;
    cfg.preload = args.preload;
    let data_plane = args.workload == "sidecar";
    cfg.workload.keys = args.keys.unwrap_or(if data_plane {
        regolith_chaos::sidecars::DISK_TIER_KEYS
    } else {
        cfg.workload.keys
    });
    if data_plane && args.preload > 0 {
        // Real sidecars mount small segments: the pool's eviction would take preloaded objects.
        eprintln!("regolith-chaos: --preload needs --workload metad-only");
        return ExitCode::from(2);
    }
    // A filter that keeps nothing would make the endless long schedule spin forever.
    let known: Vec<String> = schedule::quick(args.seed, data_plane)
        .iter()
        .map(|s| s.fault.name())
        .collect();
    if let Some(bad) = args
        .only
        .iter()
        .find(|p| !known.iter().any(|k| k.starts_with(p.as_str())))
    {
        eprintln!("regolith-chaos: --only {bad}: no such fault; faults: {known:?}");
        return ExitCode::from(2);
    }
    let only = args.only.clone();
    let wanted = move |s: &Step| {
        only.is_empty() || only.iter().any(|p| s.fault.name().starts_with(p.as_str()))
    };
    let (steps, duration): (Box<dyn Iterator<Item = Step>>, _) = if args.quick {
        let steps: Vec<_> = schedule::quick(args.seed, data_plane)
            .into_iter()
            .filter(wanted)
            .collect();
        (Box::new(steps.into_iter()), None)
    } else {
        (
            Box::new(schedule::long(args.seed, data_plane).filter(wanted)),
            Some(args.duration),
        )
    };
    let result = if data_plane {
        let sidecar = args
            .sidecar_bin
            .clone()
            .map_or_else(SidecarProgram::built, SidecarProgram::new);
        let workload = SidecarWorkload::new(SidecarConfig::new(sidecar));
        run_profile(cfg, workload, steps, duration)
    } else {
        run_profile(
            cfg,
            MetadOnly::new(MetadOnlyConfig::default()),
            steps,
            duration,
        )
    };
    match result {
        Ok(outcome) => {
            println!("seed {}, workload {}", args.seed, args.workload);
            println!("{outcome}");
            if outcome.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("regolith-chaos: {e}");
            ExitCode::FAILURE
        }
    }
}
