//! The RDMA data plane between two nodes' data planes (real segments, real TCP control
//! connections, real queue pairs).
//!
//! The tests marked `#[ignore]` need an RDMA device with an active port (a ConnectX, or
//! Soft-RoCE: `rdma link add rxe0 type rxe netdev eth0`) and a build with the feature:
//!
//! ```sh
//! cargo test -p regolith-sidecar --features rdma --test rdma -- --ignored --test-threads 1
//! ```
//!
//! (`docs/rdma.md`, "Running the RDMA tests"). The others run everywhere: with the feature
//! built and no device, a node falls back to TCP in `auto` and refuses to start in `rdma`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use regolith_proto::checksum::CHUNK;
use regolith_sidecar::segment::{Segment, SegmentOptions};
use regolith_sidecar::transport::rdma::{NodeTransport, RdmaConfig, RdmaNode, TransportMode};
use regolith_sidecar::transport::tcp::{ServerConfig, TcpConfig, TcpServer, TcpTransport};
use regolith_sidecar::transport::{
    BasicAdmission, DataClient, PeerAddrs, RemoteRange, StripeConfig, TransportStats, Version,
};

/// A node whose data plane upgrades to RDMA per `mode`.
struct RdmaTestNode {
    id: u64,
    segment: Arc<Segment>,
    admission: BasicAdmission,
    rdma: Arc<RdmaNode>,
    server: TcpServer,
    client: DataClient<NodeTransport>,
}

impl RdmaTestNode {
    async fn start(
        id: u64,
        mode: TransportMode,
        segment_size: u64,
    ) -> regolith_sidecar::Result<Self> {
        let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let segment = Arc::new(
            Segment::create(
                &format!("rdma{id}"),
                segment_size,
                &SegmentOptions::default(),
            )
            .unwrap(),
        );
        let rdma = RdmaNode::start(RdmaConfig {
            mode,
            devices: std::env::var("REGOLITH_TEST_RDMA_DEVICE")
                .map(|d| d.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            ..RdmaConfig::default()
        })?;
        if segment_size > 0 {
            rdma.attach_segment(&segment)?;
        }
        let admission = BasicAdmission::new(1);
        let stats = TransportStats::new();
        let server = TcpServer::start(
            ServerConfig {
                listen: vec![SocketAddr::new(ip, 0)],
                node_id: id,
                token: Some(TOKEN.to_vec()),
                rdma: rdma.server(),
                ..ServerConfig::default()
            },
            segment.clone(),
            Arc::new(admission.clone()),
            stats.clone(),
        )
        .await?;
        let transport = NodeTransport::new(
            TcpTransport::new(
                TcpConfig {
                    node_id: id,
                    token: Some(TOKEN.to_vec()),
                    io_timeout: Duration::from_secs(5),
                    ..TcpConfig::default()
                },
                stats.clone(),
            ),
            rdma.clone(),
        );
        let stripe = StripeConfig {
            local_nics: vec![ip],
            transfer_timeout: Duration::from_secs(20),
            ..StripeConfig::default()
        };
        let client = DataClient::new(transport, stripe, stats)?;
        Ok(Self {
            id,
            segment,
            admission,
            rdma,
            server,
            client,
        })
    }

    fn peer(&self) -> PeerAddrs {
        PeerAddrs {
            node_id: self.id,
            addrs: self.server.local_addrs(),
        }
    }
}

fn range(offset: u64, len: usize) -> RemoteRange {
    RemoteRange {
        generation: 1,
        offset,
        len: len as u64,
        grant: Default::default(),
    }
}

fn hashes(len: usize) -> Vec<u64> {
    vec![0; len.div_ceil(CHUNK)]
}

/// Sum of one counter over every port of a node.
fn total(
    node: &RdmaNode,
    f: impl Fn(&regolith_sidecar::transport::rdma::PortCounters) -> u64,
) -> u64 {
    node.stats.snapshot().iter().map(|(_, c)| f(c)).sum()
}

#[tokio::test]
async fn without_a_device_auto_serves_over_tcp_and_rdma_refuses_to_start() {
    init_logs();
    if RdmaNode::start(RdmaConfig {
        mode: TransportMode::Auto,
        ..RdmaConfig::default()
    })
    .unwrap()
    .is_rdma()
    {
        eprintln!("this machine has an RDMA port: the no-device case cannot be checked here");
        return;
    }
    let holder = RdmaTestNode::start(1, TransportMode::Auto, 8 * MIB as u64)
        .await
        .unwrap();
    let reader = RdmaTestNode::start(2, TransportMode::Auto, 0)
        .await
        .unwrap();
    assert!(!holder.rdma.is_rdma() && !reader.rdma.is_rdma());
    assert!(holder.rdma.tcp_reason.is_some());
    assert!(holder.rdma.server().is_none());

    let len = 3 * MIB + 100;
    let data = random_bytes(len, 7);
    let v = Version { term: 1, id: 9 };
    let mut wh = hashes(len);
    reader
        .client
        .write(&holder.peer(), range(MIB as u64, len), v, &data, &mut wh)
        .await
        .unwrap();
    let mut back = vec![0u8; len];
    let mut rh = hashes(len);
    reader
        .client
        .read(
            &holder.peer(),
            range(MIB as u64, len),
            v,
            &mut back,
            &mut rh,
        )
        .await
        .unwrap();
    assert!(back == data, "the bytes read back over TCP differ");
    assert_eq!(wh, rh);

    let e = RdmaNode::start(RdmaConfig {
        mode: TransportMode::Rdma,
        ..RdmaConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("--transport rdma"), "{e}");
    let _ = (&holder.segment, &holder.admission);
}

#[tokio::test]
#[ignore = "needs an RDMA device with an active port and --features rdma (docs/rdma.md)"]
async fn reads_and_writes_move_over_rdma_with_the_checksums_of_tcp() {
    init_logs();
    let holder = RdmaTestNode::start(1, TransportMode::Rdma, 64 * MIB as u64)
        .await
        .expect("an RDMA port (set REGOLITH_TEST_RDMA_DEVICE to pick one)");
    let reader = RdmaTestNode::start(2, TransportMode::Rdma, 0)
        .await
        .unwrap();
    for (i, len) in [4096usize, 256 << 10, 16 * MIB, 32 * MIB + 12345]
        .into_iter()
        .enumerate()
    {
        let data = random_bytes(len, i as u64);
        let v = Version {
            term: 1,
            id: 100 + i as u64,
        };
        let off = (i as u64) * MIB as u64;
        let mut wh = hashes(len);
        reader
            .client
            .write(&holder.peer(), range(off, len), v, &data, &mut wh)
            .await
            .unwrap();
        let mut in_segment = vec![0u8; len];
        holder.segment.read_at(off, &mut in_segment).unwrap();
        assert!(
            in_segment == data,
            "{len} bytes: the segment holds other bytes"
        );
        let mut back = vec![0u8; len];
        let mut rh = hashes(len);
        reader
            .client
            .read(&holder.peer(), range(off, len), v, &mut back, &mut rh)
            .await
            .unwrap();
        assert!(back == data, "{len} bytes: read back other bytes");
        assert_eq!(wh, rh, "{len} bytes: hashes of write and read differ");
    }
    assert!(
        total(&reader.rdma, |c| c
            .reads
            .load(std::sync::atomic::Ordering::Relaxed))
            > 0
    );
    assert!(
        total(&reader.rdma, |c| c
            .writes
            .load(std::sync::atomic::Ordering::Relaxed))
            > 0
    );
    assert!(
        total(&holder.rdma, |c| c
            .commits
            .load(std::sync::atomic::Ordering::Relaxed))
            > 0
    );
    assert_eq!(
        reader
            .rdma
            .stats
            .fallbacks
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
#[ignore = "needs an RDMA device with an active port and --features rdma (docs/rdma.md)"]
async fn a_commit_with_a_stale_term_leaves_the_segment_untouched() {
    init_logs();
    let holder = RdmaTestNode::start(1, TransportMode::Rdma, 8 * MIB as u64)
        .await
        .expect("an RDMA port");
    let writer = RdmaTestNode::start(2, TransportMode::Rdma, 0)
        .await
        .unwrap();
    holder.admission.observe_term(5);
    let data = random_bytes(MIB, 3);
    let mut wh = hashes(MIB);
    let r = writer
        .client
        .write(
            &holder.peer(),
            range(0, MIB),
            Version { term: 4, id: 1 },
            &data,
            &mut wh,
        )
        .await;
    assert!(r.is_err(), "a stale term must be refused over RDMA too");
    let mut seg = vec![0u8; MIB];
    holder.segment.read_at(0, &mut seg).unwrap();
    assert!(
        seg.iter().all(|&b| b == 0),
        "the refused slice reached the segment"
    );
    assert!(
        total(&holder.rdma, |c| c
            .commits
            .load(std::sync::atomic::Ordering::Relaxed))
            == 0
    );
}

#[tokio::test]
#[ignore = "needs an RDMA device with an active port and --features rdma (docs/rdma.md)"]
async fn a_peer_without_rdma_is_reached_over_tcp_in_auto() {
    init_logs();
    // The holder speaks TCP only; the client has a port: the upgrade is answered
    // UNSUPPORTED and the same connections carry the slices.
    let holder = RdmaTestNode::start(1, TransportMode::Tcp, 8 * MIB as u64)
        .await
        .unwrap();
    let client = RdmaTestNode::start(2, TransportMode::Auto, 0)
        .await
        .unwrap();
    assert!(
        client.rdma.is_rdma(),
        "this test needs a port on the client side"
    );
    let data = random_bytes(2 * MIB, 4);
    let v = Version { term: 1, id: 1 };
    let mut wh = hashes(data.len());
    client
        .client
        .write(&holder.peer(), range(0, data.len()), v, &data, &mut wh)
        .await
        .unwrap();
    assert!(
        client
            .rdma
            .stats
            .fallbacks
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // Under --transport rdma the same peer is refused.
    let strict = RdmaTestNode::start(3, TransportMode::Rdma, 0)
        .await
        .unwrap();
    let mut wh = hashes(data.len());
    assert!(strict
        .client
        .write(&holder.peer(), range(0, data.len()), v, &data, &mut wh)
        .await
        .is_err());
}
