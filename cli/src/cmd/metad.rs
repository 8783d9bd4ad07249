//! `regolith metad snapshot save FILE | inspect FILE`: backups of metad's replicated state
//! (docs/metad.md "Backup and recovery"). The file format is `regolith_proto::backup`'s.
//! `regolith metad transfer-leader [--to ID]`: a leadership hand-over (docs/metad.md
//! "Leadership hand-over").

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use regolith_proto::backup::{self, Validated};

use crate::args::{MetadAdminArgs, MetadAdminCommand, SnapshotCommand};
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::format;

pub fn run(ctx: &Ctx, args: &MetadAdminArgs) -> Result<()> {
    match &args.command {
        MetadAdminCommand::Snapshot(SnapshotCommand::Save { file }) => save(ctx, file),
        MetadAdminCommand::Snapshot(SnapshotCommand::Inspect { file }) => inspect(file),
        MetadAdminCommand::TransferLeader { to } => transfer_leader(ctx, *to),
    }
}

/// How long the leader may hold writes for a hand-over the CLI asks for (below the client's
/// 5 s request limit, with the leader's wait for its own vote lease inside it).
const TRANSFER_HOLD_MS: u64 = 3_000;

fn transfer_leader(ctx: &Ctx, to: Option<u64>) -> Result<()> {
    let metad = ctx.metad_client()?;
    let (r, addr) = metad.block_on(
        metad
            .client()
            .transfer_leader(to.unwrap_or(0), TRANSFER_HOLD_MS),
    )?;
    println!(
        "leader handed over: node {} ({addr}) -> node {}, term {}, in {} ms",
        r.from, r.to, r.term, r.took_ms
    );
    Ok(())
}

fn file_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::File {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Streams the snapshot into a temp file beside `file`, fsyncs and validates it, then renames
/// it into place (and fsyncs the directory): `file` is either the complete, checked snapshot or
/// untouched.
fn save(ctx: &Ctx, file: &Path) -> Result<()> {
    let metad = ctx.metad_client()?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = file
        .file_name()
        .ok_or_else(|| Error::usage(format!("{}: not a file name", file.display())))?;
    let temp = dir.join(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(file_err("create", &temp))?;
    let kept = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, out);
        let (bytes, addr) = metad.block_on(metad.client().save_snapshot(&mut w))?;
        let out: File = w.into_inner().map_err(|e| Error::File {
            what: "write",
            path: temp.clone(),
            source: e.into_error(),
        })?;
        out.sync_all().map_err(file_err("fsync", &temp))?;
        let v = backup::validate(&temp).map_err(|e| {
            Error::Failed(format!(
                "the snapshot metad {addr} sent is not valid ({e}); nothing was written to {}",
                file.display()
            ))
        })?;
        Ok::<_, Error>((bytes, addr, v))
    })();
    let (bytes, addr, v) = match kept {
        Ok(k) => k,
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    if let Err(e) = std::fs::rename(&temp, file) {
        let _ = std::fs::remove_file(&temp);
        return Err(Error::File {
            what: "rename the snapshot into place at",
            path: file.to_path_buf(),
            source: e,
        });
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(file_err("fsync directory", &dir))?;
    println!(
        "saved snapshot from metad {addr} to {} ({})",
        file.display(),
        format::bytes(bytes)
    );
    print!("{}", describe(&v));
    Ok(())
}

fn inspect(file: &Path) -> Result<()> {
    let v = backup::validate(file).map_err(|e| Error::Failed(e.to_string()))?;
    println!(
        "{}: valid snapshot file ({})",
        file.display(),
        format::bytes(v.file_len)
    );
    print!("{}", describe(&v));
    Ok(())
}

fn describe(v: &Validated) -> String {
    let i = &v.info;
    let mut s = String::new();
    let members: Vec<String> = i
        .members
        .iter()
        .map(|m| {
            format!(
                "{}={}{}",
                m.id,
                m.addr,
                if m.voter { "" } else { " (learner)" }
            )
        })
        .collect();
    let lines = [
        (
            "taken by",
            format!("metad {} (Regolith {})", i.leader_id, i.regolith_version),
        ),
        (
            "taken at",
            format!("{} ms since the Unix epoch", i.created_unix_ms),
        ),
        (
            "raft",
            format!("term {}, applied index {}", i.term, i.applied_index),
        ),
        ("members", members.join(", ")),
        ("keys", i.keys.to_string()),
        ("segments", i.segments.to_string()),
        ("metadata KV keys", i.meta_keys.to_string()),
        ("state format", i.state_format.to_string()),
    ];
    for (k, val) in lines {
        s.push_str(&format!("  {k:<17} {val}\n"));
    }
    s
}
