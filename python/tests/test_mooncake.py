"""`regolith.mooncake`: Mooncake's API and return conventions against a real loopback cluster."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import textwrap

import numpy as np
import pytest

import regolith
import regolith.mooncake as mc
from cluster import pattern

MiB = 1 << 20

# The seed's LMCache extra_config, as LMCache hands it to setup() (every value a string).
SEED = {
    "local_hostname": "localhost",
    "metadata_server": "http://localhost:8080/metadata",
    "global_segment_size": "21474836480",
    "local_buffer_size": "0",
    "protocol": "rdma",
    "device_name": "",
    "master_server_address": "localhost:50051",
}


def _store_on(cluster, i: int):
    """A store set up with the seed's config on sidecar `i`, closed after the test."""
    s = mc.MooncakeDistributedStore()
    assert s.setup(dict(SEED, sidecar_socket=cluster.socket(i))) == 0
    yield s
    s.close()


@pytest.fixture
def store(cluster):
    yield from _store_on(cluster, 0)


@pytest.fixture
def store_b(cluster):
    yield from _store_on(cluster, 1)


# ---------------------------------------------------------------- setup


def test_setup_dict_with_the_seed_config(cluster):
    s = mc.MooncakeDistributedStore()
    assert s.get_hostname() == ""
    assert s.setup(dict(SEED)) == 0  # REGOLITH_SOCKET (the fixture's) → node-0
    assert s.get_hostname() == "node-0"
    assert s.health_check() == 0
    assert s.close() == 0
    assert s.health_check() == 1


def test_setup_positional_form(cluster, monkeypatch):
    monkeypatch.setenv("REGOLITH_SOCKET", cluster.socket(1))
    s = mc.MooncakeDistributedStore()
    assert s.setup(
        "localhost", "http://localhost:8080/metadata", 21474836480, 0, "tcp", "", "localhost:50051"
    ) == 0
    assert s.get_hostname() == "node-1"
    s.close()


def test_setup_accepts_both_key_spellings_and_numbers(cluster):
    s = mc.MooncakeDistributedStore()
    cfg = {
        "local_hostname": "localhost",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 1 << 30,
        "local_buffer_size": 32 * MiB,
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": "127.0.0.1:50051",
        "sidecar_socket": cluster.socket(1),
    }
    assert s.setup(cfg) == 0
    assert s.get_hostname() == "node-1"
    s.close()
    # keyword form with the new names
    assert s.setup(
        local_hostname="h", metadata_server="m", global_segment_size="1GiB",
        local_buffer_size="16MiB", protocol="tcp", rdma_devices="",
        master_server_addr="127.0.0.1:50051",
    ) == 0  # fmt: skip
    assert s.get_hostname() == "node-0"
    s.close()


def test_setup_rejects_malformed_values(cluster):
    s = mc.MooncakeDistributedStore()
    with pytest.raises(ValueError):
        s.setup(dict(SEED, global_segment_size="lots"))
    with pytest.raises(TypeError):
        s.setup(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)


def test_setup_without_a_sidecar_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.delenv("REGOLITH_SPAWN_SIDECAR", raising=False)
    s = mc.MooncakeDistributedStore()
    with pytest.raises(regolith.ConnectError) as e:
        s.setup(dict(SEED, sidecar_socket=str(tmp_path / "none.sock")))
    msg = str(e.value)
    assert "regolith-sidecar --metad localhost:50051" in msg
    assert "REGOLITH_SOCKET" in msg and "REGOLITH_SPAWN_SIDECAR=1" in msg
    assert e.value.code == -900
    assert not isinstance(e.value, TypeError)  # LMCache would retry the legacy form
    assert s.put("k", b"v") == -1  # not set up


def test_rdma_falls_back_to_tcp_and_says_so_once(cluster, caplog, monkeypatch):
    monkeypatch.setattr(mc, "_protocol_noted", False)
    monkeypatch.setattr(mc, "_rdma_devices", lambda: [])
    caplog.set_level(logging.INFO, logger="regolith.mooncake")
    for _ in range(3):
        s = mc.MooncakeDistributedStore()
        assert s.setup(dict(SEED)) == 0
        s.close()
    warnings = [r for r in caplog.records if "rdma" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "falls back to TCP" in warnings[0].getMessage()


# ---------------------------------------------------------------- return conventions


def test_put_get_codes(store, store_b, key):
    k = key()
    assert store.put(k, b"value") == 0
    # As Mooncake's client: a put of an existing key answers 0 and leaves the object as it was.
    assert store.put(k, b"again") == 0
    assert store_b.get(k) == b"value"
    assert store.put_batch([k, key()], [b"x", b"new"]) == 0
    assert store_b.get(k) == b"value"
    assert store.get(key("missing")) == b""
    assert store.get_size(k) == 5
    assert store.get_size(key("missing")) == -704
    assert store.is_exist(k) == 1
    assert store.is_exist(key("missing")) == 0
    assert store.batch_is_exist([k, key("missing")]) == [1, 0]
    assert store.remove(k) == 0
    assert store.remove(k) == -704
    assert store.is_exist(k) == 0


def test_batch_remove_and_remove_all(store, key):
    ks = [key() for _ in range(4)]
    for k in ks:
        assert store.put(k, b"v") == 0
    assert store.batch_remove([ks[0], key("missing")]) == [0, -704]
    assert store.remove_all() >= 3
    assert store.batch_is_exist(ks) == [0, 0, 0, 0]
    assert store.batch_remove([]) == []


def test_put_parts_and_batch_get_buffer(store, store_b, key):
    meta, kv = b"M" * 28, pattern(256 * 1024, seed=4)
    k = key()
    assert store.put_parts(k, meta, memoryview(kv)) == 0
    assert store.put_parts(k, b"other", kv) == 0  # exists: 0, nothing rewritten
    bufs = store_b.batch_get_buffer([k, key("missing")])
    assert bufs[1] is None
    h = bufs[0]
    assert h.size() == len(meta) + len(kv)
    view = memoryview(h)
    assert bytes(view[:28]) == meta and bytes(view[28:]) == kv
    assert ctypes.string_at(h.ptr(), 28) == meta
    # a private copy: writing it leaves the cache alone
    view[:28] = b"X" * 28
    assert bytes(store.get_buffer(k))[:28] == meta
    assert store.get_buffer(key("missing")) is None
    assert store.get_batch([k, key("missing")]) == [meta + kv, b""]


def test_put_parts_with_config(store, key):
    cfg = mc.ReplicateConfig()
    cfg.preferred_segment = "node-1"
    k = key()
    assert store.put_parts(k, b"a", b"b", config=cfg) == 0
    assert store.get(k) == b"ab"


def test_register_buffer_put_from_get_into(store, store_b, key):
    src = np.frombuffer(pattern(MiB, seed=2), dtype=np.uint8).copy()
    dst = np.zeros(MiB, dtype=np.uint8)
    assert store.register_buffer(src.ctypes.data, src.nbytes) == 0
    assert store_b.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    k = key()
    cfg = mc.ReplicateConfig()
    cfg.replica_num = 1
    assert store.put_from(k, src.ctypes.data, src.nbytes, cfg) == 0
    assert store.put_from(k, src.ctypes.data, src.nbytes) == 0  # exists: 0 as in Mooncake
    assert store_b.get_into(k, dst.ctypes.data, dst.nbytes) == MiB
    assert np.array_equal(src, dst)
    assert store_b.get_into(k, dst.ctypes.data, 100) == -600  # too small, as Mooncake
    assert store_b.get_into(key("missing"), dst.ctypes.data, 100) == -704
    assert store.unregister_buffer(src.ctypes.data) == 0
    assert store.unregister_buffer(src.ctypes.data) == -600
    assert store.put_from(key(), src.ctypes.data, 10) == -600  # no longer registered


def test_bad_pointers_answer_invalid_params(store, key):
    k = key()
    assert store.put(k, b"0123456789") == 0
    arr = np.zeros(64, dtype=np.uint8)
    assert store.register_buffer(arr.ctypes.data, 64) == 0
    assert store.get_into(k, 0xDEAD0000, 10) == -600
    assert store.get_into(k, arr.ctypes.data + 60, 10) == -600
    assert store.put_from(key(), 0x10, 4) == -600
    assert store.batch_get_into([k, k], [0x10, arr.ctypes.data], [10, 10]) == [-600, 10]
    assert store.batch_put_from([key()], [0x10], [4]) == [-600]
    assert store.register_buffer(0, 10) == -600
    assert bytes(arr[:10]) == b"0123456789"


def test_batch_put_from_batch_get_into(store, store_b, key):
    n, size = 32, 128 * 1024
    src = np.frombuffer(pattern(n * size, seed=8), dtype=np.uint8).copy()
    dst = np.zeros(n * size, dtype=np.uint8)
    store.register_buffer(src.ctypes.data, src.nbytes)
    store_b.register_buffer(dst.ctypes.data, dst.nbytes)
    keys = [key() for _ in range(n)]
    ptrs = [src.ctypes.data + i * size for i in range(n)]
    cfg = mc.ReplicateConfig()
    cfg.preferred_segment = store.get_hostname()
    assert store.batch_put_from(keys, ptrs, [size] * n, cfg) == [0] * n
    assert store.batch_put_from(keys[:2], ptrs[::-1][:2], [size] * 2, cfg) == [0, 0]
    out = [dst.ctypes.data + i * size for i in range(n)]
    assert store_b.batch_get_into(keys, out, [size] * n) == [size] * n
    assert np.array_equal(src, dst)
    assert store_b.batch_get_into([key("missing")], out[:1], [size]) == [-704]
    assert store.batch_put_from([], [], []) == []


def test_object_of_32_mib(store, store_b, key):
    data = np.frombuffer(pattern(32 * MiB, seed=12), dtype=np.uint8).copy()
    out = np.zeros_like(data)
    store.register_buffer(data.ctypes.data, data.nbytes)
    store_b.register_buffer(out.ctypes.data, out.nbytes)
    k = key("big")
    assert store.put_from(k, data.ctypes.data, data.nbytes) == 0
    assert store_b.get_size(k) == 32 * MiB
    assert store_b.get_into(k, out.ctypes.data, out.nbytes) == 32 * MiB
    assert np.array_equal(data, out)
    assert len(store_b.get(k)) == 32 * MiB


def test_shared_memory_buffers_through_the_store(store, store_b, key):
    buf = store.client.alloc_buffer(2 * MiB)
    np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(pattern(2 * MiB, seed=6), dtype=np.uint8)
    k = key()
    assert store.put_from(k, buf.address, 2 * MiB) == 0  # no registration needed
    other = store_b.client.alloc_buffer(2 * MiB)
    assert store_b.get_into(k, other.address, 2 * MiB) == 2 * MiB
    assert bytes(memoryview(other)) == pattern(2 * MiB, seed=6)


def test_replicate_config_mooncake_attributes(store, key):
    cfg = mc.ReplicateConfig()
    assert cfg.replica_num == 1
    cfg.replica_num = 2
    cfg.with_soft_pin = True
    cfg.with_hard_pin = False
    cfg.prefer_alloc_in_same_node = True
    cfg.preferred_segments = ["node-0", "node-1"]
    assert store.put(key(), b"x", cfg) == 0


def test_closed_store(cluster, key):
    s = mc.MooncakeDistributedStore()
    assert s.setup(dict(SEED)) == 0
    assert s.close() == 0
    assert s.close() == 0
    assert s.put(key(), b"v") == -1
    assert s.put_from(key(), 1, 1) == -1
    assert s.get("x") == b""
    assert s.get_buffer("x") is None
    assert s.batch_get_buffer(["x", "y"]) == [None, None]
    assert s.is_exist("x") < 0
    assert s.batch_is_exist(["x"]) == [-1]
    assert s.batch_put_from(["a"], [1], [1]) == [-1]
    assert s.batch_get_into(["a"], [1], [1]) == [-1]
    assert s.get_into("x", 1, 1) == -1
    assert s.get_size("x") == -1
    assert s.remove("x") == -1
    assert s.remove_all() == -1
    assert s.register_buffer(1, 1) == -1
    assert s.get_hostname() == ""
    with pytest.raises(regolith.ClosedError):
        s.client


def test_bind_to_numa_node_is_accepted():
    assert mc.bind_to_numa_node(0) is None
    with pytest.raises(TypeError):
        mc.bind_to_numa_node("zero")


def test_two_processes_through_the_mooncake_api(cluster, store, key):
    k = key()
    script = textwrap.dedent(
        f"""
        import ctypes
        from regolith.mooncake import MooncakeDistributedStore, ReplicateConfig
        s = MooncakeDistributedStore()
        assert s.setup({dict(SEED)!r}) == 0
        buf = ctypes.create_string_buffer(1 << 20)
        assert s.register_buffer(ctypes.addressof(buf), 1 << 20) == 0
        ctypes.memmove(buf, b"written by the child" * 1000, 20000)
        cfg = ReplicateConfig()
        cfg.preferred_segment = s.get_hostname()
        print(s.put_from({k!r}, ctypes.addressof(buf), 20000, cfg), s.get_hostname())
        s.close()
        """
    )
    out = cluster.run_python(script, 1)
    assert out == ["0", "node-1"]
    got = store.get(k)
    assert hashlib.sha256(got).digest() == hashlib.sha256(b"written by the child" * 1000).digest()


def test_mooncake_store_module_via_the_shim():
    store_mod = pytest.importorskip("mooncake.store")
    assert store_mod.MooncakeDistributedStore is mc.MooncakeDistributedStore
    assert store_mod.ReplicateConfig is mc.ReplicateConfig
    assert store_mod.bind_to_numa_node is mc.bind_to_numa_node
