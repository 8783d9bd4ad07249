"""``mooncake.async_store`` on Regolith: ``MooncakeDistributedStoreAsync`` (every method ``m``
of the store also as ``await store.async_m(...)``)."""

from regolith.mooncake import MooncakeDistributedStoreAsync  # noqa: F401
