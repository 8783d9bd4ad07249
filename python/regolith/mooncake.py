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

import logging
import os
from typing import Any

from . import _native
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
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "bind_to_numa_node",
]

logger = logging.getLogger("regolith.mooncake")

OK = _native.OK
INTERNAL_ERROR = _native.INTERNAL_ERROR
INVALID_PARAMS = _native.INVALID_PARAMS
OBJECT_NOT_FOUND = _native.OBJECT_NOT_FOUND
OBJECT_ALREADY_EXISTS = _native.OBJECT_ALREADY_EXISTS

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


class MooncakeDistributedStore:
    """Mooncake's store object, backed by the node's Regolith sidecar."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._sidecar: SpawnedSidecar | None = None
        self._config: SetupConfig | None = None

    # ------------------------------------------------------------------ set-up

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, device_name, master_server_address, ...)`` or ``setup(config: dict)``.

        Returns 0. Raises :class:`regolith.ConnectError` (with how to start a sidecar) when no
        sidecar answers and none may be spawned; ``ValueError`` for malformed values."""
        cfg = parse_setup(args, kwargs)
        if cfg.ignored:
            logger.debug("setup keys Regolith does not use: %s", sorted(cfg.ignored))
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

    def _status(self, what: str, fn_name: str, *args: Any) -> int:
        try:
            getattr(self._c(), fn_name)(*args)
            return OK
        except RegolithError as e:
            return self._fail(what, e)

    def _put_status(self, what: str, fn_name: str, *args: Any) -> int:
        """A put's code as Mooncake's client answers it: a key that already exists is success
        (its PutStart maps OBJECT_ALREADY_EXISTS to OK; the stored object is left as it was)."""
        code = self._status(what, fn_name, *args)
        return OK if code == OBJECT_ALREADY_EXISTS else code

    def _put_codes(self, what: str, n: int, fn_name: str, *args: Any) -> list[int]:
        """Per-item codes of a batch put, an existing key answering 0 as in :meth:`_put_status`."""
        codes = self._codes(what, n, fn_name, *args)
        return [OK if c == OBJECT_ALREADY_EXISTS else c for c in codes]

    def _codes(self, what: str, n: int, fn_name: str, *args: Any) -> list[int]:
        """Per-item codes of a batch call answering None / an exception per item."""
        try:
            results = getattr(self._c(), fn_name)(*args)
        except RegolithError as e:
            return [self._fail(what, e)] * n
        return [OK if r is None else self._fail(what, r) for r in results]

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
        return self._put_status(f"put_from {key!r}", "put_from", key, buffer_ptr, size, config)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
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
        """Copies the object into ``[buffer_ptr, buffer_ptr+size)``; the bytes read, or a
        negative code."""
        try:
            return self._c().get_into(key, buffer_ptr, size)
        except RegolithError as e:
            return self._fail(f"get_into {key!r}", e)

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        try:
            results = self._c().batch_get_into(keys, buffer_ptrs, sizes)
        except RegolithError as e:
            return [self._fail("batch_get_into", e)] * len(keys)
        return [
            self._fail("batch_get_into", r) if isinstance(r, RegolithError) else r for r in results
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

