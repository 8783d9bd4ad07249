//! The process entry point shared by the `regolith-metad` binary and the test harnesses' thin
//! binaries: argument parsing, logging, signals, the runtime.

use std::process::ExitCode;

use clap::Parser;
use tokio::sync::watch;

use crate::args::{normalize_argv, Args};
use crate::node::Node;
use regolith_proto::daemon;

/// Logs on stderr; `-v` debug and `-vv` trace for Regolith's crates; `RUST_LOG` overrides.
pub fn init_logging(verbose: u8, json: bool) {
    daemon::init_logging(
        &[
            "info",
            "info,regolith_metad=debug,regolith_raft_log=debug,regolith_proto=debug",
            "debug,regolith_metad=trace,regolith_raft_log=trace,openraft=debug",
        ],
        verbose,
        json,
    );
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
    let rt = match daemon::runtime(settings.worker_threads) {
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
            daemon::wait_for_signal().await;
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
