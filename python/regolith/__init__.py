"""Regolith: the Python client of the Regolith distributed KV-cache store.

* :class:`Client` — a connection to the node's sidecar (``REGOLITH_SOCKET``, then
  ``/run/regolith/sidecar.sock``): ``put``/``get``, ``put_from``/``get_into`` (address + size, or
  any buffer-protocol object), batch forms, ``exists``, ``remove``, ``stats``; the GIL is released
  during I/O.
* :meth:`Client.alloc_buffer` — a writable :class:`Buffer` in shared memory (``memoryview``,
  numpy, torch) that the sidecar reads and writes directly: no staging copy.
* :mod:`regolith.mooncake` — ``MooncakeDistributedStore`` / ``ReplicateConfig``, a drop-in for
  ``mooncake.store`` (installable under that name with ``python/mooncake-shim``).
* :mod:`regolith.lmcache` — an LMCache remote-storage plugin (``remote_storage_plugins``).

Errors are exceptions derived from :class:`RegolithError`, carrying ``key``, ``reason`` and
``code`` (Mooncake's error code).
"""

from ._native import (
    DEFAULT_SOCKET,
    AlreadyExistsError,
    Buffer,
    BufferHandle,
    BufferTooSmallError,
    Client,
    ClosedError,
    ConnectError,
    CorruptError,
    DisconnectedError,
    InternalError,
    InvalidArgumentError,
    NoSpaceError,
    NotFoundError,
    RegolithError,
    ReplicateConfig,
    UnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET",
    "AlreadyExistsError",
    "Buffer",
    "BufferHandle",
    "BufferTooSmallError",
    "Client",
    "ClosedError",
    "ConnectError",
    "CorruptError",
    "DisconnectedError",
    "InternalError",
    "InvalidArgumentError",
    "NoSpaceError",
    "NotFoundError",
    "RegolithError",
    "ReplicateConfig",
    "UnavailableError",
]
