//! `regolith put KEY [FILE|-]`: stores a file (or stdin) under KEY through the sidecar.

use std::io::Read;
use std::path::Path;

use regolith_client::{Error as ClientError, ReplicateConfig};

use crate::args::PutArgs;
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::format;

pub fn run(ctx: &Ctx, args: &PutArgs) -> Result<()> {
    let value = read_value(args.file.as_deref())?;
    if value.is_empty() {
        return Err(Error::Failed(format!(
            "put {:?}: the value is empty (objects hold at least one byte)",
            args.key
        )));
    }
    let client = ctx.sidecar()?;
    let info = client
        .put(&args.key, &value, &replicate_config(args))
        .map_err(|e| explain(&args.key, e))?;
    let replicas: Vec<String> = info
        .replicas
        .iter()
        .map(|r| {
            if r.local {
                format!("{} (local)", r.node_name)
            } else {
                r.node_name.clone()
            }
        })
        .collect();
    println!(
        "put {:?}: {} on {}",
        args.key,
        format::bytes(value.len() as u64),
        replicas.join(", ")
    );
    Ok(())
}

fn replicate_config(args: &PutArgs) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: args.replicas,
        preferred_segments: args.preferred_segments.clone(),
        prefer_local: args.prefer_local,
        soft_pin: args.soft_pin,
        hard_pin: args.hard_pin,
        soft_pin_ttl: None,
        ttl: args.ttl,
        upsert: args.upsert,
    }
}

/// Reads the whole value: a file, or stdin for `-` and no file.
fn read_value(file: Option<&Path>) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    match file {
        None => std::io::stdin().lock().read_to_end(&mut buf).map(|_| ()),
        Some(p) if p == Path::new("-") => std::io::stdin().lock().read_to_end(&mut buf).map(|_| ()),
        Some(p) => std::fs::read(p).map(|b| buf = b),
    }
    .map_err(|source| Error::File {
        what: "cannot read",
        path: file.unwrap_or(Path::new("-")).to_path_buf(),
        source,
    })?;
    Ok(buf)
}

/// The put's error, with what to do about an existing key.
fn explain(key: &str, e: ClientError) -> Error {
    match e {
        ClientError::AlreadyExists { .. } => Error::Failed(format!(
            "key {key:?} already exists (objects are immutable: `regolith rm {key}` first)"
        )),
        e => e.into(),
    }
}
