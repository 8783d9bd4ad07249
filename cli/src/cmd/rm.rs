//! `regolith rm KEY...`: removes keys through the sidecar. Every key is tried; the command
//! fails (exit 1) when any of them could not be removed (e.g. not found).

use crate::args::RmArgs;
use crate::ctx::Ctx;
use crate::error::{Error, Result};

pub fn run(ctx: &Ctx, args: &RmArgs) -> Result<()> {
    let client = ctx.sidecar()?;
    let mut failed = 0usize;
    for key in &args.keys {
        match client.remove(key) {
            Ok(()) => println!("removed {key:?}"),
            Err(e) if args.keys.len() == 1 => return Err(e.into()),
            Err(e) => {
                eprintln!("regolith: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        return Err(Error::Failed(format!(
            "{failed} of {} keys could not be removed",
            args.keys.len()
        )));
    }
    Ok(())
}
