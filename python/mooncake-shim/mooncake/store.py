"""``mooncake.store`` on Regolith: ``MooncakeDistributedStore`` and everything else
``regolith.mooncake`` exports (``ReplicateConfig``, the replica descriptors and enums,
``BufferHandle``, ``bind_to_numa_node``)."""

from regolith.mooncake import *  # noqa: F401,F403
from regolith.mooncake import (  # noqa: F401
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ParallelAxis,
    ReadTarget,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TensorParallelism,
    bind_to_numa_node,
)
