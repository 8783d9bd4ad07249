"""The real LMCache (0.5.6) on Regolith: its own MooncakestoreConnector (through the
``mooncake.store`` shim) with ``save_chunk_meta`` true (put_parts / batch_get_buffer) and false
(put_from / batch_put_from / batch_get_into), its RemoteBackend built from the seed's
configuration as written, and the ``regolith`` remote-storage plugin without the shim. The KV
bytes must come back exact. CPU only: LMCache's allocator hands out plain memory and
LocalCPUBackend builds the memory objects; no GPU, no vLLM.

Skipped unless lmcache is installed (python/ci/lmcache.sh installs it in a cached venv).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

lmcache = pytest.importorskip("lmcache")
torch = pytest.importorskip("torch")

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import CreateStorageBackends  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

import regolith  # noqa: E402

CHUNK = 16
# (num_layers, 2, chunk_size, num_kv_heads, head_size)
KV_SHAPE = (4, 2, CHUNK, 2, 32)

# The seed's configuration, as written (chunk_size added: small chunks keep the test fast).
SEED_YAML = """\
chunk_size: {chunk}
local_cpu: False
remote_url: "mooncakestore://localhost:50051/"
max_local_cpu_size: 2
numa_mode: "auto"
pre_caching_hash_algorithm: sha256_cbor_64bit
extra_config:
  use_exists_sync: true
  save_chunk_meta: {save_chunk_meta}
  local_hostname: "localhost"
  metadata_server: "http://localhost:8080/metadata"
  protocol: "rdma"          # Regolith falls back to TCP where no RDMA device exists, and says so once
  device_name: ""
  global_segment_size: 21474836480
  master_server_address: "localhost:50051"
  local_buffer_size: 0
  mooncake_prefer_local_alloc: true
"""


# The seed's configuration byte for byte, as the issue gives it (LMCache's default chunk size).
SEED_VERBATIM = """\
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
  protocol: "rdma"          # Regolith falls back to TCP where no RDMA device exists, and says so once
  device_name: ""
  global_segment_size: 21474836480
  master_server_address: "localhost:50051"
  local_buffer_size: 0
  mooncake_prefer_local_alloc: true
"""


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)


@pytest.fixture
def metadata():
    return LMCacheMetadata(
        model_name="regolith-test",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=KV_SHAPE,
        chunk_size=CHUNK,
    )


def seed_config(tmp_path: Path, save_chunk_meta: bool, **extra) -> LMCacheEngineConfig:
    path = tmp_path / "lmcache.yaml"
    path.write_text(SEED_YAML.format(chunk=CHUNK, save_chunk_meta=save_chunk_meta))
    cfg = LMCacheEngineConfig.from_file(str(path))
    cfg.extra_config.update(extra)
    return cfg


def plugin_config(tmp_path: Path, class_name: str, save_chunk_meta: bool) -> LMCacheEngineConfig:
    """The plugin alternative: no remote_url, `remote_storage_plugins: ["regolith"]`."""
    path = tmp_path / "plugin.yaml"
    path.write_text(
        f"""\
chunk_size: {CHUNK}
local_cpu: False
max_local_cpu_size: 0.5
remote_storage_plugins: ["regolith"]
extra_config:
  remote_storage_plugin.regolith.module_path: regolith.lmcache
  remote_storage_plugin.regolith.class_name: {class_name}
  use_exists_sync: true
  save_chunk_meta: {save_chunk_meta}
  local_hostname: "localhost"
  master_server_address: "localhost:50051"
  local_buffer_size: 0
  mooncake_prefer_local_alloc: true
"""
    )
    return LMCacheEngineConfig.from_file(str(path))


_hash = iter(range(10_000, 10_000_000))


def new_key(name: str = "regolith-test") -> CacheEngineKey:
    return CacheEngineKey(name, 1, 0, next(_hash), torch.bfloat16)


def filled(backend: LocalCPUBackend, md: LMCacheMetadata, tokens: int = CHUNK):
    obj = backend.allocate(md.get_shapes(tokens), md.get_dtypes(), MemoryFormat.KV_2LTD)
    assert obj is not None
    obj.tensor.copy_(torch.randn(obj.tensor.shape).to(torch.bfloat16))
    return obj


def snapshot(obj) -> bytes:
    return bytes(obj.byte_array)


def wait_stored(remote, keys, timeout: float = 10) -> None:
    """Waits until every key is in the store (RemoteBackend's batched puts run in the
    background, and LMCache tracks no completion for them)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(remote.contains(k) for k in keys):
            return
        time.sleep(0.02)
    raise AssertionError("puts did not finish")


def release(*objs) -> None:
    """Hands memory objects back to LMCache's allocator."""
    for o in objs:
        if o is not None:
            o.ref_count_down()


def close_all(backends) -> None:
    for name, b in reversed(list(backends.items())):
        b.close()


def store_of(remote):
    """The MooncakeDistributedStore under a RemoteBackend (LMCache wraps its connector)."""
    return getattr(remote.connection, "_connector", remote.connection).store


def remote_of(backends):
    (name,) = [n for n in backends if n.startswith("RemoteBackend")]
    return backends[name]


def roundtrip(remote, local, md, *, partial: bool):
    """Batched put then batched get through LMCache; returns (sent, got) byte strings."""
    objs = [filled(local, md) for _ in range(4)]
    if partial:
        objs.append(filled(local, md, tokens=CHUNK // 2))
    keys = [new_key() for _ in objs]
    sent = [snapshot(o) for o in objs]
    remote.batched_submit_put_task(keys, objs)
    wait_stored(remote, keys)
    got = remote.batched_get_blocking(keys)
    assert all(g is not None for g in got)
    received = [snapshot(g) for g in got]
    release(*objs)
    return keys, sent, received, got


@pytest.fixture
def shim():
    store_mod = pytest.importorskip("mooncake.store")
    assert store_mod.MooncakeDistributedStore.__module__ == "regolith.mooncake"
    return store_mod


@pytest.mark.parametrize("save_chunk_meta", [False, True])
def test_seed_config_through_lmcache_storage_backends(
    cluster, shim, tmp_path, loop, metadata, save_chunk_meta
):
    cfg = seed_config(tmp_path, save_chunk_meta)
    backends = CreateStorageBackends(cfg, metadata, loop)
    try:
        remote, local = remote_of(backends), backends["LocalCPUBackend"]
        assert "Mooncakestore" in repr(remote.connection)
        keys, sent, got, objs = roundtrip(remote, local, metadata, partial=True)
        assert got == sent
        # the partial chunk came back with its own token count
        assert objs[-1].get_shape()[2] == CHUNK // 2
        release(*objs)
        # the bytes are in Regolith, and their layout says which Mooncake calls were used
        c = regolith.Client(cluster.socket(0))
        full = len(sent[0])
        sizes = [c.get_size(k.to_string()) for k in keys[:4]]
        assert sizes == [full + 28] * 4 if save_chunk_meta else [full] * 4
        c.close()
        # misses are None, not errors
        assert remote.batched_get_blocking([new_key()]) == [None]
        assert not remote.contains(new_key())
    finally:
        close_all(backends)


def test_seed_config_verbatim(cluster, shim, tmp_path, loop):
    """The seed's file unchanged (no chunk_size: LMCache's default of 256 tokens)."""
    path = tmp_path / "seed.yaml"
    path.write_text(SEED_VERBATIM)
    cfg = LMCacheEngineConfig.from_file(str(path))
    assert cfg.chunk_size == 256 and cfg.remote_url == "mooncakestore://localhost:50051/"
    md = LMCacheMetadata(
        model_name="regolith-seed",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(4, 2, cfg.chunk_size, 2, 32),
        chunk_size=cfg.chunk_size,
    )
    backends = CreateStorageBackends(cfg, md, loop)
    try:
        remote, local = remote_of(backends), backends["LocalCPUBackend"]
        store = store_of(remote)
        assert store.__class__.__module__ == "regolith.mooncake"
        assert store.get_hostname() == "node-0"
        objs = [filled(local, md, tokens=cfg.chunk_size) for _ in range(3)]
        keys = [new_key("regolith-seed") for _ in objs]
        sent = [snapshot(o) for o in objs]
        remote.batched_submit_put_task(keys, objs)
        wait_stored(remote, keys)
        got = remote.batched_get_blocking(keys)
        assert [snapshot(g) for g in got] == sent
        # save_chunk_meta False: the bare KV bytes; mooncake_prefer_local_alloc: on this node
        assert [store.get_size(k.to_string()) for k in keys] == [len(sent[0])] * 3
        conn = getattr(remote.connection, "_connector", remote.connection)
        assert conn.replica_config.preferred_segment == "node-0"
        release(*objs, *got)
    finally:
        close_all(backends)


def test_another_node_reads_what_one_wrote(cluster, shim, tmp_path, loop, metadata):
    a = CreateStorageBackends(seed_config(tmp_path, False), metadata, loop)
    b_cfg = seed_config(tmp_path, False, mooncake_sidecar_socket=cluster.socket(1))
    b = CreateStorageBackends(b_cfg, metadata, loop)
    try:
        ra, rb = remote_of(a), remote_of(b)
        assert store_of(ra).get_hostname() == "node-0"
        assert store_of(rb).get_hostname() == "node-1"
        objs = [filled(a["LocalCPUBackend"], metadata) for _ in range(3)]
        keys = [new_key() for _ in objs]
        sent = [snapshot(o) for o in objs]
        ra.batched_submit_put_task(keys, objs)
        wait_stored(ra, keys)
        got = rb.batched_get_blocking(keys)
        assert [snapshot(g) for g in got] == sent
        release(*objs, *got)
    finally:
        close_all(b)
        close_all(a)


@pytest.mark.parametrize("save_chunk_meta", [False, True])
def test_mooncakestore_connector_methods(cluster, shim, tmp_path, loop, metadata, save_chunk_meta):
    from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
        MooncakestoreConnector,
    )

    cfg = seed_config(tmp_path, save_chunk_meta)
    cfg.max_local_cpu_size = 0.5
    local = LocalCPUBackend(cfg, metadata)
    conn = MooncakestoreConnector(loop, local, cfg)

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    try:
        assert conn.save_chunk_meta is save_chunk_meta
        assert conn.replica_config.preferred_segment == "node-0"  # mooncake_prefer_local_alloc
        one, batch = filled(local, metadata), [filled(local, metadata) for _ in range(3)]
        k1, keys = new_key(), [new_key() for _ in batch]
        run(conn.put(k1, one))  # put_parts / put_from
        run(conn.batched_put(keys, batch))  # put_parts each / batch_put_from
        assert run(conn.exists(k1)) and conn.exists_sync(keys[0])
        assert not conn.exists_sync(new_key())
        assert run(conn.batched_async_contains("lookup", [k1, *keys, new_key()])) == 4
        got = run(conn.batched_get([k1, *keys, new_key()]))  # batch_get_buffer / batch_get_into
        assert [snapshot(g) for g in got[:4]] == [snapshot(o) for o in [one, *batch]]
        assert got[4] is None
        # putting the same key again is harmless (Regolith: already exists, no bytes moved)
        other = filled(local, metadata)
        run(conn.put(k1, other))
        again = run(conn.batched_get([k1]))
        assert snapshot(again[0]) == snapshot(one)
        release(one, *batch, *got, other, *again)
    finally:
        run(conn.close())
        local.close()


@pytest.mark.parametrize("class_name", ["RegolithConnectorAdapter", "RegolithConnector"])
@pytest.mark.parametrize("save_chunk_meta", [False, True])
def test_regolith_plugin_without_the_shim(
    cluster, tmp_path, loop, metadata, monkeypatch, class_name, save_chunk_meta
):
    # Neither Mooncake nor the shim may be imported by the plugin.
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(ImportError):
        import mooncake.store  # noqa: F401
    cfg = plugin_config(tmp_path, class_name, save_chunk_meta)
    backends = CreateStorageBackends(cfg, metadata, loop)
    try:
        remote = backends["RemoteBackend-regolith"]
        assert type(remote.connection).__name__ != "NoneType"
        keys, sent, got, objs = roundtrip(
            remote, backends["LocalCPUBackend"], metadata, partial=not save_chunk_meta
        )
        assert got == sent
        release(*objs)
        assert remote.batched_get_blocking([new_key()]) == [None]
    finally:
        close_all(backends)
    with pytest.raises(ImportError):
        import mooncake.store  # noqa: F401,F811
