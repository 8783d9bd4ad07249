#!/usr/bin/env bash
# The real LMCache on Regolith: installs lmcache==0.5.6 (and torch) into a virtual environment
# cached between runs on the same machine (/var/cache/regolith-ci/venv, about 6 GB; override
# with REGOLITH_LMCACHE_VENV), installs the current `regolith` wheel and the mooncake.store shim
# into it, and runs tests/test_lmcache.py (LMCache's MooncakestoreConnector with
# save_chunk_meta true and false, its RemoteBackend from the seed configuration, the `regolith`
# remote-storage plugin without the shim) plus the torch buffer test, against a loopback cluster.
# CPU only: no GPU, no vLLM.
#
# torch comes from the CPU wheel index when it is reachable, else from PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${REGOLITH_LMCACHE_VENV:-/var/cache/regolith-ci/venv}"
version=0.5.6
cpu_index=https://download.pytorch.org/whl/cpu

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

have_lmcache() {
  "$venv/bin/python" - "$version" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(0 if m.version("lmcache") == sys.argv[1] else 1)
PY
}

reachable() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10).close()
except Exception:
    sys.exit(1)
PY
}

if have_lmcache; then
  step "cached venv $venv has lmcache $version"
else
  step "creating $venv with lmcache==$version"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  if reachable "$cpu_index/"; then
    "$venv/bin/python" -m pip install -q --progress-bar off --index-url "$cpu_index" torch
  else
    echo "$cpu_index is not reachable: torch comes from PyPI"
  fi
  "$venv/bin/python" -m pip install -q --progress-bar off "lmcache==$version"
fi

step "daemons: cargo build --release -p regolith-metad -p regolith-sidecar"
cargo build --release --locked -p regolith-metad -p regolith-sidecar

step "pip install ./python ./python/mooncake-shim (into $venv)"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./python ./python/mooncake-shim

# The LMCache tests skip themselves where lmcache is missing: here that must be a failure.
"$venv/bin/python" -c "import lmcache, torch, mooncake.store, regolith.lmcache"

step "pytest: LMCache on Regolith"
cd python
"$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  tests/test_lmcache.py tests/test_client.py::test_torch_frombuffer "$@"
