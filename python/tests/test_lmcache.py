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
import os
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


# ---------------------------------------------------------------- the disk tier (storage_root_dir)

# The spawned node's memory, and the working set put through LMCache: four times as much.
DISK_SEGMENT = 32 << 20
DISK_CHUNK = 256  # LMCache's default chunk size
# (num_layers, 2, chunk_size, num_kv_heads, head_size) in bfloat16: 1 MiB per chunk
DISK_KV_SHAPE = (4, 2, DISK_CHUNK, 4, 64)
DISK_CHUNK_BYTES = 1 << 20
DISK_CHUNKS = 4 * DISK_SEGMENT // DISK_CHUNK_BYTES
# metad's defaults (docs/ssd.md): offload above 0.8 of the pool, eviction above 0.9. Puts go in
# batches smaller than the gap between them, and the next batch waits for offload to bring
# the pool under 0.8 again: LMCache does not retry a put the pool refuses, and a put faster
# than offload would otherwise fill the pool (docs/ssd.md, "Known problems").
OFFLOAD_WATERMARK = 0.8
DISK_PUT_BATCH = 2

DISK_NODE = "lmcache-disk-node"

# What a user writes to give Mooncake an SSD tier: storage_root_dir beside the seed's keys
# (LMCache 0.5.6 keeps it for itself and exports MOONCAKE_STORAGE_ROOT_DIR before setup()).
# The sidecar is spawned by setup(): no sidecar answers at sidecar_socket.
DISK_YAML = """\
chunk_size: {chunk}
local_cpu: False
remote_url: "mooncakestore://{metad}/"
max_local_cpu_size: 0.5
extra_config:
  use_exists_sync: true
  save_chunk_meta: False
  local_hostname: "{node}"
  metadata_server: "http://localhost:8080/metadata"
  protocol: "tcp"
  device_name: ""
  global_segment_size: {segment}
  master_server_address: "{metads}"
  local_buffer_size: 0
  mooncake_prefer_local_alloc: true
  storage_root_dir: "{root}"
  mooncake_regolith_spawn_sidecar: true
  mooncake_sidecar_socket: "{socket}"
"""


@pytest.fixture
def small_pool():
    """A cluster of its own whose one sidecar holds less than a chunk (regolith up needs one):
    the pool's memory is then the spawned node's segment, so its watermarks are that node's."""
    import cluster as _cluster

    c = _cluster.start(sidecars=1, segment_size="512KiB")
    yield c
    _cluster.cleanup(c)


@pytest.fixture
def storage_root_env(monkeypatch, small_pool):
    """The spawned sidecar's binary and token; MOONCAKE_STORAGE_ROOT_DIR removed afterwards
    (LMCache exports it for the whole process)."""
    from cluster import binary

    monkeypatch.setenv("REGOLITH_SIDECAR_BIN", str(binary("regolith-sidecar")))
    monkeypatch.setenv("REGOLITH_CLUSTER_TOKEN_FILE", str(small_pool.token_file))
    monkeypatch.delenv("REGOLITH_METRICS_ADDR", raising=False)
    before = os.environ.pop("MOONCAKE_STORAGE_ROOT_DIR", None)
    yield small_pool
    os.environ.pop("MOONCAKE_STORAGE_ROOT_DIR", None)
    if before is not None:
        os.environ["MOONCAKE_STORAGE_ROOT_DIR"] = before


def disk_config(tmp_path: Path, pool, root: Path) -> LMCacheEngineConfig:
    path = tmp_path / "lmcache-ssd.yaml"
    path.write_text(
        DISK_YAML.format(
            chunk=DISK_CHUNK, metad=pool.metad[0], metads=pool.metad_addrs, node=DISK_NODE,
            segment=DISK_SEGMENT, root=root, socket=tmp_path / "no-sidecar-here.sock",
        )  # fmt: skip
    )
    return LMCacheEngineConfig.from_file(str(path))


def metrics_addr(sidecar) -> str:
    """The --metrics-addr a spawned sidecar was started with."""
    args = list(sidecar.popen.args)
    return args[args.index("--metrics-addr") + 1]


class DiskTier:
    """The spawned sidecar's disk as its metrics and /status show it."""

    def __init__(self, sidecar, path: Path):
        self.addr = metrics_addr(sidecar)
        self.label = f'{{disk="{path}"}}'

    def metric(self, name: str) -> float:
        from cluster import scrape

        return scrape(self.addr, f"regolith_sidecar_{name}{self.label}")

    def counter(self, name: str) -> float:
        """One of the node's unlabelled counters (offloads, promotions)."""
        from cluster import scrape

        return scrape(self.addr, f"regolith_sidecar_{name}")

    def offloads(self) -> float:
        return self.counter("disk_offloads_total")

    def status(self) -> dict:
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://{self.addr}/status", timeout=10) as r:
            return json.loads(r.read())

    def describe(self) -> str:
        names = ("disk_objects", "disk_reads", "disk_writes", "disk_evicted", "disk_errors")
        return ", ".join(f"{n}={self.metric(n):.0f}" for n in names) + (
            f", offloads={self.offloads():.0f}"
        )


def pool_use(client: regolith.Client) -> float:
    """The share of the pool's memory in use (metad's committed replicas; disk not counted)."""
    s = client.stats()
    return s["bytes_used"] / s["bytes_total"]


def wait_for(what: str, cond, explain, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what} within {timeout:.0f}s: {explain()}")
        time.sleep(0.05)


def test_storage_root_dir_working_set_larger_than_memory_read_back_from_disk(
    storage_root_env, tmp_path, loop
):
    """LMCache's `storage_root_dir` through its Mooncake connector: setup() spawns a sidecar of
    32 MiB with a disk tier under the root; 128 MiB of KV chunks put through LMCache go to
    disk as memory fills (metad's offload), and every chunk comes back exact through LMCache,
    those only on disk read from the disk."""
    pool = storage_root_env
    md = LMCacheMetadata(
        model_name="regolith-ssd", world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=DISK_KV_SHAPE,
        chunk_size=DISK_CHUNK,
    )  # fmt: skip
    root = tmp_path / "ssd"
    backends = CreateStorageBackends(disk_config(tmp_path, pool, root), md, loop)
    try:
        remote, local = remote_of(backends), backends["LocalCPUBackend"]
        store = store_of(remote)
        # LMCache exported the root; setup() spawned the node's sidecar with its disk there.
        assert os.environ.get("MOONCAKE_STORAGE_ROOT_DIR") == str(root)
        assert store.get_hostname() == DISK_NODE
        sidecar = store._sidecar
        assert sidecar is not None and sidecar.running()
        disk_dir = root / f"regolith-{DISK_NODE}"
        args = list(sidecar.popen.args)
        assert args[args.index("--disk") + 1] == str(disk_dir)
        disk = DiskTier(sidecar, disk_dir)
        (status,) = disk.status()["disks"]
        assert status["path"] == str(disk_dir) and status["healthy"], status
        assert (disk_dir / "regolith-disk.json").exists()
        c = store.client
        segs = {s["node_name"]: s for s in c.list_segments()}
        assert segs[DISK_NODE]["capacity"] == DISK_SEGMENT

        keys, sent = put_working_set(remote, local, md, c, disk)
        # 4 x memory: most chunks can only be on disk (memory holds at most a segment).
        wait_for(
            "offload did not settle (every record on disk committed as a move)",
            lambda: disk.offloads() == disk.metric("disk_objects") and pool_use(c) <= OFFLOAD_WATERMARK,
            disk.describe,
        )  # fmt: skip
        on_disk = int(disk.metric("disk_objects"))
        assert on_disk >= DISK_CHUNKS - DISK_SEGMENT // DISK_CHUNK_BYTES, disk.describe()
        assert all(remote.contains(k) for k in keys)
        reads_before = disk.metric("disk_reads")
        read_bytes_before = disk.metric("disk_read_bytes")

        for i in range(0, len(keys), 4):
            got = remote.batched_get_blocking(keys[i : i + 4])
            assert all(g is not None for g in got), (i, disk.describe())
            assert [snapshot(g) for g in got] == sent[i : i + 4], f"chunks {i}..{i + 3} differ"
            release(*got)

        # Each chunk that was only on disk was read from it (a hit may then promote it to
        # memory; it was read once here), and nothing was lost on the way.
        reads = disk.metric("disk_reads") - reads_before
        assert reads >= on_disk, disk.describe()
        assert disk.metric("disk_read_bytes") - read_bytes_before >= on_disk * DISK_CHUNK_BYTES
        assert disk.metric("disk_evicted") == 0 and disk.metric("disk_errors") == 0
        assert pool.metad_metric("regolith_metad_evicted_objects") == 0
        promoted = disk.counter("disk_promotions_total")
        print(
            f"\n{DISK_CHUNKS} chunks of {DISK_CHUNK_BYTES >> 20} MiB, segment "
            f"{DISK_SEGMENT >> 20} MiB: {on_disk} only on disk before the reads, "
            f"{reads:.0f} disk reads, {promoted:.0f} promoted; {disk.describe()}"
        )
    finally:
        close_all(backends)
    assert not sidecar.running()


def put_working_set(remote, local, md, client, disk: DiskTier):
    """Puts DISK_CHUNKS chunks through LMCache, DISK_PUT_BATCH at a time, each batch once the
    pool is back under the offload watermark. Returns the keys and the bytes put."""
    keys, sent = [], []
    for _ in range(0, DISK_CHUNKS, DISK_PUT_BATCH):
        wait_for(
            "the pool did not come back under the offload watermark",
            lambda: pool_use(client) <= OFFLOAD_WATERMARK,
            lambda: f"pool use {pool_use(client):.3f}; {disk.describe()}",
        )
        objs = [filled(local, md, tokens=DISK_CHUNK) for _ in range(DISK_PUT_BATCH)]
        batch = [new_key("regolith-ssd") for _ in objs]
        assert all(len(o.byte_array) == DISK_CHUNK_BYTES for o in objs)
        sent += [snapshot(o) for o in objs]
        remote.batched_submit_put_task(batch, objs)
        wait_stored(remote, batch, timeout=30)
        release(*objs)
        keys += batch
    return keys, sent
