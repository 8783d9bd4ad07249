//! The process entry point shared by the `regolith-metad` binary and the test harnesses' thin
//! binaries: argument parsing, logging, signals, the runtime.

use std::process::ExitCode;

use clap::Parser;
use tokio::sync::watch;

use crate::args::{normalize_argv, Args};
use crate::node::Node;

/// Sets up `tracing`: `-v` debug for Regolith's crates, `-vv` trace; `RUST_LOG` overrides.
pub fn init_logging(verbose: u8, json: bool) {
    let level = match verbose {
        0 => "info",
        1 => "info,regolith_metad=debug,regolith_raft_log=debug,regolith_proto=debug",
        _ => "debug,regolith_metad=trace,regolith_raft_log=trace,openraft=debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    use std::io::IsTerminal;
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

/// Resolves when SIGTERM or SIGINT arrives.
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

/// Runs `regolith-metad` with these arguments (argv[0] included) until SIGTERM/SIGINT.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    let args = match Args::try_parse_from(normalize_argv(argv)) {
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
    let settings = match args.resolve() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("regolith-metad: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(settings.verbose, settings.json_logs);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = settings.worker_threads {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("regolith-metad: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        let node = Node::start(settings).await?;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            let _ = tx.send(true);
        });
        node.serve(rx).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "regolith-metad failed");
            eprintln!("regolith-metad: {e}");
            ExitCode::FAILURE
        }
    }
}
