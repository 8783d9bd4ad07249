//! Test harness: in-process sidecar data planes on loopback, each with two "NIC" addresses.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngCore, SeedableRng};
use regolith_proto::dataplane::{Hello, HelloReply, HELLO_REPLY_LEN};
use regolith_sidecar::segment::{Segment, SegmentOptions};
use regolith_sidecar::transport::tcp::{ServerConfig, TcpConfig, TcpServer, TcpTransport};
use regolith_sidecar::transport::{
    BasicAdmission, DataClient, PeerAddrs, StripeConfig, TransportStats,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const TOKEN: &[u8] = b"test-cluster-token";
pub const MIB: usize = 1 << 20;

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub fn ips(a: &str, b: &str) -> Vec<IpAddr> {
    vec![a.parse().unwrap(), b.parse().unwrap()]
}

/// One sidecar's data plane: a segment, its server on two NIC addresses, and a client bound to
/// the same two addresses.
pub struct Node {
    pub id: u64,
    pub nics: Vec<IpAddr>,
    pub segment: Arc<Segment>,
    pub admission: BasicAdmission,
    pub server: TcpServer,
    pub stats: Arc<TransportStats>,
    pub client: DataClient<TcpTransport>,
}

impl Node {
    pub async fn start(id: u64, nics: Vec<IpAddr>, segment_size: u64, generation: u64) -> Node {
        Self::start_with(id, nics, segment_size, generation, |_, _| {}).await
    }

    /// Like `start`, letting the caller adjust the server and striping settings.
    pub async fn start_with(
        id: u64,
        nics: Vec<IpAddr>,
        segment_size: u64,
        generation: u64,
        adjust: impl FnOnce(&mut ServerConfig, &mut StripeConfig),
    ) -> Node {
        let segment = Arc::new(
            Segment::create(
                &format!("node{id}"),
                segment_size,
                &SegmentOptions::default(),
            )
            .unwrap(),
        );
        let admission = BasicAdmission::new(generation);
        let stats = TransportStats::new();
        let mut server_cfg = ServerConfig {
            listen: nics.iter().map(|ip| SocketAddr::new(*ip, 0)).collect(),
            node_id: id,
            token: Some(TOKEN.to_vec()),
            io_timeout: Duration::from_secs(5),
            ..ServerConfig::default()
        };
        let mut stripe = stripe_config(&nics);
        adjust(&mut server_cfg, &mut stripe);
        let server = TcpServer::start(
            server_cfg,
            segment.clone(),
            Arc::new(admission.clone()),
            stats.clone(),
        )
        .await
        .unwrap();
        let client = client_with(id, Some(TOKEN), stripe, stats.clone());
        Node {
            id,
            nics,
            segment,
            admission,
            server,
            stats,
            client,
        }
    }

    pub fn peer(&self) -> PeerAddrs {
        PeerAddrs {
            node_id: self.id,
            addrs: self.server.local_addrs(),
        }
    }
}

pub fn stripe_config(nics: &[IpAddr]) -> StripeConfig {
    StripeConfig {
        local_nics: nics.to_vec(),
        transfer_timeout: Duration::from_secs(20),
        backoff_base: Duration::from_millis(20),
        ..StripeConfig::default()
    }
}

pub fn client_for(
    id: u64,
    nics: &[IpAddr],
    token: Option<&[u8]>,
    stats: Arc<TransportStats>,
) -> DataClient<TcpTransport> {
    client_with(id, token, stripe_config(nics), stats)
}

pub fn client_with(
    id: u64,
    token: Option<&[u8]>,
    stripe: StripeConfig,
    stats: Arc<TransportStats>,
) -> DataClient<TcpTransport> {
    let transport = TcpTransport::new(
        TcpConfig {
            node_id: id,
            token: token.map(<[u8]>::to_vec),
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
            tls: None,
        },
        stats.clone(),
    );
    DataClient::new(transport, stripe, stats).unwrap()
}

pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A raw connection that has passed the handshake.
pub async fn raw_connect(addr: SocketAddr, token: &[u8]) -> (TcpStream, HelloReply) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&Hello::new(99, token).encode().unwrap())
        .await
        .unwrap();
    let mut b = [0u8; HELLO_REPLY_LEN];
    s.read_exact(&mut b).await.unwrap();
    (s, HelloReply::decode(&b).unwrap())
}

/// Reads until EOF (or error), with a deadline; returns the bytes read.
pub async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("server did not close the connection");
    out
}
