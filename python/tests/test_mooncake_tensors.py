"""Mooncake's tensor API on Regolith, against a real loopback cluster: objects in Mooncake's
layout (written by Mooncake 0.3.13.post1 itself, `data/mooncake_tensors.json`, read back with
`get_tensor`), several dtypes and shapes, batches with missing keys and bad tensors in the
middle, views into registered buffers, upserts, publishing, and tensor parallelism. Needs
torch (LMCache's environment, `python/ci/lmcache.sh`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import regolith.mooncake as mc
from test_mooncake import _store_on

torch = pytest.importorskip("torch")

FIXTURES = json.loads((Path(__file__).parent / "data" / "mooncake_tensors.json").read_text())[
    "fixtures"
]
HEADER = 304


@pytest.fixture
def store(cluster):
    yield from _store_on(cluster, 0)


@pytest.fixture
def store_b(cluster):
    yield from _store_on(cluster, 1)


def fixture_tensor(fx: dict):
    dtype = getattr(torch, fx["dtype"])
    via = torch.float32 if dtype.is_floating_point else None
    t = torch.tensor(fx["values"], dtype=via) if via else torch.tensor(fx["values"])
    return t.to(dtype).reshape(fx["shape"])


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a.view(-1) == b.view(-1)).all())


def registered(store, n: int) -> np.ndarray:
    a = np.zeros(n, dtype=np.uint8)
    assert store.register_buffer(a.ctypes.data, n) == 0
    return a


@pytest.mark.parametrize("fx", [f for f in FIXTURES if "tp_" not in f["name"]], ids=lambda f: f["name"])
def test_objects_written_by_mooncake_read_back_and_ours_match_them(store, store_b, key, fx):
    obj = bytes.fromhex(fx["object_hex"])
    want = fixture_tensor(fx).reshape(fx["mooncake_get_tensor_shape"])
    k = key()
    assert store.put(k, obj) == 0, "the raw object Mooncake's put_tensor stored"
    assert same(store_b.get_tensor(k), want)
    # Ours, put with put_tensor, is the same object byte for byte.
    k2 = key()
    assert store.put_tensor(k2, fixture_tensor(fx)) == 0
    assert store_b.get(k2) == obj


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "uint8", "bool"]
)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (0, 4)])
def test_round_trip_of_dtypes_and_shapes(store, store_b, key, dtype, shape):
    t = (torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) % 5).to(
        getattr(torch, dtype)
    )
    k = key()
    assert store.put_tensor(k, t) == 0
    assert same(store_b.get_tensor(k), t)


def test_put_tensor_conventions(store, key):
    k = key()
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    assert store.put_tensor(k, a) == 0
    assert same(store.get_tensor(k), a.contiguous())
    assert store.put_tensor(k, torch.zeros(3)) == 0, "an existing key answers 0 ..."
    assert same(store.get_tensor(k), a.contiguous()), "... and keeps its value"
    assert store.put_tensor(key(), "not a tensor") == -600
    assert store.put_tensor(key(), torch.zeros([1] * 9)) == -600, "more than 8 dims"
    assert store.put_tensor(key(), torch.zeros(2, dtype=torch.complex64)) == -600
    assert store.get_tensor(key("missing")) is None
    raw = key()
    assert store.put(raw, b"x" * 400) == 0
    assert store.get_tensor(raw) is None, "not a tensor object"


def test_batches_with_failures_in_the_middle(store, store_b, key):
    keys = [key(), key(), key()]
    ts = [torch.ones(4), "bad", torch.arange(3)]
    assert store.batch_put_tensor(keys, ts) == [0, -600, 0]
    got = store_b.batch_get_tensor([keys[0], keys[1], key("missing"), keys[2]])
    assert same(got[0], ts[0]) and got[1] is None and got[2] is None and same(got[3], ts[2])
    assert store.batch_put_tensor(keys, ts[:2]) == [-600] * 3


def test_get_tensor_into_views_the_registered_buffer(store, store_b, key):
    k, k2 = key(), key()
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert store.put_tensor(k, t) == 0
    assert store.put_tensor(k2, t * 2) == 0
    buf = registered(store_b, 4096)
    view = store_b.get_tensor_into(k, buf.ctypes.data, 4096)
    assert same(view, t)
    buf[HEADER : HEADER + 4] = 255
    assert view[0, 0].item() == -1, "a view of the caller's buffer, not a copy"
    assert store_b.get_tensor_into(k, buf.ctypes.data, 100) is None, "too small"
    assert store_b.get_tensor_into(key("missing"), buf.ctypes.data, 4096) is None

    other = registered(store_b, 4096)
    got = store_b.batch_get_tensor_into(
        [k, key("missing"), k2], [buf.ctypes.data, other.ctypes.data, other.ctypes.data + 2048], [2048, 2048, 2048]
    )
    assert same(got[0], t) and got[1] is None and same(got[2], t * 2)
    assert store_b.batch_get_tensor_into([k], [0], [10]) == [-600]


def test_put_tensor_from_a_buffer_holding_an_object(store, store_b, key):
    src_key = key()
    t = torch.linspace(0, 1, 10, dtype=torch.float64)
    assert store.put_tensor(src_key, t) == 0
    obj = store.get(src_key)
    buf = registered(store, 4096)
    buf[: len(obj)] = np.frombuffer(obj, dtype=np.uint8)
    p = buf.ctypes.data
    k = key()
    assert store.put_tensor_from(k, p, len(obj)) == 0
    assert same(store_b.get_tensor(k), t)
    assert store.put_tensor_from(key(), p, len(obj) + 1) == -600, "the exact object size"
    assert store.batch_put_tensor_from([key(), key()], [p, p + 8], [len(obj), len(obj)]) == [-600, -600]
    assert store.upsert_tensor_from(k, p, len(obj)) == 0


# A replacing put made through one node is seen at once through that node, and through another
# node's index within its staleness bound (docs/sidecar.md: 2 s; milliseconds on a healthy
# stream), meanwhile only as a tensor put under the key before, never another.
STALE_BOUND_S = 2.5


def tensor_seen_by(store, k: str, want, *earlier) -> None:
    deadline = time.monotonic() + STALE_BOUND_S
    while True:
        got = store.get_tensor(k)
        if got is not None and same(got, want):
            return
        assert got is not None and any(same(got, e) for e in earlier), f"{k}: {got!r} was never put"
        assert time.monotonic() < deadline, f"{k}: still {got!r} after {STALE_BOUND_S} s"
        time.sleep(0.01)


def test_upserts_and_publishing(store, store_b, key):
    k = key()
    assert store.upsert_tensor(k, torch.zeros(2, 2)) == 0
    assert store.upsert_tensor(k, torch.ones(5, dtype=torch.int64)) == 0, "shape and dtype change"
    assert same(store.get_tensor(k), torch.ones(5, dtype=torch.int64)), "read-your-writes"
    tensor_seen_by(store_b, k, torch.ones(5, dtype=torch.int64), torch.zeros(2, 2))
    assert store.batch_upsert_tensor([k, key()], [torch.zeros(1), torch.zeros(2)]) == [0, 0]
    assert same(store.get_tensor(k), torch.zeros(1))
    tensor_seen_by(store_b, k, torch.zeros(1), torch.ones(5, dtype=torch.int64))

    cfg = mc.ReplicateConfig()
    cfg.replica_num = 2
    assert store.pub_tensor(key(), torch.ones(3), cfg) == 0
    cfg.preferred_segments = [store.get_hostname()]
    assert store.pub_tensor(key(), torch.ones(3), cfg) == -600, "one preferred segment per replica"
    cfg.replica_num = 1
    p = key()
    assert store.pub_tensor(p, torch.ones(3), cfg) == 0
    assert store.upsert_pub_tensor(p, torch.zeros(3), cfg) == 0
    assert same(store.get_tensor(p), torch.zeros(3))
    tensor_seen_by(store_b, p, torch.zeros(3), torch.ones(3))


def test_tensor_parallel_shards(store, store_b, key):
    k = key()
    full = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    assert store.put_tensor_with_tp(k, full, tp_rank=1, tp_size=2, split_dim=1) == 0
    assert store.is_exist(k) == 0, "the base key is never written"
    for r in range(2):
        shard = store_b.get_tensor_with_tp(k, tp_rank=r, tp_size=2)
        assert same(shard, full[:, 2 * r : 2 * r + 2].contiguous())
    # The shard object carries Mooncake's SHARD layout (global shape, the TP axis).
    obj = store_b.get(f"{k}_tp_1")
    assert int.from_bytes(obj[16:20], "little") == 1
    assert store.put_tensor_with_tp(key(), torch.zeros(3, 4), tp_size=2, split_dim=0) == -600
    assert store.put_tensor_with_tp(key(), full, tp_size=2, split_dim=-1) == -600
    assert store.put_tensor_with_tp(key(), full, tp_size=1) == 0

    keys = [key(), key()]
    assert store.batch_put_tensor_with_tp(keys, [full, "bad"], tp_size=4, split_dim=0) == [0, -600]
    got = store_b.batch_get_tensor_with_tp(keys, tp_rank=3, tp_size=4)
    assert same(got[0], full[3:4]) and got[1] is None

    buf = registered(store_b, 4096)
    assert same(store_b.get_tensor_with_tp_into(keys[0], buf.ctypes.data, 4096, tp_rank=2, tp_size=4), full[2:3])

    # From a buffer holding a whole object: decoded, then sharded.
    whole = key()
    assert store.put_tensor(whole, full) == 0
    obj = store.get(whole)
    src = registered(store, 4096)
    src[: len(obj)] = np.frombuffer(obj, dtype=np.uint8)
    k3 = key()
    assert store.put_tensor_with_tp_from(k3, src.ctypes.data, len(obj), tp_size=2, split_dim=0) == 0
    assert same(store_b.get_tensor_with_tp(k3, tp_rank=0, tp_size=2), full[:2])


def test_parallelism_forms_store_whole_tensors_and_refuse_bad_requests(store, key):
    k = key()
    assert store.put_tensor_with_parallelism(k, torch.ones(2)) == 0
    assert same(store.get_tensor_with_parallelism(k), torch.ones(2))
    assert store.put_tensor_with_parallelism(key(), torch.ones(2), parallelism=object()) == -600, "no axes"
    assert store.get_tensor_into_cuda(k, torch.ones(2)) == -1012


def test_safetensors_files(store, key, tmp_path):
    pytest.importorskip("safetensors")
    k = key()
    t = torch.arange(5, dtype=torch.float16)
    assert store.put_tensor(k, t) == 0
    path = str(tmp_path / "t.safetensors")
    assert store.save_tensor_to_safetensor(k, path) == 0
    assert store.save_tensor_to_safetensor(key("missing"), path) == -1100
    k2 = key()
    assert same(store.load_tensor_from_safetensor(k2, path), t)
    assert same(store.get_tensor(k2), t)
