//! Thin binary: `regolith-sidecar`'s entry point, built by `cargo test -p regolith-e2e`.
fn main() -> std::process::ExitCode {
    regolith_sidecar::run::main_with_args(std::env::args().collect())
}
