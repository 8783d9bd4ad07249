//! Thin binary: `regolith-metad`'s entry point, built by `cargo test -p regolith-e2e`.
fn main() -> std::process::ExitCode {
    regolith_metad::run::main_with_args(std::env::args().collect())
}
