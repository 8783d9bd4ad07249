//! regolith-cli: the `regolith` command (design §1, §9).
//!
//! Module map:
//! * [`args`] — the command line (clap derive): global flags, subcommands, their flags.
//! * [`cmd`] — one module per subcommand: [`cmd::up`] (a whole local cluster in the
//!   foreground), [`cmd::status`], [`cmd::put`], [`cmd::get`], [`cmd::ls`], [`cmd::rm`],
//!   [`cmd::members`], [`cmd::segments`].
//! * [`ctx`] — what a subcommand talks to: the sidecar socket, the metad addresses and the
//!   cluster token, from flags, `REGOLITH_*` variables or the `regolith up` cluster in `--dir`.
//! * [`cluster_file`] — `DIR/cluster.json`, written by `up`, read by the others.
//! * [`layout`] — the addresses and ports of `up`'s processes (pure).
//! * [`procs`] — `up`'s child processes: spawn, signal, stop.
//! * [`http`] — a one-request HTTP GET (metad's `/status` during start-up).
//! * [`format`] — byte sizes, durations, tables.
//! * [`tiers`] — memory and disks per node (metad's segments, the sidecars' `/status`).
//! * [`error`] — the crate's error enum and the exit code of each error.
//!
//! put/get/rm go through a sidecar (its socket), like every client; status/ls/members/segments
//! ask the metad leader. Exit codes: 0 ok, 1 the operation failed, 2 usage error.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod args;
pub mod cluster_file;
pub mod cmd;
pub mod ctx;
pub mod error;
pub mod format;
pub mod http;
pub mod layout;
pub mod procs;
pub mod tiers;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, Command};
pub use crate::error::{Error, Result};

/// Runs `regolith` with these arguments (argv[0] included) and returns its exit code.
pub fn main_with_args<I, T>(argv: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match parse(argv) {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_logging(&cli);
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("regolith: {e}");
            e.exit_code()
        }
    }
}

/// The parsed command line, or the exit code of a usage error (after printing it) or of
/// `--help`/`--version`.
fn parse<I, T>(argv: I) -> std::result::Result<Cli, ExitCode>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let print = |e: clap::Error| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    };
    let matches = Cli::command().try_get_matches_from(argv).map_err(print)?;
    let cli = Cli::from_arg_matches(&matches).map_err(print)?;
    if matches!(cli.command, Command::Up(_))
        && matches.value_source("metad") == Some(ValueSource::CommandLine)
    {
        eprintln!(
            "regolith: `--metad ADDRS` before `up` names metad addresses; `regolith up --metad N` sets how many replicas to start"
        );
        return Err(ExitCode::from(2));
    }
    Ok(cli)
}

/// Logs on stderr: `up` at info, the other subcommands at warn; `-v` debug for this crate,
/// `-vv` debug for everything; `RUST_LOG` overrides.
fn init_logging(cli: &Cli) {
    let base = if matches!(cli.command, Command::Up(_)) {
        "warn,regolith_cli=info"
    } else {
        "warn"
    };
    let level = match cli.global.verbose {
        0 => base.to_string(),
        1 => "info,regolith_cli=debug".to_string(),
        _ => "debug".to_string(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
