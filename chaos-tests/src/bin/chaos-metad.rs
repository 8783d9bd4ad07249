//! `chaos-metad`: `regolith-metad` built inside this package, so that `cargo test -p
//! regolith-chaos` builds the daemon it starts (found with `CARGO_BIN_EXE_chaos-metad`).

fn main() -> std::process::ExitCode {
    regolith_metad::run::main_with_args(std::env::args().collect())
}
