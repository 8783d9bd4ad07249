"""``mooncake`` as provided by Regolith's shim: only ``mooncake.store`` is here (it re-exports
``regolith.mooncake``). Do not install it beside Mooncake's own distribution
(``mooncake-transfer-engine``): both provide this package."""
