"""SGLang HiCache's Mooncake storage backend on Regolith (issue 13 item 3): SGLang's own
`MooncakeStore` class (sglang 0.5.23, `sglang.srt.mem_cache.storage.mooncake_store`) on CPU,
with a host KV pool whose memory it registers with `register_buffer`, against a real loopback
cluster through the `mooncake.store` shim. MHA pages (one buffer per K and V key:
`batch_put_from` / `batch_get_into`) and MLA pages in the layer-first layout (one buffer per
layer: `batch_put_from_multi_buffers` / `batch_get_into_multi_buffers`), written through one
node and read through the other.

Runs where sglang is installed (LMCache's environment, `python/ci/lmcache.sh`); the host pool
below is test scaffolding with the attributes the backend uses, as SGLang's own tests mock it."""

from __future__ import annotations

import uuid

import pytest

torch = pytest.importorskip("torch")
mooncake_store = pytest.importorskip("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store")
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402

PAGE = 4


class HostPool:
    """A host KV pool in SGLang's layouts: MHA `page_first` (K and V of a page contiguous
    across layers) or MLA `layer_first` (one buffer per layer of a page)."""

    def __init__(self, pages: int, mla: bool, layers: int = 3, width: int = 16) -> None:
        self.page_size = PAGE
        self.mla = mla
        self.layers = layers
        self.layout = "layer_first" if mla else "page_first"
        shape = (layers, pages * PAGE, width) if mla else (2, pages * PAGE, layers * width)
        self.kv_buffer = torch.zeros(shape, dtype=torch.float16)
        self.width = width

    def get_ksize_per_token(self) -> int:
        per_token = self.width if self.mla else self.layers * self.width
        return per_token * self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in range(0, len(indices), PAGE):
            t = int(indices[i])
            if self.mla:
                for layer in range(self.layers):
                    ptrs.append(self.kv_buffer[layer, t].data_ptr())
                    sizes.append(PAGE * self.width * self.kv_buffer.element_size())
            else:
                for kv in (0, 1):
                    ptrs.append(self.kv_buffer[kv, t].data_ptr())
                    sizes.append(PAGE * self.get_ksize_per_token())
        return ptrs, sizes

    def page(self, p: int):
        rows = slice(p * PAGE, (p + 1) * PAGE)
        return self.kv_buffer[:, rows].clone()


def backend(cluster, monkeypatch, node: int, mla: bool, pool: HostPool):
    monkeypatch.setenv("REGOLITH_SOCKET", cluster.socket(node))
    cfg = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=not mla,
        model_name="test/model",
        extra_config={
            "master_server_address": cluster.metad_addrs,
            "protocol": "tcp",
            "global_segment_size": 64 << 20,
            "metadata_server": "P2PHANDSHAKE",
        },
    )
    store = mooncake_store.MooncakeStore(cfg)  # setup() and its put/is_exist/get warm-up
    store.register_mem_pool_host(pool)
    return store


@pytest.mark.parametrize("mla", [False, True], ids=["mha-page-first", "mla-layer-first"])
def test_pages_written_on_one_node_are_read_on_the_other(cluster, monkeypatch, mla):
    pages = 3
    writer_pool = HostPool(pages, mla)
    writer_pool.kv_buffer.copy_(torch.randn(writer_pool.kv_buffer.shape).to(torch.float16))
    writer = backend(cluster, monkeypatch, 0, mla, writer_pool)
    keys = [uuid.uuid4().hex for _ in range(pages)]
    indices = torch.arange(pages * PAGE)

    assert writer.batch_set_v1(keys, indices) == [True] * pages
    assert writer.batch_exists(keys) == pages
    assert writer.batch_set_v1(keys, indices) == [True] * pages, "existing pages are skipped"

    reader_pool = HostPool(pages, mla)
    reader = backend(cluster, monkeypatch, 1, mla, reader_pool)
    # Read into the pool's pages in another order than written.
    order = [2, 0, 1]
    got = reader.batch_get_v1([keys[o] for o in order], indices)
    assert got == [True] * pages
    for slot, o in enumerate(order):
        assert torch.equal(reader_pool.page(slot), writer_pool.page(o))

    missing = uuid.uuid4().hex
    assert reader.batch_exists([keys[0], missing, keys[1]]) == 1, "the leading run that exists"
    assert reader.batch_get_v1([missing], torch.arange(PAGE)) == [False]
