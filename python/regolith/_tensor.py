"""Mooncake Store's tensor object layout, in pure Python (stdlib, numpy and torch only).

Mooncake's ``put_tensor`` stores a tensor as one object: a 304-byte ``TensorMetadata`` header
followed by the tensor's raw C-contiguous bytes. ``get_tensor`` accepts an object only if its
header passes ``ValidateTensorMetadata``. This module writes and reads that exact layout, so that
objects written by Mooncake and by ``regolith.mooncake`` can be read by either.

The layout is Mooncake's, not ours. Source: kvcache-ai/Mooncake,
``mooncake-integration/integration_utils.h`` (``TensorObjectHeader``, ``TensorLayoutMetadata``,
``LayoutAxis``, ``BuildTensorMetadata``, ``ValidateTensorMetadata``),
``mooncake-integration/store/store_py.cpp`` (``extract_tensor_info_impl``, ``buffer_to_tensor``)
and ``store_py_internal.h`` (TP sharding, ``calculate_shard_range``). The tests check these bytes
against objects written by Mooncake 0.3.13.post1.

Header (little-endian, natural alignment, 304 bytes)::

    0    TensorObjectHeader  u32 magic, u16 version, u16 header_size, i32 dtype, i32 ndim,
                             u32 layout_kind, u32 reserved_flags, u64 data_offset, u64 data_bytes
    40   i64 global_shape[8] dims [0, ndim), then -1
    104  i64 local_shape[8]  the stored tensor's shape, same convention
    168  u32 axis_count, u32 reserved0
    176  LayoutAxis[4]       i32 kind, axis_index, shard_rank, shard_count, split_dim, reserved0;
                             i64 reserved1 (local extent along split_dim)

torch is imported inside the functions that need it, so importing this module costs nothing.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

if TYPE_CHECKING:
    import torch

HEADER_SIZE = 304
MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4

LAYOUT_FULL = 0
LAYOUT_SHARD = 1

AXIS_DP, AXIS_TP, AXIS_EP, AXIS_PP, AXIS_RESERVED = range(5)

_OBJECT_HEADER = struct.Struct("<IHHiiIIQQ")
_SHAPE = struct.Struct("<8q")
_AXIS_COUNT = struct.Struct("<II")
_AXIS = struct.Struct("<6iq")

GLOBAL_SHAPE_OFFSET = _OBJECT_HEADER.size
LOCAL_SHAPE_OFFSET = GLOBAL_SHAPE_OFFSET + _SHAPE.size
AXIS_COUNT_OFFSET = LOCAL_SHAPE_OFFSET + _SHAPE.size
AXES_OFFSET = AXIS_COUNT_OFFSET + _AXIS_COUNT.size

# Mooncake's TensorDtype, by value: (torch attribute name, element size in bytes).
DTYPES: tuple[tuple[str, int], ...] = (
    ("float32", 4),
    ("float64", 8),
    ("int8", 1),
    ("uint8", 1),
    ("int16", 2),
    ("uint16", 2),
    ("int32", 4),
    ("uint32", 4),
    ("int64", 8),
    ("uint64", 8),
    ("bool", 1),
    ("float16", 2),
    ("bfloat16", 2),
    ("float8_e4m3fn", 1),
    ("float8_e5m2", 1),
)


class LayoutAxis(NamedTuple):
    """One parallelism axis of a shard (Mooncake's ``LayoutAxis``)."""

    kind: int
    axis_index: int
    shard_rank: int
    shard_count: int
    split_dim: int
    reserved0: int
    reserved1: int


class Header(NamedTuple):
    """A validated header; shapes hold only the ``ndim`` used dims, axes only ``axis_count``."""

    dtype: int
    ndim: int
    layout_kind: int
    data_offset: int
    data_bytes: int
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    axes: tuple[LayoutAxis, ...]


def is_tensor(obj: Any) -> bool:
    """Mooncake's test for a tensor argument: the class name contains "Tensor"."""
    return "Tensor" in obj.__class__.__name__


def tp_key(key: str, rank: int) -> str:
    """The key Mooncake's ``*_with_tp`` methods use for TP rank ``rank`` of ``key``."""
    return f"{key}_tp_{rank}"


def dtype_code(dtype: Any) -> Optional[int]:
    """Mooncake's ``TensorDtype`` value for a torch dtype, or None if Mooncake cannot store it."""
    import torch

    for code, (name, _) in enumerate(DTYPES):
        if getattr(torch, name, None) == dtype:
            return code
    return None


def _torch_dtype(code: int) -> Any:
    """The torch dtype for a valid ``TensorDtype`` value; None if this torch lacks it."""
    import torch

    return getattr(torch, DTYPES[code][0], None)


def pack(
    tensor: Any, *, shard: Optional[tuple[int, int, int, Sequence[int]]] = None
) -> tuple[bytes, memoryview]:
    """Serialize ``tensor`` as Mooncake does: ``(header bytes, memoryview of the data)``.

    The object is ``header + data``. The data is the C-contiguous tensor's bytes; when the tensor
    is already a contiguous CPU tensor the memoryview shares its memory (no copy) and keeps it
    alive. Non-contiguous tensors are made contiguous and device tensors are copied to the host,
    because the bytes must be in C order in host memory.

    ``shard`` = ``(rank, count, split_dim, global_shape)`` marks ``tensor`` as TP shard ``rank``
    of ``count`` of a tensor of ``global_shape``, split along ``split_dim``, as Mooncake's
    ``put_tensor_with_tp`` writes each shard.

    Raises ValueError for what Mooncake's put refuses (-600): a non-tensor, an unsupported
    dtype, more than 8 dims, or an impossible shard description.
    """
    if not is_tensor(tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    code = dtype_code(tensor.dtype)
    if code is None:
        supported = ", ".join(name for name, _ in DTYPES)
        raise ValueError(f"unsupported tensor dtype {tensor.dtype}; Mooncake stores {supported}")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"tensor has {tensor.dim()} dims; Mooncake stores at most {MAX_DIMS}")

    data = _host_bytes(tensor)
    local_shape = tuple(tensor.shape)
    if shard is None:
        header = _build_header(code, local_shape, local_shape, LAYOUT_FULL, (), data.nbytes)
    else:
        axis, global_shape = _tp_axis(shard, local_shape)
        header = _build_header(code, global_shape, local_shape, LAYOUT_SHARD, (axis,), data.nbytes)
    return header, data


def _host_bytes(tensor: Any) -> memoryview:
    """The tensor's C-contiguous bytes as a flat byte memoryview that keeps the tensor alive.

    Viewing as uint8 first is what lets bfloat16 and float8 (no numpy dtype) through numpy.
    """
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def _tp_axis(
    shard: tuple[int, int, int, Sequence[int]], local_shape: tuple[int, ...]
) -> tuple[LayoutAxis, tuple[int, ...]]:
    """The TP ``LayoutAxis`` and global shape for ``pack``'s ``shard`` argument.

    Rejects what would make a header that Mooncake's reader refuses.
    """
    rank, count, split_dim, global_shape = shard
    global_shape = tuple(int(d) for d in global_shape)
    if len(global_shape) != len(local_shape):
        raise ValueError(
            f"shard global_shape {global_shape} has {len(global_shape)} dims, "
            f"the tensor has {len(local_shape)}"
        )
    if any(d < 0 for d in global_shape):
        raise ValueError(f"shard global_shape {global_shape} has a negative dim")
    if not 0 <= rank < count:
        raise ValueError(f"shard rank {rank} is not in [0, {count})")
    if not 0 <= split_dim < len(local_shape):
        raise ValueError(f"shard split_dim {split_dim} is not in [0, {len(local_shape)})")
    axis = LayoutAxis(AXIS_TP, 0, rank, count, split_dim, 0, local_shape[split_dim])
    return axis, global_shape


def _padded(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape as the 8 slots Mooncake stores: the dims, then -1."""
    return tuple(shape) + (-1,) * (MAX_DIMS - len(shape))


def _build_header(
    code: int,
    global_shape: Sequence[int],
    local_shape: Sequence[int],
    layout_kind: int,
    axes: Sequence[LayoutAxis],
    data_bytes: int,
) -> bytes:
    """Mooncake's ``BuildTensorMetadata`` with ``data_bytes`` filled in; unused axes are zero."""
    buf = bytearray(HEADER_SIZE)
    _OBJECT_HEADER.pack_into(
        buf, 0, MAGIC, VERSION, HEADER_SIZE, code, len(local_shape), layout_kind, 0,
        HEADER_SIZE, data_bytes,
    )
    _SHAPE.pack_into(buf, GLOBAL_SHAPE_OFFSET, *_padded(global_shape))
    _SHAPE.pack_into(buf, LOCAL_SHAPE_OFFSET, *_padded(local_shape))
    _AXIS_COUNT.pack_into(buf, AXIS_COUNT_OFFSET, len(axes), 0)
    for i, axis in enumerate(axes):
        _AXIS.pack_into(buf, AXES_OFFSET + i * _AXIS.size, *axis)
    return bytes(buf)


def read_header(buf: Any) -> Optional[Header]:
    """Parse and validate the header of the object ``buf`` (exactly the object's bytes).

    Applies every check of Mooncake's ``ValidateTensorMetadata`` with ``total_length =
    len(buf)``, so anything Mooncake's ``get_tensor`` or ``put_tensor_from`` refuses gives None.
    """
    view = memoryview(buf).cast("B")
    total = view.nbytes
    if total < HEADER_SIZE:
        return None
    (magic, version, header_size, dtype, ndim, layout_kind, _flags, data_offset,
     data_bytes) = _OBJECT_HEADER.unpack_from(view, 0)
    if (magic, version, header_size) != (MAGIC, VERSION, HEADER_SIZE):
        return None
    if not 0 <= dtype < len(DTYPES) or not 0 <= ndim <= MAX_DIMS:
        return None
    axis_count, _ = _AXIS_COUNT.unpack_from(view, AXIS_COUNT_OFFSET)
    if axis_count > MAX_AXES or layout_kind > LAYOUT_SHARD:
        return None
    if not HEADER_SIZE <= data_offset <= total or data_bytes != total - data_offset:
        return None
    global_slots = _SHAPE.unpack_from(view, GLOBAL_SHAPE_OFFSET)
    local_slots = _SHAPE.unpack_from(view, LOCAL_SHAPE_OFFSET)
    if not _valid_shape(global_slots, ndim) or not _valid_shape(local_slots, ndim):
        return None
    local_shape = local_slots[:ndim]
    if data_bytes != math.prod(local_shape) * DTYPES[dtype][1]:
        return None
    axes = tuple(
        LayoutAxis(*_AXIS.unpack_from(view, AXES_OFFSET + i * _AXIS.size))
        for i in range(axis_count)
    )
    if not all(_valid_axis(axis, ndim) for axis in axes):
        return None
    return Header(dtype, ndim, layout_kind, data_offset, data_bytes, global_slots[:ndim],
                  local_shape, axes)


def _valid_shape(slots: tuple[int, ...], ndim: int) -> bool:
    """Used dims are >= 0 and every unused slot is exactly -1, as Mooncake requires."""
    return all(d >= 0 for d in slots[:ndim]) and all(d == -1 for d in slots[ndim:])


def _valid_axis(axis: LayoutAxis, ndim: int) -> bool:
    """Mooncake's per-axis checks: a known kind, rank within count, split_dim -1 or a dim."""
    return (
        AXIS_DP <= axis.kind <= AXIS_RESERVED
        and 0 <= axis.shard_rank < axis.shard_count
        and -1 <= axis.split_dim < ndim
    )


def unpack(buf: Any) -> Optional[torch.Tensor]:
    """Decode a stored object into a CPU tensor that owns a copy of the data; None if invalid.

    ``buf`` is any bytes-like object holding exactly the object's bytes. The copy lets the
    caller reuse its buffer. The tensor has the header's local shape and dtype; an empty
    tensor comes back as ``torch.empty(shape, dtype)``, as in Mooncake.

    Mooncake's own ``get_tensor`` returns a 0-d object as shape ``(1,)`` (it skips the reshape
    when ndim is 0); this returns the stored 0-d shape.
    """
    view = memoryview(buf).cast("B")
    header = read_header(view)
    if header is None:
        return None
    return _as_tensor(header, view, copy=True)


def unpack_view(address_or_buffer: Any, size: int) -> Optional[torch.Tensor]:
    """Decode the object of ``size`` bytes at the start of caller memory, viewing its data.

    Like Mooncake's ``get_tensor_into``: the tensor views the caller's memory at
    ``data_offset`` (no copy, no ownership), so writes to either side show in the other.
    ``address_or_buffer`` is a writable buffer-protocol object (a numpy array, bytearray,
    ctypes array, ...), which the tensor keeps alive, or an int address, whose memory the
    caller must keep alive for the tensor's lifetime. Returns None for a null address, a
    ``size`` beyond the buffer, or an invalid object; empty tensors are fresh, as in Mooncake.

    Raises ValueError for a read-only buffer, which a tensor view could not write to.
    """
    if isinstance(address_or_buffer, int):
        if address_or_buffer == 0 or size < 0:
            return None
        view = memoryview((ctypes.c_ubyte * size).from_address(address_or_buffer)).cast("B")
    else:
        view = memoryview(address_or_buffer).cast("B")
        if view.readonly:
            raise ValueError("unpack_view needs a writable buffer; unpack() copies read-only ones")
        if not 0 <= size <= view.nbytes:
            return None
        view = view[:size]
    header = read_header(view)
    if header is None:
        return None
    return _as_tensor(header, view, copy=False)


def _as_tensor(header: Header, view: memoryview, *, copy: bool) -> Optional[torch.Tensor]:
    """A tensor of the header's shape and dtype over the data in ``view`` (copied if ``copy``).

    Goes through a uint8 numpy array because numpy has no bfloat16 or float8; ``view(dtype)``
    then reinterprets the bytes without copying.
    """
    import numpy as np
    import torch

    dtype = _torch_dtype(header.dtype)
    if dtype is None:
        return None
    if header.data_bytes == 0:
        return torch.empty(header.local_shape, dtype=dtype)
    data = np.frombuffer(view, np.uint8, header.data_bytes, header.data_offset)
    if copy:
        data = data.copy()
    return torch.from_numpy(data).view(dtype).reshape(header.local_shape)


def tp_shards(tensor: Any, tp_size: int, split_dim: int) -> Optional[list[torch.Tensor]]:
    """Mooncake's TP split of ``tensor``: ``tp_size`` contiguous shards, or None if refused.

    Shard ``r`` is ``tensor.narrow(split_dim, dim*r//n, dim*(r+1)//n - dim*r//n)``. Mooncake
    only allows uniform splits: ``tp_size > 0``, ``0 <= split_dim < ndim`` (a negative
    ``split_dim`` is not normalised) and the dim divisible by ``tp_size``.
    """
    if not is_tensor(tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tp_size <= 0 or not 0 <= split_dim < tensor.dim():
        return None
    dim = tensor.shape[split_dim]
    if dim % tp_size != 0:
        return None
    shards = []
    for rank in range(tp_size):
        start = dim * rank // tp_size
        end = dim * (rank + 1) // tp_size
        shards.append(tensor.narrow(split_dim, start, end - start).contiguous())
    return shards


# ---------------------------------------------------------------------------------------------
# Parallelism layouts: multi-axis shard headers and the 96-byte manifests Mooncake writes next
# to them (``store_py_internal.h``: ``WriterShardManifest``, ``ParallelismManifest``).

AXIS_KIND_NAMES = ("dp", "tp", "ep", "pp")

MANIFEST_SIZE = 96
MANIFEST_MAGIC = 0x574D414E
MANIFEST_VERSION = 1
_MANIFEST_HEADER = struct.Struct("<IHHiiiii")
_MANIFEST_SHAPE_OFFSET = 32


class Manifest(NamedTuple):
    """A parsed manifest: the full tensor's dtype and shape, its split dim and shard count."""

    dtype: int
    split_dim: int
    shard_count: int
    global_shape: tuple[int, ...]


def pack_layout(
    tensor: Any, global_shape: Sequence[int], axes: Sequence[LayoutAxis]
) -> tuple[bytes, memoryview]:
    """Like :func:`pack`, for a SHARD object of ``global_shape`` with any axes (up to 4).

    Raises ValueError for what Mooncake's put refuses (see :func:`pack`)."""
    header, data = pack(tensor)
    code = struct.unpack_from("<i", header, 8)[0]
    if len(axes) > MAX_AXES or len(global_shape) != tensor.dim():
        raise ValueError("invalid shard layout")
    return shard_header(code, global_shape, tuple(tensor.shape), axes, data.nbytes), data


def shard_header(
    code: int,
    global_shape: Sequence[int],
    local_shape: Sequence[int],
    axes: Sequence[LayoutAxis],
    data_bytes: int,
    layout_kind: int = LAYOUT_SHARD,
) -> bytes:
    """Mooncake's ``BuildTensorMetadata`` for a shard (or, with LAYOUT_FULL, a full tensor)."""
    return _build_header(code, tuple(global_shape), tuple(local_shape), layout_kind, tuple(axes), data_bytes)


def pack_manifest(dtype: int, global_shape: Sequence[int], split_dim: int, shard_count: int) -> bytes:
    """A manifest's 96 bytes: ``{u32 magic, u16 version, u16 size, i32 dtype, i32 ndim,
    i32 split_dim, i32 shard_count, i32 reserved0}``, 4 pad bytes, ``i64 global_shape[8]``."""
    buf = bytearray(MANIFEST_SIZE)
    _MANIFEST_HEADER.pack_into(
        buf, 0, MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE, dtype, len(global_shape),
        split_dim, shard_count, 0,
    )
    _SHAPE.pack_into(buf, _MANIFEST_SHAPE_OFFSET, *_padded(global_shape))
    return bytes(buf)


def read_manifest(buf: Any) -> Optional[Manifest]:
    """Parse a manifest with Mooncake's checks (``parse_writer_shard_manifest``); None if
    invalid."""
    if buf is None:
        return None
    view = memoryview(buf).cast("B")
    if view.nbytes < MANIFEST_SIZE:
        return None
    magic, version, size, dtype, ndim, split_dim, count, _ = _MANIFEST_HEADER.unpack_from(view, 0)
    if (magic, version, size) != (MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE):
        return None
    if not 0 <= ndim <= MAX_DIMS or count <= 0 or not 0 <= split_dim < ndim:
        return None
    shape = _SHAPE.unpack_from(view, _MANIFEST_SHAPE_OFFSET)[:ndim]
    if any(d < 0 for d in shape):
        return None
    return Manifest(dtype, split_dim, count, tuple(shape))


def shard_range(dim: int, rank: int, count: int) -> tuple[int, int]:
    """Mooncake's ``calculate_shard_range``: (start, extent) of shard ``rank`` of ``count``."""
    if dim < 0 or count <= 0 or not 0 <= rank < count:
        return 0, 0
    start = dim * rank // count
    return start, dim * (rank + 1) // count - start
