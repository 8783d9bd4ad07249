#!/usr/bin/env bash
# The Python package's CI: builds the daemons, the CLI and the `regolith` wheel (pip + maturin,
# fetched from PyPI as the build backend), installs it with the mooncake.store shim into a
# virtual environment with pytest and numpy, and runs the pytest suite against loopback
# clusters started with `regolith up` (real regolith-metad and regolith-sidecar processes).
#
#   python/ci/test.sh [PYTEST ARGS]     (from anywhere; CARGO_TARGET_DIR is honoured)
#
# The suite runs twice, each time in a fresh venv where only the built wheels (with the daemons
# and the CLI inside) and pytest/numpy are installed: on python3 (3.11 here) in
# $CARGO_TARGET_DIR/py-venv (override with REGOLITH_PY_VENV) and on Python 3.10 (pyenv's) in
# the same path with -3.10 appended.
set -euo pipefail
cd "$(dirname "$0")/../.."
. python/ci/common.sh
venv_base="${REGOLITH_PY_VENV:-$CARGO_TARGET_DIR/py-venv}"

build_daemons
build_wheels

# A fresh venv of interpreter $1 with only the built wheels (and pytest, numpy) installed; the
# tests start every process through the wheel's console entry points (REGOLITH_BINARIES=wheel:
# `regolith up` from the venv, which finds the daemons beside the binary it runs).
run_suite() {
  local py="$1" venv="$2"
  shift 2
  step "fresh venv $venv ($("$py" --version 2>&1)): the wheels, pytest, numpy"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q pytest numpy
  install_wheels "$venv/bin/python"
  [ -x "$venv/bin/regolith" ] && [ -x "$venv/bin/regolith-metad" ] && [ -x "$venv/bin/regolith-sidecar" ] || {
    echo "test.sh: the wheel installed no regolith console scripts into $venv/bin" >&2
    exit 1
  }
  # -P (3.11+): the installed package, never a source tree on sys.path (the repository root,
  # where this runs, holds no `regolith` package either, which is what 3.10 relies on).
  local safe=()
  "$venv/bin/python" -P -c '' 2>/dev/null && safe=(-P)
  step "pytest python/tests on $("$py" --version 2>&1), binaries from the wheel"
  REGOLITH_BINARIES=wheel PATH="$venv/bin:$PATH" \
    "$venv/bin/python" ${safe[@]+"${safe[@]}"} -m pytest -q -p no:cacheprovider python/tests "$@"
}

run_suite python3 "$venv_base" "$@"
py310="$(python310 || true)"
if [ -n "$py310" ]; then
  run_suite "$py310" "$venv_base-3.10" "$@"
elif [ "${REGOLITH_REQUIRE_PY310:-0}" = 1 ]; then
  echo "test.sh: no Python 3.10 (pyenv install 3.10) for the 3.10 run" >&2
  exit 1
else
  echo "test.sh: no Python 3.10 here: the suite ran on $(python3 --version 2>&1) only" >&2
fi
