"""Mooncake's return codes, enums and descriptor classes, and its host-memory allocator, as
``regolith.mooncake`` exports them (``mooncake.store`` with the shim)."""

from __future__ import annotations

import ctypes
import enum
import threading

from . import _native

OK = _native.OK
INTERNAL_ERROR = _native.INTERNAL_ERROR
INVALID_PARAMS = _native.INVALID_PARAMS
OBJECT_NOT_FOUND = _native.OBJECT_NOT_FOUND
OBJECT_ALREADY_EXISTS = _native.OBJECT_ALREADY_EXISTS
TRANSFER_FAIL = _native.TRANSFER_FAIL
# Mooncake's codes for what Regolith never answers itself.
NOT_SUPPORTED = -1012
FILE_NOT_FOUND = -1100


class ReplicaStatus(enum.IntEnum):
    """Mooncake's replica states; Regolith shows only committed replicas (``COMPLETE``)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class SoftPinAction(enum.IntEnum):
    """``ReplicateConfig.soft_pin_action``: PRESERVE keeps ``with_soft_pin``."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    """``ReplicateConfig.data_type`` (accepted and kept; Regolith stores every kind alike)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class Descriptor:
    """Where a memory replica lives (Mooncake's ``AllocatedBuffer::Descriptor``):
    ``transport_endpoint`` is the holding node's name (what its ``get_hostname()`` answers),
    ``buffer_address`` the replica's offset in that node's segment, ``size`` its bytes."""

    def __init__(self, size: int = 0, buffer_address: int = 0, transport_endpoint: str = "") -> None:
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (
            f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
            f"transport_endpoint={self.transport_endpoint}>"
        )


class MemoryDescriptor:
    def __init__(self, buffer_descriptor: Descriptor) -> None:
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    """Present for Mooncake's API; Regolith replicas are in memory only."""

    def __init__(self, file_path: str = "", object_size: int = 0) -> None:
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object, as ``get_replica_desc`` answers it."""

    def __init__(self, memory: MemoryDescriptor) -> None:
        self._memory = memory

    @property
    def status(self) -> ReplicaStatus:
        return ReplicaStatus.COMPLETE

    def is_memory_replica(self) -> bool:
        return True

    def is_disk_replica(self) -> bool:
        return False

    def is_local_disk_replica(self) -> bool:
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        raise RuntimeError("Expected DiskDescriptor")

    def __repr__(self) -> str:
        return f"<ReplicaDescriptor memory {self._memory.buffer_descriptor!r}>"


def _replica_descriptors(located: dict) -> list[ReplicaDescriptor]:
    return [
        ReplicaDescriptor(
            MemoryDescriptor(Descriptor(located["size"], r["offset"], r["node_name"]))
        )
        for r in located["replicas"]
    ]


class MooncakeHostMemAllocator:
    """Host memory for a store's buffers (Mooncake's allocator for its dummy client): private
    anonymous pages, usable with ``register_buffer``. ``alloc`` answers the address (0 on
    failure), ``free`` 0 or -1."""

    _PROT_RW = 0x1 | 0x2
    _MAP_PRIVATE_ANON = 0x02 | 0x20

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mmap.restype = ctypes.c_void_p
        self._libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
        ]
        self._libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int:
        if size <= 0:
            return 0
        p = self._libc.mmap(None, size, self._PROT_RW, self._MAP_PRIVATE_ANON, -1, 0)
        if p is None or p == 2**64 - 1:  # MAP_FAILED
            return 0
        with self._lock:
            self._sizes[p] = size
        return p

    def free(self, ptr: int) -> int:
        with self._lock:
            size = self._sizes.pop(ptr, None)
        if size is None:
            return -1
        return 0 if self._libc.munmap(ptr, size) == 0 else -1
