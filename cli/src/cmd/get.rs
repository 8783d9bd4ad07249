//! `regolith get KEY [FILE|-]`: writes the value of KEY to a file (or stdout), through the
//! sidecar. A file is written whole or not at all (a temporary file renamed into place).

use std::io::Write;
use std::path::Path;

use crate::args::GetArgs;
use crate::cluster_file::write_atomically;
use crate::ctx::Ctx;
use crate::error::{Error, Result};

pub fn run(ctx: &Ctx, args: &GetArgs) -> Result<()> {
    let client = ctx.sidecar()?;
    let value = client.get(&args.key)?;
    match args.file.as_deref() {
        None => write_stdout(&value),
        Some(p) if p == Path::new("-") => write_stdout(&value),
        Some(p) => write_atomically(p, &value),
    }
}

fn write_stdout(value: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(value).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // `regolith get k | head -c 10`: the reader left; nothing went wrong here.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(source) => Err(Error::File {
            what: "cannot write",
            path: "-".into(),
            source,
        }),
    }
}
