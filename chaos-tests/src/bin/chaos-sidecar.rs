//! `chaos-sidecar`: `regolith-sidecar` built inside this package, so that `cargo test -p
//! regolith-chaos` builds the daemon it starts (found with `CARGO_BIN_EXE_chaos-sidecar`).

fn main() -> std::process::ExitCode {
    regolith_sidecar::run::main_with_args(std::env::args().collect())
}
