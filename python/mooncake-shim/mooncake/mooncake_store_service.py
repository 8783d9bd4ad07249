"""``python -m mooncake.mooncake_store_service --config=config.json`` on Regolith: Mooncake's
standalone store process (the memory this node contributes, and its REST API) as a
``regolith-sidecar`` started from the same JSON keys (``regolith.store_service``)."""

import sys

from regolith.store_service import main

if __name__ == "__main__":
    sys.exit(main())
