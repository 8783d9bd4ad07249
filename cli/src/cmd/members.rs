//! `regolith members list|add|remove`: metad membership.

use regolith_proto::metad::Member;

use crate::args::{MembersArgs, MembersCommand};
use crate::cmd::status::{self, MemberView};
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
        status::members_table(&views(&members, leader)).render()
    );
    Ok(())
}

fn views(members: &[Member], leader: Option<u64>) -> Vec<MemberView> {
    members
        .iter()
        .map(|m| MemberView {
            id: m.id,
            addr: m.addr.clone(),
            role: if Some(m.id) == leader {
                "leader"
            } else if m.voter {
                "voter"
            } else {
                "learner"
            },
            voter: m.voter,
        })
        .collect()
}
