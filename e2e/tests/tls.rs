//! Mutual TLS end to end (issue 14): a cluster of real processes with `--tls-ca/--tls-cert/
//! --tls-key` on every daemon serves puts and gets across nodes; processes without a
//! certificate of the cluster's CA reach neither metad nor the data plane; certificates rotate
//! without a restart.

use std::time::Duration;

use regolith_client::ReplicateConfig;
use regolith_e2e::{metric, rt, value, wait_until, Cluster};
use regolith_proto::tls::{Protocol, Tls, TlsArgs};
use tokio::net::TcpStream;

fn tls_of(ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Tls {
    TlsArgs {
        tls_ca: Some(ca.to_path_buf()),
        tls_cert: Some(cert.to_path_buf()),
        tls_key: Some(key.to_path_buf()),
        ..TlsArgs::default()
    }
    .load(false)
    .unwrap()
    .unwrap()
}

/// The leaf certificate `addr` presents to `tls` over `proto` (an error when the handshake
/// fails either way).
fn leaf(tls: &Tls, proto: Protocol, addr: &str) -> std::io::Result<Vec<u8>> {
    rt().block_on(async {
        let tcp = TcpStream::connect(addr).await?;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let mut s = tls.connect(proto, host, tcp).await?;
        // TLS 1.3: the server checks the client's certificate after the client's view of the
        // handshake ends; a refused client learns it at its first read.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"\0").await?;
        s.flush().await?;
        let mut b = [0u8; 1];
        let refused = tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await;
        if let Ok(Err(e)) = refused {
            return Err(e);
        }
        let (_, conn) = s.get_ref();
        Ok(conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default())
    })
}

fn pem_der(path: &std::path::Path) -> Vec<u8> {
    use regolith_proto::tls::pki_types::pem::PemObject;
    regolith_proto::tls::pki_types::CertificateDer::from_pem_file(path)
        .unwrap()
        .as_ref()
        .to_vec()
}

fn round_trip(c: &Cluster, key: &str, len: usize) {
    let a = c.client(0);
    let b = c.client(1);
    let v = value(key, len);
    // Placed on node-b, written through node-a: the bytes cross the TLS data plane.
    let cfg = ReplicateConfig {
        preferred_segments: vec!["node-b".into()],
        ..ReplicateConfig::default()
    };
    let info = a.put(key, &v, &cfg).expect("put over TLS");
    assert_eq!(info.replicas[0].node_name, "node-b", "{info:?}");
    assert!(
        a.get(key).expect("remote get over TLS") == v,
        "{key}: wrong bytes"
    );
    assert!(b.get(key).expect("local get") == v, "{key}: wrong bytes");
}

#[test]
fn a_tls_cluster_serves_puts_and_gets_across_nodes() {
    let c = Cluster::start_tls(&["256MiB", "256MiB"], &[], &[]);
    for i in 0..2 {
        assert_eq!(c.sidecar_status(i)["tls"], true, "sidecar {i} /status");
        assert!(c.client(i).stats().unwrap().tls);
    }
    for i in 0..3 {
        assert_eq!(c.metad_status(i).unwrap()["tls"], true, "metad {i} /status");
    }
    for (i, len) in [(0, 4096), (1, 3 << 20 | 17)] {
        round_trip(&c, &format!("tls/{i}"), len);
    }
    let m = c.sidecar_metrics(1);
    let served = metric(&m, "regolith_sidecar_nic_bytes_out").unwrap_or(0.0)
        + metric(&m, "regolith_sidecar_nic_bytes_in").unwrap_or(0.0);
    assert!(served > 0.0, "node-b moved no data-plane bytes:\n{m}");
    // The metad client over TLS sees the cluster.
    let segs = rt()
        .block_on(c.metad_client().list_segments())
        .expect("segments over TLS");
    assert_eq!(segs.len(), 2);
}

#[test]
fn peers_without_a_certificate_of_the_cluster_ca_are_refused() {
    let c = Cluster::start_tls(&["64MiB", "64MiB"], &[], &[]);
    let tls_dir = c.tls_dir.clone().unwrap();
    let data = format!("{}:{}", c.sidecars[0].nics[0], c.sidecars[0].data_port);
    let metad = c.metad[0].grpc.clone();

    // A member's client certificate: both listeners answer.
    let member = tls_of(
        &tls_dir.join("ca.crt"),
        &tls_dir.join("client.crt"),
        &tls_dir.join("client.key"),
    );
    leaf(&member, Protocol::Data, &data).expect("a member reaches the data plane");
    leaf(&member, Protocol::Grpc, &metad).expect("a member reaches metad");

    // A stranger: a certificate of another CA (that trusts ours).
    let other = tempfile::tempdir().unwrap();
    let files =
        regolith_proto::pki::make_cluster(other.path(), &["stranger"], &["127.0.0.1".into()])
            .unwrap();
    let stranger = tls_of(&tls_dir.join("ca.crt"), &files[0].cert, &files[0].key);
    assert!(leaf(&stranger, Protocol::Data, &data).is_err());
    assert!(leaf(&stranger, Protocol::Grpc, &metad).is_err());

    // In clear: a data-plane hello with the right token gets no answer, and a gRPC call with
    // the right token fails.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&data).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = regolith_proto::dataplane::Hello::new(99, c.token().as_bytes())
            .encode()
            .unwrap();
        let _ = s.write_all(&hello);
        let mut b = [0u8; 64];
        let n = s.read(&mut b).unwrap_or(0);
        assert!(
            n == 0 || !b[..n].starts_with(&regolith_proto::dataplane::MAGIC),
            "a clear hello was answered by the data plane"
        );
    }
    let mut cfg = regolith_proto::client::ClientConfig::new(vec![metad.clone()]);
    cfg.token = Some(c.token());
    cfg.retry_deadline = Duration::from_millis(500);
    let clear = regolith_proto::client::MetadClient::new(cfg).unwrap();
    let r = rt().block_on(clear.list_segments());
    assert!(r.is_err(), "metad answered a call in clear");

    wait_until(
        "the refused handshakes counted",
        Duration::from_secs(5),
        || {
            metric(
                &c.sidecar_metrics(0),
                "regolith_sidecar_data_plane_refusals{reason=\"tls_handshake\"}",
            )
            .unwrap_or(0.0)
                >= 2.0
        },
    );
    let m = regolith_e2e::http_get(&c.metad[0].http, "/metrics")
        .unwrap()
        .1;
    assert!(
        metric(&m, "regolith_metad_tls_handshake_failures_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    // And the cluster still serves.
    round_trip(&c, "after/strangers", 100_000);
}

#[test]
fn certificates_rotate_without_a_restart() {
    let c = Cluster::start_tls(
        &["64MiB", "64MiB"],
        &["--tls-reload-interval", "200ms"],
        &["--tls-reload-interval", "200ms"],
    );
    round_trip(&c, "before/rotation", 200_000);
    let tls_dir = c.tls_dir.clone().unwrap();
    let client = tls_of(
        &tls_dir.join("ca.crt"),
        &tls_dir.join("client.crt"),
        &tls_dir.join("client.key"),
    );
    let data = format!("{}:{}", c.sidecars[1].nics[0], c.sidecars[1].data_port);
    let metad = c.metad[0].grpc.clone();
    let old_data = leaf(&client, Protocol::Data, &data).unwrap();
    assert_eq!(old_data, pem_der(&tls_dir.join("node-b.crt")));

    // A rotation to a new CA, as docs/security.md describes it: first every process trusts
    // both CAs (the bundle), then certificates of the new CA replace the old ones (here
    // node-b's and metad-1's), each file replaced atomically as cert-manager or a renewal
    // script would.
    let new_ca = regolith_proto::pki::Ca::new("renewal CA").unwrap();
    let bundle = format!(
        "{}{}",
        std::fs::read_to_string(tls_dir.join("ca.crt")).unwrap(),
        new_ca.cert_pem()
    );
    regolith_proto::pki::write_pem(&tls_dir.join("ca.crt"), &bundle, false).unwrap();
    std::thread::sleep(Duration::from_millis(600)); // every daemon trusts both CAs now
    let sans: Vec<String> = c
        .sidecars
        .iter()
        .flat_map(|s| s.nics.clone())
        .chain(["127.0.0.1".to_string()])
        .collect();
    for name in ["node-b", "metad-1"] {
        let issued = new_ca.issue(name, &sans).unwrap();
        regolith_proto::pki::write_pem(&tls_dir.join(format!("{name}.key")), &issued.key_pem, true)
            .unwrap();
        regolith_proto::pki::write_pem(
            &tls_dir.join(format!("{name}.crt")),
            &issued.cert_pem,
            false,
        )
        .unwrap();
    }
    let want_data = pem_der(&tls_dir.join("node-b.crt"));
    let want_metad = pem_der(&tls_dir.join("metad-1.crt"));
    assert_ne!(want_data, old_data);
    let client = tls_of(
        &tls_dir.join("ca.crt"),
        &tls_dir.join("client.crt"),
        &tls_dir.join("client.key"),
    );
    wait_until(
        "node-b serving its renewed certificate",
        Duration::from_secs(10),
        || leaf(&client, Protocol::Data, &data).is_ok_and(|l| l == want_data),
    );
    wait_until(
        "metad-1 serving its renewed certificate",
        Duration::from_secs(10),
        || leaf(&client, Protocol::Grpc, &metad).is_ok_and(|l| l == want_metad),
    );
    let m = regolith_e2e::http_get(&c.metad[0].http, "/metrics")
        .unwrap()
        .1;
    assert!(
        metric(&m, "regolith_metad_tls_reloads").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    // Processes still serve: new connections between node-a and node-b use the new pair.
    round_trip(&c, "after/rotation", 200_000);
    for (i, p) in c.sidecars.iter().enumerate() {
        assert!(
            regolith_e2e::http_get(&p.http, "/health").is_ok(),
            "sidecar {i}"
        );
    }
}

/// Silent connections to a TLS gRPC port sit in their handshake; past 256 of them the oldest is
/// closed to make room, so they cannot keep a real client out (finding 8's rule, for metad).
#[test]
fn silent_connections_cannot_lock_clients_out_of_metad_tls() {
    let c = Cluster::start_tls(&["64MiB"], &[], &[]);
    let addr = c.metad[0].grpc.clone();
    let silent: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut cfg = regolith_proto::client::ClientConfig::new(vec![addr.clone()]);
    cfg.token = Some(c.token());
    cfg.tls = c.client_tls();
    cfg.retry_deadline = Duration::from_secs(3);
    let client = regolith_proto::client::MetadClient::new(cfg).unwrap();
    rt().block_on(client.stats())
        .expect("a member's call while 300 connections sit silent in their handshake");
    let m = regolith_e2e::http_get(&c.metad[0].http, "/metrics")
        .unwrap()
        .1;
    let evicted = metric(
        &m,
        "regolith_metad_connections_refused_total{listener=\"grpc_tls_handshake\"}",
    )
    .unwrap_or(0.0);
    assert!(
        evicted >= 44.0,
        "{evicted} handshakes closed to make room:\n{m}"
    );
    drop(silent);
}

/// `--tls-node-identity` (on in TLS clusters): a node's mount, heartbeats and unmount need a
/// client certificate naming it. A token holder with another certificate of the cluster's CA
/// (here the CLI's, and node-b's) can neither take node-a's place nor unmount it; node-a's own
/// certificate can.
#[test]
fn only_a_nodes_own_certificate_mounts_heartbeats_or_unmounts_it() {
    use regolith_proto::metad::{HeartbeatRequest, MountSegmentRequest, UnmountSegmentRequest};
    let c = Cluster::start_tls(&["64MiB", "64MiB"], &[], &[]);
    let tls_dir = c.tls_dir.clone().unwrap();
    let client_with = |name: &str| {
        let mut cfg = regolith_proto::client::ClientConfig::new(
            c.metad.iter().map(|m| m.grpc.clone()).collect(),
        );
        cfg.token = Some(c.token());
        cfg.tls = Some(tls_of(
            &tls_dir.join("ca.crt"),
            &tls_dir.join(format!("{name}.crt")),
            &tls_dir.join(format!("{name}.key")),
        ));
        cfg.retry_deadline = Duration::from_secs(5);
        regolith_proto::client::MetadClient::new(cfg).unwrap()
    };
    let segs = rt().block_on(c.metad_client().list_segments()).unwrap();
    let a = segs
        .iter()
        .find(|s| s.node_name == "node-a")
        .expect("node-a")
        .clone();
    let denied = |r: Result<(), regolith_proto::Error>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(
            format!("{:?}", e.code()),
            "Some(PermissionDenied)",
            "{what}: {e}"
        );
    };
    for stranger in ["client", "node-b"] {
        let m = client_with(stranger);
        let mount = MountSegmentRequest {
            node_name: "node-a".into(),
            node_id: a.node_id,
            capacity: 1 << 20,
            data_addrs: vec![],
        };
        denied(
            rt().block_on(m.mount(mount)).map(drop),
            &format!("{stranger} mounting node-a"),
        );
        let hb = HeartbeatRequest {
            node_id: a.node_id,
            generation: a.generation,
            ..Default::default()
        };
        denied(
            rt().block_on(m.heartbeat(hb)).map(drop),
            &format!("{stranger} heartbeating for node-a"),
        );
        let unmount = UnmountSegmentRequest {
            node_id: a.node_id,
            generation: a.generation,
        };
        denied(
            rt().block_on(m.unmount(unmount)).map(drop),
            &format!("{stranger} unmounting node-a"),
        );
    }
    // node-a's segment is untouched: same generation, alive, and it serves.
    let after = rt().block_on(c.metad_client().list_segments()).unwrap();
    let a2 = after.iter().find(|s| s.node_name == "node-a").unwrap();
    assert_eq!(a2.generation, a.generation);
    round_trip(&c, "identity/after", 10_000);
    // Its own certificate may (a heartbeat is the harmless call to show it).
    let own = client_with("node-a");
    let hb = HeartbeatRequest {
        node_id: a.node_id,
        generation: a.generation,
        ..Default::default()
    };
    rt().block_on(own.heartbeat(hb))
        .expect("node-a's own heartbeat");
}
