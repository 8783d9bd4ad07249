# Shared by python/ci/test.sh and python/ci/lmcache.sh (sourced, from the repository root).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
wheels="$CARGO_TARGET_DIR/python-wheels"

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

# The daemons and the CLI the tests start (`regolith up`), with the dev profile (optimised a
# little, see Cargo.toml): after `cargo test --workspace` this reuses every compiled crate, where
# a release build would compile the whole stack again (minutes on 2 cores).
build_daemons() {
  step "daemons: cargo build -p regolith-cli -p regolith-metad -p regolith-sidecar"
  cargo build --locked -p regolith-cli -p regolith-metad -p regolith-sidecar
  export REGOLITH_BIN_PROFILE=debug
}

# The `regolith` wheel (pip fetches maturin from PyPI as the build backend; cargo builds the
# extension into $CARGO_TARGET_DIR, so a second build is a no-op there) and the shim's wheel.
build_wheels() {
  step "wheels: pip wheel ./python ./python/mooncake-shim"
  rm -rf "$wheels"
  # The dev profile too, for the same reason (maturin's PEP 517 backend reads these arguments).
  MATURIN_PEP517_ARGS="--profile dev" \
    python3 -m pip wheel -q --no-deps -w "$wheels" ./python ./python/mooncake-shim
}

# Installs the wheels built by build_wheels into the venv whose python is $1.
install_wheels() {
  step "pip install the wheels into $(dirname "$(dirname "$1")")"
  "$1" -m pip install -q --force-reinstall --no-deps "$wheels"/*.whl
}
