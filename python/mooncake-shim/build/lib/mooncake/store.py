"""``mooncake.store`` on Regolith: ``MooncakeDistributedStore``, ``ReplicateConfig``,
``bind_to_numa_node`` and ``BufferHandle`` from ``regolith.mooncake``."""

from regolith.mooncake import *  # noqa: F401,F403
from regolith.mooncake import (  # noqa: F401
    BufferHandle,
    MooncakeDistributedStore,
    ReplicateConfig,
    bind_to_numa_node,
)
