//! Regression tests of bugs the chaos suite found with the sidecar workload, each reproducing
//! the fault that exposed it deterministically (run as root, like the quick profile).
//!
//! Both bugs were the same mistake in two places: an operation whose request may already have
//! taken effect (its reply was lost) was retried as if it had not, and the retry's answer
//! ("already exists", "not found") was reported as the outcome. The fault that reproduces them:
//! the metad leader's replies to one sidecar host are dropped (a one-way partition), while the
//! leader still hears that host and commits what it asks.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::init_logs;
use regolith_chaos::cluster::{Cluster, MetadProgram};
use regolith_chaos::firewall::{self, Rule};
use regolith_chaos::history::History;
use regolith_chaos::netns::{self, Host, NsRuntime, Topology};
use regolith_chaos::sidecars::{SidecarConfig, SidecarProgram, SidecarWorkload};
use regolith_chaos::value;
use regolith_chaos::workload::Workload;
use regolith_client::{pb::Code, AsyncClient, ClientConfig, Error, ReplicateConfig};

/// Three metad replicas and sidecars on `s1` (its data ports behind proxies) and `s2`. Fields
/// drop in order: sidecars, runtimes, metad, then the namespaces.
struct Rig {
    workload: Arc<SidecarWorkload>,
    runtimes: Vec<(Host, Arc<NsRuntime>)>,
    cluster: Cluster,
    topo: Topology,
}

impl Rig {
    fn start() -> Self {
        let topo = Topology::build(&netns::standard_hosts()).unwrap();
        let observer = Arc::new(NsRuntime::new(&topo.bridge_ns, 1).unwrap());
        let history = History::new();
        let cluster =
            Cluster::start(&topo, MetadProgram::built(), observer, history.clone(), 3).unwrap();
        // Memory only: these regressions are about commits and removes, not tiers.
        let workload = Arc::new(SidecarWorkload::new(SidecarConfig::memory_only(
            SidecarProgram::built(),
        )));
        let mut runtimes = Vec::new();
        for name in ["s1", "s2"] {
            let host = topo.host(name).unwrap().clone();
            let rt = Arc::new(NsRuntime::new(&host.ns, 2).unwrap());
            let ctx = cluster.host_ctx(&host, &topo, &history);
            let w = workload.clone();
            rt.run(async move { w.start_host(ctx).await }).unwrap();
            runtimes.push((host, rt));
        }
        Rig {
            workload,
            runtimes,
            cluster,
            topo,
        }
    }

    fn host(&self, name: &str) -> (&Host, &Arc<NsRuntime>) {
        let (h, rt) = self.runtimes.iter().find(|(h, _)| h.name == name).unwrap();
        (h, rt)
    }

    /// A client of `host`'s sidecar, made on that host's runtime.
    fn client(&self, host: &str) -> AsyncClient {
        let socket = self.topo.dir.join(format!("{host}.sock"));
        self.host(host)
            .1
            .run(async move { AsyncClient::connect(ClientConfig::new(socket)).await })
            .unwrap()
    }

    /// Drops every packet the metad leader sends to `host` (it still hears it). Returns the
    /// leader's host, to heal with [`firewall::remove`].
    fn lose_leader_replies_to(&self, host: &str) -> Host {
        let leader = self.cluster.wait_leader(Duration::from_secs(20)).unwrap();
        let leader_host = self.cluster.replica(leader).unwrap().host.clone();
        let to: Vec<_> = self.host(host).0.nics.iter().map(|n| n.addr).collect();
        firewall::install(
            &leader_host,
            &self.topo.dir,
            "lost-replies",
            &[Rule::DropTo(to)],
        )
        .unwrap();
        tracing::info!(
            leader,
            "the leader's replies to {host} are lost from now on"
        );
        leader_host
    }
}

/// Whether an error says the outcome is unknown (the operation may have taken effect).
fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e,
        Error::Server {
            code: Code::Timeout,
            ..
        } | Error::Disconnected(_)
    )
}

/// Bug: a put whose commit was applied but whose reply was lost came back as ALREADY_EXISTS
/// (or NO_SPACE) although its own value was stored. The sidecar answered the commit's missing
/// reply with UNAVAILABLE and the client retried the put with a fresh reservation, whose answer
/// it returned. Fixed: the sidecar answers a commit of unknown outcome with TIMEOUT, and the
/// client never retries a put after its commit was sent unless the commit was refused.
#[test]
fn a_put_whose_commit_reply_was_lost_is_never_reported_as_already_existing() {
    init_logs();
    let rig = Rig::start();
    let client = rig.client("s2");
    // A put from s2 to s1, whose data ports are slowed, so there is time to cut the leader's
    // replies after the reservation and before the commit.
    let proxies = rig.workload.data_proxies();
    assert!(!proxies.is_empty(), "s1's data ports are behind proxies");
    for p in &proxies {
        p.set_delay(Duration::from_millis(800));
    }
    let bytes_before: u64 = proxies.iter().map(|p| p.bytes()).sum();
    let key = "commit-reply-lost";
    let data = value::bytes(key, 1, 3 << 20);
    let put = {
        let (c, data) = (client.clone(), data.clone());
        rig.host("s2").1.spawn(async move {
            let cfg = ReplicateConfig {
                replica_num: 1,
                preferred_segments: vec!["s1".into()],
                ..Default::default()
            };
            let t = Instant::now();
            let r = c.put(key, &data, &cfg).await;
            tracing::info!(took = ?t.elapsed(), ?r, "put answered");
            r
        })
    };
    let t0 = Instant::now();
    // The value has reached s1 (its acknowledgements are on their way back, delayed, and the
    // commit follows them): now lose the leader's replies. The commit is sent well before the
    // HTTP/2 keep-alive (2 s without an answer) gives up on the connection it travels on.
    let end = Instant::now() + Duration::from_secs(15);
    while proxies.iter().map(|p| p.bytes()).sum::<u64>() < bytes_before + data.len() as u64 {
        assert!(Instant::now() < end, "the put never reached s1's data port");
        std::thread::sleep(Duration::from_millis(5));
    }
    let leader_host = rig.lose_leader_replies_to("s2");
    tracing::info!(after = ?t0.elapsed(), "leader replies lost");
    // Longer than the commit's 5 s request timeout, well under the node TTL of s2 (the leader
    // still hears its heartbeats).
    std::thread::sleep(Duration::from_secs(9));
    firewall::remove(&leader_host, "lost-replies").unwrap();
    for p in &proxies {
        p.set_delay(Duration::ZERO);
    }
    let put = rig.host("s2").1.handle().block_on(put).unwrap();
    let got = {
        let c = client.clone();
        rig.host("s2").1.run(async move { c.get(key).await })
    };
    let stored = got.as_ref().is_ok_and(|v| *v == data);
    match &put {
        Ok(_) => assert!(stored, "acknowledged, yet get answered {got:?}"),
        Err(e) if outcome_unknown(e) => {}
        Err(e) => panic!(
            "the put answered {e:?} (a definite no) but its value is {}stored",
            if stored { "" } else { "not " }
        ),
    }
    assert!(
        put.is_err(),
        "the commit's reply was lost, so the put cannot have been acknowledged"
    );
}

/// Bug: a remove whose first attempt was applied but whose reply was lost answered NOT_FOUND:
/// the sidecar's metad client retried it (as it retries every call across elections) and the
/// retry found the key gone. Fixed: a remove retried after an attempt of unknown outcome does
/// not turn "not found" into a definite answer; it answers TIMEOUT (outcome unknown).
#[test]
fn a_remove_whose_reply_was_lost_never_answers_not_found() {
    init_logs();
    let rig = Rig::start();
    let client = rig.client("s2");
    let key = "remove-reply-lost";
    {
        let c = client.clone();
        let data = value::bytes(key, 1, 4096);
        rig.host("s2")
            .1
            .run(async move { c.put(key, &data, &ReplicateConfig::default()).await })
            .unwrap();
    }
    let leader_host = rig.lose_leader_replies_to("s2");
    let remove = {
        let c = client.clone();
        rig.host("s2").1.spawn(async move { c.remove(key).await })
    };
    std::thread::sleep(Duration::from_secs(8));
    firewall::remove(&leader_host, "lost-replies").unwrap();
    let removed = rig.host("s2").1.handle().block_on(remove).unwrap();
    tracing::info!(?removed, "the remove answered");
    let exists = {
        let c = client.clone();
        rig.host("s2").1.run(async move { c.exists(key).await })
    };
    assert!(
        matches!(exists, Ok(false)),
        "the remove reached the leader: the key must be gone ({exists:?})"
    );
    match removed {
        Ok(()) => {}
        Err(e) if outcome_unknown(&e) => {}
        Err(e) => panic!("the remove removed the key but answered {e:?}"),
    }
}
