//! The `regolith` binary.
fn main() -> std::process::ExitCode {
    regolith_cli::main_with_args(std::env::args_os())
}
