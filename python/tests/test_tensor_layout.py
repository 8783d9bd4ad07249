"""`regolith._tensor`: Mooncake's tensor object layout, byte for byte. No cluster needed.

The module is loaded from its file, not through the `regolith` package, so these tests run
without the compiled extension. `data/mooncake_tensors.json` holds objects written by Mooncake
0.3.13.post1's real store.so (put_tensor / put_tensor_with_tp, then a raw get of the key).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

HERE = Path(__file__).resolve().parent


def _load_tensor_module():
    """Import regolith/_tensor.py standalone, skipping regolith/__init__ and its extension."""
    path = HERE.parent / "regolith" / "_tensor.py"
    spec = importlib.util.spec_from_file_location("regolith_tensor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


T = _load_tensor_module()
FIXTURES = json.loads((HERE / "data" / "mooncake_tensors.json").read_text())["fixtures"]

ALL_DTYPES = [name for name, _ in T.DTYPES]
FLOAT8 = {"float8_e4m3fn", "float8_e5m2"}


def _sample(dtype_name: str, shape) -> "torch.Tensor":
    """A tensor of ``shape`` with distinct small values, exactly representable in every dtype."""
    numel = 1
    for d in shape:
        numel *= d
    values = torch.arange(numel, dtype=torch.float32).remainder(7).reshape(shape)
    if dtype_name == "bool":
        return values.remainder(2) == 1
    return values.to(getattr(torch, dtype_name))


def _same(a, b) -> bool:
    """Equal dtype, shape and bytes (float8 has no torch.equal, and bytes are what matter)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_bytes = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(a), as_bytes(b))


def _object(tensor, **kw) -> bytes:
    header, data = T.pack(tensor, **kw)
    return header + bytes(data)


def _patched(obj: bytes, fmt: str, offset: int, *values) -> bytes:
    buf = bytearray(obj)
    struct.pack_into(fmt, buf, offset, *values)
    return bytes(buf)


def _with_axis(obj: bytes, *axis) -> bytes:
    """``obj`` with axis_count 1 and ``axis`` (kind, index, rank, count, split_dim, r0, r1)."""
    return _patched(_patched(obj, "<I", 168, 1), "<6iq", 176, *axis)


def _fixture_tensor(fx):
    """The tensor a fixture records, built from its values."""
    dtype = getattr(torch, fx["dtype"])
    via = torch.float32 if fx["dtype"] in FLOAT8 else dtype
    return torch.tensor(fx["values"], dtype=via).to(dtype).reshape(fx["shape"])


def _fixture_shard(fx):
    s = fx.get("shard")
    return None if s is None else (s["rank"], s["count"], s["split_dim"], s["global_shape"])


# --- layout ---------------------------------------------------------------------------------


def test_struct_sizes_and_offsets_match_mooncake():
    assert T.HEADER_SIZE == 304
    assert T._OBJECT_HEADER.size == 40
    assert (T.GLOBAL_SHAPE_OFFSET, T.LOCAL_SHAPE_OFFSET) == (40, 104)
    assert (T.AXIS_COUNT_OFFSET, T.AXES_OFFSET) == (168, 176)
    assert T._AXIS.size == 32
    assert T.AXES_OFFSET + T.MAX_AXES * T._AXIS.size == T.HEADER_SIZE


def test_header_fields_at_documented_offsets():
    header, data = T.pack(torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.float32))
    assert len(header) == 304 and data.nbytes == 24
    assert header[:4] == b"NOOM"
    assert struct.unpack_from("<IHHiiIIQQ", header, 0) == (0x4D4F4F4E, 1, 304, 0, 2, 0, 0, 304, 24)
    expected_shape = (2, 3) + (-1,) * 6
    assert struct.unpack_from("<8q", header, 40) == expected_shape
    assert struct.unpack_from("<8q", header, 104) == expected_shape
    assert struct.unpack_from("<II", header, 168) == (0, 0)
    assert header[176:] == bytes(128)


def test_shard_header_records_tp_axis():
    full = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    shard = T.tp_shards(full, 2, 1)[1]
    header, _ = T.pack(shard, shard=(1, 2, 1, full.shape))
    assert struct.unpack_from("<I", header, 16) == (T.LAYOUT_SHARD,)
    assert struct.unpack_from("<8q", header, 40)[:3] == (3, 4, -1)
    assert struct.unpack_from("<8q", header, 104)[:3] == (3, 2, -1)
    assert struct.unpack_from("<II", header, 168) == (1, 0)
    assert struct.unpack_from("<6iq", header, 176) == (1, 0, 1, 2, 1, 0, 2)
    assert header[208:] == bytes(96)


def test_every_dtype_has_mooncakes_code_and_size():
    for code, (name, size) in enumerate(T.DTYPES):
        dtype = getattr(torch, name)
        assert T.dtype_code(dtype) == code
        assert torch.empty((), dtype=dtype).element_size() == size
    assert T.dtype_code(torch.complex64) is None


# --- fixtures from Mooncake ------------------------------------------------------------------


@pytest.mark.parametrize("fx", FIXTURES, ids=[fx["name"] for fx in FIXTURES])
def test_mooncake_object_decodes(fx):
    got = T.unpack(bytes.fromhex(fx["object_hex"]))
    assert _same(got, _fixture_tensor(fx))


@pytest.mark.parametrize("fx", FIXTURES, ids=[fx["name"] for fx in FIXTURES])
def test_pack_reproduces_mooncake_object(fx):
    assert fx["source"] == "mooncake-0.3.13.post1"
    obj = _object(_fixture_tensor(fx), shard=_fixture_shard(fx))
    assert obj.hex() == fx["object_hex"]


def test_tp_fixture_is_mooncakes_split():
    fx = next(f for f in FIXTURES if "shard" in f)
    s = fx["shard"]
    full = torch.tensor(s["full_values"], dtype=torch.float32)
    shard = T.tp_shards(full, s["count"], s["split_dim"])[s["rank"]]
    assert _same(shard, _fixture_tensor(fx))
    header = T.read_header(bytes.fromhex(fx["object_hex"]))
    assert header.global_shape == tuple(s["global_shape"])
    assert header.axes == (T.LayoutAxis(1, 0, s["rank"], s["count"], s["split_dim"], 0, 2),)


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (0, 3), (1,) * 8])
def test_round_trip(dtype_name, shape):
    t = _sample(dtype_name, shape)
    obj = _object(t)
    assert len(obj) == 304 + t.numel() * t.element_size()
    got = T.unpack(obj)
    assert _same(got, t)


def test_non_contiguous_input_is_stored_in_c_order():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = base.t()
    assert not t.is_contiguous()
    obj = _object(t)
    assert obj[304:] == t.contiguous().numpy().tobytes()
    assert _same(T.unpack(obj), t)


def test_pack_does_not_copy_contiguous_data():
    t = torch.zeros(4, dtype=torch.float32)
    _, data = T.pack(t)
    t[0] = 1.0
    assert bytes(data[:4]) == struct.pack("<f", 1.0)


def test_pack_keeps_the_tensor_alive():
    _, data = T.pack(torch.arange(6, dtype=torch.int64) * 1)
    gc.collect()
    assert np.frombuffer(data, np.int64).tolist() == [0, 1, 2, 3, 4, 5]


def test_pack_detaches_grad_tensors():
    t = torch.ones(3, requires_grad=True)
    assert _same(T.unpack(_object(t)), t.detach())


def test_unpack_copies_out_of_the_buffer():
    buf = bytearray(_object(torch.tensor([1.0, 2.0])))
    got = T.unpack(buf)
    buf[304:308] = struct.pack("<f", 9.0)
    assert got.tolist() == [1.0, 2.0]


def test_unpack_accepts_memoryview_and_numpy():
    obj = _object(torch.tensor([7, 8], dtype=torch.int16))
    assert T.unpack(memoryview(obj)).tolist() == [7, 8]
    assert T.unpack(np.frombuffer(obj, np.uint8)).tolist() == [7, 8]


def test_empty_tensor_is_header_only():
    obj = _object(torch.empty((0, 3), dtype=torch.uint8))
    assert len(obj) == 304
    got = T.unpack(obj)
    assert got.shape == (0, 3) and got.dtype == torch.uint8


# --- pack refuses what Mooncake's put refuses ------------------------------------------------


def test_pack_refuses_non_tensor():
    with pytest.raises(ValueError, match="expected a torch.Tensor, got list"):
        T.pack([1, 2, 3])


def test_pack_refuses_unsupported_dtype():
    with pytest.raises(ValueError, match="unsupported tensor dtype torch.complex64"):
        T.pack(torch.zeros(2, dtype=torch.complex64))


def test_pack_refuses_nine_dims():
    with pytest.raises(ValueError, match="9 dims"):
        T.pack(torch.zeros((1,) * 9))


@pytest.mark.parametrize(
    "shard, message",
    [
        ((2, 2, 0, (4, 2)), "rank 2"),
        ((0, 2, 2, (4, 2)), "split_dim 2"),
        ((0, 2, -1, (4, 2)), "split_dim -1"),
        ((0, 2, 0, (4,)), "has 1 dims"),
        ((0, 2, 0, (-4, 2)), "negative"),
    ],
)
def test_pack_refuses_bad_shard(shard, message):
    with pytest.raises(ValueError, match=message):
        T.pack(torch.zeros(2, 2), shard=shard)


def test_is_tensor_checks_the_class_name_like_mooncake():
    class FakeTensor:
        pass

    assert T.is_tensor(torch.zeros(1))
    assert T.is_tensor(FakeTensor())
    assert not T.is_tensor(np.zeros(1))
    assert not T.is_tensor(torch.nn.Parameter(torch.zeros(1)))


# --- invalid objects decode to None -----------------------------------------------------------

# Checked once against the real wheel: Mooncake 0.3.13.post1's _deserialize_tensor refuses each
# object in this list and accepts the two objects of the tests after it.
GOOD = _object(torch.arange(6, dtype=torch.float32).reshape(2, 3))


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(_patched(GOOD, "<I", 0, 0x12345678), id="bad magic"),
        pytest.param(_patched(GOOD, "<H", 4, 2), id="version 2"),
        pytest.param(_patched(GOOD, "<H", 6, 40), id="header_size 40"),
        pytest.param(GOOD[:-1], id="truncated data"),
        pytest.param(GOOD[:303], id="truncated header"),
        pytest.param(b"", id="empty"),
        pytest.param(b"x" * 400, id="garbage"),
        pytest.param(GOOD + b"\0", id="trailing byte"),
        pytest.param(_patched(GOOD, "<Q", 32, 20), id="data_bytes mismatch"),
        pytest.param(_patched(GOOD, "<i", 12, 9), id="ndim 9"),
        pytest.param(_patched(GOOD, "<i", 12, -1), id="ndim -1"),
        pytest.param(_patched(GOOD, "<i", 8, 15), id="dtype 15"),
        pytest.param(_patched(GOOD, "<i", 8, -1), id="dtype -1"),
        pytest.param(_patched(GOOD, "<i", 8, 1), id="dtype size mismatch"),
        pytest.param(_patched(GOOD, "<I", 16, 2), id="layout_kind 2"),
        pytest.param(_patched(GOOD, "<Q", 24, 303), id="data_offset below header"),
        pytest.param(_patched(GOOD, "<Q", 24, 1000), id="data_offset past end"),
        pytest.param(_patched(GOOD, "<q", 40 + 2 * 8, 0), id="global slot not -1"),
        pytest.param(_patched(GOOD, "<q", 104 + 7 * 8, 1), id="local slot not -1"),
        pytest.param(_patched(GOOD, "<q", 40, -2), id="negative global dim"),
        pytest.param(_patched(GOOD, "<qq", 104, 3, 3), id="local numel mismatch"),
        pytest.param(_patched(GOOD, "<I", 168, 5), id="axis_count 5"),
        pytest.param(_with_axis(GOOD, 5, 0, 0, 1, -1, 0, 0), id="axis kind 5"),
        pytest.param(_with_axis(GOOD, -1, 0, 0, 1, -1, 0, 0), id="axis kind -1"),
        pytest.param(_with_axis(GOOD, 1, 0, 0, 0, -1, 0, 0), id="shard_count 0"),
        pytest.param(_with_axis(GOOD, 1, 0, -1, 2, -1, 0, 0), id="rank -1"),
        pytest.param(_with_axis(GOOD, 1, 0, 2, 2, -1, 0, 0), id="rank >= count"),
        pytest.param(_with_axis(GOOD, 1, 0, 0, 2, 2, 0, 0), id="split_dim 2"),
        pytest.param(_with_axis(GOOD, 1, 0, 0, 2, -2, 0, 0), id="split_dim -2"),
    ],
)
def test_invalid_object_is_none(obj):
    assert T.read_header(obj) is None
    assert T.unpack(obj) is None


def test_fields_mooncake_does_not_check_are_accepted():
    """Flags, reserved words, unused axis slots and a valid axis are not grounds for refusal."""
    obj = _patched(GOOD, "<I", 20, 7)
    obj = _patched(obj, "<I", 172, 7)
    obj = _with_axis(obj, 4, 3, 0, 1, -1, 9, 9)
    obj = _patched(obj, "<6iq", 176 + 32 * 3, 99, 99, 99, 99, 99, 99, 99)
    assert _same(T.unpack(obj), T.unpack(GOOD))


def test_data_offset_past_header_is_honoured():
    """A writer may leave a gap after the header; data_offset says where the data starts."""
    obj = _patched(GOOD, "<Q", 24, 312)
    obj = obj[:304] + b"\xee" * 8 + obj[304:]
    assert _same(T.unpack(obj), T.unpack(GOOD))


# --- unpack_view -------------------------------------------------------------------------------


def test_unpack_view_views_a_writable_buffer():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    buf = bytearray(_object(t)) + bytearray(100)
    got = T.unpack_view(buf, len(GOOD))
    assert _same(got, t)
    buf[304:308] = struct.pack("<f", 42.0)
    assert got[0, 0].item() == 42.0
    got[1, 2] = -1.0
    assert struct.unpack_from("<f", buf, 304 + 5 * 4) == (-1.0,)


def test_unpack_view_at_an_address():
    t = torch.tensor([1, 2, 3], dtype=torch.int64)
    obj = _object(t)
    mem = (ctypes.c_ubyte * 4096)()
    ctypes.memmove(mem, obj, len(obj))
    got = T.unpack_view(ctypes.addressof(mem), len(obj))
    assert got.tolist() == [1, 2, 3]
    struct.pack_into("<q", mem, 304 + 8, 99)
    assert got.tolist() == [1, 99, 3]


def test_unpack_view_bfloat16_views_memory():
    t = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    buf = np.frombuffer(bytearray(_object(t)), np.uint8)
    got = T.unpack_view(buf, buf.nbytes)
    eight = torch.tensor([8.0], dtype=torch.bfloat16).view(torch.uint8).numpy()
    buf[304:306] = eight
    assert got.tolist() == [8.0, 2.0]


def test_unpack_view_refuses_what_mooncake_refuses():
    buf = bytearray(GOOD)
    assert T.unpack_view(0, len(GOOD)) is None
    assert T.unpack_view(buf, len(GOOD) + 1) is None
    assert T.unpack_view(buf, len(GOOD) - 1) is None
    assert T.unpack_view(bytearray(b"x" * 400), 400) is None


def test_unpack_view_refuses_read_only_buffers():
    with pytest.raises(ValueError, match="writable"):
        T.unpack_view(GOOD, len(GOOD))


def test_unpack_view_empty_tensor():
    obj = bytearray(_object(torch.empty((2, 0), dtype=torch.float16)))
    got = T.unpack_view(obj, len(obj))
    assert got.shape == (2, 0) and got.dtype == torch.float16


# --- tensor parallel ---------------------------------------------------------------------------


def test_tp_shards_splits_uniformly():
    t = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    shards = T.tp_shards(t, 3, 1)
    assert [s.shape for s in shards] == [(4, 2)] * 3
    assert all(s.is_contiguous() for s in shards)
    assert torch.equal(torch.cat(shards, dim=1), t)
    assert torch.equal(T.tp_shards(t, 2, 0)[1], t[2:])
    assert torch.equal(T.tp_shards(t, 1, 0)[0], t)


@pytest.mark.parametrize(
    "tp_size, split_dim",
    [(4, 1), (5, 0), (2, -1), (2, -2), (2, 2), (0, 0), (-1, 0)],
    ids=["uneven", "uneven dim 0", "negative split_dim", "negative split_dim 2",
         "split_dim past ndim", "tp_size 0", "tp_size -1"],
)
def test_tp_shards_refuses(tp_size, split_dim):
    assert T.tp_shards(torch.zeros(4, 6), tp_size, split_dim) is None


def test_tp_shards_refuses_scalar_and_non_tensor():
    assert T.tp_shards(torch.tensor(1.0), 1, 0) is None
    with pytest.raises(ValueError, match="expected a torch.Tensor"):
        T.tp_shards([1, 2], 2, 0)


def test_tp_shard_objects_round_trip():
    full = torch.arange(16, dtype=torch.bfloat16).reshape(2, 8)
    for rank, shard in enumerate(T.tp_shards(full, 4, 1)):
        obj = _object(shard, shard=(rank, 4, 1, full.shape))
        assert _same(T.unpack(obj), full[:, 2 * rank: 2 * rank + 2])
        header = T.read_header(obj)
        assert header.layout_kind == T.LAYOUT_SHARD and header.global_shape == (2, 8)


def test_tp_key():
    assert T.tp_key("weights", 3) == "weights_tp_3"
