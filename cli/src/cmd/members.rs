//! `regolith members list|add|remove`: metad membership.

use crate::args::{MembersArgs, MembersCommand};
use crate::cmd::status;
use crate::ctx::Ctx;
use crate::error::{Error, Result};

pub fn run(ctx: &Ctx, args: &MembersArgs) -> Result<()> {
    let metad = ctx.metad_client()?;
    let c = metad.client();
    let members = match &args.command {
        MembersCommand::List => metad.block_on(c.stats())?.members,
        MembersCommand::Add { id, addr } => {
            regolith_proto::client::parse_addrs(addr)
                .map_err(|e| Error::usage(format!("members add {id} {addr}: {e}")))?;
            let m = metad.block_on(c.add_member(*id, addr))?;
            println!("added metad {id} at {addr}");
            m
        }
        MembersCommand::Remove { id } => {
            let m = metad.block_on(c.remove_member(*id))?;
            println!("removed metad {id}");
            m
        }
    };
    let leader = metad.block_on(c.stats()).ok().map(|s| s.leader_id);
    print!(
        "{}",
        status::members_table(&status::member_views(&members, leader)).render()
    );
    Ok(())
}
