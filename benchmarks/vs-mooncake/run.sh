#!/usr/bin/env bash
# Side by side with Mooncake: the same Python workload (the calls LMCache makes) through
# Mooncake Store's wheel and through Regolith's drop-in, in one run, with the ratios and the
# machine's ceilings. See README.md beside this file.
#
#   benchmarks/vs-mooncake/run.sh [--json] [--quick] [--no-index] [--duration S] [--filter MODE/SIZE/OP,...]
#
# Needs root (a network namespace of its own) and PyPI (Mooncake's wheel, maturin, numpy).
# Builds what it needs in $CARGO_TARGET_DIR (default: the repository's target/): the release
# daemons and CLI, the release wheel, and two virtual environments under target/vs-mooncake/.
# Progress goes to stderr; stdout gets the table, or one JSON object with --json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

MOONCAKE_VERSION="${MOONCAKE_VERSION:-0.3.13.post1}"
json="" duration=2 filter="" index=""
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json="--json" ;;
    --quick) duration=0.3 ;;
    --duration) duration="$2"; shift ;;
    --filter) filter="$2"; shift ;;
    --index) ;;  # the default since the index is on by default; kept for old scripts
    --no-index) index="--no-index" ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
command="benchmarks/vs-mooncake/run.sh${json:+ --json}${index:+ --no-index}${filter:+ --filter $filter} (duration $duration s per row)"

say() { printf '\n== %s (%s)\n' "$1" "$(date +%T)" >&2; }
[ "$(id -u)" = 0 ] || { echo "run.sh needs root: it makes a network namespace (ip netns)" >&2; exit 2; }

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
work="$CARGO_TARGET_DIR/vs-mooncake"
mkdir -p "$work"

# Mooncake's wheel links libibverbs even when it only speaks TCP.
if ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
  say "apt-get install libibverbs1 (Mooncake's wheel links it)"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >&2
fi
command -v ip >/dev/null || { echo "needs iproute2 (ip netns)" >&2; exit 2; }

say "cargo build --release -p regolith-cli -p regolith-metad -p regolith-sidecar"
cargo build --release --locked -p regolith-cli -p regolith-metad -p regolith-sidecar >&2

say "the regolith wheel (release) and the mooncake.store shim"
rm -rf "$work/wheels"
python3 -m pip wheel -q --no-deps -w "$work/wheels" ./python ./python/mooncake-shim >&2

rg_venv="$work/regolith-venv" mc_venv="$work/mooncake-venv"
say "venv $rg_venv (numpy, the regolith wheel, the shim)"
[ -x "$rg_venv/bin/python" ] || python3 -m venv "$rg_venv"
"$rg_venv/bin/python" -m pip install -q numpy >&2
"$rg_venv/bin/python" -m pip install -q --force-reinstall --no-deps "$work/wheels"/*.whl >&2

say "venv $mc_venv (numpy, mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION)"
[ -x "$mc_venv/bin/python" ] || python3 -m venv "$mc_venv"
"$mc_venv/bin/python" -m pip install -q numpy "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" >&2

# Mooncake's processes bind every interface whatever they are told: they (and Regolith, for
# the same loopback) run in a namespace of this run's own, with loopback only.
ns="regolith-vsmc-$$"
cleanup() {
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
say "network namespace $ns (loopback only)"
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up

logdir="$work/run-$(date +%Y%m%d-%H%M%S)"
commit="$(git rev-parse --short HEAD 2>/dev/null || true)"
if [ -n "$commit" ] && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit+dirty"; fi
say "the benchmark ($duration s per row; logs in $logdir)"
ip netns exec "$ns" python3 "$here/driver.py" --target "$CARGO_TARGET_DIR" \
  --mooncake-venv "$mc_venv" --regolith-venv "$rg_venv" --logdir "$logdir" \
  --duration "$duration" --filter "$filter" --commit "$commit" --command "$command" $json $index
