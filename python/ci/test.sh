#!/usr/bin/env bash
# The Python package's CI: builds the daemons and the `regolith` wheel (pip + maturin, fetched
# from PyPI as the build backend), installs it with the mooncake.store shim into a virtual
# environment, and runs the pytest suite against a loopback cluster of real processes.
#
#   python/ci/test.sh            (from anywhere; CARGO_TARGET_DIR is honoured)
#
# The venv lives in $CARGO_TARGET_DIR/py-venv (override with REGOLITH_PY_VENV).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${REGOLITH_PY_VENV:-$CARGO_TARGET_DIR/py-venv}"

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "daemons: cargo build --release -p regolith-metad -p regolith-sidecar"
cargo build --release --locked -p regolith-metad -p regolith-sidecar

step "venv $venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q pytest numpy

step "pip install ./python ./python/mooncake-shim"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./python ./python/mooncake-shim

step "pytest python/tests"
cd python
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
