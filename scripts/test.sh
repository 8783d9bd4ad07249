#!/usr/bin/env bash
# The test command (README, CI): every Rust test of the workspace, real processes included; then
# the Python package (python/ci/test.sh: the pytest suite against `regolith up` clusters) and
# the real LMCache 0.5.6 on Regolith (python/ci/lmcache.sh: installs lmcache and torch from PyPI
# into a virtual environment cached outside the repository, about 3 GB to download the first
# time).
#
#   ./scripts/test.sh            everything
#   ./scripts/test.sh ARGS...    only `cargo test --workspace --locked ARGS...`
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
if [ $# -eq 0 ]; then
  python/ci/test.sh
  REGOLITH_WHEELS_BUILT=1 python/ci/lmcache.sh
fi
