#!/usr/bin/env bash
# The Python package's CI: builds the daemons, the CLI and the `regolith` wheel (pip + maturin,
# fetched from PyPI as the build backend), installs it with the mooncake.store shim into a
# virtual environment with pytest and numpy, and runs the pytest suite against loopback
# clusters started with `regolith up` (real regolith-metad and regolith-sidecar processes).
#
#   python/ci/test.sh [PYTEST ARGS]     (from anywhere; CARGO_TARGET_DIR is honoured)
#
# The venv lives in $CARGO_TARGET_DIR/py-venv (override with REGOLITH_PY_VENV).
set -euo pipefail
cd "$(dirname "$0")/../.."
. python/ci/common.sh
venv="${REGOLITH_PY_VENV:-$CARGO_TARGET_DIR/py-venv}"

build_daemons
build_wheels

step "venv $venv (pytest, numpy)"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q pytest numpy
install_wheels "$venv/bin/python"

# -P: the installed package, never the source tree's python/regolith (which has no _native).
step "pytest python/tests"
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider python/tests "$@"
