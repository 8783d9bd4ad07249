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
  # The sidecar with its `rdma` feature (docs/rdma.md): its unit tests (the upgrade's wire,
  # the staging windows, the transport choice) and the data-plane tests, which on a machine
  # without an RDMA device check that it falls back to TCP. sideway's build needs cmake and
  # libclang (apt: cmake clang libclang-dev; .ci/run installs them).
  if command -v cmake >/dev/null && { command -v clang >/dev/null || ldconfig -p 2>/dev/null | grep -q libclang; }; then
    cargo test --locked -p regolith-sidecar --features rdma
  elif [ "${REGOLITH_REQUIRE_RDMA_BUILD:-0}" = 1 ]; then
    echo "test.sh: the rdma feature build needs cmake and clang (apt install cmake clang libclang-dev)" >&2
    exit 1
  else
    echo "test.sh: skipping the sidecar's rdma feature build: cmake or clang missing (apt install cmake clang libclang-dev)" >&2
  fi
  python/ci/test.sh
  REGOLITH_WHEELS_BUILT=1 python/ci/lmcache.sh
fi
