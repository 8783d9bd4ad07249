//! One module per subcommand; [`run`] dispatches.

pub mod bench;
pub mod get;
pub mod ls;
pub mod members;
pub mod metad;
pub mod put;
pub mod rm;
pub mod segments;
pub mod status;
pub mod tls;
pub mod up;

use crate::args::{Cli, Command};
use crate::ctx::Ctx;
use crate::error::Result;

pub fn run(cli: Cli) -> Result<()> {
    let metad = cli
        .command
        .metad_arg()
        .map(str::to_string)
        .or(cli.metad.clone());
    let ctx = Ctx::new(cli.global.clone(), metad);
    match &cli.command {
        Command::Up(a) => up::run(&ctx, a),
        Command::Status(a) => status::run(&ctx, a),
        Command::Put(a) => put::run(&ctx, a),
        Command::Get(a) => get::run(&ctx, a),
        Command::Ls(a) => ls::run(&ctx, a),
        Command::Rm(a) => rm::run(&ctx, a),
        Command::Members(a) => members::run(&ctx, a),
        Command::Segments(a) => segments::run(&ctx, a),
        Command::Metad(a) => metad::run(&ctx, a),
        Command::Bench(a) => bench::run(&ctx, a),
        Command::Tls(a) => tls::run(a),
    }
}
