//! `regolith segments list|drain NODE`: the segments (one per sidecar) and draining one.

use std::time::{Duration, Instant};

use crate::args::{SegmentsArgs, SegmentsCommand};
use crate::cmd::status;
use crate::ctx::{Ctx, Metad};
use crate::error::{Error, Result};

pub fn run(ctx: &Ctx, args: &SegmentsArgs) -> Result<()> {
    let metad = ctx.metad_client()?;
    match &args.command {
        SegmentsCommand::List => list(&metad),
        SegmentsCommand::Drain {
            node,
            drain_timeout,
            wait,
        } => drain(&metad, node, *drain_timeout, *wait),
    }
}

fn list(metad: &Metad) -> Result<()> {
    let snap = metad.block_on(status::fetch(metad.client()))?;
    print!("{}", status::segments_table(&snap.segments).render());
    Ok(())
}

fn drain(metad: &Metad, node: &str, timeout: Option<Duration>, wait: bool) -> Result<()> {
    let generation = mounted_generation(metad, node)?;
    let timeout_ms = timeout.map_or(0, |d| d.as_millis().max(1) as u64);
    let r = metad.block_on(metad.client().drain(node, timeout_ms))?;
    println!(
        "draining {node} (node id {}): {} objects remain; no new placements there, it unmounts once empty or at the drain timeout",
        r.node_id, r.objects
    );
    if let (true, Some(g)) = (wait, generation) {
        wait_unmounted(metad, node, g, timeout)?;
        println!("{node} (generation {g}) is unmounted");
    }
    Ok(())
}

/// The generation of `node`'s mounted segment, if it has one.
fn mounted_generation(metad: &Metad, node: &str) -> Result<Option<u64>> {
    let segs = metad.block_on(metad.client().list_segments())?;
    Ok(segs
        .iter()
        .filter(|s| s.node_name == node)
        .map(|s| s.generation)
        .max())
}

/// Polls the segment list until generation `generation` of `node` is gone (a sidecar that is
/// still running may mount a newer one), a bit past the drain timeout at most when one was
/// given.
fn wait_unmounted(
    metad: &Metad,
    node: &str,
    generation: u64,
    timeout: Option<Duration>,
) -> Result<()> {
    let deadline = timeout.map(|t| Instant::now() + t + Duration::from_secs(30));
    loop {
        let segs = metad.block_on(metad.client().list_segments())?;
        if !segs
            .iter()
            .any(|s| s.node_name == node && s.generation == generation)
        {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(Error::Failed(format!(
                "{node} is still mounted after the drain timeout"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
