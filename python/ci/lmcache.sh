#!/usr/bin/env bash
# The real LMCache on Regolith: installs lmcache==0.5.6 (and torch) from PyPI into a virtual
# environment cached between runs on the same machine, outside the repository
# (/var/cache/regolith-ci/venv where writable, else ~/.cache/regolith-ci/venv;
# override with REGOLITH_LMCACHE_VENV), installs the current `regolith` wheel and the
# mooncake.store shim into it, and runs python/tests/test_lmcache.py (LMCache's
# MooncakestoreConnector with save_chunk_meta true and false, its RemoteBackend from the seed
# configuration as written, the `regolith` remote-storage plugin without the shim), the
# torch.frombuffer test and Mooncake's tensor API (test_tensor_layout.py: the object layout
# against objects Mooncake itself wrote; test_mooncake_tensors.py: every tensor method), against
# loopback clusters started with `regolith up`; and SGLang HiCache's Mooncake backend class
# (test_sglang.py; sglang itself is added without its dependency tree, see below).
#
# CPU only: no GPU, no vLLM. PyPI's torch for x86_64 Linux is the CUDA build (torch plus the
# nvidia-* wheels it depends on, about 3 GB to download, 6 GB installed); it imports and runs on
# machines without a GPU. A fresh install took 2 to 4.5 minutes here; a complete cached one
# (marked by $venv/.complete, written once the install succeeded) is reused as is.
set -euo pipefail
cd "$(dirname "$0")/../.."
. python/ci/common.sh
version=0.5.6

default_venv() {
  local base=/var/cache/regolith-ci
  if ! mkdir -p "$base" 2>/dev/null || [ ! -w "$base" ]; then
    base="${XDG_CACHE_HOME:-$HOME/.cache}/regolith-ci"
  fi
  echo "$base/venv"
}
venv="${REGOLITH_LMCACHE_VENV:-$(default_venv)}"

# A fresh directory for pip's downloads: in /dev/shm when it has 5 GiB free, else under /tmp.
download_dir() {
  local shm_kb
  shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [ -n "$shm_kb" ] && [ "$shm_kb" -ge $((5 * 1024 * 1024)) ]; then
    mktemp -d /dev/shm/regolith-pip.XXXXXX
  else
    mktemp -d "${TMPDIR:-/tmp}/regolith-pip.XXXXXX"
  fi
}

have_lmcache() {
  [ -f "$venv/.complete" ] || return 1
  "$venv/bin/python" - "$version" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(0 if m.version("lmcache") == sys.argv[1] else 1)
PY
}

if have_lmcache; then
  step "cached venv $venv has lmcache $version"
else
  step "creating $venv with lmcache==$version (from PyPI, about 3 GB)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  # pip keeps every downloaded wheel (~3 GB) in $TMPDIR until the install ends, beside the
  # 6 GB it installs: where /dev/shm has room, the downloads wait there rather than on disk.
  pip_tmp=$(download_dir)
  trap 'rm -rf "$pip_tmp"' EXIT
  # --no-cache-dir: the wheels are not kept a second time in pip's cache.
  TMPDIR="$pip_tmp" "$venv/bin/python" -m pip install -q --progress-bar off --no-cache-dir \
    "lmcache==$version" pytest numpy
  rm -rf "$pip_tmp"
  "$venv/bin/python" -c "import lmcache, torch"
  touch "$venv/.complete"
fi

# SGLang, for its HiCache Mooncake backend (test_sglang.py): the wheel without its dependency
# tree (which pins GPU kernels and a torch of its own), plus the small packages that the
# backend module's imports reach, pinned; about 300 MB, once per cached venv.
sglang_version=0.5.23
sglang_pkgs=("sglang==$sglang_version" orjson==3.13.0 pybase64==1.5.1 pillow==13.0.0
  ipython==9.18.1 traitlets==5.16.1 torchvision==0.29.2 dill==0.4.1 apache-tvm-ffi==0.1.15.post2
  sentencepiece==0.2.3 compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0)
if ! "$venv/bin/python" - "$sglang_version" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(0 if m.version("sglang") == sys.argv[1] else 1)
PY
then
  step "adding sglang $sglang_version (no dependencies) to $venv"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-cache-dir --no-deps "${sglang_pkgs[@]}"
fi
"$venv/bin/python" -c "import sglang.srt.mem_cache.storage.mooncake_store.mooncake_store"

build_daemons
[ -n "${REGOLITH_WHEELS_BUILT:-}" ] || build_wheels
install_wheels "$venv/bin/python"

# The LMCache tests skip themselves where lmcache is missing: here that must be a failure.
"$venv/bin/python" -P -c "import lmcache, torch, mooncake.store, regolith.lmcache"

step "pytest: LMCache and SGLang on Regolith, and Mooncake's tensor API (torch is here)"
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  python/tests/test_lmcache.py python/tests/test_client.py::test_torch_frombuffer \
  python/tests/test_tensor_layout.py python/tests/test_mooncake_tensors.py \
  python/tests/test_sglang.py "$@"
