"""Test scaffolding (not Regolith): a CPU paged-KV connector for LMCache 0.5.6 and vLLM's CPU
platform.

LMCache's ``CreateGPUConnector`` knows CUDA, XPU, MUSA and HPU, and raises ``No supported cpu
connector found`` on vLLM's CPU device (LMCache then runs degraded: it recomputes and never
reaches its storage backends). This class implements LMCache's ``GPUConnectorInterface`` for
the CPU device, the way ``VLLMPagedMemGPUConnectorV2`` does for CUDA: it copies the KV of tokens
``[start, end)`` between vLLM's paged cache (found through the full-sequence ``slot_mapping``
and the per-layer ``kvcaches`` LMCache passes in) and one LMCache memory object in the
``KV_2LTD`` format: ``[2 (K, V), num_layers, num_tokens, num_kv_heads * head_size]``.

vLLM's cache layout on CPU (``CPU_ATTN`` backend, ``KVCacheLayout.LBHNC``): one tensor per layer,
``[num_blocks, num_kv_heads, block_size, 2 * head_size]``, contiguous inside a block. The backend
views each block as ``[num_kv_heads, 2 * block_size, head_size]`` and gives the first half to K
and the second to V, but inside those halves the kernel ``cpu_attn_reshape_and_cache`` stores
elements in an ISA-specific packed order (for ``vec``/``vec16`` the K part is not token-major;
for ``amx`` neither part is). So the in-block layout is not hard-coded here: on first use the
connector *learns* it from vLLM's own kernel, with the same ISA the attention layers use
(``cpu_attn._get_attn_isa``): it writes tokens whose K/V elements carry their own index (two
base-256 digits, exact in fp32/bf16/fp16) into a scratch cache and reads back where each element
landed. That yields, for every (K or V, token offset in the block, head, dim), its element offset
inside a block; it must be a permutation of the block, and a random round trip through the
kernel is checked before use. Gathers (store) and scatters (load) then index the flat per-layer
cache with ``block * block_elems + offset`` -- the exact inverse of what vLLM's kernel does, so
loaded KV is bit-identical to what vLLM computed and stored.

``REGOLITH_E2E_PERTURB_LOADED_KV=1`` makes ``to_gpu`` add noise to the KV it loads (the test
uses it to prove that its same-output check can fail); it logs ``PERTURBED`` when it does.
"""

from __future__ import annotations

import os
from typing import List, Optional

import torch
from lmcache.logging import init_logger
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryObj

logger = init_logger(__name__)

PERTURB_ENV = "REGOLITH_E2E_PERTURB_LOADED_KV"


def _isa(dtype: torch.dtype, block_size: int, head_size: int) -> str:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(dtype, block_size, head_size, "auto")


def _write(cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots, isa: str) -> None:
    """vLLM's own write: ``key``/``value`` [T, H, D] into `cache` [N, H, B, 2D] at `slots`."""
    from vllm import _custom_ops as ops

    n, h, b, d2 = cache.shape
    key_cache, value_cache = cache.view(n, h, 2 * b, d2 // 2).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)


def learn_block_layout(
    num_kv_heads: int, block_size: int, head_size: int, dtype: torch.dtype, isa: str
) -> torch.Tensor:
    """Where vLLM's CPU kernel puts each KV element inside a block.

    Returns a long tensor ``[2, block_size, num_kv_heads, head_size]``: for K (0) or V (1) of the
    token at offset ``o`` in a block, head ``h``, dim ``d``, the element's offset inside that
    block's ``num_kv_heads * block_size * 2 * head_size`` contiguous elements.
    """
    h, b, d = num_kv_heads, block_size, head_size
    elems = h * b * 2 * d
    ids = torch.arange(elems, dtype=torch.long).view(2, b, h, d)
    landed = torch.zeros(elems, dtype=torch.long)  # id found at each in-block position
    written = torch.ones(elems, dtype=torch.bool)
    slots = torch.arange(b, 2 * b, dtype=torch.long)  # the tokens of block 1 (of 3)
    digits = 1
    while 256**digits < elems:
        digits += 1
    for k in range(digits):
        digit = ((ids // 256**k) % 256).to(dtype)  # 0..255: exact in fp32, bf16 and fp16
        cache = torch.full((3, h, b, 2 * d), -1.0, dtype=dtype)
        _write(cache, digit[0].contiguous(), digit[1].contiguous(), slots, isa)
        flat = cache.view(3, elems)
        if not (torch.all(flat[0] == -1) and torch.all(flat[2] == -1)):
            raise RuntimeError("vLLM's CPU KV kernel wrote outside the block of the slots")
        got = flat[1]
        written &= got >= 0
        landed += got.clamp(min=0).to(torch.long) * 256**k
    if not bool(written.all()):
        raise RuntimeError("vLLM's CPU KV kernel left part of a full block unwritten")
    if not torch.equal(torch.sort(landed).values, torch.arange(elems)):
        raise RuntimeError("vLLM's CPU KV layout is not a permutation of a block")
    offsets = torch.empty(elems, dtype=torch.long)
    offsets[landed] = torch.arange(elems, dtype=torch.long)
    offsets = offsets.view(2, b, h, d)
    _check_roundtrip(offsets, h, b, d, dtype, isa)
    return offsets


def _gather_index(offsets: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat indices [2, T, H, D] of the KV of the tokens at `slots` in a per-layer cache."""
    elems = offsets[0].numel() * 2
    slots = slots.to(device="cpu", dtype=torch.long)
    base = (slots // block_size) * elems
    return offsets[:, slots % block_size] + base.view(1, -1, 1, 1)


def _check_roundtrip(offsets, h, b, d, dtype, isa) -> None:
    """Random KV written by vLLM's kernel at random slots reads back exactly via `offsets`."""
    gen = torch.Generator().manual_seed(1234)
    blocks, tokens = 5, 3 * b // 2
    cache = torch.zeros(blocks, h, b, 2 * d, dtype=dtype)
    slots = torch.randperm(blocks * b, generator=gen)[:tokens]
    kv = torch.randn(2, tokens, h, d, generator=gen).to(dtype)
    _write(cache, kv[0].contiguous(), kv[1].contiguous(), slots, isa)
    got = cache.view(-1)[_gather_index(offsets, slots, b)]
    if not torch.equal(got, kv):
        raise RuntimeError("learned CPU KV layout does not round-trip through vLLM's kernel")


class CPUPagedKVConnector(GPUConnectorInterface):
    """LMCache connector between vLLM's CPU paged KV cache and ``KV_2LTD`` memory objects."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int, dtype: torch.dtype):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.hidden_dim_size = num_kv_heads * head_size
        self.dtype = dtype
        self.kvcaches: Optional[List[torch.Tensor]] = None
        self._flat: Optional[List[torch.Tensor]] = None
        self._flat_src: Optional[List[int]] = None
        self._offsets: Optional[torch.Tensor] = None
        self.block_size = 0
        self.perturb = os.environ.get(PERTURB_ENV, "") not in ("", "0")

    @classmethod
    def from_metadata(cls, metadata, **_ignored) -> "CPUPagedKVConnector":
        # kv_shape: (num_layers, 2 (1 with MLA), chunk_size, num_kv_heads, head_size)
        if metadata.use_mla:
            raise NotImplementedError("the CPU test connector does not handle MLA")
        num_layers, _, _, num_kv_heads, head_size = metadata.kv_shape
        return cls(num_layers, num_kv_heads, head_size, metadata.kv_dtype)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])

    # -- geometry ---------------------------------------------------------------------------

    def _layers(self, kwargs) -> List[torch.Tensor]:
        """Flat per-layer views of vLLM's cache (learning the block layout on first use)."""
        self.initialize_kvcaches_ptr(**kwargs)
        if self.kvcaches is None:
            raise ValueError("'kvcaches' should be provided in kwargs or registered before")
        ptrs = [t.data_ptr() for t in self.kvcaches]
        if self._flat is not None and self._flat_src == ptrs:
            return self._flat
        if len(self.kvcaches) != self.num_layers:
            raise ValueError(f"{len(self.kvcaches)} KV layers, metadata says {self.num_layers}")
        flat = []
        for t in self.kvcaches:
            if t.device.type != "cpu" or t.dim() != 4:
                raise ValueError(f"expected vLLM CPU_ATTN caches [N, H, B, 2D], got {t.shape}")
            n, h, b, d2 = t.shape
            if (h, d2) != (self.num_kv_heads, 2 * self.head_size) or t.dtype != self.dtype:
                raise ValueError(f"KV cache {tuple(t.shape)} {t.dtype} does not match metadata")
            if not t[0].is_contiguous():
                raise ValueError("vLLM's CPU KV blocks are expected to be contiguous")
            elems = h * b * d2
            flat.append(t.as_strided((n, elems), (t.stride(0), 1)))
        block_size = self.kvcaches[0].shape[2]
        if self._offsets is None or block_size != self.block_size:
            isa = _isa(self.dtype, block_size, self.head_size)
            self._offsets = learn_block_layout(
                self.num_kv_heads, block_size, self.head_size, self.dtype, isa
            )
            self.block_size = block_size
            logger.info(
                "CPU KV connector (test scaffolding): %d layers of %s %s, block_size %d, "
                "isa %s, layout learned from vLLM's kernel",
                len(self.kvcaches), tuple(self.kvcaches[0].shape), self.dtype, block_size, isa,
            )
        self._flat = [f.view(-1) if f.is_contiguous() else f for f in flat]
        self._flat_src = ptrs
        return self._flat

    def _index(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        assert self._offsets is not None
        if bool((slot_mapping < 0).any()):
            raise ValueError("slot_mapping has -1 inside the range to copy")
        return _gather_index(self._offsets, slot_mapping, self.block_size)

    @staticmethod
    def _slots(kwargs, start: int, end: int) -> torch.Tensor:
        if "slot_mapping" not in kwargs:
            raise ValueError("'slot_mapping' should be provided in kwargs.")
        return kwargs["slot_mapping"][start:end]

    def _check(self, memory_obj: MemoryObj, start: int, end: int) -> torch.Tensor:
        t = memory_obj.tensor
        assert t is not None
        if t.shape != self.get_shape(end - start) or t.dtype != self.dtype:
            raise ValueError(f"memory object {tuple(t.shape)} {t.dtype}, want KV_2LTD")
        return t

    # -- GPUConnectorInterface ----------------------------------------------------------------

    @torch.inference_mode()
    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs):
        """vLLM's cache -> memory object (LMCache store)."""
        dst = self._check(memory_obj, start, end)
        layers = self._layers(kwargs)
        idx = self._index(self._slots(kwargs, start, end))
        n = end - start
        for layer, flat in enumerate(layers):
            dst[:, layer].copy_(self._take(flat, idx).reshape(2, n, self.hidden_dim_size))

    @torch.inference_mode()
    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs):
        """Memory object -> vLLM's cache (LMCache retrieve)."""
        src = self._check(memory_obj, start, end)
        layers = self._layers(kwargs)
        # Tokens vLLM already holds (its own prefix cache) are not overwritten, as in
        # VLLMPagedMemGPUConnectorV2 (skip_prefix_n_tokens).
        skip = min(end - start, max(0, kwargs.get("vllm_cached_tokens", 0) - start))
        if skip == end - start:
            return
        idx = self._index(self._slots(kwargs, start + skip, end))
        n = end - start - skip
        for layer, flat in enumerate(layers):
            kv = src[:, layer, skip:].reshape(2, n, self.num_kv_heads, self.head_size)
            if self.perturb:
                gen = torch.Generator().manual_seed(start * 1000 + layer)
                noise = torch.randn(kv.shape, generator=gen).to(kv.dtype)
                kv = kv + noise * kv.float().std().to(kv.dtype)
            self._put(flat, idx, kv)
        if self.perturb:
            logger.warning("PERTURBED the KV loaded for tokens [%d, %d)", start + skip, end)

    @staticmethod
    def _take(flat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if flat.dim() == 1:
            return flat[idx]
        row = flat.shape[1]
        return flat[idx // row, idx % row]

    @staticmethod
    def _put(flat: torch.Tensor, idx: torch.Tensor, kv: torch.Tensor) -> None:
        if flat.dim() == 1:
            flat[idx] = kv
        else:
            row = flat.shape[1]
            flat[idx // row, idx % row] = kv

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(memory_obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(memory_obj, start, end, **kwargs)
