# Shared by python/ci/test.sh, python/ci/lmcache.sh and scripts/test.sh (sourced, from the
# repository root).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
wheels="$CARGO_TARGET_DIR/python-wheels"
wheels_cp310="$CARGO_TARGET_DIR/python-wheels-cp310"

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

# Whether the sidecar's `rdma` feature can be built here: sideway's bindings need cmake and
# libclang (apt: cmake clang libclang-dev).
rdma_buildable() {
  command -v cmake >/dev/null && { command -v clang >/dev/null || ldconfig -p 2>/dev/null | grep -q libclang; }
}

# The daemons and the CLI the tests start (`regolith up`), with the dev profile (optimised a
# little, see Cargo.toml): after `cargo test --workspace` this reuses every compiled crate, where
# a release build would compile the whole stack again (minutes on 2 cores).
build_daemons() {
  # The sidecar with the `rdma` feature where it can be built: it loads rdma-core at run time
  # and serves over TCP where there is no device (docs/rdma.md), so the wheel that carries it
  # serves RDMA clusters too.
  local features=()
  if rdma_buildable; then
    features=(--features regolith-sidecar/rdma)
  fi
  step "daemons: cargo build -p regolith-cli -p regolith-metad -p regolith-sidecar ${features[*]-}"
  cargo build --locked -p regolith-cli -p regolith-metad -p regolith-sidecar ${features[@]+"${features[@]}"}
  export REGOLITH_BIN_PROFILE=debug
}

# The `regolith` wheel (pip fetches maturin from PyPI as the build backend; cargo builds the
# extension into $CARGO_TARGET_DIR, so a second build is a no-op there) and the shim's wheel.
# The wheel carries the daemons and the CLI built by build_daemons (stripped), run by its
# console entry points (regolith/_bin.py): `pip install` then `regolith up`, no Rust toolchain.
build_wheels() {
  step "bundle: regolith, regolith-metad, regolith-sidecar into python/regolith/bin"
  local from="$CARGO_TARGET_DIR/${REGOLITH_BIN_PROFILE:-release}"
  rm -rf python/regolith/bin
  mkdir -p python/regolith/bin
  for b in regolith regolith-metad regolith-sidecar; do
    [ -x "$from/$b" ] || { echo "build_wheels: no $from/$b (run build_daemons first)" >&2; exit 1; }
    install -s -m 0755 "$from/$b" python/regolith/bin/
  done
  step "wheels: pip wheel ./python ./python/mooncake-shim"
  rm -rf "$wheels" "$wheels_cp310"
  # The dev profile too, for the same reason (maturin's PEP 517 backend reads these arguments).
  MATURIN_PEP517_ARGS="--profile dev" \
    python3 -m pip wheel -q --no-deps -w "$wheels" ./python ./python/mooncake-shim
  # Python 3.10 predates the stable ABI's buffer protocol: a wheel of its own (cp310).
  local py310
  py310="$(python310 || true)"
  if [ -n "$py310" ]; then
    step "wheel for $("$py310" --version 2>&1): pip wheel ./python (no abi3)"
    MATURIN_PEP517_ARGS="--profile dev --no-default-features" \
      "$py310" -m pip wheel -q --no-deps -w "$wheels_cp310" ./python
  fi
}

# The interpreter of Python 3.10 (pyenv's, else one on PATH that runs), or nothing.
python310() {
  local root c
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  for c in "$root"/versions/3.10*/bin/python3.10 "$(command -v python3.10 2>/dev/null || true)"; do
    if [ -n "$c" ] && [ -x "$c" ] &&
      "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$c"
      return
    fi
  done
}

# Installs the wheels built by build_wheels into the venv whose python is $1: the abi3 wheel
# and the shim's, or on Python 3.10 its own wheel and the shim's.
install_wheels() {
  step "pip install the wheels into $(dirname "$(dirname "$1")")"
  local minor
  minor="$("$1" -c 'import sys; print(sys.version_info[1])')"
  if [ "$minor" -ge 11 ]; then
    "$1" -m pip install -q --force-reinstall --no-deps "$wheels"/*.whl
  else
    "$1" -m pip install -q --force-reinstall --no-deps "$wheels_cp310"/*.whl "$wheels"/regolith_mooncake_shim-*.whl
  fi
}
