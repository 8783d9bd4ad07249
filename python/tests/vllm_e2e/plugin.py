"""Test scaffolding (not Regolith): a vLLM general plugin that gives LMCache a KV connector for
vLLM's CPU device (``cpu_connector.CPUPagedKVConnector``).

vLLM runs every entry point of the group ``vllm.general_plugins`` in each of its processes (API
server, engine core, workers) before it builds anything. ``register`` arranges for
``lmcache.v1.gpu_connector.CreateGPUConnector`` (which LMCache's vLLM service factory imports
from that module at call time) to be wrapped as soon as that module is imported: for
``EngineType.VLLM`` on the CPU platform it returns the CPU connector; every other case goes to
LMCache's own factory unchanged.

Registration without installing anything: ``make_site(dir)`` writes ``dir/<name>.dist-info``
(``METADATA`` + ``entry_points.txt`` naming ``vllm_e2e.plugin:register``) and links this package
in as ``dir/vllm_e2e``; putting ``dir`` on the vLLM processes' ``PYTHONPATH`` makes
``importlib.metadata.entry_points(group="vllm.general_plugins")`` find it in every process.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from pathlib import Path

DIST = "regolith_vllm_e2e_scaffolding"
ENTRY = "regolith_e2e_cpu_kv_connector"
PACKAGE = Path(__file__).resolve().parent
TARGET = "lmcache.v1.gpu_connector"


def register() -> None:
    """vLLM general-plugin entry point (idempotent; runs once per vLLM process).

    It must not import LMCache itself: on CPU, a vLLM worker scans every loaded module while it
    registers its Triton-kernel overrides (``vllm.triton_utils.dispatcher._rebind_kernels``), and
    that scan fails on an LMCache native object (``'_lib_fn_wrapper' object has no attribute
    'get'``) when LMCache is loaded before it. LMCache is loaded later, when vLLM builds the KV
    connector; a post-import hook patches its factory then.
    """
    module = sys.modules.get(TARGET)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(factory) -> None:
    if getattr(factory.CreateGPUConnector, "_regolith_e2e", False):
        return
    original = factory.CreateGPUConnector

    def create_gpu_connector(config, metadata, engine, layout_hints=None):
        from lmcache.utils import EngineType
        from vllm.platforms import current_platform

        if engine == EngineType.VLLM and current_platform.is_cpu():
            from vllm_e2e.cpu_connector import CPUPagedKVConnector

            return CPUPagedKVConnector.from_metadata(metadata)
        return original(config, metadata, engine, layout_hints=layout_hints)

    create_gpu_connector._regolith_e2e = True
    factory.CreateGPUConnector = create_gpu_connector


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``lmcache.v1.gpu_connector`` right after it is first imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(module)


def make_site(root: Path) -> Path:
    """A directory that, on ``PYTHONPATH``, registers this plugin; returns it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{DIST}-0.0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.0.0\n"
        "Summary: test scaffolding for Regolith's vLLM end-to-end test (not Regolith)\n"
    )
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{ENTRY} = vllm_e2e.plugin:register\n"
    )
    link = root / "vllm_e2e"
    if not link.exists():
        os.symlink(PACKAGE, link, target_is_directory=True)
    return root
