//! Which transport a node and each of its peers use (sans-I/O).
//!
//! At start ([`choose_local`]): `--transport tcp` never opens a device; `auto` uses the RDMA
//! ports that are active among those named by `--rdma-device` (all devices when none is named)
//! and falls back to TCP, saying why, when there are none or the feature is not built; `rdma`
//! refuses to start instead of falling back.
//!
//! Per peer ([`peer_outcome`]): the upgrade of each connection either succeeds or tells why
//! not (the peer has no RDMA, predates it, or has no port on this port's link layer); `auto`
//! keeps the connection as TCP and logs that once per peer ([`OncePerPeer`]); `rdma` fails
//! the connection.

use std::collections::HashSet;

use parking_lot::Mutex;
use regolith_proto::rdma::LinkLayer;

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum TransportMode {
    /// RDMA to every peer where both ends have an active port, TCP elsewhere.
    #[default]
    Auto,
    /// TCP only; no RDMA device is opened.
    Tcp,
    /// RDMA only: no start without an active port, no connection to a peer without one.
    Rdma,
}

impl std::fmt::Display for TransportMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportMode::Auto => "auto",
            TransportMode::Tcp => "tcp",
            TransportMode::Rdma => "rdma",
        })
    }
}

/// One port of one device as the probe found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortProbe {
    pub device: String,
    pub port: u8,
    pub active: bool,
    pub link_layer: LinkLayer,
}

/// What probing the machine's RDMA devices gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The sidecar was built without the `rdma` feature.
    NotBuilt,
    /// Listing or opening devices failed (no rdma-core, no kernel support, no device).
    Failed(String),
    Ports(Vec<PortProbe>),
}

/// The node's RDMA ports, or why it speaks TCP only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalChoice {
    /// Active ports to use, in `--rdma-device` order (device order when none was named).
    pub ports: Vec<PortProbe>,
    /// Set when `ports` is empty: why the node speaks TCP only (logged once at start).
    pub tcp_reason: Option<String>,
}

impl LocalChoice {
    fn tcp(reason: impl Into<String>) -> Self {
        LocalChoice {
            ports: Vec::new(),
            tcp_reason: Some(reason.into()),
        }
    }
}

/// The node's transport at start. `Err` only for `--transport rdma`, with what is missing.
/// With mutual TLS configured (`tls`), `auto` keeps to TCP: RDMA moves the bytes in clear on
/// the fabric, which an operator who asked for TLS did not choose; `rdma` says they did.
pub fn choose_local(
    mode: TransportMode,
    wanted: &[String],
    tls: bool,
    probe: Probe,
) -> Result<LocalChoice, String> {
    let fallback = |why: String| match mode {
        TransportMode::Rdma => Err(format!("--transport rdma: {why}")),
        _ => Ok(LocalChoice::tcp(why)),
    };
    if mode == TransportMode::Tcp {
        return Ok(LocalChoice::tcp("--transport tcp"));
    }
    if tls && mode == TransportMode::Auto {
        return Ok(LocalChoice::tcp(
            "mutual TLS is configured and RDMA transfers are not encrypted \
             (--transport rdma moves them over RDMA anyway)",
        ));
    }
    let ports = match probe {
        Probe::NotBuilt => {
            return fallback("this sidecar was built without the `rdma` feature".into())
        }
        Probe::Failed(e) => return fallback(format!("no RDMA device usable: {e}")),
        Probe::Ports(p) => p,
    };
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|w| !ports.iter().any(|p| &p.device == *w))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() && mode == TransportMode::Rdma {
        return fallback(format!(
            "--rdma-device {} not found (devices: {})",
            missing.join(","),
            device_names(&ports)
        ));
    }
    let named: Vec<PortProbe> = if wanted.is_empty() {
        ports.clone()
    } else {
        // In the order the operator named them: a multi-rail node lists its rails in order.
        wanted
            .iter()
            .flat_map(|w| ports.iter().filter(move |p| &p.device == w))
            .cloned()
            .collect()
    };
    let active: Vec<PortProbe> = named.iter().filter(|p| p.active).cloned().collect();
    if active.is_empty() {
        let why = if named.is_empty() {
            format!(
                "no RDMA device{} (devices: {})",
                if wanted.is_empty() {
                    String::new()
                } else {
                    format!(" named {}", wanted.join(","))
                },
                device_names(&ports)
            )
        } else {
            format!("no active port on {}", device_names(&named))
        };
        return fallback(why);
    }
    Ok(LocalChoice {
        ports: active,
        tcp_reason: None,
    })
}

fn device_names(ports: &[PortProbe]) -> String {
    if ports.is_empty() {
        return "none".into();
    }
    let mut seen = Vec::new();
    for p in ports {
        let state = if p.active { "active" } else { "down" };
        seen.push(format!("{}:{} {state}", p.device, p.port));
    }
    seen.join(", ")
}

/// What the peer answered an upgrade with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAnswer {
    Accepted,
    /// UNSUPPORTED: the peer has no RDMA, or no port on our link layer, or no staging room.
    Unsupported,
    /// BAD_REQUEST and a closed connection: a node older than the RDMA upgrade.
    OldPeer,
    /// The peer accepted, but its answer or our queue pair could not be used.
    Failed(String),
}

/// What a connection does after its upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerOutcome {
    Rdma,
    /// Stay TCP (the same connection while it is in step, else a fresh one), for this reason.
    Tcp {
        reason: String,
    },
    /// `--transport rdma` and the peer cannot: the connection fails with this.
    Refuse(String),
}

/// The decision for one connection to `node`.
pub fn peer_outcome(mode: TransportMode, node: u64, answer: PeerAnswer) -> PeerOutcome {
    let reason = match answer {
        PeerAnswer::Accepted => return PeerOutcome::Rdma,
        PeerAnswer::Unsupported => format!("node {node} has no RDMA port this node can reach"),
        PeerAnswer::OldPeer => format!("node {node} runs a sidecar without the RDMA upgrade"),
        PeerAnswer::Failed(e) => format!("RDMA to node {node} failed: {e}"),
    };
    match mode {
        TransportMode::Rdma => PeerOutcome::Refuse(format!("--transport rdma: {reason}")),
        _ => PeerOutcome::Tcp { reason },
    }
}

/// The local port the `stripe`-th connection to a peer uses, and the port a server picks for
/// it among its own: rails line up (connection k uses port k mod n on each side), so a
/// multi-rail pair of nodes with the same port count stripes one rail per connection.
pub fn port_for(stripe: u32, ports: usize) -> Option<usize> {
    (ports > 0).then(|| stripe as usize % ports)
}

/// The server's port for an offer: the `stripe`-th among its ports on the offer's link layer.
pub fn server_port(stripe: u32, ours: &[LinkLayer], theirs: LinkLayer) -> Option<usize> {
    let same: Vec<usize> = (0..ours.len()).filter(|&i| ours[i] == theirs).collect();
    port_for(stripe, same.len()).map(|k| same[k])
}

/// Remembers which (peer, reason) pairs were logged, so a fallback is said once per peer and
/// not once per connection (bounded: a node with thousands of peers forgets the oldest).
#[derive(Default)]
pub struct OncePerPeer {
    seen: Mutex<HashSet<(u64, String)>>,
}

const ONCE_CAP: usize = 4096;

impl OncePerPeer {
    /// `true` the first time `(node, reason)` is seen.
    pub fn first(&self, node: u64, reason: &str) -> bool {
        let mut seen = self.seen.lock();
        if seen.contains(&(node, reason.to_owned())) {
            return false;
        }
        if seen.len() >= ONCE_CAP {
            seen.clear();
        }
        seen.insert((node, reason.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, active: bool) -> PortProbe {
        PortProbe {
            device: device.into(),
            port: 1,
            active,
            link_layer: LinkLayer::Ethernet,
        }
    }

    #[test]
    fn tcp_mode_never_looks_at_devices() {
        let c = choose_local(
            TransportMode::Tcp,
            &[],
            false,
            Probe::Ports(vec![port("mlx5_0", true)]),
        )
        .unwrap();
        assert!(c.ports.is_empty());
        assert_eq!(c.tcp_reason.as_deref(), Some("--transport tcp"));
    }

    #[test]
    fn no_device_falls_back_in_auto_and_refuses_in_rdma() {
        for probe in [
            Probe::NotBuilt,
            Probe::Failed("Operation not supported (os error 95)".into()),
            Probe::Ports(vec![]),
        ] {
            let c = choose_local(TransportMode::Auto, &[], false, probe.clone()).unwrap();
            assert!(c.ports.is_empty());
            assert!(c.tcp_reason.is_some(), "{probe:?}");
            let e = choose_local(TransportMode::Rdma, &[], false, probe.clone()).unwrap_err();
            assert!(e.starts_with("--transport rdma: "), "{e}");
        }
        let e = choose_local(TransportMode::Rdma, &[], false, Probe::NotBuilt).unwrap_err();
        assert!(e.contains("without the `rdma` feature"), "{e}");
    }

    #[test]
    fn a_device_with_no_active_port_is_not_used() {
        let probe = Probe::Ports(vec![port("mlx5_0", false), port("mlx5_1", false)]);
        let c = choose_local(TransportMode::Auto, &[], false, probe.clone()).unwrap();
        assert!(c.ports.is_empty());
        let why = c.tcp_reason.unwrap();
        assert!(
            why.contains("no active port") && why.contains("mlx5_0:1 down"),
            "{why}"
        );
        assert!(choose_local(TransportMode::Rdma, &[], false, probe).is_err());
    }

    #[test]
    fn named_devices_are_used_in_the_order_named_and_only_if_active() {
        let probe = Probe::Ports(vec![
            port("mlx5_0", true),
            port("mlx5_1", true),
            port("mlx5_2", false),
        ]);
        let wanted = vec!["mlx5_1".to_string(), "mlx5_0".to_string(), "mlx5_2".into()];
        let c = choose_local(TransportMode::Auto, &wanted, false, probe.clone()).unwrap();
        let names: Vec<_> = c.ports.iter().map(|p| p.device.as_str()).collect();
        assert_eq!(names, ["mlx5_1", "mlx5_0"]);
        assert_eq!(c.tcp_reason, None);

        // A name that does not exist: auto uses the others, rdma refuses and lists what exists.
        let wanted = vec!["mlx5_9".to_string(), "mlx5_0".to_string()];
        let c = choose_local(TransportMode::Auto, &wanted, false, probe.clone()).unwrap();
        assert_eq!(c.ports.len(), 1);
        let e = choose_local(TransportMode::Rdma, &wanted, false, probe.clone()).unwrap_err();
        assert!(
            e.contains("mlx5_9 not found") && e.contains("mlx5_1:1 active"),
            "{e}"
        );

        let only_missing = vec!["ib9".to_string()];
        let c = choose_local(TransportMode::Auto, &only_missing, false, probe).unwrap();
        assert!(c.tcp_reason.unwrap().contains("named ib9"));
    }

    #[test]
    fn with_tls_auto_keeps_to_tcp_and_rdma_is_an_explicit_choice() {
        let probe = Probe::Ports(vec![port("mlx5_0", true)]);
        let c = choose_local(TransportMode::Auto, &[], true, probe.clone()).unwrap();
        assert!(c.ports.is_empty());
        assert!(c.tcp_reason.unwrap().contains("not encrypted"));
        let c = choose_local(TransportMode::Rdma, &[], true, probe.clone()).unwrap();
        assert_eq!(c.ports.len(), 1);
        let c = choose_local(TransportMode::Auto, &[], false, probe).unwrap();
        assert_eq!(c.ports.len(), 1);
    }

    #[test]
    fn peer_outcomes() {
        assert_eq!(
            peer_outcome(TransportMode::Auto, 3, PeerAnswer::Accepted),
            PeerOutcome::Rdma
        );
        match peer_outcome(TransportMode::Auto, 3, PeerAnswer::Unsupported) {
            PeerOutcome::Tcp { reason } => assert!(reason.contains("node 3 has no RDMA port")),
            o => panic!("{o:?}"),
        }
        match peer_outcome(TransportMode::Auto, 3, PeerAnswer::OldPeer) {
            PeerOutcome::Tcp { reason } => assert!(reason.contains("without the RDMA upgrade")),
            o => panic!("{o:?}"),
        }
        for a in [
            PeerAnswer::Unsupported,
            PeerAnswer::OldPeer,
            PeerAnswer::Failed("qp".into()),
        ] {
            assert!(matches!(
                peer_outcome(TransportMode::Rdma, 3, a),
                PeerOutcome::Refuse(_)
            ));
        }
    }

    #[test]
    fn ports_line_up_by_rail_and_link_layer() {
        assert_eq!(port_for(0, 0), None);
        assert_eq!(
            (0..5).map(|k| port_for(k, 2).unwrap()).collect::<Vec<_>>(),
            [0, 1, 0, 1, 0]
        );
        let ours = [
            LinkLayer::InfiniBand,
            LinkLayer::Ethernet,
            LinkLayer::InfiniBand,
        ];
        assert_eq!(server_port(0, &ours, LinkLayer::InfiniBand), Some(0));
        assert_eq!(server_port(1, &ours, LinkLayer::InfiniBand), Some(2));
        assert_eq!(server_port(7, &ours, LinkLayer::Ethernet), Some(1));
        assert_eq!(
            server_port(0, &[LinkLayer::Ethernet], LinkLayer::InfiniBand),
            None
        );
    }

    #[test]
    fn fallbacks_are_said_once_per_peer_and_reason() {
        let once = OncePerPeer::default();
        assert!(once.first(1, "a"));
        assert!(!once.first(1, "a"));
        assert!(once.first(2, "a"));
        assert!(once.first(1, "b"));
    }
}
