#!/usr/bin/env bash
# The test command (README, CI): every Rust test of the workspace, real processes included.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
