//! `regolith-chaos`: the long chaos profile.
//!
//! `cargo run -p regolith-chaos -- --duration 10m --seed N` runs seeded random faults for the
//! duration against three metad replicas in network namespaces (as root), then checks the
//! history and prints the table. The same binary also runs metad itself (`regolith-chaos
//! metad …`), so it needs nothing else built.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use regolith_chaos::cluster::MetadLaunch;
use regolith_chaos::metad_only::{MetadOnly, MetadOnlyConfig};
use regolith_chaos::run::{run_profile, HarnessConfig};
use regolith_chaos::schedule;

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
    /// Keys in the key space.
    #[arg(long, default_value_t = 40)]
    keys: usize,
    /// Clients per sidecar host.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Only faults whose name starts with one of these (comma-separated), e.g.
    /// `pause-leader,split`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// metad binary to run (default: this binary's `metad` subcommand).
    #[arg(long)]
    metad_bin: Option<std::path::PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    regolith_proto::units::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // Multi-call: `regolith-chaos metad ARGS…` is regolith-metad.
    if argv.get(1).map(String::as_str) == Some("metad") {
        let mut metad_argv = vec!["regolith-metad".to_string()];
        metad_argv.extend(argv[2..].iter().cloned());
        return regolith_metad::run::main_with_args(metad_argv);
    }
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let launch = match args.metad_bin {
        Some(p) => MetadLaunch::new(p),
        None => match std::env::current_exe() {
            Ok(me) => {
                let mut l = MetadLaunch::new(me);
                l.prefix_args = vec!["metad".into()];
                l
            }
            Err(e) => {
                eprintln!("regolith-chaos: cannot find my own binary: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let mut cfg = HarnessConfig::new(launch);
    cfg.workload.seed = args.seed;
    cfg.workload.keys = args.keys;
    cfg.workload.clients_per_host = args.clients;
    let workload = MetadOnly::new(MetadOnlyConfig::default());
    // A filter that keeps nothing would make the endless long schedule spin forever.
    let known: Vec<String> = schedule::quick(args.seed, true)
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
    let wanted = move |s: &schedule::Step| {
        only.is_empty() || only.iter().any(|p| s.fault.name().starts_with(p.as_str()))
    };
    let result = if args.quick {
        let steps: Vec<_> = schedule::quick(args.seed, false)
            .into_iter()
            .filter(wanted)
            .collect();
        run_profile(cfg, workload, steps, None)
    } else {
        let steps = schedule::long(args.seed, false).filter(wanted);
        run_profile(cfg, workload, steps, Some(args.duration))
    };
    match result {
        Ok(outcome) => {
            println!("seed {}", args.seed);
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
