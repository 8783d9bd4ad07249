//! `regolith-metad`: one replica of the metadata service. See docs/metad.md.

fn main() -> std::process::ExitCode {
    regolith_metad::run::main_with_args(std::env::args().collect())
}
