//! Integration tests with three (or five) real `regolith-metad` processes on loopback.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use regolith_proto::launch::MetadLaunch;
use regolith_proto::leader;
use regolith_proto::metad as pb;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn leader_elected_follower_redirects_and_http_kv_replicates() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(Duration::from_secs(15));
    let follower = *c.replicas.keys().find(|id| **id != leader).unwrap();
    let statuses: Vec<_> = c.replicas.keys().map(|id| c.status(*id).unwrap()).collect();
    for s in &statuses {
        assert_eq!(s["members"].as_array().unwrap().len(), 3);
        for f in [
            "id",
            "role",
            "leader_id",
            "term",
            "last_applied",
            "keys",
            "bytes_used",
            "bytes_total",
        ] {
            assert!(s.get(f).is_some(), "/status lacks {f}: {s}");
        }
    }
    runtime().block_on(async {
        // A follower answers NOT_LEADER and names the leader.
        let client = c.client();
        let mut stub = client.stub(&c.replicas[&follower].grpc).unwrap();
        let err = stub.stats(pb::StatsRequest {}).await.unwrap_err();
        assert!(leader::is_not_leader(&err), "{err:?}");
        let hint = leader::hint_of(&err).expect("leader named");
        assert_eq!(hint.id, leader);
        assert_eq!(hint.addr, c.replicas[&leader].grpc);
        // The leader-following client gets there by itself.
        let st = client.stats().await.unwrap();
        assert_eq!(st.leader_id, leader);
    });
    // HTTP metadata KV through a follower: forwarded to the leader, readable on every member.
    let f_kv = c.replicas[&follower].kv.clone();
    let (code, _) = http_request(
        &f_kv,
        "PUT",
        "/metadata?key=mooncake%2Fram%2Fnode1",
        b"{\"segment\":1}",
    )
    .unwrap();
    assert_eq!(code, 200);
    for r in c.replicas.values() {
        let (code, body) =
            http_request(&r.kv, "GET", "/metadata?key=mooncake/ram/node1", b"").unwrap();
        assert_eq!(
            (code, body.as_slice()),
            (200, &b"{\"segment\":1}"[..]),
            "replica {}",
            r.id
        );
    }
    let (code, _) = http_request(&f_kv, "GET", "/metadata?key=absent", b"").unwrap();
    assert_eq!(code, 404);
    let (code, _) = http_request(&f_kv, "DELETE", "/metadata?key=mooncake/ram/node1", b"").unwrap();
    assert_eq!(code, 200);
    let (code, _) = http_request(&f_kv, "GET", "/metadata?key=mooncake/ram/node1", b"").unwrap();
    assert_eq!(code, 404);
    // SIGTERM stops a replica cleanly.
    let status = c.sigterm(follower);
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn acknowledged_writes_survive_leader_kill_and_full_restart() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(async {
        let (node, generation) = mount(&client, "node-a", 64 << 20).await;
        heartbeat(&client, node, generation, vec![]).await;
        for i in 0..50 {
            put(&client, &format!("key-{i}"), 4096, 1).await.unwrap();
        }
        client.meta_put("meta-1", b"v1".to_vec()).await.unwrap();
        (node, generation)
    });
    // Puts keep flowing while the leader is killed; every acknowledged one must survive.
    let writer = {
        let client = c.client();
        std::thread::spawn(move || {
            runtime().block_on(async move {
                let mut acked = Vec::new();
                let end = Instant::now() + Duration::from_secs(5);
                let mut i = 0;
                while Instant::now() < end {
                    // Sidecars heartbeat; a new leader needs one before it places anything.
                    let _ = client
                        .heartbeat(pb::HeartbeatRequest {
                            node_id: node,
                            generation,
                            ..Default::default()
                        })
                        .await;
                    let key = format!("during-{i}");
                    if put(&client, &key, 4096, 1).await.is_ok() {
                        acked.push(key);
                    }
                    i += 1;
                }
                acked
            })
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let killed_at = Instant::now();
    c.kill(leader);
    let new_leader = c.wait_leader(Duration::from_secs(10));
    assert_ne!(new_leader, leader);
    eprintln!(
        "new leader {new_leader} ready {:?} after kill -9",
        killed_at.elapsed()
    );
    let acked = writer.join().unwrap();
    assert!(
        acked.len() > 10,
        "too few puts acknowledged: {}",
        acked.len()
    );
    rt.block_on(async {
        // Right after the election: every acknowledged key is found (never "not found").
        let mut keys: Vec<String> = (0..50).map(|i| format!("key-{i}")).collect();
        keys.extend(acked.iter().cloned());
        let found = client.batch_exists(keys.clone()).await.unwrap();
        let missing: Vec<_> = keys
            .iter()
            .zip(&found)
            .filter(|(_, f)| !**f)
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty(),
            "acknowledged keys missing after failover: {missing:?}"
        );
        assert_eq!(
            client.meta_get("meta-1").await.unwrap().as_deref(),
            Some(&b"v1"[..])
        );
    });
    // Restart the killed one, then every replica.
    c.spawn(leader, None, false);
    c.wait_leader(Duration::from_secs(10));
    for id in [1, 2, 3] {
        c.kill(id);
    }
    for id in [1, 2, 3] {
        c.spawn(id, Some(&c.members()), true);
    }
    c.wait_leader(Duration::from_secs(15));
    rt.block_on(async {
        let client = c.client();
        let mut keys: Vec<String> = (0..50).map(|i| format!("key-{i}")).collect();
        keys.extend(acked.iter().cloned());
        let found = client.batch_exists(keys.clone()).await.unwrap();
        let missing: Vec<_> = keys
            .iter()
            .zip(&found)
            .filter(|(_, f)| !**f)
            .map(|(k, _)| k)
            .collect();
        if !missing.is_empty() {
            c.dump_logs();
        }
        assert!(
            missing.is_empty(),
            "keys lost across a full restart: {missing:?}"
        );
        let g = client.get("key-7", node).await.unwrap();
        assert_eq!(g.status.unwrap_or_default().code, pb::Code::Ok as i32);
        assert_eq!(g.size, 4096);
        assert_eq!(g.checksum, 42);
        assert_eq!(
            client.meta_get("meta-1").await.unwrap().as_deref(),
            Some(&b"v1"[..])
        );
    });
}

#[test]
fn deposed_leaders_reservation_is_refused_and_new_leader_declares_nobody_dead_early() {
    let mut c = Cluster::start_with(3, &["--node-ttl", "3s"]);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (res, node, generation) = rt.block_on(async {
        let (node, generation) = mount(&client, "node-a", 64 << 20).await;
        heartbeat(&client, node, generation, vec![]).await;
        let (r, _) = client
            .reserve(pb::ReserveRequest {
                key: "orphan".into(),
                size: 1000,
                options: None,
                requester_node_id: node,
            })
            .await
            .unwrap();
        (r.reservation.unwrap(), node, generation)
    });
    c.kill(leader);
    let new_leader = c.wait_leader(Duration::from_secs(10));
    let elected = Instant::now();
    rt.block_on(async {
        // The commit goes to the new leader: it does not know the old term's reservation.
        let r = client
            .commit_at(
                &c.replicas[&new_leader].grpc,
                pb::CommitRequest {
                    version: res.version,
                    checksum: 1,
                },
            )
            .await
            .unwrap();
        assert_eq!(r.status.unwrap().code, pb::Code::StaleReservation as i32);
        assert!(!client.exists("orphan").await.unwrap());
        // No heartbeat for a while: the new leader must not declare the node dead before a full
        // node_ttl has passed since its election.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let segs = client.list_segments().await.unwrap();
        assert_eq!(
            segs.len(),
            1,
            "declared dead {:?} after election",
            elected.elapsed()
        );
        // A heartbeat naming the old in-flight reservation makes it quarantined on the new leader.
        let hb = client
            .heartbeat(pb::HeartbeatRequest {
                node_id: node,
                generation,
                in_flight: vec![pb::InFlight {
                    version: res.version,
                    extents: res.replicas[0].extents.clone(),
                }],
                ..Default::default()
            })
            .await
            .unwrap()
            .0;
        assert_eq!(hb.quarantined, vec![res.version.unwrap()]);
        // Silence past node_ttl: now it is declared dead.
        let end = Instant::now() + Duration::from_secs(8);
        loop {
            if client.list_segments().await.unwrap().is_empty() {
                break;
            }
            assert!(Instant::now() < end, "node never declared dead");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The old generation is told to remount.
        let hb = heartbeat(&client, node, generation, vec![]).await;
        assert!(hb.remount);
    });
}

#[test]
fn expired_reservation_stays_quarantined_until_released() {
    let c = Cluster::start_with(3, &["--put-timeout", "500ms"]);
    c.wait_leader(Duration::from_secs(15));
    runtime().block_on(async {
        let client = c.client();
        let (node, generation) = mount(&client, "node-a", 8192).await;
        heartbeat(&client, node, generation, vec![]).await;
        let (r, addr) = client
            .reserve(pb::ReserveRequest {
                key: "slow".into(),
                size: 8192,
                options: None,
                requester_node_id: node,
            })
            .await
            .unwrap();
        let res = r.reservation.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let cr = client
            .commit_at(
                &addr,
                pb::CommitRequest {
                    version: res.version,
                    checksum: 0,
                },
            )
            .await
            .unwrap();
        assert_eq!(cr.status.unwrap().code, pb::Code::Expired as i32);
        // The whole segment is still held: a new put finds no space.
        let (r2, _) = client
            .reserve(pb::ReserveRequest {
                key: "next".into(),
                size: 8192,
                options: None,
                requester_node_id: node,
            })
            .await
            .unwrap();
        assert_eq!(r2.status.unwrap().code, pb::Code::NoSpace as i32);
        // The owner hears of the quarantine, fences it, and releases it.
        let hb = heartbeat(&client, node, generation, vec![]).await;
        assert_eq!(hb.quarantined, vec![res.version.unwrap()]);
        let hb = heartbeat(&client, node, generation, hb.quarantined.clone()).await;
        assert!(hb.quarantined.is_empty());
        put(&client, "next", 8192, 1).await.unwrap();
    });
}

/// Puts arriving together on a full pool each make room for themselves: none is refused
/// "no space" because another put's eviction was still in flight. (No watermark eviction
/// here, high watermark 1.0: every eviction is a reservation's.)
#[test]
fn concurrent_puts_on_a_full_pool_each_evict_room_for_themselves() {
    let c = Cluster::start_with(3, &["--eviction-high-watermark", "1.0"]);
    c.wait_leader(Duration::from_secs(15));
    runtime().block_on(async {
        let client = c.client();
        let (node, generation) = mount(&client, "node-a", 16 * 4096).await;
        put_series(&client, node, generation, "old", 16).await;
        for round in 0..3 {
            let mut puts = tokio::task::JoinSet::new();
            for i in 0..8 {
                let client = client.clone();
                let key = format!("new-{round}-{i}");
                puts.spawn(async move { (put(&client, &key, 4096, 1).await, key) });
            }
            while let Some(done) = puts.join_next().await {
                let (r, key) = done.unwrap();
                assert!(r.is_ok(), "{key}: {r:?}");
            }
        }
    });
}

#[test]
fn wrong_token_and_bad_input_are_refused_without_harm() {
    let c = Cluster::start(3);
    let leader = c.wait_leader(Duration::from_secs(15));
    runtime().block_on(async {
        // Wrong token.
        let mut cfg = regolith_proto::client::ClientConfig::new(c.addrs());
        cfg.token = Some("not-the-token".into());
        cfg.retry_deadline = Duration::from_secs(2);
        let bad = regolith_proto::client::MetadClient::new(cfg).unwrap();
        let e = bad.stats().await.unwrap_err();
        assert_eq!(e.code(), Some(tonic::Code::Unauthenticated), "{e}");
        let mut cfg = regolith_proto::client::ClientConfig::new(c.addrs());
        cfg.retry_deadline = Duration::from_secs(2);
        let none = regolith_proto::client::MetadClient::new(cfg).unwrap();
        assert_eq!(
            none.stats().await.unwrap_err().code(),
            Some(tonic::Code::Unauthenticated)
        );

        let client = c.client();
        let (node, generation) = mount(&client, "node-a", 1 << 20).await;
        heartbeat(&client, node, generation, vec![]).await;
        let reserve = |key: String, size: u64| {
            let client = client.clone();
            async move {
                let (r, _) = client
                    .reserve(pb::ReserveRequest {
                        key,
                        size,
                        options: None,
                        requester_node_id: node,
                    })
                    .await
                    .unwrap();
                r.status.unwrap().code
            }
        };
        assert_eq!(
            reserve(String::new(), 10).await,
            pb::Code::InvalidArgument as i32
        );
        assert_eq!(
            reserve("k".repeat(5000), 10).await,
            pb::Code::InvalidArgument as i32
        );
        assert_eq!(
            reserve("zero".into(), 0).await,
            pb::Code::InvalidArgument as i32
        );
        assert_eq!(
            reserve("huge".into(), u64::MAX).await,
            pb::Code::InvalidArgument as i32
        );
        // Unknown segment: told to remount; commit of an unknown reservation refused.
        let hb = heartbeat(&client, 999, 1, vec![]).await;
        assert!(hb.remount);
        let r = client
            .commit_at(
                &c.replicas[&leader].grpc,
                pb::CommitRequest {
                    version: Some(pb::Version {
                        term: 1,
                        id: 999_999,
                    }),
                    checksum: 0,
                },
            )
            .await
            .unwrap();
        assert_ne!(r.status.unwrap().code, 0);
        let e = client.get("", node).await.unwrap_err();
        assert_eq!(e.code(), Some(tonic::Code::InvalidArgument));
        let bad_mount = client
            .mount(pb::MountSegmentRequest {
                node_name: String::new(),
                node_id: 0,
                capacity: 1,
                data_addrs: vec![],
            })
            .await
            .unwrap_err();
        assert_eq!(bad_mount.code(), Some(tonic::Code::InvalidArgument));
    });
    // Garbage on the gRPC and HTTP ports.
    for r in c.replicas.values() {
        for addr in [&r.grpc, &r.http, &r.kv] {
            use std::io::Write;
            if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                let _ = s.write_all(b"\x00\xff\xfe garbage PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00");
                let _ = s.write_all(&[0xAB; 4096]);
            }
        }
        let (code, _) =
            http_request(&r.kv, "PUT", "/metadata?key=big", &vec![b'x'; 600 * 1024]).unwrap();
        assert_eq!(code, 413);
        let (code, _) = http_request(&r.kv, "GET", "/metadata", b"").unwrap();
        assert_eq!(code, 400);
        let (code, _) = http_request(&r.http, "GET", "/nope", b"").unwrap();
        assert_eq!(code, 404);
    }
    std::thread::sleep(Duration::from_millis(300));
    for id in c.replicas.keys() {
        let s = c.status(*id).expect("replica still serving after garbage");
        assert_eq!(s["keys"], 0, "no state change from bad input");
    }
}

#[test]
fn membership_grows_to_five_and_shrinks_to_three_under_writes() {
    let mut c = Cluster::start(3);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(async {
        let m = mount(&client, "node-a", 256 << 20).await;
        heartbeat(&client, m.0, m.1, vec![]).await;
        m
    });
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let progress = std::sync::Arc::new(AtomicUsize::new(0));
    let writer = {
        let client = c.client();
        let (stop, progress) = (stop.clone(), progress.clone());
        std::thread::spawn(move || {
            runtime().block_on(async move {
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = client
                        .heartbeat(pb::HeartbeatRequest {
                            node_id: node,
                            generation,
                            ..Default::default()
                        })
                        .await;
                    match put(&client, &format!("m-{i}"), 1024, 1).await {
                        Ok(_) => {
                            acked.push(format!("m-{i}"));
                            progress.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => eprintln!("put m-{i}: {e}"),
                    }
                    i += 1;
                }
                acked
            })
        })
    };
    // Each membership step happens while puts are being acknowledged.
    let writes_continue = |what: &str| {
        let start = progress.load(Ordering::Relaxed);
        let end = Instant::now() + Duration::from_secs(15);
        while progress.load(Ordering::Relaxed) < start + 3 {
            assert!(Instant::now() < end, "puts stalled after {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    writes_continue("start");
    for id in [4, 5] {
        c.add_replica_slot(id);
        c.spawn(id, None, false);
        let addr = c.replicas[&id].grpc.clone();
        let members = rt.block_on(client.add_member(id, &addr)).unwrap();
        assert!(members.iter().any(|m| m.id == id && m.voter), "{members:?}");
        writes_continue(&format!("adding member {id}"));
    }
    let leader = c.wait_leader(Duration::from_secs(10));
    // Remove two members, the leader among them.
    let other = *c
        .replicas
        .keys()
        .find(|id| **id != leader && **id != 4)
        .unwrap();
    for id in [leader, other] {
        let members = rt.block_on(client.remove_member(id)).unwrap();
        assert!(!members.iter().any(|m| m.id == id), "{members:?}");
        c.kill(id);
        c.replicas.remove(&id);
        writes_continue(&format!("removing member {id}"));
    }
    c.wait_leader(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let acked = writer.join().unwrap();
    rt.block_on(async {
        let client = c.client();
        let st = client.stats().await.unwrap();
        assert_eq!(st.members.len(), 3, "{:?}", st.members);
        let found = client.batch_exists(acked.clone()).await.unwrap();
        assert!(
            found.iter().all(|f| *f),
            "acknowledged writes lost during membership change"
        );
    });
}

/// Regression: a leader restored by openraft at start-up keeps its old term and may have saved a
/// commit index behind entries already acknowledged; it must not serve (or build its allocator)
/// before it has applied everything its log held.
#[test]
fn restarted_leader_serves_only_after_applying_its_whole_log() {
    let mut c = Cluster::start(3);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(async {
        let m = mount(&client, "node-a", 64 << 20).await;
        heartbeat(&client, m.0, m.1, vec![]).await;
        m
    });
    for round in 0..3 {
        let last = rt.block_on(async {
            let client = c.client();
            heartbeat(&client, node, generation, vec![]).await;
            let mut last = String::new();
            for i in 0..20 {
                last = format!("r{round}-{i}");
                put(&client, &last, 1024, 1).await.unwrap();
            }
            last
        });
        // Kill every replica right after the acknowledgement: the commit index on disk is
        // likely behind the last entry.
        for id in [1, 2, 3] {
            c.kill(id);
        }
        for id in [1, 2, 3] {
            c.spawn(id, None, false);
        }
        c.wait_leader(Duration::from_secs(15));
        rt.block_on(async {
            let client = c.client();
            assert!(
                client.exists(&last).await.unwrap(),
                "round {round}: acknowledged {last} not visible after restart"
            );
        });
    }
}

/// Regression (issue 17): openraft restored a replica that led when it stopped as the leader of
/// the same term, with its leader memory empty, so reservation versions (numbered from 1 in each
/// term) were issued twice: two objects committed under one version, and a sidecar's release of
/// an old reservation could free a new one's extents. A leader that stopped now starts as a
/// follower, and the next leader leads a new term: no version is ever issued twice, for one
/// replica (always restored before) or three.
#[test]
fn reservation_versions_are_never_issued_twice_across_restarts() {
    let rt = runtime();
    for n in [1u64, 3] {
        let mut c = Cluster::start(n);
        let leader = c.wait_leader(Duration::from_secs(15));
        let client = c.client();
        let (node, generation) = rt.block_on(mount(&client, "node-a", 64 << 20));
        let mut issued: Vec<(u64, u64)> = Vec::new();
        let mut term = c.status(leader).unwrap()["term"].as_u64().unwrap();
        for round in 0..3 {
            rt.block_on(async {
                let client = c.client();
                heartbeat(&client, node, generation, vec![]).await;
                for i in 0..5 {
                    let res = put(&client, &format!("n{n}-r{round}-{i}"), 4096, 1)
                        .await
                        .unwrap();
                    let v = res.version.unwrap();
                    issued.push((v.term, v.id));
                }
            });
            for id in 1..=n {
                c.kill(id);
            }
            for id in 1..=n {
                c.spawn(id, None, false);
            }
            let leader = c.wait_leader(Duration::from_secs(15));
            let now = c.status(leader).unwrap()["term"].as_u64().unwrap();
            assert!(
                now > term,
                "{n} replicas, round {round}: term {term} led again after the restart"
            );
            term = now;
        }
        let distinct: BTreeSet<_> = issued.iter().collect();
        assert_eq!(
            distinct.len(),
            issued.len(),
            "{n} replicas: a version issued twice: {issued:?}"
        );
    }
}

/// Regression (issue 17): a remove held in TCP retransmission through a partition reached a
/// replica seconds after its client had retried elsewhere and answered, just as that replica
/// won an election, and removed a newer put. A request whose deadline
/// (`regolith-deadline-ms`) has passed is not acted on: no removal, no reservation; the same
/// request within its deadline, or without one, is.
#[test]
fn a_request_past_its_deadline_is_not_acted_on() {
    fn with_deadline<T>(msg: T, at: Option<u64>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(at) = at {
            r.metadata_mut()
                .insert(regolith_proto::auth::DEADLINE_HEADER, at.into());
        }
        r
    }

    use regolith_proto::auth::{unix_ms, TokenInterceptor};
    use regolith_proto::metad::metad_client::MetadClient as Stub;

    let c = Cluster::start(1);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    rt.block_on(async {
        let client = c.client();
        let (node, generation) = mount(&client, "node-a", 64 << 20).await;
        put_series(&client, node, generation, "kept", 1).await;
        // A stub that stamps no deadline of its own: each request carries the one set here.
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", c.replicas[&leader].grpc))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut raw =
            Stub::with_interceptor(channel, TokenInterceptor::new(Some(&c.token())).unwrap());
        let past = Some(unix_ms() - 1_000);
        let remove = || pb::RemoveRequest {
            keys: vec!["kept-0".into()],
        };
        let late = raw.remove(with_deadline(remove(), past)).await.unwrap_err();
        assert_eq!(late.code(), tonic::Code::DeadlineExceeded, "{late:?}");
        assert!(late.message().contains("deadline"), "{}", late.message());
        assert!(
            client.exists("kept-0").await.unwrap(),
            "a late remove removed the key"
        );

        let reserve = |key: &str| pb::ReserveRequest {
            key: key.into(),
            size: 4096,
            options: Some(pb::PutOptions {
                replicas: 1,
                ..Default::default()
            }),
            requester_node_id: 0,
        };
        let late = raw
            .reserve(with_deadline(reserve("late"), past))
            .await
            .unwrap_err();
        assert_eq!(late.code(), tonic::Code::DeadlineExceeded, "{late:?}");
        put(&client, "late", 4096, 1)
            .await
            .expect("a late reservation held the key");

        let future = Some(unix_ms() + 30_000);
        let on_time = raw.remove(with_deadline(remove(), future)).await.unwrap();
        assert_eq!(on_time.into_inner().codes, vec![pb::Code::Ok as i32]);
        let ok = raw
            .reserve(with_deadline(reserve("none"), None))
            .await
            .unwrap();
        assert_eq!(
            ok.into_inner().status.unwrap_or_default().code,
            0,
            "no deadline: served"
        );
        let metrics = http_get(&c.replicas[&leader].http, "/metrics").unwrap().1;
        assert!(
            metrics.contains("regolith_metad_requests_past_deadline_total 2"),
            "{}",
            metrics
                .lines()
                .filter(|l| l.contains("deadline"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    });
}

/// A remove whose first attempt went unanswered (a replica that accepts connections and never
/// replies) answers only once that attempt's deadline has passed, so nothing it might still do
/// happens after the caller has the answer; a read is not held back.
#[test]
fn a_remove_after_an_attempt_of_unknown_fate_answers_after_its_deadline() {
    let c = Cluster::start(1);
    c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    rt.block_on(async {
        let (node, generation) = mount(&c.client(), "node-a", 64 << 20).await;
        put_series(&c.client(), node, generation, "k", 2).await;
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let _accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let client = || {
            let mut cfg = regolith_proto::client::ClientConfig::new(
                std::iter::once(silent_addr.clone())
                    .chain(c.addrs())
                    .collect(),
            );
            cfg.token = Some(c.token());
            cfg.connect_timeout = Duration::from_millis(200);
            cfg.request_timeout = Duration::from_millis(400);
            regolith_proto::client::MetadClient::new(cfg).unwrap()
        };
        let t = Instant::now();
        assert!(client().exists("k-0").await.unwrap());
        let read = t.elapsed();
        let t = Instant::now();
        let r = client().remove(vec!["k-0".into()]).await.unwrap();
        let removed = t.elapsed();
        assert_eq!(r.codes, vec![pb::Code::Ok as i32]);
        assert!(
            removed >= Duration::from_millis(600),
            "answered {removed:?} after sending, before the silent attempt's deadline"
        );
        assert!(read < removed, "read {read:?}, remove {removed:?}");
    });
}

/// A leader that no longer hears a quorum (here its followers are stopped; in the chaos suite
/// it was deaf to its peers and not to the sidecars) refuses heartbeats once its lease has
/// lapsed, so that sidecars look for the leader the others follow, which would otherwise
/// declare them all dead; with its followers back it takes them again.
#[test]
fn a_leader_cut_off_from_its_quorum_refuses_heartbeats() {
    let c = Cluster::start(3);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(mount(&client, "node-a", 64 << 20));
    let beat = || {
        let addr = c.replicas[&leader].grpc.clone();
        let req = pb::HeartbeatRequest {
            node_id: node,
            generation,
            ..Default::default()
        };
        let client = &client;
        async move {
            client
                .call_at(&addr, |mut s| async move { s.heartbeat(req).await })
                .await
        }
    };
    rt.block_on(async { beat().await.expect("the leader takes heartbeats") });
    let followers: Vec<u64> = c
        .replicas
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    for id in &followers {
        c.signal(*id, 19); // SIGSTOP
    }
    std::thread::sleep(Duration::from_millis(2500));
    let refused = rt.block_on(beat());
    for id in &followers {
        c.signal(*id, 18); // SIGCONT
    }
    assert!(
        refused.is_err(),
        "a leader without a quorum took a heartbeat: {refused:?}"
    );
    c.wait_leader(Duration::from_secs(15));
    // Through the client's retries: the followers back may elect again meanwhile.
    let r = rt.block_on(client.heartbeat(pb::HeartbeatRequest {
        node_id: node,
        generation,
        ..Default::default()
    }));
    assert!(r.is_ok(), "{r:?}");
}

/// A replica whose port is taken stops before it touches its data dir or votes: the other
/// replicas' cluster is not disturbed by a half-started member.
#[test]
fn replica_with_a_taken_port_exits_before_raft_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    let data = tmp.path().join("metad-1");
    for flag in ["--listen", "--metrics-addr"] {
        let mut launch = MetadLaunch {
            data_dir: Some(data.clone()),
            peers: vec![(1, "127.0.0.1:1".into())],
            bootstrap: true,
            ..MetadLaunch::new(1)
        };
        if flag == "--metrics-addr" {
            launch.listen = Some(format!("127.0.0.1:{}", common::free_port()));
            launch.metrics_addr = Some(taken.clone());
        } else {
            launch.listen = Some(taken.clone());
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_regolith-metad"))
            .args(launch.args())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains("Address already in use") && stderr.contains(&taken),
            "{flag}: {stderr}"
        );
        assert!(!data.exists(), "{flag}: the data dir was created");
    }
    drop(held);
}

/// One of a replica's gauges from its `/metrics` (a few tries: the machine may be busy).
fn gauge(c: &Cluster, id: u64, name: &str) -> Option<f64> {
    for _ in 0..20 {
        if let Ok((200, body)) = http_get(&c.replicas[&id].http, "/metrics") {
            return body
                .lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Issue 17: a follower that missed more log than the leader keeps (snapshots every 100 entries,
/// then purged) catches up with exactly one snapshot install, and the leader keeps its term
/// throughout (the install does not stop the follower from answering heartbeats, nor make it
/// call an election).
#[test]
fn lagging_follower_catches_up_with_one_snapshot_while_the_leader_keeps_its_term() {
    let mut c = Cluster::start_with(3, &["--snapshot-logs", "100"]);
    let leader = c.wait_leader(Duration::from_secs(15));
    let term = c.status(leader).unwrap()["term"].as_u64().unwrap();
    let follower = *c.replicas.keys().find(|id| **id != leader).unwrap();
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(mount(&client, "node-a", 1 << 30));
    c.kill(follower);
    // 600 commits, one entry each: six snapshots' worth, purged behind them.
    rt.block_on(put_series(&client, node, generation, "lag", 600));
    let target = c.status(leader).unwrap()["last_applied"].as_u64().unwrap();
    assert!(
        gauge(&c, leader, "regolith_metad_snapshots_built").unwrap_or(0.0) >= 3.0,
        "the leader built too few snapshots for the test to mean anything"
    );
    // Let the leader finish the snapshot the last puts triggered (slow on a busy machine): a
    // follower back during that build is sent the previous snapshot, then this one.
    let mut built = gauge(&c, leader, "regolith_metad_snapshots_built");
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(700));
        let now = gauge(&c, leader, "regolith_metad_snapshots_built");
        if now == built {
            break;
        }
        built = now;
    }
    c.spawn(follower, None, false);
    let end = Instant::now() + Duration::from_secs(30);
    let caught_up = loop {
        let applied = c
            .status(follower)
            .and_then(|s| s["last_applied"].as_u64())
            .unwrap_or(0);
        if applied >= target {
            break true;
        }
        if Instant::now() > end {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !caught_up {
        c.dump_logs();
    }
    assert!(
        caught_up,
        "follower {follower} did not reach index {target}"
    );
    let installed = gauge(&c, follower, "regolith_metad_snapshots_installed");
    if installed != Some(1.0) {
        c.dump_logs();
    }
    assert_eq!(
        installed,
        Some(1.0),
        "the follower should catch up with exactly one snapshot"
    );
    assert_eq!(c.status(follower).unwrap()["keys"].as_u64(), Some(600));
    let now = c.status(leader).unwrap();
    assert_eq!(now["role"].as_str(), Some("leader"), "{now}");
    assert_eq!(now["term"].as_u64(), Some(term), "an election: {now}");
    assert_eq!(
        c.status(follower).unwrap()["term"].as_u64(),
        Some(term),
        "the follower moved to another term"
    );
    // The replicas export their heap as jemalloc counts it (issue 17's memory accounting): a
    // replica holding 600 objects and its runtime has some MB of it, resident at least as much.
    let allocated = gauge(&c, follower, "regolith_metad_heap_allocated_bytes").unwrap_or(0.0);
    let resident = gauge(&c, follower, "regolith_metad_heap_resident_bytes").unwrap_or(0.0);
    assert!(allocated > 1e6, "heap allocated: {allocated}");
    assert!(
        resident >= allocated,
        "heap resident {resident} < allocated {allocated}"
    );
}

/// Issue 17: a new leader whose followers already hold its log does not send it to them again.
/// openraft 0.9 probes a follower from the middle of the unpurged log with the entries in the
/// probe; the follower's vote answer names its last log id, so the leader asks about that entry
/// with an empty AppendEntries instead, and its first entry commits after one round trip rather
/// than after re-sending half a snapshot's worth of log.
#[test]
fn a_new_leader_does_not_resend_the_log_its_follower_holds() {
    let mut c = Cluster::start_with(3, &["--snapshot-logs", "100000"]);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(mount(&client, "node-a", 1 << 30));
    // 600 commits, one entry each, none purged.
    rt.block_on(put_series(&client, node, generation, "held", 600));
    c.kill(leader);
    let new_leader = c.wait_leader(Duration::from_secs(15));
    assert_ne!(new_leader, leader);
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            heartbeat(&client, node, generation, vec![]).await;
            if put(&client, "after-failover", 4096, 1).await.is_ok() {
                break;
            }
            assert!(Instant::now() < end, "no put committed after the failover");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let sent = gauge(&c, new_leader, "regolith_metad_raft_entries_sent_total").unwrap_or(-1.0);
    let matched = gauge(
        &c,
        new_leader,
        r#"regolith_metad_raft_append_probes_total{result="matched"}"#,
    )
    .unwrap_or(0.0);
    if sent > 100.0 || matched < 1.0 {
        c.dump_logs();
    }
    assert!(matched >= 1.0, "no probe matched (sent {sent} entries)");
    assert!(
        (0.0..=100.0).contains(&sent),
        "the new leader sent {sent} entries: its follower's log again"
    );
    assert_eq!(c.status(new_leader).unwrap()["keys"].as_u64(), Some(601));
}

/// The index of the newest snapshot file in a replica's data dir (0: none). Files are named
/// `snap-<20-digit index>-...`.
fn newest_snapshot_index(c: &Cluster, id: u64) -> u64 {
    let dir = c.replicas[&id].dir.join("snapshots");
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().to_string();
                name.strip_prefix("snap-")?.get(..20)?.parse::<u64>().ok()
            })
            .max()
            .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Issue 17: a replica stopped with SIGTERM builds a last snapshot of what it applied, so its
/// next start loads that instead of replaying the log; it starts with everything.
#[test]
fn sigterm_builds_a_last_snapshot_and_the_restart_loads_it() {
    // No snapshot by entry count or log size during the test: only the stop makes one.
    let mut c = Cluster::start_with(1, &["--snapshot-logs", "1000000"]);
    let leader = c.wait_leader(Duration::from_secs(15));
    let rt = runtime();
    let client = c.client();
    let (node, generation) = rt.block_on(mount(&client, "node-a", 1 << 30));
    rt.block_on(put_series(&client, node, generation, "stop", 1500));
    let applied = c.status(leader).unwrap()["last_applied"].as_u64().unwrap();
    assert!(newest_snapshot_index(&c, leader) < applied - 1024);
    let status = c.sigterm(leader);
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(&c.replicas[&leader].log).unwrap();
    assert!(log.contains("last snapshot built"), "{log}");
    assert!(
        newest_snapshot_index(&c, leader) >= applied,
        "newest snapshot at {} for {applied} applied",
        newest_snapshot_index(&c, leader)
    );
    c.spawn(leader, None, false);
    c.wait_leader(Duration::from_secs(15));
    let status = c.status(leader).unwrap();
    assert_eq!(status["keys"].as_u64(), Some(1500), "{status}");
}
