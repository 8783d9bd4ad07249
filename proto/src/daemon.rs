//! What both daemons (`regolith-metad`, `regolith-sidecar`) do the same way at start-up and
//! shutdown: the `main` shell ([`main`]: argv → clap → settings → logging → runtime → run until
//! SIGTERM/SIGINT → exit code), logging on stderr, the runtime, and waiting for the signals.

use std::ffi::OsString;
use std::fmt::Display;
use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;

use crate::shutdown::Shutdown;

/// What a daemon tells [`main`] about itself.
pub struct Shell {
    /// The binary's name, prefixed to the errors it prints (`regolith-metad: …`).
    pub name: &'static str,
    /// `tracing` filters for no `-v`, `-v` and `-vv` (see [`init_logging`]).
    pub log_levels: [&'static str; 3],
}

/// `--worker-threads` as the runtime takes it: absent (one per core) or at least 1.
pub fn worker_threads(n: Option<usize>) -> Result<Option<usize>, String> {
    match n {
        Some(0) => Err("--worker-threads must be at least 1".into()),
        n => Ok(n),
    }
}

/// Parses a daemon's command line (`argv[0]` first; Mooncake's `-v=N` spellings accepted).
pub fn parse_argv<A: clap::Parser>(
    argv: impl IntoIterator<Item = String>,
) -> Result<A, clap::Error> {
    A::try_parse_from(normalize_argv(argv))
}

/// What [`main`] needs from a daemon's resolved settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub verbose: u8,
    pub json_logs: bool,
    pub worker_threads: Option<usize>,
}

/// A daemon's whole process: parses `argv` (argv[0] included; Mooncake's `-v=N` rewritten by
/// [`normalize_argv`]) with clap into `A`, resolves it into settings (`resolve`), starts
/// logging and the runtime, runs `start` (before SIGTERM/SIGINT are caught: a signal then ends
/// the process at once), then `serve` with a [`Shutdown`] that fires on
/// SIGTERM/SIGINT. Exit codes: 0 (also for `--help`/`--version`), 2 for a usage or
/// configuration error, 1 when the runtime cannot start or `start`/`serve` fails.
pub fn main<A, S, E, T, RE, Start, Serve>(
    shell: &Shell,
    argv: Vec<String>,
    resolve: impl FnOnce(A) -> Result<S, E>,
    process: impl FnOnce(&S) -> Process,
    start: impl FnOnce(S) -> Start,
    serve: impl FnOnce(T, Shutdown) -> Serve,
) -> ExitCode
where
    A: clap::Parser,
    E: Display,
    RE: Display,
    Start: Future<Output = Result<T, RE>>,
    Serve: Future<Output = Result<(), RE>>,
{
    let name = shell.name;
    restrict_umask();
    let args = match parse_argv::<A>(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let settings = match resolve(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    let p = process(&settings);
    init_logging(&shell.log_levels, p.verbose, p.json_logs);
    let rt = match runtime(p.worker_threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        let started = start(settings).await?;
        let (trigger, shutdown) = crate::shutdown::channel();
        tokio::spawn(async move {
            wait_for_signal().await;
            trigger.trigger();
        });
        serve(started, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{name} failed");
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Files a daemon creates (sled, snapshots, state files, the socket before its chmod) are its
/// own: mode 0600/0700. What must be shared (the UDS socket, 0660 with `--socket-group`) is
/// widened explicitly. Finding 12 of the hardening review: sled files were 0644 in 0755
/// directories, so any local user read the metadata KV.
fn restrict_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Creates `dir` (and its parents) if needed and makes it 0700: only the daemon's user may list
/// or open what is inside. Returns whether an existing directory had wider permissions (the
/// caller logs it).
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(mode & 0o077 != 0)
}

/// Rewrites Mooncake's `-v=N` / `--v=N` into N `-v` flags (at most 4), and gflags' single-dash
/// long flags (`-rpc_port 50051`, `-enable_gc=true`, `-port 50001`: Mooncake's own scripts
/// write them so) into the double-dash form clap reads.
pub fn normalize_argv<T: Into<OsString>>(argv: impl IntoIterator<Item = T>) -> Vec<OsString> {
    let mut out = Vec::new();
    for a in argv {
        let a: OsString = a.into();
        let a = match a.to_str().and_then(gflags_long) {
            Some(long) => OsString::from(long),
            None => a,
        };
        let n = a.to_str().and_then(|s| {
            s.strip_prefix("-v=")
                .or_else(|| s.strip_prefix("--v="))
                .map(|n| n.parse::<usize>().unwrap_or(1))
        });
        match n {
            Some(n) => out.extend(std::iter::repeat_n(OsString::from("-v"), n.min(4))),
            None => out.push(a),
        }
    }
    out
}

/// `-name[=value]` as `--name[=value]` when `name` is a gflags-style long name: several
/// characters with an underscore (`-rpc_port`), or Mooncake's `-port`.
fn gflags_long(arg: &str) -> Option<String> {
    let rest = arg.strip_prefix('-')?;
    if rest.starts_with('-') {
        return None;
    }
    let name = rest.split_once('=').map_or(rest, |(n, _)| n);
    let word = name.len() > 1 && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    (word && (name.contains('_') || name == "port")).then(|| format!("-{arg}"))
}

/// Logs on stderr through `tracing`: `levels[v]` for `-v` given `v` times (the last entry for
/// more), `RUST_LOG` overriding; JSON lines with `json`; colours only on a terminal.
pub fn init_logging(levels: &[&str; 3], verbose: u8, json: bool) {
    let level = levels[usize::from(verbose).min(2)];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The multi-threaded runtime, with `worker_threads` workers (default: one per core).
pub fn runtime(worker_threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        b.worker_threads(n);
    }
    b.enable_all().build()
}

/// Resolves when SIGTERM or SIGINT arrives (never, if the handlers cannot be installed).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_verbosity_becomes_repeated_v() {
        let out = normalize_argv(["d", "-v=2", "--v=9", "-v=x", "--id", "-v"]);
        let out: Vec<&str> = out.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            out,
            ["d", "-v", "-v", "-v", "-v", "-v", "-v", "-v", "--id", "-v"]
        );
    }

    #[test]
    fn gflags_single_dash_long_flags_get_two_dashes() {
        let out = normalize_argv([
            "d",
            "-rpc_port",
            "50001",
            "-enable_gc=true",
            "-port",
            "7",
            "-h",
            "-v",
            "--metrics_port",
            "-x_",
            "-Upper_case",
            "-",
        ]);
        let out: Vec<&str> = out.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            out,
            [
                "d",
                "--rpc_port",
                "50001",
                "--enable_gc=true",
                "--port",
                "7",
                "-h",
                "-v",
                "--metrics_port",
                "--x_",
                "-Upper_case",
                "-"
            ]
        );
    }
}
