"""Mooncake Store compatibility: ``MooncakeDistributedStore`` and ``ReplicateConfig`` with
Mooncake's Python API (argument names, defaults and return conventions), backed by Regolith.

Return conventions (as Mooncake's): 0 on success and a negative Mooncake error code on failure
(-704 not found, -600 invalid parameters, -10 buffer too small, -200 no space, -900 sidecar
unreachable, -1 not set up / closed); a put of a key that already exists answers 0, in every put
form, as Mooncake's client does (it leaves the stored object as it was); ``is_exist`` answers 1, 0 or a
negative code; ``get_into`` answers the bytes read; ``get`` answers ``b""`` on a miss;
``get_buffer`` answers None on a miss. Misuse of argument types raises ``TypeError`` as
pybind11 would.

Where the memory comes from: ``setup`` connects to the node's sidecar (the ``sidecar_socket``
key, ``$REGOLITH_SOCKET``, then ``/run/regolith/sidecar.sock``); ``master_server_address``,
``metadata_server`` and ``global_segment_size`` are then only hints. When none answers and
``regolith_spawn_sidecar`` (or ``$REGOLITH_SPAWN_SIDECAR=1``) is set, it starts a private
sidecar that contributes ``global_segment_size`` bytes and registers with
``master_server_address``; otherwise it raises :class:`regolith.ConnectError` saying how to
start one.

Addresses (``put_from``, ``get_into`` and their batch forms) must lie in a buffer given to
``register_buffer`` (any memory: ctypes, numpy, torch; its bytes are copied through the
connection's staging area) or in a buffer from ``client.alloc_buffer`` (shared memory, read and
written by the sidecar directly). Other addresses are refused (-600), never dereferenced.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket as socket_module
import re
import threading
from typing import Any

from . import _native
from ._mooncake_parallelism import (
    ParallelAxis,
    ParallelismMethods,
    ReadTarget,
    TensorParallelism,
)
from ._mooncake_tensors import TensorMethods
from ._mooncake_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    NOT_SUPPORTED,
    OBJECT_ALREADY_EXISTS,
    OBJECT_NOT_FOUND,
    OK,
    TRANSFER_FAIL,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    SoftPinAction,
    _replica_descriptors,
)
from ._native import (
    DEFAULT_SOCKET,
    BufferHandle,
    Client,
    ClosedError,
    ConnectError,
    RegolithError,
    ReplicateConfig,
)
from ._setup import SetupConfig, parse_setup
from ._spawn import SpawnedSidecar

__all__ = [
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeDistributedStoreAsync",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ParallelAxis",
    "ReadTarget",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TensorParallelism",
    "bind_to_numa_node",
]

logger = logging.getLogger("regolith.mooncake")


_QUIET = (OBJECT_NOT_FOUND, OBJECT_ALREADY_EXISTS)

_protocol_noted = False


def bind_to_numa_node(node: int) -> None:
    """Accepted for compatibility. Regolith's memory (the segment and the staging area) is
    allocated by the sidecar, not in this process, so there is nothing here to bind."""
    if not isinstance(node, int) or node < 0:
        raise TypeError(f"bind_to_numa_node: expected a NUMA node number, got {node!r}")
    logger.debug("bind_to_numa_node(%d): nothing to bind (memory belongs to the sidecar)", node)


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def _note_protocol(protocol: str) -> None:
    """Says once per process how the requested protocol is served."""
    global _protocol_noted
    p = protocol.strip().lower()
    if p in ("", "tcp") or _protocol_noted:
        return
    _protocol_noted = True
    if p != "rdma":
        logger.warning("protocol %r is not one Regolith speaks: it moves the data over TCP", protocol)
    elif not _rdma_devices():
        logger.warning(
            "protocol 'rdma' requested but this machine has no RDMA device "
            "(/sys/class/infiniband is empty): Regolith falls back to TCP"
        )
    else:
        logger.info(
            "protocol 'rdma': the node's sidecar chooses the transport (RDMA to peers where "
            "both ends have an active port and it was built with the rdma feature, TCP "
            "otherwise; a sidecar setup() starts gets --rdma-device from device_name)"
        )


def _how_to_start(socket: str, cfg: SetupConfig, err: RegolithError) -> str:
    metad = cfg.master_server_address or "METAD_HOST:50051"
    return (
        f"no Regolith sidecar answers at {socket} ({err.reason or err}). Start one on this "
        f"node, e.g. `regolith-sidecar --metad {metad} --segment-size "
        f"{cfg.global_segment_size} --socket {socket}` (or `regolith up` for a whole local "
        "cluster), and point REGOLITH_SOCKET or the `sidecar_socket` setup key at its socket; "
        "or set REGOLITH_SPAWN_SIDECAR=1 (setup key `regolith_spawn_sidecar`) to have setup() "
        "start one that contributes global_segment_size bytes and registers with "
        "master_server_address."
    )


def _code(e: RegolithError) -> int:
    code = getattr(e, "code", INTERNAL_ERROR)
    return code if isinstance(code, int) and code < 0 else INTERNAL_ERROR



_REMOVE_BATCH = 1024
_LIST_PAGE = 10_000
_UNSUPPORTED_NOTED: set[str] = set()
_SIDECAR_OWNS_MEMORY = (
    "the node's sidecar owns the memory it contributes (regolith-sidecar --segment-size)"
)


def _total(parts: Any) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def _ranges_shape(
    buffer_ptrs: list[int], all_keys: list[list[str]], all_dst_offsets: list[list[list[int]]]
) -> list[list[list[int]]]:
    """``get_into_ranges``'s answer before anything is read: -600 everywhere, shaped by the
    buffers, their keys and the keys' destination offsets (1 where a level is missing)."""
    out = []
    for i in range(len(buffer_ptrs)):
        keys = all_keys[i] if i < len(all_keys) else [""]
        dsts = all_dst_offsets[i] if i < len(all_dst_offsets) else []
        out.append(
            [[INVALID_PARAMS] * (len(dsts[j]) if j < len(dsts) else 1) for j in range(len(keys))]
        )
    return out


def _same_shape(outer: list, *inner: list) -> bool:
    """Whether every list of ``inner`` has one entry per entry of ``outer`` and those entries
    (lists) have the lengths of ``outer``'s."""
    if any(len(x) != len(outer) for x in inner):
        return False
    return all(len(a) == len(b) for x in inner for a, b in zip(outer, x))



def _disk_dir(cfg: SetupConfig) -> str | None:
    """The disk tier of a spawned sidecar: Mooncake's ``storage_root_dir`` (a setup key, or
    ``$MOONCAKE_STORAGE_ROOT_DIR`` as LMCache sets it), one directory per node under it
    (docs/ssd.md); None without one."""
    root = cfg.ignored.get("storage_root_dir") or os.environ.get("MOONCAKE_STORAGE_ROOT_DIR")
    if not root:
        return None
    node = cfg.local_hostname or socket_module.gethostname()
    return os.path.join(os.path.abspath(str(root)), f"regolith-{node}")

class MooncakeDistributedStore(TensorMethods, ParallelismMethods):
    """Mooncake's store object, backed by the node's Regolith sidecar."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._sidecar: SpawnedSidecar | None = None
        self._config: SetupConfig | None = None
        self._sessions_lock = threading.Lock()
        self._put_sessions: dict[str, tuple[bytearray, ReplicateConfig | None]] = {}
        self._get_sessions: set[str] = set()
        self._pool: list[Any] = []

    # ------------------------------------------------------------------ set-up

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, device_name, master_server_address, ...)`` or ``setup(config: dict)``.

        Returns 0. Raises :class:`regolith.ConnectError` (with how to start a sidecar) when no
        sidecar answers and none may be spawned; ``ValueError`` for malformed values."""
        cfg = parse_setup(args, kwargs)
        if cfg.ignored:
            logger.debug("setup keys Regolith does not use: %s", sorted(cfg.ignored))
        tenant = str(cfg.ignored.get("tenant_id") or "default")
        if tenant != "default":
            logger.warning(
                "tenant_id %r: Regolith has one key space for every tenant (keys are not "
                "separated by tenant; give each tenant its own key prefix); see "
                "docs/mooncake-api.md",
                tenant,
            )
        _note_protocol(cfg.protocol)
        self.close()
        socket = cfg.sidecar_socket or os.environ.get("REGOLITH_SOCKET") or DEFAULT_SOCKET
        self._client = self._connect(socket, cfg)
        self._config = cfg
        logger.info("connected to the Regolith sidecar of node %s", self.get_hostname())
        return OK

    def _connect(self, socket: str, cfg: SetupConfig) -> Client:
        name = f"mooncake-{os.getpid()}"
        try:
            return Client(socket, staging_size=cfg.local_buffer_size, name=name)
        except ConnectError as e:
            if not cfg.spawn_sidecar:
                raise ConnectError(_how_to_start(socket, cfg, e)) from None
            logger.info("no sidecar at %s: starting a private one", socket)
        self._sidecar = SpawnedSidecar.start(
            node_name=cfg.local_hostname,
            metad=cfg.master_server_address,
            segment_size=cfg.global_segment_size,
            binary=cfg.sidecar_bin,
            protocol=cfg.protocol,
            device_name=cfg.device_name,
            disk=_disk_dir(cfg),
        )
        try:
            return Client(str(self._sidecar.socket), staging_size=cfg.local_buffer_size, name=name)
        except BaseException:
            self._stop_sidecar()
            raise

    def _stop_sidecar(self) -> None:
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None:
            sidecar.stop()

    def close(self) -> int:
        """Closes the connection (and stops a sidecar that setup started). Returns 0."""
        with self._sessions_lock:
            self._put_sessions.clear()
            self._get_sessions.clear()
        self._pool.clear()
        client, self._client = self._client, None
        if client is not None:
            client.close()
        self._stop_sidecar()
        return OK

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    @property
    def client(self) -> Client:
        """The underlying :class:`regolith.Client` (for ``alloc_buffer`` and the native API)."""
        return self._c()

    def _c(self) -> Client:
        c = self._client
        if c is None:
            raise ClosedError("the store is not set up (call setup()) or is closed")
        return c

    def _fail(self, what: str, e: RegolithError) -> int:
        code = _code(e)
        if code in _QUIET:
            logger.debug("%s: %s", what, e)
        else:
            logger.warning("%s failed: %s", what, e)
        return code

    def _status(self, what: str, fn_name: str, *args: Any, **kwargs: Any) -> int:
        try:
            getattr(self._c(), fn_name)(*args, **kwargs)
            return OK
        except RegolithError as e:
            return self._fail(what, e)

    def _put_status(self, what: str, fn_name: str, *args: Any, **kwargs: Any) -> int:
        """A put's code as Mooncake's client answers it: a key that already exists is success
        (its PutStart maps OBJECT_ALREADY_EXISTS to OK; the stored object is left as it was)."""
        code = self._status(what, fn_name, *args, **kwargs)
        return OK if code == OBJECT_ALREADY_EXISTS else code

    def _put_codes(self, what: str, n: int, fn_name: str, *args: Any, **kwargs: Any) -> list[int]:
        """Per-item codes of a batch put, an existing key answering 0 as in :meth:`_put_status`."""
        codes = self._codes(what, n, fn_name, *args, **kwargs)
        return [OK if c == OBJECT_ALREADY_EXISTS else c for c in codes]

    def _codes(self, what: str, n: int, fn_name: str, *args: Any, **kwargs: Any) -> list[int]:
        """Per-item codes of a batch call answering None / an exception per item."""
        try:
            results = getattr(self._c(), fn_name)(*args, **kwargs)
        except RegolithError as e:
            return [self._fail(what, e)] * n
        return [OK if r is None else self._fail(what, r) for r in results]

    def _read_code(self, what: str, e: RegolithError) -> int:
        """A read's code: a destination smaller than the object is Mooncake's -600."""
        code = self._fail(what, e)
        return INVALID_PARAMS if code == _native.BUFFER_OVERFLOW else code

    # ------------------------------------------------------------------ identity

    def get_hostname(self) -> str:
        """The sidecar's node name (pass it back as ``preferred_segment``); "" before setup."""
        c = self._client
        if c is None:
            return ""
        try:
            return c.node_name
        except RegolithError as e:
            self._fail("get_hostname", e)
            return ""

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 sidecar or metad unreachable."""
        c = self._client
        if c is None:
            return 1
        try:
            c.stats()
            return 0
        except RegolithError:
            return 2

    # ------------------------------------------------------------------ buffers

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Declares ``[buffer_ptr, buffer_ptr+size)`` usable by the address-based calls."""
        return self._status("register_buffer", "register_buffer", buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        return self._status("unregister_buffer", "unregister_buffer", buffer_ptr)

    # ------------------------------------------------------------------ puts

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_status(f"put {key!r}", "put", key, value, config)

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """0 and nothing stored for a size of 0, as Mooncake's ``put_from``."""
        if size == 0:
            return OK
        return self._put_status(f"put_from {key!r}", "put_from", key, buffer_ptr, size, config)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """The parts' concatenation as one object (copied piece by piece, never joined)."""
        if _total(parts) == 0:
            return OK
        return self._put_status(f"put_parts {key!r}", "put_parts", key, list(parts), config)

    def put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        codes = self._put_codes("put_batch", len(keys), "batch_put", keys, values, config)
        return next((c for c in codes if c != OK), OK)

    def batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        return self._put_codes(
            "batch_put_from", len(keys), "batch_put_from", keys, buffer_ptrs, sizes, config
        )

    # ------------------------------------------------------------------ gets

    def get(self, key: str) -> bytes:
        """The object's bytes; ``b""`` on a miss or an error."""
        try:
            return self._c().get(key)
        except RegolithError as e:
            self._fail(f"get {key!r}", e)
            return b""

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return [b"" if h is None else h.tobytes() for h in self.batch_get_buffer(keys)]

    def get_buffer(self, key: str) -> BufferHandle | None:
        """A private copy of the object (buffer protocol, ``ptr()``, ``size()``); None on a miss."""
        try:
            return self._c().get_buffer(key)
        except RegolithError as e:
            self._fail(f"get_buffer {key!r}", e)
            return None

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        try:
            results = self._c().batch_get_buffer(keys)
        except RegolithError as e:
            self._fail("batch_get_buffer", e)
            return [None] * len(keys)
        out: list[BufferHandle | None] = []
        for r in results:
            if isinstance(r, RegolithError):
                self._fail("batch_get_buffer", r)
                out.append(None)
            else:
                out.append(r)
        return out

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Copies the object into ``[buffer_ptr, buffer_ptr+size)``; the object's size, or a
        negative code (-600 when the buffer is smaller than the object)."""
        try:
            return self._c().get_into(key, buffer_ptr, size)
        except RegolithError as e:
            return self._read_code(f"get_into {key!r}", e)

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        try:
            results = self._c().batch_get_into(keys, buffer_ptrs, sizes)
        except RegolithError as e:
            return [self._read_code("batch_get_into", e)] * len(keys)
        return [
            self._read_code("batch_get_into", r) if isinstance(r, RegolithError) else r
            for r in results
        ]

    def get_size(self, key: str) -> int:
        try:
            return self._c().get_size(key)
        except RegolithError as e:
            return self._fail(f"get_size {key!r}", e)

    # ------------------------------------------------------------------ keys

    def is_exist(self, key: str) -> int:
        """1 if the object exists, 0 if not, a negative code on error."""
        try:
            return 1 if self._c().exists(key) else 0
        except RegolithError as e:
            return self._fail(f"is_exist {key!r}", e)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        try:
            return [1 if x else 0 for x in self._c().batch_exists(keys)]
        except RegolithError as e:
            return [self._fail("batch_is_exist", e)] * len(keys)

    def batch_probe_key(self, keys: list[str]) -> list[int]:
        """``batch_is_exist`` under the name vLLM's selective-lease mode asks for: existence
        checks never take or extend a read lease on Regolith."""
        return self.batch_is_exist(keys)

    def remove(self, key: str, force: bool = False) -> int:
        return self._status(f"remove {key!r}", "remove", key)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._codes("batch_remove", len(keys), "batch_remove", keys)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object; the number removed, or a negative code."""
        try:
            return self._c().remove_all()
        except RegolithError as e:
            return self._fail("remove_all", e)

    # ------------------------------------------------------------------ upserts

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Puts ``value``, replacing an existing object under ``key`` in one step: a reader
        sees the old value or the new one, whole (Mooncake's in-place upsert makes readers
        wait instead; Regolith writes the new version beside the old and swaps)."""
        return self._status(f"upsert {key!r}", "put", key, value, config, upsert=True)

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        if size == 0:
            return OK
        return self._status(
            f"upsert_from {key!r}", "put_from", key, buffer_ptr, size, config, upsert=True
        )

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        if _total(parts) == 0:
            return OK
        return self._status(
            f"upsert_parts {key!r}", "put_parts", key, list(parts), config, upsert=True
        )

    def upsert_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        """0, or the first failing key's code."""
        if len(keys) != len(values):
            return INVALID_PARAMS
        codes = self._codes("upsert_batch", len(keys), "batch_put", keys, values, config, upsert=True)
        return next((c for c in codes if c != OK), OK)

    def batch_upsert_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._codes(
            "batch_upsert_from",
            len(keys),
            "batch_put_from",
            keys,
            buffer_ptrs,
            sizes,
            config,
            upsert=True,
        )

    # ------------------------------------------------------------------ scatter / gather

    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Per key, the concatenation of its buffers as one object (one reservation and one
        commit for the batch; the buffers are copied piece by piece, never joined)."""
        if len(keys) != len(all_buffer_ptrs) or not _same_shape(all_buffer_ptrs, all_sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._put_codes(
            "batch_put_from_multi_buffers",
            len(keys),
            "batch_put_parts",
            keys,
            all_buffer_ptrs,
            all_sizes,
            config,
        )

    def batch_get_into_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Per key, the object scattered over its buffers in order; the object's size, or a
        negative code. As in Mooncake, the buffers must add up to exactly the object's size:
        fewer bytes is -600, more is -800."""
        if len(keys) != len(all_buffer_ptrs) or not _same_shape(all_buffer_ptrs, all_sizes):
            return [INVALID_PARAMS] * len(keys)
        try:
            results = self._c().batch_get_into_parts(keys, all_buffer_ptrs, all_sizes)
        except RegolithError as e:
            return [self._read_code("batch_get_into_multi_buffers", e)] * len(keys)
        out = []
        for r, sizes in zip(results, all_sizes):
            if isinstance(r, RegolithError):
                out.append(self._read_code("batch_get_into_multi_buffers", r))
            elif r != sum(sizes):
                out.append(TRANSFER_FAIL)
            else:
                out.append(r)
        return out

    def get_into_ranges(
        self,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[list[int]]],
        all_src_offsets: list[list[list[int]]],
        all_sizes: list[list[list[int]]],
    ) -> list[list[list[int]]]:
        """Byte ranges of objects into registered buffers: fragment ``[i][j][k]`` copies
        ``all_sizes[i][j][k]`` bytes of object ``all_keys[i][j]`` from its byte
        ``all_src_offsets[i][j][k]`` to ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``. Answers
        the bytes copied per fragment, or a negative code. Each object is read whole (its
        checksum covers all of it) in one batched get, then its ranges are copied."""
        result = _ranges_shape(buffer_ptrs, all_keys, all_dst_offsets)
        outer_ok = (
            len(all_keys)
            == len(all_dst_offsets)
            == len(all_src_offsets)
            == len(all_sizes)
            == len(buffer_ptrs)
        )
        if not outer_ok or not all(
            len(keys) == len(dst) and _same_shape(dst, src, sz)
            for keys, dst, src, sz in zip(all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        ):
            return result
        wanted = sorted({k for keys in all_keys for k in keys})
        objects = dict(zip(wanted, self.batch_get_buffer(wanted)))
        c = self._c()
        for i, keys in enumerate(all_keys):
            for j, key in enumerate(keys):
                obj = objects.get(key)
                frags = zip(all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j])
                for k, (dst, src, n) in enumerate(frags):
                    if obj is None:
                        result[i][j][k] = OBJECT_NOT_FOUND
                    elif src < 0 or n < 0 or src + n > obj.size():
                        result[i][j][k] = INVALID_PARAMS
                    else:
                        result[i][j][k] = self._copy_range(c, buffer_ptrs[i] + dst, obj, src, n)
        return result

    def _copy_range(self, c: Client, address: int, obj: BufferHandle, src: int, n: int) -> int:
        try:
            c.write_into(address, memoryview(obj)[src : src + n])
            return n
        except RegolithError as e:
            return self._fail("get_into_ranges", e)

    # ------------------------------------------------------------------ sessions

    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Opens a put of ``sizes[i]`` bytes per key, filled by
        ``batch_put_from_multi_buffer_ranges`` and made visible by ``batch_put_session_end``
        (the bytes wait in this process until then). -705 for a key that exists, -600 for a
        key with a session already."""
        if len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        exists = self.batch_is_exist(keys)
        out = []
        with self._sessions_lock:
            for key, size, there in zip(keys, sizes, exists):
                if key in self._put_sessions or size <= 0:
                    out.append(INVALID_PARAMS)
                elif there == 1:
                    out.append(OBJECT_ALREADY_EXISTS)
                elif there < 0:
                    out.append(there)
                else:
                    self._put_sessions[key] = (bytearray(size), config)
                    out.append(OK)
        return out

    def batch_put_from_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]:
        """Writes ranges of a session's object: buffer ``j`` of key ``i`` goes to byte
        ``all_dst_offsets[i][j]``. Per key, the bytes written, or -600."""
        if len(keys) != len(all_buffer_ptrs) or not _same_shape(
            all_buffer_ptrs, all_sizes, all_dst_offsets
        ):
            return [INVALID_PARAMS] * len(keys)
        c = self._c()
        out = []
        for key, ptrs, sizes, offs in zip(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
            with self._sessions_lock:
                session = self._put_sessions.get(key)
            if session is None or any(o < 0 or o + n > len(session[0]) for o, n in zip(offs, sizes)):
                out.append(INVALID_PARAMS)
                continue
            out.append(self._fill_session(c, key, session[0], ptrs, sizes, offs))
        return out

    def _fill_session(
        self, c: Client, key: str, obj: bytearray, ptrs: list[int], sizes: list[int], offs: list[int]
    ) -> int:
        view = memoryview(obj)
        try:
            for ptr, n, off in zip(ptrs, sizes, offs):
                c.read_from(ptr, view[off : off + n])
        except RegolithError as e:
            return self._fail(f"batch_put_from_multi_buffer_ranges {key!r}", e)
        return sum(sizes)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Puts each session's object (one batch); per key 0 or a code (-600: no session)."""
        with self._sessions_lock:
            sessions = {k: self._put_sessions.pop(k) for k in keys if k in self._put_sessions}
        out = []
        for key in keys:
            s = sessions.get(key)
            if s is None:
                out.append(INVALID_PARAMS)
                continue
            out.append(self._put_status(f"session put {key!r}", "put", key, s[0], s[1]))
        return out

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        with self._sessions_lock:
            return [OK if self._put_sessions.pop(k, None) is not None else INVALID_PARAMS for k in keys]

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Opens reads of ranges of existing objects (``batch_get_into_multi_buffer_ranges``);
        per key 0 or a code (-704 not found)."""
        codes = []
        for key, located in zip(keys, self._locate(keys)):
            if isinstance(located, int):
                codes.append(located)
                continue
            with self._sessions_lock:
                self._get_sessions.add(key)
            codes.append(OK)
        return codes

    def batch_get_into_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]:
        """Reads ranges of objects with an open get session: ``all_sizes[i][j]`` bytes from byte
        ``all_src_offsets[i][j]`` into ``all_buffer_ptrs[i][j]``. Per key, the bytes read, or a
        code (-600: no session or a range past the object)."""
        if len(keys) != len(all_buffer_ptrs) or not _same_shape(
            all_buffer_ptrs, all_sizes, all_src_offsets
        ):
            return [INVALID_PARAMS] * len(keys)
        with self._sessions_lock:
            open_keys = [k for k in keys if k in self._get_sessions]
        objects = dict(zip(open_keys, self.batch_get_buffer(open_keys)))
        c = self._c()
        out = []
        for key, ptrs, sizes, offs in zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            obj = objects.get(key)
            if key not in objects or any(o < 0 or o + n > (obj.size() if obj else 0) for o, n in zip(offs, sizes)):
                out.append(OBJECT_NOT_FOUND if key in objects and obj is None else INVALID_PARAMS)
                continue
            codes = [self._copy_range(c, p, obj, o, n) for p, n, o in zip(ptrs, sizes, offs)]
            out.append(next((x for x in codes if x < 0), sum(sizes)))
        return out

    def batch_get_session_end(self, keys: list[str]) -> int:
        with self._sessions_lock:
            self._get_sessions.difference_update(keys)
        return OK

    # ------------------------------------------------------------------ replicas

    def _locate(self, keys: list[str]) -> list[dict | int]:
        """Per key, its size and replicas (a dict), or a negative code."""
        try:
            results = self._c().batch_locate(keys)
        except RegolithError as e:
            return [self._fail("locate", e)] * len(keys)
        return [self._fail("locate", r) if isinstance(r, RegolithError) else r for r in results]

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The object's replicas (memory only: Regolith has no disk tier yet); ``[]`` on a miss
        or an error. A lease read, as a get's."""
        located = self._locate([key])[0]
        return [] if isinstance(located, int) else _replica_descriptors(located)

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """Per key found, its replicas; keys that were not are absent (sorted, as Mooncake's
        ``std::map``)."""
        found = {k: v for k, v in zip(keys, self._locate(keys)) if not isinstance(v, int)}
        return {k: _replica_descriptors(found[k]) for k in sorted(found)}

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Removes the objects among ``keys`` (all of them, or those with a replica on node
        ``segment_name``); the keys removed. Regolith removes an object whole: it has no
        command that drops one replica and keeps the others."""
        if segment_name:
            located = dict(zip(keys, self._locate(keys)))
            keys = [
                k
                for k, v in located.items()
                if not isinstance(v, int)
                and any(r["node_name"] == segment_name for r in v["replicas"])
            ]
        keys = [k for k in dict.fromkeys(keys) if k]
        codes = self.batch_remove(keys)
        return [k for k, c in zip(keys, codes) if c == OK]

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes every object whose key the pattern matches anywhere (``re.search``, as
        Mooncake's ``std::regex_search``; anchor with ``^...$`` for whole keys); the number
        removed, or -600 for a pattern that does not compile."""
        try:
            pattern = re.compile(regex_pattern)
        except re.error as e:
            logger.warning("remove_by_regex: %r does not compile: %s", regex_pattern, e)
            return INVALID_PARAMS
        try:
            matched = [k for k in self._all_keys() if pattern.search(k)]
        except RegolithError as e:
            return self._fail("remove_by_regex", e)
        removed = 0
        for i in range(0, len(matched), _REMOVE_BATCH):
            codes = self.batch_remove(matched[i : i + _REMOVE_BATCH], force)
            removed += sum(1 for c in codes if c == OK)
        return removed

    def _all_keys(self) -> list[str]:
        keys: list[str] = []
        after = ""
        while True:
            page, after = self._c().list_keys("", after, _LIST_PAGE)
            keys.extend(k for k, _ in page)
            if not after:
                return keys

    # ------------------------------------------------------------------ segments and memory

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's "dummy client" borrows a real client's memory over RPC: what every
        Regolith client does with its node's sidecar. Connects to the sidecar (the
        ``$REGOLITH_SOCKET`` one, else the default socket) with a staging area of
        ``local_buffer_size``; ``server_address`` (the real client's RPC address) has no
        meaning here. 0, or -1 when no sidecar answers."""
        try:
            return self.setup({"local_buffer_size": local_buffer_size})
        except (RegolithError, ValueError) as e:
            logger.warning("setup_dummy: %s", e)
            return INTERNAL_ERROR

    def alloc_from_mem_pool(self, size: int) -> int:
        """The address of ``size`` bytes of shared memory registered with the sidecar (puts
        from it and gets into it skip the staging copy); 0 on failure. Freed by ``close``."""
        try:
            buf = self._c().alloc_buffer(size)
        except RegolithError as e:
            self._fail("alloc_from_mem_pool", e)
            return 0
        self._pool.append(buf)
        return buf.address

    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict:
        return {"ret": self._unsupported("mount_segment", _SIDECAR_OWNS_MEMORY), "segment_ids": []}

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> dict:
        return {
            "ret": self._unsupported("allocate_and_mount_segment", _SIDECAR_OWNS_MEMORY),
            "segment_ids": [],
            "allocated_size": 0,
        }

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        return self._unsupported("unmount_segment", _SIDECAR_OWNS_MEMORY)

    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        return self._unsupported("unmount_and_free_segment", _SIDECAR_OWNS_MEMORY)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """0: there is no local disk segment (as Mooncake without SSD offload)."""
        return OK

    def put_from_with_metadata(
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """``metadata[:metadata_size] + data[:size]`` as one object (gathered, never joined).
        0 and nothing stored for a size of 0. A failure answers the code negated (a positive
        number), as Mooncake's does."""
        if size == 0:
            return OK
        codes = self._put_codes(
            f"put_from_with_metadata {key!r}",
            1,
            "batch_put_parts",
            [key],
            [[metadata_buffer_ptr, buffer_ptr]],
            [[metadata_size, size]],
            config,
        )
        return -codes[0]

    def get_offload_rpc_read_count(self) -> int:
        """0: Regolith has no offload tier whose reads would be counted."""
        return 0

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        return (0, 0), self._unsupported("create_copy_task", "replicas are placed at put time; there are no copy or move tasks")

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        return (0, 0), self._unsupported("create_move_task", "replicas are placed at put time; there are no copy or move tasks")

    def query_task(self, task_id: tuple[int, int]) -> tuple[None, int]:
        return None, self._unsupported("query_task", "replicas are placed at put time; there are no copy or move tasks")

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 16 * 1024 * 1024) -> int:
        return self._unsupported("init_all", "a legacy set-up; use setup()")


    def _unsupported(self, name: str, why: str = "") -> int:
        """Mooncake's NOT_SUPPORTED, said once per method in the log with the reason."""
        if name not in _UNSUPPORTED_NOTED:
            _UNSUPPORTED_NOTED.add(name)
            logger.warning(
                "%s is not supported on Regolith%s; see docs/mooncake-api.md",
                name,
                f": {why}" if why else "",
            )
        return NOT_SUPPORTED


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """Mooncake's asyncio face (``mooncake.async_store``): every method ``m`` also answers as
    ``await store.async_m(...)``, run in the event loop's default executor (the native calls
    release the GIL, so they run in parallel)."""

    def __getattr__(self, name: str) -> Any:
        sync_name = name[len("async_") :] if name.startswith("async_") else None
        method = getattr(self, sync_name, None) if sync_name else None
        if method is None or not callable(method):
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}"
                + (f" (nor {sync_name!r})" if sync_name else "")
            )

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(method, *args, **kwargs))

        setattr(self, name, call)
        return call
