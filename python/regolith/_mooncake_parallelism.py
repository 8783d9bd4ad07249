"""Mooncake's parallelism tensor methods of ``MooncakeDistributedStore`` (a mixin beside
``TensorMethods``): ``*_tensor_with_parallelism*`` with Mooncake 0.3.13.post1's key names, object
bytes and manifests (multi-axis shards, writer partitions), and reads that return a shard as
stored, this rank's shard, or the full tensor (joining or resharding TP shards); the request
classes ``ParallelAxis``, ``TensorParallelism`` and ``ReadTarget``. The routes follow Mooncake's
``store_py_parallel_write.h`` and ``store_py_parallel_read.h``."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from . import _tensor
from ._mooncake_tensors import _as_mooncake_shape, _publishable, _tp_name
from ._mooncake_types import INVALID_PARAMS, OK
from ._native import RegolithError, ReplicateConfig

logger = logging.getLogger("regolith.mooncake")


class ParallelismMethods:
    """The parallelism half of the tensor API; the store provides ``TensorMethods`` and the
    put, get and get_into calls."""


    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._par_write("put_tensor_with_parallelism", key, tensor, parallelism, config, writer_partition, False)

    def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._par_write("upsert_tensor_with_parallelism", key, tensor, parallelism, config, writer_partition, True)

    def batch_put_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._par_batch_write(
            "batch_put_tensor_with_parallelism", keys, tensors_list, parallelisms, config,
            writer_partitions, False, False,
        )

    def batch_upsert_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._par_batch_write(
            "batch_upsert_tensor_with_parallelism", keys, tensors_list, parallelisms, config,
            writer_partitions, True, False,
        )

    def put_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._par_write(
            "put_tensor_with_parallelism_from", key, (buffer_ptr, size), parallelism, config,
            writer_partition, False, source=True,
        )

    def upsert_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._par_write(
            "upsert_tensor_with_parallelism_from", key, (buffer_ptr, size), parallelism, config,
            writer_partition, True, source=True,
        )

    def batch_put_tensor_with_parallelism_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._par_batch_write(
            "batch_put_tensor_with_parallelism_from", keys, (buffer_ptrs, sizes), parallelisms,
            config, writer_partitions, False, True,
        )

    def batch_upsert_tensor_with_parallelism_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._par_batch_write(
            "batch_upsert_tensor_with_parallelism_from", keys, (buffer_ptrs, sizes), parallelisms,
            config, writer_partitions, True, True,
        )

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor a ReadTarget asks for: as stored (no target), one shard (``"shard"``:
        the stored shard, else cut from the shards Mooncake's manifests describe, resharding
        to another TP size), or the whole tensor (``"full"``: joined from TP shards, or with
        no parallelism from writer partitions). None when Mooncake's answers None."""
        plan = self._par_read_plan("get_tensor_with_parallelism", key, target)
        if plan is None:
            return None
        if plan[0] == "key":
            return self.get_tensor(plan[1])
        return _as_mooncake_shape(plan[2])

    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any:
        """As :meth:`get_tensor_with_parallelism`, into a registered buffer: the object
        (header, then data) is written at ``buffer_ptr`` and the tensor views it; None if it
        does not fit or the read fails."""
        what = "get_tensor_with_parallelism_into"
        plan = self._par_read_plan(what, key, target, into=True)
        if plan is None:
            return None
        if plan[0] == "key":
            n = self.get_into(plan[1], buffer_ptr, size) if buffer_ptr else INVALID_PARAMS
            return None if n < 0 else _as_mooncake_shape(_tensor.unpack_view(buffer_ptr, n))
        header, t = plan[1], plan[2]
        data = _tensor._host_bytes(t)
        total = len(header) + data.nbytes
        if not buffer_ptr or total > size:
            return None
        try:
            self._c().read_from(buffer_ptr, bytearray(total))  # the range must be registered
            self._c().write_into(buffer_ptr, header)
            if data.nbytes:
                self._c().write_into(buffer_ptr + len(header), data)
        except RegolithError as e:
            self._fail(what, e)
            return None
        return _as_mooncake_shape(_tensor.unpack_view(buffer_ptr, total))

    def batch_get_tensor_with_parallelism_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], targets: Any = None
    ) -> list[Any]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [None] * len(keys)
        if targets is not None and (not isinstance(targets, list) or len(targets) != len(keys)):
            return [None] * len(keys)
        tl = targets if targets is not None else [None] * len(keys)
        return [
            self.get_tensor_with_parallelism_into(k, p, n, t)
            for k, p, n, t in zip(keys, buffer_ptrs, sizes, tl)
        ]

    # -- parallelism writes

    def _par_batch_write(
        self,
        what: str,
        keys: list[str],
        values: Any,
        parallelisms: Any,
        config: ReplicateConfig | None,
        writer_partitions: Any,
        upsert: bool,
        source: bool,
    ) -> list[int]:
        """Mooncake's batch routing: both request lists, a values list of another length, or
        a request list that is not a list of the keys' length make every key -600; with no
        requests the values are stored whole; otherwise each key is written on its own."""
        n = len(values[0]) if source else len(values)
        if parallelisms is not None and writer_partitions is not None or n != len(keys):
            return [INVALID_PARAMS] * len(keys)
        if source:
            items = list(zip(*values)) if len(values[0]) == len(values[1]) else None
        else:
            items = list(values)
        if parallelisms is None and writer_partitions is None:
            if source:
                if items is None:
                    return [INVALID_PARAMS] * len(keys)
                if not _publishable(config):
                    return [INVALID_PARAMS] * len(keys)
                return self._put_tensor_objects(what, keys, values[0], values[1], upsert, config)
            if not _publishable(config):
                return [INVALID_PARAMS] * len(keys)
            return self._put_tensors(what, keys, items, config, upsert=upsert)
        reqs = parallelisms if parallelisms is not None else writer_partitions
        if not isinstance(reqs, list) or len(reqs) != len(keys) or items is None:
            return [INVALID_PARAMS] * len(keys)
        return [
            self._par_write(
                what, k, v,
                r if parallelisms is not None else None, config,
                r if writer_partitions is not None else None, upsert, source=source,
            )
            for k, v, r in zip(keys, items, reqs)
        ]

    def _par_write(
        self,
        what: str,
        key: str,
        value: Any,
        parallelism: Any,
        config: ReplicateConfig | None,
        writer_partition: Any,
        upsert: bool,
        *,
        source: bool = False,
    ) -> int:
        """One key's write: the route Mooncake's ``resolve_parallelism_write_request`` picks.
        ``value`` is a tensor, or with ``source`` a ``(buffer_ptr, size)`` tensor object."""
        if writer_partition is not None:
            if parallelism is not None:
                return INVALID_PARAMS
            writer = _parse_writer(writer_partition)
            if writer is None:
                return INVALID_PARAMS
            route = "writer"
        elif parallelism is None:
            if not _publishable(config):
                return INVALID_PARAMS
            if source:
                return self._put_tensor_objects(what, [key], [value[0]], [value[1]], upsert, config)[0]
            return self._put_tensors(what, [key], [value], config, upsert=upsert)[0]
        else:
            axes = _validate(_parse_parallelism(parallelism))
            if axes is None:
                return INVALID_PARAMS
            route = "tp" if any(a.kind == _tensor.AXIS_TP for a in axes) else "generic"

        if source:
            obj = self._tensor_object_at(what, value[0], value[1])
            header = None if obj is None else _tensor.read_header(obj)
            if header is None:
                return INVALID_PARAMS
            full = _tensor.unpack(obj)
            if route == "writer":
                writes = _writer_writes(key, full, writer, header)
            elif route == "tp":
                writes = _tp_all_writes(key, full, axes, header)
            else:
                writes = _generic_writes(key, full, axes, header)
        else:
            tensor = value
            shape = tuple(tensor.shape)  # Mooncake reads .shape / .dtype first: a non-tensor raises
            code = _tensor.dtype_code(tensor.dtype)
            if code is None or not _tensor.is_tensor(tensor) or len(shape) > _tensor.MAX_DIMS:
                return INVALID_PARAMS
            if route == "writer":
                writes = _writer_writes(key, tensor, writer, None)
            elif route == "generic":
                writes = _generic_writes(key, tensor, axes, None)
            elif len(axes) == 1:
                writes = _tp_local_writes(key, tensor, axes)
            else:
                writes = _tp_requested_writes(key, tensor, axes)
        if writes is None:
            return INVALID_PARAMS
        for k, parts in writes:
            code = self._put_object_parts(what, k, parts, config, upsert)
            if code != OK:
                return code
        return OK

    def _put_object_parts(
        self, what: str, key: str, parts: list, config: ReplicateConfig | None, upsert: bool
    ) -> int:
        args = ([key], [parts], None, config)
        if upsert:
            return self._codes(what, 1, "batch_put_parts", *args, upsert=True)[0]
        return self._put_codes(what, 1, "batch_put_parts", *args)[0]

    # -- parallelism reads

    def _par_read_plan(self, what: str, key: str, target: Any, *, into: bool = False) -> Any:
        """What a read returns: ``("key", k)`` (the object at ``k`` as stored), ``("made",
        header, tensor)`` (a tensor joined or cut from shards, with the header Mooncake writes
        before it), or None."""
        parsed = _parse_target(target)
        if parsed is None:
            return None
        mode, par = parsed
        if mode == "as_stored" and par is None:
            return ("key", key)
        if mode == "full" and par is None:
            made = self._writer_full(key)
            if made is None:
                return ("key", key)
            return None if made[0] == "none" else made
        axes = _validate(par)
        if axes is None:
            return None
        tp = next((a for a in axes if a.kind == _tensor.AXIS_TP), None)
        if mode == "shard":
            direct = _par_key(key, axes)
            if _matches(axes, self._header_at(direct)):
                return ("key", direct)
            if len(axes) == 1 and tp is not None:
                wkey = _writer_key(key, tp.rank, tp.size, tp.split_dim)
                h = self._header_at(wkey)
                if h is not None and len(_stored_axes(h) or ()) == 1 and _matches(axes, h):
                    return ("key", wkey)
            if tp is not None:
                made = self._reconstruct(key, axes, shard=True)
                if made is not None:
                    return made
                if len(axes) == 1:
                    return ("key", _tp_name(key, tp.rank, tp.size))
            return None
        if mode == "full":
            if tp is None:
                return None
            return self._reconstruct(key, axes, shard=False)
        return None  # as_stored with a parallelism: Mooncake has no such route

    def _header_at(self, key: str) -> Any:
        h = self.get_buffer(key)
        return None if h is None else _tensor.read_header(h)

    def _objects(self, keys: list[str]) -> list[Any] | None:
        """The shard objects (header, tensor) at ``keys``; None if any is missing or invalid."""
        out = []
        for h in self.batch_get_buffer(keys):
            header = None if h is None else _tensor.read_header(h)
            if header is None:
                return None
            out.append((header, _tensor.unpack(h)))
        return out

    def _writer_full(self, key: str) -> Any:
        """The full tensor from writer partitions (``key__writer_manifest``); None if there is
        no complete set of them (the caller then reads ``key`` itself)."""
        m = _tensor.read_manifest(self.get_buffer(f"{key}__writer_manifest"))
        if m is None:
            return None
        keys = [_writer_key(key, r, m.shard_count, m.split_dim) for r in range(m.shard_count)]
        sources = self._objects(keys)
        if sources is None:
            return None
        for r, (h, _) in enumerate(sources):
            axes = _stored_axes(h)
            if (
                axes is None or len(axes) != 1 or axes[0].kind != _tensor.AXIS_TP
                or (axes[0].rank, axes[0].size, axes[0].split_dim) != (r, m.shard_count, m.split_dim)
            ):
                return None
        return _assemble(sources, m.global_shape, m.split_dim, m.dtype, None) or ("none",)

    def _reconstruct(self, key: str, axes: tuple, *, shard: bool) -> Any:
        """Mooncake's ``load_parallelism_full_reconstruction_sources``, then the full tensor
        or (``shard``) the requested TP rank's part of it."""
        rec = self._manifest_sources(key, axes) or self._tp_sources(key, axes)
        if rec is None:
            return None
        sources, global_shape, split_dim, dtype = rec
        made = _assemble(sources, global_shape, split_dim, dtype, axes if shard else None)
        return made

    def _manifest_sources(self, key: str, axes: tuple) -> Any:
        tp = next(a for a in axes if a.kind == _tensor.AXIS_TP)
        m = _tensor.read_manifest(self.get_buffer(f"{key}__parallelism_manifest"))
        if m is None or tp.split_dim != m.split_dim:
            return None
        dim = m.global_shape[m.split_dim]
        if not _uniform(dim, tp.size) or not _uniform(dim, m.shard_count):
            return None
        canon = _canonical(axes)
        shard_specs = [
            tuple(a._replace(rank=r, size=m.shard_count) if a.kind == _tensor.AXIS_TP else a for a in canon)
            for r in range(m.shard_count)
        ]
        sources = self._objects([_par_key(key, s) for s in shard_specs])
        if sources is None:
            return None
        for spec, (h, _) in zip(shard_specs, sources):
            if not _tp_compatible(spec, h):
                return None
        return sources, m.global_shape, m.split_dim, m.dtype

    def _tp_sources(self, key: str, axes: tuple) -> Any:
        tp = next(a for a in axes if a.kind == _tensor.AXIS_TP)
        canon = _canonical(axes)
        if len(canon) == 1:
            first = self._header_at(_tp_name(key, 0, tp.size))
            stored = None if first is None else _layout_tp(first)
            if stored is None or tp.split_dim != stored.split_dim:
                return None
            global_shape, sd, count = first.global_shape, stored.split_dim, stored.shard_count
            if not _uniform(global_shape[sd], tp.size) or not _uniform(global_shape[sd], count):
                return None
            sources = self._objects([_tp_name(key, r, count) for r in range(count)])
            if sources is None:
                return None
            for r, (h, _) in enumerate(sources):
                a = _layout_tp(h)
                if a is None or (a.shard_rank, a.shard_count, a.split_dim) != (r, count, sd):
                    return None
            return sources, global_shape, sd, first.dtype
        specs = [
            tuple(a._replace(rank=r) if a.kind == _tensor.AXIS_TP else a for a in canon)
            for r in range(tp.size)
        ]
        sources = self._objects([_par_key(key, s) for s in specs])
        if sources is None:
            return None
        for spec, (h, _) in zip(specs, sources):
            if not _tp_compatible(spec, h):
                return None
        first = sources[0][0]
        stored = _layout_tp(first)
        if stored is None or tp.split_dim != stored.split_dim:
            return None
        if not _uniform(first.global_shape[stored.split_dim], tp.size):
            return None
        return sources, first.global_shape, stored.split_dim, first.dtype


# ---------------------------------------------------------------------------------------------
# The parallelism request classes Mooncake's module exports (``mooncake.store.ParallelAxis``,
# ``TensorParallelism``, ``ReadTarget``). Mooncake's take no constructor arguments and are
# filled in by attribute; these also take them as keywords. Requests are read by attribute, so
# Mooncake's own objects (or any object with these attributes) work as well.


class ParallelAxis:
    """One axis of a tensor's parallel layout: ``kind`` "tp", "dp", "ep" or "pp" (any case),
    this writer's ``rank`` of ``size``; TP needs ``split_dim``, EP ``expert_id``, PP
    ``stage_id``."""

    def __init__(
        self,
        kind: str = "",
        rank: int = 0,
        size: int = 1,
        split_dim: int | None = None,
        expert_id: int | None = None,
        stage_id: int | None = None,
    ) -> None:
        self.kind = kind
        self.rank = rank
        self.size = size
        self.split_dim = split_dim
        self.expert_id = expert_id
        self.stage_id = stage_id

    def __repr__(self) -> str:
        extra = "".join(
            f", {n}={getattr(self, n)}" for n in ("split_dim", "expert_id", "stage_id") if getattr(self, n) is not None
        )
        return f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}{extra})"


class TensorParallelism:
    """A tensor's parallel layout: its axes (at most 4, one per kind)."""

    def __init__(self, axes: list[ParallelAxis] | None = None) -> None:
        self.axes = list(axes) if axes is not None else []

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


_READ_MODES = ("as_stored", "shard", "full")


class ReadTarget:
    """What a parallelism read returns: ``mode`` "as_stored" (default), "shard" or "full"
    (any case; read back in lower case), for the layout ``parallelism``."""

    def __init__(self, mode: str = "as_stored", parallelism: TensorParallelism | None = None) -> None:
        self.mode = mode
        self.parallelism = parallelism

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        m = str(mode).lower()
        if m not in _READ_MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = m

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


class _Axis(NamedTuple):
    kind: int
    rank: int
    size: int
    split_dim: int | None
    expert_id: int | None
    stage_id: int | None


class _Writer(NamedTuple):
    rank: int
    size: int
    split_dim: int


def _parse_kind(kind: Any) -> int | None:
    name = str(kind).lower()
    return _tensor.AXIS_KIND_NAMES.index(name) if name in _tensor.AXIS_KIND_NAMES else None


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _parse_parallelism(obj: Any) -> list[_Axis] | None:
    """Mooncake's ``parse_tensor_parallelism_spec``: None for no object, an object without
    ``axes``, or an axis without kind, rank and size or of an unknown kind."""
    if obj is None or not hasattr(obj, "axes"):
        return None
    out = []
    for a in list(obj.axes):
        if not all(hasattr(a, n) for n in ("kind", "rank", "size")):
            return None
        kind = _parse_kind(a.kind)
        if kind is None:
            return None
        out.append(_Axis(kind, int(a.rank), int(a.size), _opt_int(a.split_dim),
                         _opt_int(a.expert_id), _opt_int(a.stage_id)))
    return out


def _validate(axes: list[_Axis] | None) -> tuple[_Axis, ...] | None:
    """Mooncake's ``validate_parallelism_spec``: 1 to 4 axes of distinct kinds, each with
    ``0 <= rank < size``; TP with a split_dim, DP without; EP with an expert_id and PP with a
    stage_id, neither with a split_dim."""
    if not axes or len(axes) > _tensor.MAX_AXES:
        return None
    if len({a.kind for a in axes}) != len(axes):
        return None
    for a in axes:
        if a.size <= 0 or not 0 <= a.rank < a.size:
            return None
        if a.kind == _tensor.AXIS_TP and a.split_dim is None:
            return None
        if a.kind != _tensor.AXIS_TP and a.split_dim is not None:
            return None
        if a.kind == _tensor.AXIS_EP and a.expert_id is None:
            return None
        if a.kind == _tensor.AXIS_PP and a.stage_id is None:
            return None
    return tuple(axes)


def _parse_writer(obj: Any) -> _Writer | None:
    if not all(hasattr(obj, n) for n in ("rank", "size", "split_dim")):
        return None
    w = _Writer(int(obj.rank), int(obj.size), int(obj.split_dim))
    if w.size <= 0 or not 0 <= w.rank < w.size or w.split_dim < 0:
        return None
    return w


def _parse_target(target: Any) -> tuple[str, list[_Axis] | None] | None:
    if target is None:
        return "as_stored", None
    if not hasattr(target, "mode") or not hasattr(target, "parallelism"):
        return None
    mode = str(target.mode).lower()
    if mode not in _READ_MODES:
        return None
    if target.parallelism is None:
        return mode, None
    axes = _parse_parallelism(target.parallelism)
    return None if axes is None else (mode, axes)


def _canonical(axes: Any) -> tuple[_Axis, ...]:
    """Mooncake's canonical order: DP, TP, EP, PP."""
    return tuple(sorted(axes, key=lambda a: a.kind))


def _par_key(key: str, axes: Any) -> str:
    """Mooncake's ``get_parallelism_key_name``: ``key_tp_<r>`` for a lone TP axis, else
    ``key`` + ``__<kind>_<rank>of<size>[_sd<d>][_eid<e>][_sid<s>]`` per axis, canonical order."""
    if len(axes) == 1 and axes[0].kind == _tensor.AXIS_TP:
        return _tensor.tp_key(key, axes[0].rank)
    out = key
    for a in _canonical(axes):
        out += f"__{_tensor.AXIS_KIND_NAMES[a.kind]}_{a.rank}of{a.size}"
        if a.split_dim is not None:
            out += f"_sd{a.split_dim}"
        if a.expert_id is not None:
            out += f"_eid{a.expert_id}"
        if a.stage_id is not None:
            out += f"_sid{a.stage_id}"
    return out


def _writer_key(key: str, rank: int, size: int, split_dim: int) -> str:
    return f"{key}__writer_{rank}of{size}_sd{split_dim}"


def _uniform(dim: int, count: int) -> bool:
    return dim >= 0 and count > 0 and dim % count == 0


def _layout_axes(axes: Any, local_shape: tuple[int, ...]) -> tuple[_tensor.LayoutAxis, ...] | None:
    """Mooncake's ``build_shard_metadata_from_shapes`` axes: in the request's order, the local
    extent along each split dim, EP's expert id or PP's stage id in ``reserved0``."""
    out = []
    for i, a in enumerate(axes):
        extent = 0
        if a.split_dim is not None:
            if not 0 <= a.split_dim < len(local_shape):
                return None
            extent = local_shape[a.split_dim]
        r0 = a.expert_id if a.kind == _tensor.AXIS_EP and a.expert_id is not None else (
            a.stage_id if a.kind == _tensor.AXIS_PP and a.stage_id is not None else 0)
        out.append(_tensor.LayoutAxis(a.kind, i, a.rank, a.size,
                                      -1 if a.split_dim is None else a.split_dim, r0, extent))
    return tuple(out)


def _shard_object(tensor: Any, code: int, global_shape: Any, axes: Any) -> list | None:
    """``[header, data]`` of a SHARD object holding ``tensor``."""
    local = tuple(tensor.shape)
    layout = _layout_axes(axes, local)
    if layout is None or not axes or len(axes) > _tensor.MAX_AXES:
        return None
    data = _tensor._host_bytes(tensor)
    return [_tensor.shard_header(code, tuple(global_shape), local, layout, data.nbytes), data]


def _narrow(tensor: Any, split_dim: int, rank: int, size: int) -> Any:
    start, extent = _tensor.shard_range(tensor.shape[split_dim], rank, size)
    return tensor.narrow(split_dim, start, extent).contiguous()


def _tp_local_writes(key: str, tensor: Any, axes: tuple) -> list | None:
    """A lone TP axis: the tensor is this rank's shard; the full shape is its shape times the
    TP size along split_dim. The shard goes to ``key_tp_<rank>``, plus the manifest."""
    tp = axes[0]
    local = tuple(tensor.shape)
    if not 0 <= tp.split_dim < len(local):
        return None
    global_shape = list(local)
    global_shape[tp.split_dim] *= tp.size
    code = _tensor.dtype_code(tensor.dtype)
    obj = _shard_object(tensor, code, global_shape, axes)
    if obj is None:
        return None
    manifest = _tensor.pack_manifest(code, global_shape, tp.split_dim, tp.size)
    return [(_par_key(key, axes), obj), (f"{key}__parallelism_manifest", [manifest])]


def _tp_requested_writes(key: str, tensor: Any, axes: tuple) -> list | None:
    """TP with other axes: the tensor is the full one; this TP rank's part is stored under the
    canonical multi-axis key, plus the manifest."""
    tp = next(a for a in axes if a.kind == _tensor.AXIS_TP)
    shape = tuple(tensor.shape)
    if not 0 <= tp.split_dim < len(shape) or not _uniform(shape[tp.split_dim], tp.size):
        return None
    code = _tensor.dtype_code(tensor.dtype)
    obj = _shard_object(_narrow(tensor, tp.split_dim, tp.rank, tp.size), code, shape, axes)
    if obj is None:
        return None
    manifest = _tensor.pack_manifest(code, shape, tp.split_dim, tp.size)
    return [(_par_key(key, axes), obj), (f"{key}__parallelism_manifest", [manifest])]


def _generic_writes(key: str, tensor: Any, axes: tuple, header: Any) -> list | None:
    """No TP axis (DP, EP, PP): the tensor as it is, marked with the axes, under the canonical
    key; no manifest. From a buffer the object's own global and local shapes are kept."""
    code = _tensor.dtype_code(tensor.dtype) if header is None else header.dtype
    global_shape = tuple(tensor.shape) if header is None else header.global_shape
    obj = _shard_object(tensor, code, global_shape, axes)
    return None if obj is None else [(_par_key(key, axes), obj)]


def _writer_writes(key: str, tensor: Any, w: _Writer, header: Any) -> list | None:
    """A writer partition: the writer's part of the full tensor at
    ``key__writer_<r>of<n>_sd<d>`` (a TP shard), plus ``key__writer_manifest``."""
    shape = tuple(tensor.shape)
    if header is not None and header.global_shape != shape:
        return None
    if not 0 <= w.split_dim < len(shape) or not _uniform(shape[w.split_dim], w.size):
        return None
    code = _tensor.dtype_code(tensor.dtype) if header is None else header.dtype
    axis = (_Axis(_tensor.AXIS_TP, w.rank, w.size, w.split_dim, None, None),)
    obj = _shard_object(_narrow(tensor, w.split_dim, w.rank, w.size), code, shape, axis)
    if obj is None:
        return None
    manifest = _tensor.pack_manifest(code, shape, w.split_dim, w.size)
    return [(_writer_key(key, w.rank, w.size, w.split_dim), obj), (f"{key}__writer_manifest", [manifest])]


def _tp_all_writes(key: str, full: Any, axes: tuple, header: Any) -> list | None:
    """From a buffer with a TP axis: the object is the full tensor; every TP rank's part is
    stored (under the key for that rank), and no manifest."""
    tp = next(a for a in axes if a.kind == _tensor.AXIS_TP)
    shape = header.global_shape
    if header.local_shape != shape:
        return None
    if not 0 <= tp.split_dim < len(shape) or not _uniform(shape[tp.split_dim], tp.size):
        return None
    out = []
    for r in range(tp.size):
        shard_axes = tuple(a._replace(rank=r) if a is tp else a for a in axes)
        obj = _shard_object(_narrow(full, tp.split_dim, r, tp.size), header.dtype, shape, shard_axes)
        if obj is None:
            return None
        out.append((_par_key(key, shard_axes), obj))
    return out


def _stored_axes(h: Any) -> tuple[_Axis, ...] | None:
    """The layout of a stored SHARD object as request axes (Mooncake's
    ``parallelism_from_metadata``), in canonical order; None for a FULL object."""
    if h is None or h.layout_kind != _tensor.LAYOUT_SHARD:
        return None
    return _canonical(
        _Axis(a.kind, a.shard_rank, a.shard_count, a.split_dim if a.split_dim >= 0 else None,
              a.reserved0 if a.kind == _tensor.AXIS_EP else None,
              a.reserved0 if a.kind == _tensor.AXIS_PP else None)
        for a in h.axes
    )


def _matches(axes: tuple, h: Any) -> bool:
    stored = _stored_axes(h)
    return stored is not None and stored == _canonical(axes)


def _tp_compatible(spec: tuple, h: Any) -> bool:
    """A stored shard fits a (canonical) request but for its TP rank."""
    stored = _stored_axes(h)
    if stored is None or len(stored) != len(spec):
        return False
    for want, got in zip(spec, stored):
        if want.kind != got.kind:
            return False
        if want.kind == _tensor.AXIS_TP:
            if (want.size, want.split_dim, want.expert_id, want.stage_id) != (
                got.size, got.split_dim, got.expert_id, got.stage_id):
                return False
        elif want != got:
            return False
    return True


def _layout_tp(h: Any) -> Any:
    if h is None or h.layout_kind != _tensor.LAYOUT_SHARD:
        return None
    return next((a for a in h.axes if a.kind == _tensor.AXIS_TP), None)


def _assemble(sources: list, global_shape: tuple, split_dim: int, dtype: int, shard_axes: Any) -> Any:
    """The full tensor (``shard_axes`` None) or the requested TP rank's part of it, from TP
    shards: ``("made", header, tensor)``, or None where Mooncake's reconstruction fails."""
    import torch

    if not 0 <= split_dim < len(global_shape):
        return None
    dim = global_shape[split_dim]
    if shard_axes is None:
        start, extent = 0, dim
    else:
        tp = next(a for a in shard_axes if a.kind == _tensor.AXIS_TP)
        start, extent = _tensor.shard_range(dim, tp.rank, tp.size)
    target = list(global_shape)
    target[split_dim] = extent
    torch_dtype = _tensor._torch_dtype(dtype) if 0 <= dtype < len(_tensor.DTYPES) else None
    if torch_dtype is None:
        return None
    out = torch.empty(target, dtype=torch_dtype)
    covered = [False] * extent
    for h, t in sources:
        if h.dtype != dtype or len(h.local_shape) != len(global_shape):
            return None
        if any(h.local_shape[d] != global_shape[d] for d in range(len(global_shape)) if d != split_dim):
            return None
        a = _layout_tp(h)
        if a is None or a.split_dim != split_dim or not _uniform(dim, a.shard_count):
            return None
        s_start, s_extent = _tensor.shard_range(dim, a.shard_rank, a.shard_count)
        if h.local_shape[split_dim] != s_extent:
            return None
        lo, hi = max(s_start, start), min(s_start + s_extent, start + extent)
        if hi <= lo:
            continue
        out.narrow(split_dim, lo - start, hi - lo).copy_(t.narrow(split_dim, lo - s_start, hi - lo))
        for i in range(lo - start, hi - start):
            covered[i] = True
    if not all(covered):
        return None
    nbytes = out.numel() * _tensor.DTYPES[dtype][1]
    if shard_axes is None:
        header = _tensor.shard_header(dtype, global_shape, global_shape, (), nbytes, _tensor.LAYOUT_FULL)
    else:
        layout = _layout_axes(shard_axes, tuple(target))
        if layout is None:
            return None
        header = _tensor.shard_header(dtype, global_shape, target, layout, nbytes)
    return ("made", header, out)
