"""``mooncake`` as provided by Regolith's shim: ``mooncake.store`` and ``mooncake.async_store``
(they re-export ``regolith.mooncake``). Do not install it beside Mooncake's own distribution
(``mooncake-transfer-engine``): both provide this package."""
