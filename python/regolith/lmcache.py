"""Regolith as an LMCache remote-storage plugin, without the ``mooncake.store`` shim.

LMCache configuration (YAML)::

    remote_storage_plugins: ["regolith"]
    extra_config:
      remote_storage_plugin.regolith.module_path: regolith.lmcache
      remote_storage_plugin.regolith.class_name: RegolithConnectorAdapter
      save_chunk_meta: false
      local_hostname: "localhost"
      master_server_address: "localhost:50051"
      # ... the same keys as for LMCache's Mooncake connector

The connector is LMCache's own ``MooncakestoreConnector`` (same configuration keys, same
behaviour for ``save_chunk_meta`` true and false), built on :mod:`regolith.mooncake` whatever
``mooncake.store`` resolves to, with two changes: existence checks answer booleans (never a
truthy negative error code), and prefix lookups ask for every key in one round trip.
``class_name: RegolithConnector`` works too (LMCache wraps a connector class itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
    MooncakestoreConnector,
)

from . import mooncake as _mooncake

PLUGIN_TYPE = "regolith"

_ABSENT = object()

__all__ = ["PLUGIN_TYPE", "RegolithConnector", "RegolithConnectorAdapter"]


@contextlib.contextmanager
def _regolith_as_mooncake_store() -> Iterator[None]:
    """Has ``mooncake.store`` resolve to :mod:`regolith.mooncake` while LMCache's connector
    constructor imports it; the previous modules (if any) are put back afterwards."""
    names = ("mooncake", "mooncake.store")
    saved = {n: sys.modules.get(n, _ABSENT) for n in names}
    pkg = types.ModuleType("mooncake")
    pkg.__path__ = []  # a package, so that `mooncake.store` may be a submodule
    pkg.store = _mooncake  # type: ignore[attr-defined]
    sys.modules["mooncake"] = pkg
    sys.modules["mooncake.store"] = _mooncake
    try:
        yield
    finally:
        for n, mod in saved.items():
            if mod is _ABSENT:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = mod


class RegolithConnector(MooncakestoreConnector):
    """LMCache's Mooncake connector on Regolith's ``MooncakeDistributedStore``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: Any,
        config: Any = None,
        lmcache_config: Any = None,
        plugin_name: str | None = None,
    ) -> None:
        with _regolith_as_mooncake_store():
            super().__init__(
                loop=loop,
                local_cpu_backend=local_cpu_backend,
                lmcache_config=lmcache_config if lmcache_config is not None else config,
                plugin_name=plugin_name,
            )

    def _exists(self, key: Any) -> bool:
        return self.store.is_exist(key.to_string()) == 1

    async def exists(self, key: Any) -> bool:
        return await asyncio.to_thread(self._exists, key)

    def exists_sync(self, key: Any) -> bool:
        return self._exists(key)

    async def batched_async_contains(
        self, lookup_id: str, keys: list[Any], pin: bool = False
    ) -> int:
        """How many keys, from the first, are present: one round trip for all of them."""
        if not keys:
            return 0
        flags = await asyncio.to_thread(self.store.batch_is_exist, [k.to_string() for k in keys])
        hits = 0
        for f in flags:
            if f != 1:
                break
            hits += 1
        return hits

    def __repr__(self) -> str:
        return f"<RegolithConnector node={self.store.get_hostname()!r}>"


class RegolithConnectorAdapter(ConnectorAdapter):
    """Creates :class:`RegolithConnector` for ``plugin://regolith`` (and ``regolith://``)."""

    def __init__(self) -> None:
        super().__init__("regolith://")

    def can_parse(self, url: str) -> bool:
        if url.startswith(self.schema):
            return True
        if url.startswith("plugin://"):
            return extract_plugin_type(url[len("plugin://") :]) == PLUGIN_TYPE
        return False

    def create_connector(self, context: ConnectorContext) -> RegolithConnector:
        return RegolithConnector(
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            lmcache_config=context.config,
            plugin_name=context.plugin_name,
        )
