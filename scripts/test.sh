#!/usr/bin/env bash
# The test command (README, CI): every Rust test of the workspace, real processes included; then
# the Python package (python/ci/test.sh: the pytest suite against `regolith up` clusters) and
# the real LMCache 0.5.6 on Regolith (python/ci/lmcache.sh: installs lmcache and torch from PyPI
# into a virtual environment cached outside the repository, about 3 GB to download the first
# time).
#
#   ./scripts/test.sh            everything
#   ./scripts/test.sh ARGS...    only `cargo test --workspace --locked [--features regolith-sidecar/rdma] ARGS...`
set -euo pipefail
cd "$(dirname "$0")/.."
# The workspace with the sidecar's `rdma` feature (docs/rdma.md): on a machine without an RDMA
# device every test then also checks that such a build serves over TCP. sideway's build needs
# cmake and libclang (apt: cmake clang libclang-dev; .ci/run installs them).
. python/ci/common.sh
features=()
if rdma_buildable; then
  features=(--features regolith-sidecar/rdma)
elif [ "${REGOLITH_REQUIRE_RDMA_BUILD:-0}" = 1 ]; then
  echo "test.sh: the rdma feature build needs cmake and clang (apt install cmake clang libclang-dev)" >&2
  exit 1
else
  echo "test.sh: building without the sidecar's rdma feature: cmake or clang missing (apt install cmake clang libclang-dev)" >&2
fi
cargo test --workspace --locked ${features[@]+"${features[@]}"} "$@"
if [ $# -eq 0 ]; then
  # The sidecar's default build too (no rdma feature: what `cargo build` gives without cmake).
  if [ ${#features[@]} -gt 0 ]; then
    cargo test --locked -p regolith-sidecar
  fi
  python/ci/test.sh
  REGOLITH_WHEELS_BUILT=1 python/ci/lmcache.sh
fi
