//! Thin binary: the `regolith` CLI's entry point, built by `cargo test -p regolith-e2e`.
fn main() -> std::process::ExitCode {
    regolith_cli::main_with_args(std::env::args_os())
}
