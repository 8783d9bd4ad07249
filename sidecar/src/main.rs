//! `regolith-sidecar`: one per node; owns the node's memory segment. See docs/sidecar.md.

fn main() -> std::process::ExitCode {
    regolith_sidecar::run::main_with_args(std::env::args().collect())
}
