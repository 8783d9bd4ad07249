"""Mooncake's tensor methods of ``MooncakeDistributedStore`` (a mixin): objects in Mooncake's
tensor layout (``regolith._tensor``: a 304-byte header, then the tensor's bytes), put as two
pieces without a joined copy and read back as CPU tensors; tensor-parallel shards under
Mooncake's ``key_tp_r`` names; safetensors files (the parallelism forms are
``_mooncake_parallelism``). torch is needed only by the calls that take or return tensors."""

from __future__ import annotations

import logging
from typing import Any

from . import _tensor
from ._mooncake_types import FILE_NOT_FOUND, INVALID_PARAMS, OK
from ._native import RegolithError, ReplicateConfig

logger = logging.getLogger("regolith.mooncake")

_CUDA_IPC = "CUDA IPC of Mooncake's dummy client; get_tensor_into reads into host memory"


class TensorMethods:
    """The tensor half of the store's API; the store provides ``_codes``, ``_put_codes``,
    ``_fail``, ``_unsupported``, ``_c``, the put, get and get_into calls."""


    def _put_tensors(
        self,
        what: str,
        keys: list[str],
        tensors: list[Any],
        config: ReplicateConfig | None = None,
        *,
        upsert: bool = False,
        shards: list[tuple | None] | None = None,
    ) -> list[int]:
        """Per key 0 or a code; a tensor Mooncake could not store (not a tensor, an
        unsupported dtype, more than 8 dims) is -600."""
        if len(keys) != len(tensors):
            return [INVALID_PARAMS] * len(keys)
        out: list[int] = [INVALID_PARAMS] * len(keys)
        idx, parts = [], []
        for i, t in enumerate(tensors):
            try:
                header, data = _tensor.pack(t, shard=shards[i] if shards else None)
            except ValueError as e:
                logger.warning("%s %r: %s", what, keys[i], e)
                continue
            idx.append(i)
            parts.append([header, data])
        if idx:
            args = ([keys[i] for i in idx], parts, None, config)
            codes = (
                self._codes(what, len(idx), "batch_put_parts", *args, upsert=True)
                if upsert
                else self._put_codes(what, len(idx), "batch_put_parts", *args)
            )
            for i, c in zip(idx, codes):
                out[i] = c
        return out

    def put_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensors("put_tensor", [key], [tensor])[0]

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._put_tensors("batch_put_tensor", keys, tensors_list)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensors("upsert_tensor", [key], [tensor], upsert=True)[0]

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, upsert=True)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self.batch_pub_tensor([key], [tensor], config)[0]

    def batch_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        if not _publishable(config):
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config)

    def upsert_pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self.batch_upsert_pub_tensor([key], [tensor], config)[0]

    def batch_upsert_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        if not _publishable(config):
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config, upsert=True)

    def get_tensor(self, key: str) -> Any:
        """The tensor (a CPU tensor owning its data), or None on a miss or an object that is
        not in the tensor layout."""
        h = self.get_buffer(key)
        return None if h is None else _as_mooncake_shape(_tensor.unpack(h))

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return [
            None if h is None else _as_mooncake_shape(_tensor.unpack(h))
            for h in self.batch_get_buffer(keys)
        ]

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the whole object (header included) into the registered buffer and returns a
        tensor viewing it (no copy: it lives as long as the buffer does); None on failure."""
        n = self.get_into(key, buffer_ptr, size) if buffer_ptr else INVALID_PARAMS
        return None if n < 0 else _as_mooncake_shape(_tensor.unpack_view(buffer_ptr, n))

    def batch_get_tensor_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[Any]:
        """Per key, a tensor viewing its buffer or None; a list of -600 when the lists differ
        in length or a pointer is null (as Mooncake's)."""
        if not len(keys) == len(buffer_ptrs) == len(sizes) or not all(buffer_ptrs):
            return [INVALID_PARAMS] * len(keys)
        return [
            None if n < 0 else _as_mooncake_shape(_tensor.unpack_view(p, n))
            for p, n in zip(buffer_ptrs, self.batch_get_into(keys, buffer_ptrs, sizes))
        ]

    def _tensor_object_at(self, what: str, buffer_ptr: int, size: int) -> memoryview | None:
        """The ``size`` bytes at a registered address, if they are one whole tensor object."""
        if not buffer_ptr or size < _tensor.HEADER_SIZE:
            return None
        head = bytearray(_tensor.HEADER_SIZE)
        try:
            self._c().read_from(buffer_ptr, head)
            obj = bytearray(size)
            self._c().read_from(buffer_ptr, obj)
        except RegolithError as e:
            self._fail(what, e)
            return None
        return memoryview(obj) if _tensor.read_header(obj) is not None else None

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores a buffer that already holds one tensor object (header and data, ``size``
        bytes exactly), as it is; -600 if it does not."""
        return self.batch_put_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        return self._put_tensor_objects("batch_put_tensor_from", keys, buffer_ptrs, sizes, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self.batch_upsert_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_upsert_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        return self._put_tensor_objects("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, True)

    def _put_tensor_objects(
        self,
        what: str,
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
        upsert: bool,
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Any entry that is not one whole tensor object makes every key -600 (Mooncake's)."""
        if not len(keys) == len(ptrs) == len(sizes) or any(
            self._tensor_object_at(what, p, n) is None for p, n in zip(ptrs, sizes)
        ):
            return [INVALID_PARAMS] * len(keys)
        if upsert:
            return self._codes(what, len(keys), "batch_put_from", keys, ptrs, sizes, config, upsert=True)
        return self._put_codes(what, len(keys), "batch_put_from", keys, ptrs, sizes, config)

    # Tensor parallelism: shard r of `key` is the object `key_tp_r` (Mooncake's names), split
    # evenly along `split_dim`; every call writes all `tp_size` shards, whatever `tp_rank`.

    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        return self.batch_put_tensor_with_tp([key], [tensor], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        return self._put_tp("batch_put_tensor_with_tp", base_keys, tensors_list, None, tp_size, split_dim)

    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        return self.batch_pub_tensor_with_tp([key], [tensor], config, tp_rank, tp_size, split_dim)[0]

    def batch_pub_tensor_with_tp(
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        if not _publishable(config):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_tp("batch_pub_tensor_with_tp", base_keys, tensors_list, config, tp_size, split_dim)

    def _put_tp(
        self,
        what: str,
        base_keys: list[str],
        tensors: list[Any],
        config: ReplicateConfig | None,
        tp_size: int,
        split_dim: int,
    ) -> list[int]:
        """Per base key, 0 or the first failing shard's code, all shards in one batch."""
        if tp_size <= 1:
            return self._put_tensors(what, base_keys, tensors, config)
        if len(base_keys) != len(tensors):
            return [INVALID_PARAMS] * len(base_keys)
        keys, pieces, shards, owner = [], [], [], []
        out = [INVALID_PARAMS] * len(base_keys)
        for i, (key, t) in enumerate(zip(base_keys, tensors)):
            split = _tensor.tp_shards(t, tp_size, split_dim) if _tensor.is_tensor(t) else None
            if split is None:
                logger.warning("%s %r: cannot split %d ways along dim %d", what, key, tp_size, split_dim)
                continue
            out[i] = OK
            for r, shard in enumerate(split):
                keys.append(_tensor.tp_key(key, r))
                pieces.append(shard)
                shards.append((r, tp_size, split_dim, tuple(t.shape)))
                owner.append(i)
        for i, code in zip(owner, self._put_tensors(what, keys, pieces, config, shards=shards)):
            if out[i] == OK and code != OK:
                out[i] = code
        return out

    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        """Shard ``tp_rank`` as stored (``key`` itself when ``tp_size`` is 1)."""
        return self.get_tensor(_tp_name(key, tp_rank, tp_size))

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        return self.batch_get_tensor([_tp_name(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        return self.get_tensor_into(_tp_name(key, tp_rank, tp_size), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        keys = [_tp_name(k, tp_rank, tp_size) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Decodes each buffer's full tensor object, then shards it as ``put_tensor_with_tp``."""
        if not len(base_keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(base_keys)
        objs = [self._tensor_object_at("put_tensor_with_tp_from", p, n) for p, n in zip(buffer_ptrs, sizes)]
        tensors = [None if o is None else _tensor.unpack(o) for o in objs]
        return self._put_tp("batch_put_tensor_with_tp_from", base_keys, tensors, None, tp_size, split_dim)

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        return self._unsupported("get_tensor_into_cuda", _CUDA_IPC)

    def batch_get_tensor_into_cuda(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return [self._unsupported("batch_get_tensor_into_cuda", _CUDA_IPC)] * len(keys)

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file (``file_name``, else the key);
        -1100 on a miss, -600 when safetensors fails."""
        t = self.get_tensor(key)
        if t is None:
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file

            save_file({key: t.contiguous()}, file_name or key)
        except Exception as e:  # noqa: BLE001 - any failure of the optional package
            logger.warning("save_tensor_to_safetensor %r: %s", key, e)
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(self, key: str | None = None, file_name: str = "") -> Any:
        """Reads a safetensors file and stores one of its tensors: the entry named ``key``
        (else the first, with a warning) under ``key``, or with no key the first under
        ``file_name``. The tensor, or None on failure."""
        try:
            from safetensors.torch import load_file

            entries = load_file(file_name)
        except Exception as e:  # noqa: BLE001
            logger.warning("load_tensor_from_safetensor %r: %s", file_name, e)
            return None
        if not entries:
            return None
        name = key if key is not None else file_name
        if key is not None and key not in entries:
            logger.warning("load_tensor_from_safetensor: %r has no entry %r; storing the first", file_name, key)
        t = entries.get(key) if key in entries else next(iter(entries.values()))
        return t if self.put_tensor(name, t) == OK else None


def _publishable(config: ReplicateConfig | None) -> bool:
    """Mooncake's check of a publish's config: preferred segments, when given, name one per
    replica."""
    if config is None:
        return True
    segs = list(config.preferred_segments)
    return not segs or len(segs) == config.replica_num


def _tp_name(key: str, tp_rank: int, tp_size: int) -> str:
    return key if tp_size <= 1 else _tensor.tp_key(key, tp_rank)


def _as_mooncake_shape(t: Any) -> Any:
    """Mooncake's readers return a 0-d tensor as shape (1,) (they skip the reshape when ndim
    is 0): so do these."""
    return t.reshape(1) if t is not None and t.dim() == 0 else t
