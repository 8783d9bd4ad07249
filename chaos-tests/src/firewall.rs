//! nftables rules that make network faults inside a host's namespace.
//!
//! Each fault is one table `inet rgc_<fault>` with its own `input` and `output` base chains, so
//! faults compose (a drop in any table drops the packet) and healing one is deleting its table.
//! Every chain first accepts loopback and the observer's addresses: the observer is the test's
//! own view of the cluster (status sampling), not a participant, and must see through faults.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::error::Result;
use crate::netns::{self, Host};

/// One kind of drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Drop packets arriving from these addresses.
    DropFrom(Vec<Ipv4Addr>),
    /// Drop packets leaving for these addresses.
    DropTo(Vec<Ipv4Addr>),
    /// Drop everything in and out of this interface.
    DropInterface(String),
    /// Drop everything except loopback (and the observer).
    DropAll,
    /// Drop this share of packets, in and out, at random (`numgen random mod 100 < N`).
    Loss { percent: u8 },
}

/// The table name a fault uses.
pub fn table_name(fault: &str) -> String {
    let clean: String = fault
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("rgc_{clean}")
}

fn addr_set(addrs: &[Ipv4Addr]) -> String {
    let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    format!("{{ {} }}", list.join(", "))
}

/// Renders the nft script of one fault table.
pub fn render(table: &str, rules: &[Rule], exempt: &[Ipv4Addr]) -> String {
    let mut input = Vec::new();
    let mut output = Vec::new();
    for rule in rules {
        match rule {
            Rule::DropFrom(a) if !a.is_empty() => {
                input.push(format!("ip saddr {} drop", addr_set(a)))
            }
            Rule::DropTo(a) if !a.is_empty() => {
                output.push(format!("ip daddr {} drop", addr_set(a)))
            }
            Rule::DropFrom(_) | Rule::DropTo(_) => {}
            Rule::DropInterface(i) => {
                input.push(format!("iifname \"{i}\" drop"));
                output.push(format!("oifname \"{i}\" drop"));
            }
            Rule::DropAll => {
                input.push("drop".into());
                output.push("drop".into());
            }
            Rule::Loss { percent } => {
                let p = (*percent).min(100);
                input.push(format!("numgen random mod 100 < {p} drop"));
                output.push(format!("numgen random mod 100 < {p} drop"));
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "table inet {table} {{");
    for (chain, hook, iface, dir, body) in [
        ("input", "input", "iifname", "saddr", &input),
        ("output", "output", "oifname", "daddr", &output),
    ] {
        let _ = writeln!(s, "  chain {chain} {{");
        let _ = writeln!(
            s,
            "    type filter hook {hook} priority -10; policy accept;"
        );
        let _ = writeln!(s, "    {iface} \"lo\" accept");
        if !exempt.is_empty() {
            let _ = writeln!(s, "    ip {dir} {} accept", addr_set(exempt));
        }
        for r in body {
            let _ = writeln!(s, "    {r}");
        }
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(s, "}}");
    s
}

/// The observer's addresses (one per subnet), exempt from every fault.
pub fn observer_exempt(subnets: u8) -> Vec<Ipv4Addr> {
    (0..subnets.max(1)).map(netns::observer_addr).collect()
}

/// Installs fault table `fault` on `host` (replacing an older one of the same name).
pub fn install(host: &Host, run_dir: &std::path::Path, fault: &str, rules: &[Rule]) -> Result<()> {
    let table = table_name(fault);
    netns::nft_delete_table(&host.ns, &table)?;
    let script = render(&table, rules, &observer_exempt(2));
    tracing::debug!(host = %host.name, %fault, "nft:\n{script}");
    netns::nft_apply(
        &host.ns,
        run_dir,
        &format!("{}-{table}", host.name),
        &script,
    )
}

/// Removes fault table `fault` from `host`.
pub fn remove(host: &Host, fault: &str) -> Result<()> {
    netns::nft_delete_table(&host.ns, &table_name(fault))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_each_rule_in_the_right_chain() {
        let a = Ipv4Addr::new(10, 77, 0, 12);
        let s = render(
            "rgc_t",
            &[
                Rule::DropFrom(vec![a]),
                Rule::DropTo(vec![]),
                Rule::DropInterface("eth1".into()),
                Rule::Loss { percent: 130 },
            ],
            &observer_exempt(2),
        );
        let (input, output) = s.split_once("chain output").unwrap();
        assert!(input.contains("ip saddr { 10.77.0.12 } drop"));
        assert!(input.contains("iifname \"eth1\" drop"));
        assert!(input.contains("numgen random mod 100 < 100 drop"));
        assert!(input.contains("ip saddr { 10.77.0.254, 10.77.1.254 } accept"));
        assert!(output.contains("oifname \"eth1\" drop"));
        assert!(!output.contains("daddr { 10.77.0.12 }"));
        assert!(output.contains("ip daddr { 10.77.0.254, 10.77.1.254 } accept"));
        // Exemptions come before drops.
        let acc = input.find("accept").unwrap();
        let drop = input.find("drop").unwrap();
        assert!(acc < drop);
    }

    #[test]
    fn table_names_are_nft_identifiers() {
        assert_eq!(table_name("split-2/1"), "rgc_split_2_1");
    }
}
