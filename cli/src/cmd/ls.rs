//! `regolith ls [PREFIX]`: lists keys, one per line (with `-l`: size, replicas, pin), paging
//! through metad's `ListKeys`.

use std::io::Write;

use regolith_proto::metad::{KeyInfo, ListKeysRequest, PinKind};

use crate::args::LsArgs;
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::format;

/// Keys asked for per page.
const PAGE: u32 = 1000;

pub fn run(ctx: &Ctx, args: &LsArgs) -> Result<()> {
    let metad = ctx.metad_client()?;
    let prefix = args.prefix.clone().unwrap_or_default();
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut out = std::io::stdout().lock();
    let mut start_after = String::new();
    let mut shown = 0u64;
    while shown < limit {
        let page = metad.block_on(metad.client().list_keys(ListKeysRequest {
            prefix: prefix.clone(),
            start_after: start_after.clone(),
            limit: PAGE,
        }))?;
        for k in &page.keys {
            if shown == limit {
                break;
            }
            if !print_key(&mut out, k, args.long)? {
                return Ok(());
            }
            shown += 1;
        }
        if page.next_start_after.is_empty() || page.keys.is_empty() {
            break;
        }
        start_after = page.next_start_after;
    }
    Ok(())
}

/// Prints one key; false when stdout was closed (`regolith ls | head`).
fn print_key(out: &mut impl Write, k: &KeyInfo, long: bool) -> Result<bool> {
    let line = if long {
        let pin = match PinKind::try_from(k.pin) {
            Ok(PinKind::PinHard) => "hard-pin",
            Ok(PinKind::PinSoft) => "soft-pin",
            _ => "-",
        };
        format!(
            "{}\t{}\t{}\t{}",
            k.key,
            format::bytes(k.size),
            k.replicas,
            pin
        )
    } else {
        k.key.clone()
    };
    match writeln!(out, "{line}") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(source) => Err(Error::File {
            what: "cannot write",
            path: "-".into(),
            source,
        }),
    }
}
