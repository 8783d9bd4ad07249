//! The process entry point of the `regolith-metad` binary: the daemons' shared `main` shell
//! ([`regolith_proto::daemon::main`]: argument parsing, logging, signals, the runtime) around
//! [`Node`].

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::watch;

use crate::args::{Args, Settings};
use crate::node::Node;
use regolith_proto::daemon;

/// Logs on stderr; `-v` debug and `-vv` trace for Regolith's crates; `RUST_LOG` overrides.
pub const SHELL: daemon::Shell = daemon::Shell {
    name: "regolith-metad",
    log_levels: [
        "info",
        "info,regolith_metad=debug,regolith_raft_log=debug,regolith_proto=debug",
        "debug,regolith_metad=trace,regolith_raft_log=trace,openraft=debug",
    ],
};

/// Runs `regolith-metad` with these arguments (argv[0] included) until SIGTERM/SIGINT.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    daemon::main(
        &SHELL,
        argv,
        Args::resolve,
        Settings::process,
        Node::start,
        |node: Arc<Node>, shutdown: watch::Receiver<bool>| node.serve(shutdown),
    )
}
