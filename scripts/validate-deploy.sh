#!/usr/bin/env bash
# Validates the deployment artefacts under deploy/ with the tools that consume them (CI runs it
# from .ci/run; docs/operations.md, "Validating the artefacts"):
#
#  * Kubernetes: every kustomization (base, overlays/*, examples/*) rendered by `kubectl
#    kustomize`, then validated with kubernetes-validate (PyPI; it ships the Kubernetes
#    schemas, nothing is downloaded at run time) in strict mode against Kubernetes 1.30 and its
#    newest schema; the Prometheus Operator objects (no schema in that package) are checked
#    against what they must match: the PrometheusRule equals deploy/prometheus's rules, each
#    ServiceMonitor selects a Service with its port.
#  * Compose: `docker-compose config` (Debian's docker-compose), with and without the
#    monitoring profile.
#  * systemd: `systemd-analyze verify` of both units in a temporary root holding the binaries
#    at their ExecStart paths (symlinks to this build's target/<profile>/ binaries) and the
#    regolith user and group.
#  * Prometheus: `promtool check rules` and `promtool test rules` (the alerts' unit tests),
#    `promtool check config` of the compose Prometheus, and every dashboard query parsed by
#    promtool as a recording rule; the dashboard JSON loaded and its panels checked.
#
# promtool comes from Debian's prometheus package, unpacked (`apt-get download`, `dpkg -x`)
# into a cache directory rather than installed: installing it would start a Prometheus.
# The tools and the virtual environment are cached in /var/cache/regolith-ci (else
# ~/.cache/regolith-ci), so a second run takes seconds.
#
#   scripts/validate-deploy.sh                          validate
#   scripts/validate-deploy.sh --write-prometheusrule   regenerate the PrometheusRule from the rules
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { echo "validate-deploy: $*"; }
die() { echo "validate-deploy: FAILED: $*" >&2; exit 1; }

cache=/var/cache/regolith-ci
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/regolith-ci"
  mkdir -p "$cache"
fi
venv=$cache/deploy-venv
python() { "$venv/bin/python" "$@"; }

ensure_venv() {
  if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    say "virtual environment $venv: kubernetes-validate, PyYAML (PyPI)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --progress-bar off "kubernetes-validate==1.37.0" "PyYAML>=6"
  fi
}

write_prometheusrule() {
  python - "$root" <<'PY'
import sys, yaml
root = sys.argv[1]
rules = yaml.safe_load(open(f"{root}/deploy/prometheus/regolith-alerts.yml"))
def rep(d, s):
    style = "|" if "\n" in s else None
    return d.represent_scalar("tag:yaml.org,2002:str", s, style=style)
yaml.add_representer(str, rep, Dumper=yaml.SafeDumper)
doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
       "metadata": {"name": "regolith", "labels": {"app.kubernetes.io/name": "regolith"}},
       "spec": rules}
hdr = ("# Generated from deploy/prometheus/regolith-alerts.yml by\n"
       "# `scripts/validate-deploy.sh --write-prometheusrule`; scripts/validate-deploy.sh fails when\n"
       "# they differ. Edit the rules there.\n")
open(f"{root}/deploy/kubernetes/overlays/monitoring/prometheusrule.yaml", "w").write(
    hdr + yaml.safe_dump(doc, sort_keys=False, width=100))
PY
}

apt_install() {
  command -v apt-get >/dev/null || die "no apt-get to install $*"
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}

ensure_venv
if [ "${1:-}" = --write-prometheusrule ]; then
  write_prometheusrule
  say "wrote deploy/kubernetes/overlays/monitoring/prometheusrule.yaml"
  exit 0
fi
# Under target/ (the binaries' file system, for hard links), removed on exit.
mkdir -p target
tmp=$(mktemp -d "$root/target/validate-deploy.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# ---- tools ---------------------------------------------------------------------------------
command -v kubectl >/dev/null || apt_install kubernetes-client
command -v docker-compose >/dev/null || apt_install docker-compose
command -v systemd-analyze >/dev/null || apt_install systemd
# The sidecar unit's ExecReload runs /bin/kill (procps, on every standard Debian system).
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || apt_install procps
promtool=$cache/prometheus/usr/bin/promtool
if [ ! -x "$promtool" ]; then
  say "promtool: Debian's prometheus package, unpacked into $cache/prometheus"
  (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get download prometheus >/dev/null; })
  rm -rf "$cache/prometheus"
  dpkg -x "$tmp"/prometheus_*.deb "$cache/prometheus"
fi
"$promtool" --version 2>&1 | head -n 1 | sed 's/^/validate-deploy: /'

# ---- Kubernetes ----------------------------------------------------------------------------
kver=$(kubectl version --client -o json 2>/dev/null | python -c 'import json,sys; print(json.load(sys.stdin).get("kustomizeVersion",""))' || true)
case "$kver" in
  v[4-9]*) render=kustomize ;;
  # Debian bookworm's kubectl (1.20) embeds kustomize v2, which reads none of these
  # kustomizations: validate each kustomization's own resource files as they are instead.
  *) render=files
     say "WARNING: kubectl's kustomize ${kver:-(none)} is older than v4: overlays are not rendered, only their resource files validated" ;;
esac
say "kubectl kustomize (${kver:-none}), kubernetes-validate $(python -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))')"
# The Secrets are generated from two files an operator makes with gen-secrets.sh: render a copy.
cp -r deploy/kubernetes "$tmp/k8s"
rm -f "$tmp/k8s/base/secrets/token" "$tmp/k8s/base/secrets/peer-token"
"$tmp/k8s/base/gen-secrets.sh" >/dev/null
# The TLS overlay's certificate, made as its kustomization says, with this build's CLI.
cli=""
if [ -n "${REGOLITH_BIN_DIR:-}" ]; then
  cli=$REGOLITH_BIN_DIR/regolith
else # the newest build
  cli=$(ls -t target/debug/regolith target/release/regolith 2>/dev/null | head -n 1 || true)
fi
[ -n "$cli" ] && [ -x "$cli" ] || die "no regolith CLI in target/release or target/debug (cargo build -p regolith-cli), or set REGOLITH_BIN_DIR"
"$cli" tls init "$tmp/k8s/overlays/tls/secrets" --name regolith --force >/dev/null \
  || die "regolith tls init (the TLS overlay's certificate)"
mkdir -p "$tmp/rendered"
for k in $(cd "$tmp/k8s" && find . -name kustomization.yaml -printf '%h\n' | sed 's|^\./||' | sort); do
  out="$tmp/rendered/$(echo "$k" | tr / -).yaml"
  if [ "$render" = kustomize ]; then
    kubectl kustomize "$tmp/k8s/$k" > "$out" 2> "$tmp/kustomize.err" \
      || { cat "$tmp/kustomize.err" >&2; die "kubectl kustomize deploy/kubernetes/$k"; }
  else
    python - "$tmp/k8s/$k" > "$out" <<'PY'
import os, sys, yaml
d = sys.argv[1]
k = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
for r in k.get("resources", []):
    p = os.path.join(d, r)
    if os.path.isfile(p):
        print("---")
        print(open(p).read())
PY
  fi
  for v in 1.30.0 1.37.0; do
    "$venv/bin/kubernetes-validate" --strict --quiet --no-warn -k "$v" "$out" \
      || die "deploy/kubernetes/$k does not validate against Kubernetes $v"
  done
  say "deploy/kubernetes/$k: $(grep -c '^kind:' "$out") objects valid (Kubernetes 1.30, 1.37)"
done
python - "$root" "$tmp/rendered" <<'PY' || die "the Prometheus Operator objects (above)"
import glob, sys, yaml
root, rendered = sys.argv[1], sys.argv[2]
core = {"Namespace", "Service", "StatefulSet", "DaemonSet", "Deployment", "PodDisruptionBudget",
        "Secret", "ConfigMap"}
rules = yaml.safe_load(open(f"{root}/deploy/prometheus/regolith-alerts.yml"))
bad = []
rendered_docs = {p: [d for d in yaml.safe_load_all(open(p)) if d]
                 for p in sorted(glob.glob(f"{rendered}/*.yaml"))}
services = [d for docs in rendered_docs.values() for d in docs if d["kind"] == "Service"]
for path, docs in rendered_docs.items():
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "PrometheusRule":
            if d["spec"] != rules:
                bad.append(f"{path}: PrometheusRule {name} differs from deploy/prometheus/regolith-alerts.yml "
                           "(scripts/validate-deploy.sh --write-prometheusrule)")
        elif kind == "ServiceMonitor":
            sel = d["spec"]["selector"]["matchLabels"]
            for ep in d["spec"]["endpoints"]:
                if not any(all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())
                           and any(p.get("name") == ep["port"] for p in s["spec"]["ports"])
                           for s in services):
                    bad.append(f"{path}: ServiceMonitor {name}: no Service with labels {sel} and port {ep['port']}")
        elif kind not in core:
            bad.append(f"{path}: {kind} {name}: neither validated by schema nor checked here")
if bad:
    sys.exit("\n".join(bad))
PY
say "PrometheusRule equals the rules file; ServiceMonitors select Services with their ports"

# ---- Compose -------------------------------------------------------------------------------
for profile in "" monitoring; do
  docker-compose -f deploy/compose/compose.yaml ${profile:+--profile $profile} config -q \
    || die "docker-compose config (profile ${profile:-default})"
done
say "deploy/compose/compose.yaml: docker-compose config ok ($(docker-compose version --short 2>/dev/null))"

# ---- systemd -------------------------------------------------------------------------------
bin_dir=${REGOLITH_BIN_DIR:-}
if [ -z "$bin_dir" ]; then
  for d in target/release target/debug; do
    if [ -x "$d/regolith-metad" ] && [ -x "$d/regolith-sidecar" ]; then bin_dir=$d; break; fi
  done
fi
[ -n "$bin_dir" ] || die "no regolith-metad and regolith-sidecar in target/release or target/debug (cargo build -p regolith-metad -p regolith-sidecar), or set REGOLITH_BIN_DIR"
sysroot=$tmp/sysroot
mkdir -p "$sysroot/usr/bin" "$sysroot/usr/lib/systemd" "$sysroot/etc/systemd/system" "$sysroot/etc/regolith"
# Links are resolved inside the root, so the binaries are hard links (copies across file
# systems), and the root gets the host's own units (network-online.target, sysinit.target...).
for b in regolith-metad regolith-sidecar; do
  ln -f "$bin_dir/$b" "$sysroot/usr/bin/$b" 2>/dev/null || cp "$bin_dir/$b" "$sysroot/usr/bin/$b"
done
cp -r /usr/lib/systemd/system "$sysroot/usr/lib/systemd/"
mkdir -p "$sysroot/bin"
cp "$(readlink -f "$( [ -x /bin/kill ] && echo /bin/kill || echo /usr/bin/kill)")" "$sysroot/bin/kill"
cp deploy/systemd/*.service "$sysroot/etc/systemd/system/"
cp deploy/systemd/metad.toml deploy/systemd/sidecar.toml "$sysroot/etc/regolith/"
# The units run as regolith; the temporary root has that user and group (the host's files plus
# them: systemd-analyze resolves users under --root).
mkdir -p "$sysroot/etc"
{ cat /etc/passwd; echo 'regolith:x:10001:10001:Regolith:/var/lib/regolith:/usr/sbin/nologin'; } > "$sysroot/etc/passwd"
{ cat /etc/group; echo 'regolith:x:10001:'; } > "$sysroot/etc/group"
for u in regolith-metad.service regolith-sidecar.service; do
  if ! SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --root="$sysroot" \
      "$sysroot/etc/systemd/system/$u" > "$tmp/verify.out" 2>&1 \
      || grep -v -e '^$' "$tmp/verify.out" | grep -q .; then
    cat "$tmp/verify.out" >&2
    die "systemd-analyze verify $u"
  fi
done
say "deploy/systemd: systemd-analyze verify ok ($(systemd-analyze --version | head -n 1)), binaries from $bin_dir"

# ---- Prometheus and Grafana ----------------------------------------------------------------
"$promtool" check rules deploy/prometheus/regolith-alerts.yml >/dev/null \
  || die "promtool check rules deploy/prometheus/regolith-alerts.yml"
(cd deploy/prometheus && "$promtool" test rules regolith-alerts.test.yml >/dev/null) \
  || (cd deploy/prometheus && "$promtool" test rules regolith-alerts.test.yml >&2; die "promtool test rules")
say "deploy/prometheus: rules valid, their unit tests pass"
# The compose Prometheus, with the rule file where its config names it.
mkdir -p "$tmp/prom/etc/prometheus"
cp deploy/prometheus/regolith-alerts.yml "$tmp/prom/etc/prometheus/"
sed "s|/etc/prometheus/|$tmp/prom/etc/prometheus/|" deploy/compose/prometheus.yml > "$tmp/prom/prometheus.yml"
"$promtool" check config "$tmp/prom/prometheus.yml" >/dev/null || die "promtool check config deploy/compose/prometheus.yml"
say "deploy/compose/prometheus.yml: promtool check config ok"
python - deploy/grafana/regolith.json "$tmp/dashboard-rules.yml" <<'PY' || die "deploy/grafana/regolith.json (above)"
import json, sys, yaml
path, out = sys.argv[1], sys.argv[2]
d = json.load(open(path))
bad, exprs, ids = [], [], set()
for key in ("title", "uid", "panels", "templating", "schemaVersion"):
    if key not in d:
        bad.append(f"no {key}")
if not any(v.get("name") == "datasource" and v.get("type") == "datasource" for v in d["templating"]["list"]):
    bad.append("no datasource variable")
for p in d["panels"]:
    if p["id"] in ids:
        bad.append(f"panel id {p['id']} twice")
    ids.add(p["id"])
    g = p.get("gridPos", {})
    if not all(k in g for k in ("h", "w", "x", "y")) or g["x"] + g["w"] > 24:
        bad.append(f"panel {p['title']!r}: bad gridPos {g}")
    if p["type"] == "row":
        continue
    if p.get("datasource", {}).get("uid") != "${datasource}":
        bad.append(f"panel {p['title']!r}: not on the datasource variable")
    if not p.get("targets"):
        bad.append(f"panel {p['title']!r}: no query")
    for t in p.get("targets", []):
        exprs.append(t["expr"].replace("$__rate_interval", "5m"))
if bad:
    sys.exit(f"{path}: " + "; ".join(bad))
rules = {"groups": [{"name": "dashboard", "rules": [
    {"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(exprs)]}]}
yaml.safe_dump(rules, open(out, "w"))
PY
"$promtool" check rules "$tmp/dashboard-rules.yml" >/dev/null \
  || { "$promtool" check rules "$tmp/dashboard-rules.yml" >&2; die "a query of deploy/grafana/regolith.json does not parse"; }
say "deploy/grafana/regolith.json: loads, panels sound, every query parses (promtool)"
say "all deployment artefacts valid"
