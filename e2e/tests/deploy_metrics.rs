//! The metrics the deployment artefacts query exist: every `regolith_metad_*` and
//! `regolith_sidecar_*` name in deploy/ (the Grafana dashboard, the Prometheus alert rules, the
//! Kubernetes PrometheusRule, ...) and in docs/operations.md is exported by the real
//! `regolith-metad` and `regolith-sidecar` processes of this build, scraped from `/metrics`
//! after traffic that makes every labelled family appear (puts and gets across nodes, a
//! follower redirecting a call, a get failing against a killed node).
//!
//! In deploy/ the names are PromQL, so they must be sample names as exported (a histogram is
//! `_bucket`, `_sum` and `_count`, never its bare family name); docs/operations.md may also
//! name a histogram by its family.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use regolith_client::ReplicateConfig;
use regolith_e2e::{value, Cluster};
use regolith_proto::client::{ClientConfig as MetadConfig, MetadClient};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Every `regolith_metad_…` / `regolith_sidecar_…` word in `text` (not part of a longer word,
/// e.g. a config key such as `mooncake_regolith_…`).
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    for prefix in ["regolith_metad_", "regolith_sidecar_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix).map(|i| i + from) {
            let mut end = at + prefix.len();
            while end < b.len() && word(b[end]) {
                end += 1;
            }
            if at == 0 || !word(b[at - 1]) {
                out.insert(text[at..end].to_string());
            }
            from = end;
        }
    }
    out
}

/// Sample names of a Prometheus text exposition, and the histogram families.
fn exported(exposition: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut samples = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" histogram") {
                histograms.insert(name.to_string());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_string());
        }
    }
    (samples, histograms)
}

/// The files under `dir`, recursively (sorted, so the report is stable).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Names used in `uses` (name → files) that the scrape did not show; a doc may name a
/// histogram family.
fn missing(
    uses: &BTreeMap<String, BTreeSet<String>>,
    samples: &BTreeSet<String>,
    histograms: &BTreeSet<String>,
) -> Vec<String> {
    uses.iter()
        .filter(|(name, files)| {
            let doc_only = files.iter().all(|f| f.ends_with(".md"));
            !(samples.contains(*name) || doc_only && histograms.contains(*name))
        })
        .map(|(name, files)| {
            format!(
                "{name} (in {})",
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

#[test]
fn the_name_scanner_finds_metrics_and_skips_longer_words() {
    let names = metric_names(
        "rate(regolith_sidecar_ops_total{op=\"get\"}[5m]) / regolith_metad_keys\n\
         mooncake_regolith_spawn_sidecar: true, xregolith_metad_role",
    );
    let want: BTreeSet<String> = ["regolith_metad_keys", "regolith_sidecar_ops_total"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
    let (samples, hist) = exported(
        "# TYPE regolith_metad_commit_latency_seconds histogram\n\
         regolith_metad_commit_latency_seconds_bucket{le=\"0.1\"} 1\n\
         regolith_metad_keys 3\n",
    );
    let uses: BTreeMap<String, BTreeSet<String>> = [
        ("regolith_metad_keys", "deploy/a.yml"),
        ("regolith_metad_commit_latency_seconds", "deploy/a.json"),
        (
            "regolith_metad_commit_latency_seconds",
            "docs/operations.md",
        ),
        ("regolith_metad_no_such_metric", "docs/operations.md"),
    ]
    .into_iter()
    .fold(BTreeMap::new(), |mut m, (n, f)| {
        m.entry(n.to_string())
            .or_insert_with(BTreeSet::new)
            .insert(f.to_string());
        m
    });
    let miss = missing(&uses, &samples, &hist);
    assert_eq!(miss.len(), 2, "{miss:?}");
    assert!(
        miss[0].starts_with("regolith_metad_commit_latency_seconds "),
        "{miss:?}"
    );
    assert!(
        miss[1].starts_with("regolith_metad_no_such_metric "),
        "{miss:?}"
    );
}

#[test]
fn every_metric_in_the_deploy_files_is_exported_by_a_running_cluster() {
    // What the artefacts use.
    let root = repo();
    let mut files = Vec::new();
    files_under(&root.join("deploy"), &mut files);
    files.push(root.join("docs/operations.md"));
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue; // not text
        };
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        if rel.ends_with(".json") {
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"));
        }
        for name in metric_names(&text) {
            uses.entry(name).or_default().insert(rel.clone());
        }
    }
    let in_dashboard = uses
        .values()
        .filter(|f| f.contains("deploy/grafana/regolith.json"))
        .count();
    assert!(
        in_dashboard >= 30,
        "the dashboard names only {in_dashboard} metrics: is deploy/grafana/regolith.json there?"
    );
    for rules in [
        "deploy/prometheus/regolith-alerts.yml",
        "deploy/kubernetes/overlays/monitoring/prometheusrule.yaml",
    ] {
        assert!(
            uses.values().filter(|f| f.contains(rules)).count() >= 8,
            "{rules} names too few metrics"
        );
    }

    // A cluster, and traffic that makes every labelled family appear.
    let mut c = Cluster::start(&["64MiB", "64MiB"]);
    let (a, b) = (c.client(0), c.client(1));
    let on = |node: &str| ReplicateConfig {
        preferred_segments: vec![node.to_string()],
        ..Default::default()
    };
    // Written by a into b's segment (a remote write), read back through a (a remote read),
    // and the other way round; a local put and get on each.
    for (client, key, node) in [
        (&a, "deploy/a-to-b", "node-b"),
        (&b, "deploy/b-to-a", "node-a"),
        (&a, "deploy/a-local", "node-a"),
        (&b, "deploy/b-local", "node-b"),
    ] {
        let v = value(key, 3 << 20);
        let info = client
            .put(key, &v, &on(node))
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        assert_eq!(info.replicas[0].node_name, node, "{key} placed elsewhere");
        assert!(client.get(key).unwrap() == v, "{key} read back wrong");
    }
    assert!(a.get("deploy/missing").is_err());
    assert!(a.exists("deploy/a-to-b").unwrap());
    // A follower asked first answers NOT_LEADER (counted as a failed RPC there) and the client
    // follows it to the leader.
    let leader = c.wait_leader(Duration::from_secs(10));
    let follower = (leader + 1) % c.metad.len();
    let mut cfg = MetadConfig::new(vec![c.metad[follower].grpc.clone()]);
    cfg.token = Some(c.token());
    let rt = regolith_e2e::rt();
    rt.block_on(async {
        let m = MetadClient::new(cfg).expect("metad client");
        m.stats().await.expect("stats through a follower");
        m.list_segments()
            .await
            .expect("segments through a follower");
    });

    let mut scrape = String::new();
    for i in 0..c.sidecars.len() {
        scrape.push_str(&c.sidecar_metrics(i));
    }
    // b dies: a get of what only b holds fails on the data plane (an op error on a) before
    // metad declares b dead.
    c.sidecars[1].proc.kill();
    assert!(a.get("deploy/b-local").is_err(), "read from a killed node");
    scrape.push_str(&c.sidecar_metrics(0));
    for m in &c.metad {
        let (code, body) = regolith_e2e::http_get(&m.http, "/metrics").expect("metad /metrics");
        assert_eq!(code, 200);
        scrape.push_str(&body);
    }
    let (samples, histograms) = exported(&scrape);
    assert!(
        samples.iter().any(|s| s.starts_with("regolith_metad_"))
            && samples.iter().any(|s| s.starts_with("regolith_sidecar_")),
        "the scrape holds no Regolith metrics"
    );

    let miss = missing(&uses, &samples, &histograms);
    if !miss.is_empty() {
        c.dump_logs();
    }
    assert!(
        miss.is_empty(),
        "not exported by regolith-metad or regolith-sidecar:\n  {}",
        miss.join("\n  ")
    );
}
