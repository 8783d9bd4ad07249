"""Mooncake's parallelism tensor methods (``*_tensor_with_parallelism*``) on Regolith, checked
against Mooncake 0.3.13.post1 itself (`data/mooncake_parallelism.json`, recorded with the real
store.so and mooncake_master): each write stores the same keys with the same bytes and returns
the same code; objects Mooncake wrote, put raw under its keys, read back with every ReadTarget
("as_stored", "shard", "full", resharding) as Mooncake's reads returned them. Needs torch."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as _np
import pytest

import regolith.mooncake as mc
from regolith import _mooncake_parallelism as mt
from test_mooncake import _store_on

torch = pytest.importorskip("torch")

DATA = json.loads((Path(__file__).parent / "data" / "mooncake_parallelism.json").read_text())
HEADER = 304

# Our request classes, by the names Mooncake's module gives them.
CLASSES = types.SimpleNamespace(
    ParallelAxis=mc.ParallelAxis,
    TensorParallelism=mc.TensorParallelism,
    ReadTarget=mc.ReadTarget,
    ReplicateConfig=mc.ReplicateConfig,
)


def serialize(t) -> bytes:
    from regolith import _tensor

    header, data = _tensor.pack(t)
    return header + bytes(data)


# --- spec helpers (also run by the generator against Mooncake's own store.so) ---


def make_tensor(spec):
    """{"shape": [...], "dtype": "float32", "offset": k}: arange(numel) + k, reshaped."""
    import torch as _torch

    n = 1
    for d in spec["shape"]:
        n *= d
    t = (_torch.arange(n, dtype=_torch.float32) + spec.get("offset", 0)).reshape(spec["shape"])
    return t.to(getattr(_torch, spec.get("dtype", "float32")))


def make_axis(cls, a):
    ax = cls()
    ax.kind = a["kind"]
    ax.rank = a.get("rank", 0)
    ax.size = a.get("size", 1)
    ax.split_dim = a.get("split_dim")
    ax.expert_id = a.get("expert_id")
    ax.stage_id = a.get("stage_id")
    return ax


def make_parallelism(classes, spec):
    """None, "object" (an object with no axes), or a list of axis dicts."""
    if spec is None:
        return None
    if spec == "object":
        return object()
    p = classes.TensorParallelism()
    p.axes = [make_axis(classes.ParallelAxis, a) for a in spec]
    return p


def make_writer(spec):
    if spec is None:
        return None
    if spec == "object":
        return object()
    return types.SimpleNamespace(**spec)


def make_target(classes, spec):
    if spec is None:
        return None
    t = classes.ReadTarget()
    t.mode = spec.get("mode", "as_stored")
    t.parallelism = make_parallelism(classes, spec.get("parallelism"))
    return t


_KEEP = []  # registered buffers stay alive (and registered) for the process's life


class Buffers:
    """Registered host buffers holding objects (the `_from` sources) or receiving reads."""

    def __init__(self, store):
        self.store = store
        self.keep = _KEEP

    def new(self, n):
        a = _np.zeros(max(n, 1), dtype=_np.uint8)
        assert self.store.register_buffer(a.ctypes.data, a.nbytes) == 0
        self.keep.append(a)
        return a

    def holding(self, obj: bytes):
        a = self.new(len(obj))
        a[: len(obj)] = _np.frombuffer(obj, dtype=_np.uint8)
        return a.ctypes.data, len(obj)


def run_write(store, classes, case, pfx, bufs, serialize):
    """Run one write case; its keys are pfx + the case's keys. Returns the call's result."""
    op = case["op"]
    keys = [pfx + k for k in case["keys"]]
    kw = {}
    if "config" in case:
        cfg = classes.ReplicateConfig()
        for k, v in case["config"].items():
            setattr(cfg, k, v)
        kw["config"] = cfg
    batch = op.startswith("batch_")
    if op.endswith("_from"):
        srcs = [bufs.holding(serialize(make_tensor(t))) if t is not None else (0, 0) for t in case["tensors"]]
        data = ([p for p, _ in srcs], [n for _, n in srcs]) if batch else srcs[0]
    else:
        ts = [make_tensor(t) if isinstance(t, dict) else t for t in case["tensors"]]
        data = (ts,) if batch else (ts[0],)
    if batch:
        pars = case.get("parallelisms")
        wps = case.get("writer_partitions")
        if pars is not None:
            kw["parallelisms"] = pars if pars == "notalist" else [make_parallelism(classes, p) for p in pars]
        if wps is not None:
            kw["writer_partitions"] = wps if wps == "notalist" else [make_writer(w) for w in wps]
        return getattr(store, op)(keys, *data, **kw)
    if "tp" in case:
        kw.update(case["tp"])
    if case.get("parallelism") is not None:
        kw["parallelism"] = make_parallelism(classes, case["parallelism"])
    if case.get("writer_partition") is not None:
        kw["writer_partition"] = make_writer(case["writer_partition"])
    return getattr(store, op)(keys[0], *data, **kw)


def describe(x, buf_ptr=None):
    """A read's result as JSON: null, an int, or a tensor's shape, dtype and values."""
    if x is None or isinstance(x, int):
        return x
    import torch as _torch

    d = {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
         "values": x.to(_torch.float64).reshape(-1).tolist()}
    if buf_ptr is not None:
        d["views_buffer_at"] = x.data_ptr() - buf_ptr if x.numel() else None
    return d


def run_read(store, classes, case, pfx, bufs):
    """Run one read case: get / batch get / the _into forms. Returns its described result,
    and for the _into forms each buffer's first bytes (the header written there)."""
    op = case["op"]
    keys = [pfx + k for k in case["keys"]]
    targets = case.get("targets")
    if targets is None:
        tl = None
    elif targets == "notalist":
        tl = "notalist"
    else:
        tl = [make_target(classes, t) for t in targets]
    batch = op.startswith("batch_")
    if op.endswith("_into"):
        sizes = case["sizes"]
        arrs = [bufs.new(n) for n in sizes]
        ptrs = [a.ctypes.data for a in arrs]
        if batch:
            args = (keys, ptrs, sizes) + (() if tl is None else (tl,))
            res = getattr(store, op)(*args)
            out = [describe(r, p) for r, p in zip(res, ptrs)]
        else:
            args = (keys[0], ptrs[0], sizes[0]) + (() if tl is None else (tl[0],))
            out = describe(getattr(store, op)(*args), ptrs[0])
        return {"result": out, "headers": [bytes(a[:304]).hex() for a in arrs]}
    if batch:
        res = getattr(store, op)(keys, *(() if tl is None else (tl,)))
        return {"result": [describe(r) for r in res]}
    return {"result": describe(getattr(store, op)(keys[0], *(() if tl is None else (tl[0],))))}
# --- end spec helpers ---


@pytest.fixture
def store(cluster):
    yield from _store_on(cluster, 0)


def prefix(key) -> str:
    return key("par") + "/"


def keys_under(store, pfx: str) -> dict[str, bytes]:
    return {k[len(pfx):]: bytes(store.get(k)) for k in store._all_keys() if k.startswith(pfx)}


def call(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - Mooncake's recorded answer may be an exception
        return f"raises {type(e).__name__}"


def recorded(result):
    return result if not (isinstance(result, str) and result.startswith("raises")) else result.split(":")[0]


@pytest.mark.parametrize("case", DATA["writes"], ids=lambda c: c["name"])
def test_writes_store_mooncakes_keys_and_bytes(store, key, case):
    pfx = prefix(key)
    got = call(lambda: run_write(store, CLASSES, case, pfx, Buffers(store), serialize))
    assert got == recorded(case["result"])
    objs = keys_under(store, pfx)
    assert sorted(objs) == sorted(case["objects"])
    for k, h in case["objects"].items():
        assert objs[k].hex() == h, k


def _compare(got, want):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _compare(g, w)
        return
    assert got == want


@pytest.mark.parametrize("scenario", DATA["reads"], ids=lambda s: s["name"])
def test_reads_of_objects_mooncake_wrote(store, key, scenario):
    pfx = prefix(key)
    for k, h in scenario["objects"].items():
        assert store.put(pfx + k, bytes.fromhex(h)) == 0
    bufs = Buffers(store)
    for rd in scenario["reads"]:
        got = call(lambda: run_read(store, CLASSES, rd, pfx, bufs))
        assert not isinstance(got, str), (rd["name"], got)
        _compare(got["result"], rd["result"])
        if "headers" in rd:
            results = rd["result"] if isinstance(rd["result"], list) else [rd["result"]]
            for res, g, w in zip(results, got["headers"], rd["headers"]):
                if res is not None:
                    assert g == w, rd["name"]


@pytest.mark.parametrize("scenario", DATA["reads"], ids=lambda s: s["name"])
def test_reads_of_objects_we_wrote(store, key, scenario):
    """The same reads after our own writes of the scenario's set-up."""
    pfx = prefix(key)
    bufs = Buffers(store)
    for s in scenario["setup"]:
        assert run_write(store, CLASSES, s, pfx, bufs, serialize) == 0
    assert {k: v.hex() for k, v in keys_under(store, pfx).items()} == scenario["objects"]
    for rd in scenario["reads"]:
        _compare(run_read(store, CLASSES, rd, pfx, bufs)["result"], rd["result"])


def test_mooncakes_own_request_objects_and_ours():
    t = mt.ReadTarget()
    assert (t.mode, t.parallelism) == ("as_stored", None)
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        t.mode = "bogus"
    a = mt.ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
    p = mt.TensorParallelism(axes=[mt.ParallelAxis("tp", 1, 2, split_dim=0)])
    assert mt._par_key("K", mt._validate(mt._parse_parallelism(p))) == "K_tp_1"


def test_manifest_codec():
    from regolith import _tensor

    m = _tensor.pack_manifest(0, (8, 2), 0, 2)
    assert len(m) == 96 and m[:4] == b"NAMW"
    assert _tensor.read_manifest(m) == _tensor.Manifest(0, 0, 2, (8, 2))
    assert _tensor.read_manifest(m[:95]) is None
    assert _tensor.read_manifest(_tensor.pack_manifest(0, (8, 2), 2, 2)) is None


def test_upsert_replaces_shards_and_put_keeps_them(store, key):
    k = key()
    tp = mt.TensorParallelism([mt.ParallelAxis("tp", 1, 2, split_dim=0)])
    full = mt.ReadTarget("full", tp)
    assert store.put_tensor_with_parallelism(k, torch.ones(2, 3), tp) == 0
    assert store.put_tensor_with_parallelism(k, torch.zeros(2, 3), tp) == 0  # kept, as Mooncake's
    assert bool((store.get_tensor_with_parallelism(k, mt.ReadTarget("shard", tp)) == 1).all())
    assert store.upsert_tensor_with_parallelism(k, torch.full((2, 3), 7.0), tp) == 0
    assert bool((store.get_tensor_with_parallelism(k, mt.ReadTarget("shard", tp)) == 7).all())
    assert store.get_tensor_with_parallelism(k, full) is None  # rank 0 was never written
    tp0 = mt.TensorParallelism([mt.ParallelAxis("tp", 0, 2, split_dim=0)])
    assert store.upsert_tensor_with_parallelism(k, torch.zeros(2, 3), tp0) == 0
    got = store.get_tensor_with_parallelism(k, full)
    assert got.shape == (4, 3) and got[:2].sum() == 0 and bool((got[2:] == 7).all())
