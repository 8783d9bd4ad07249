"""The rest of Mooncake's store API on Regolith (issue 13 item 1), against a real loopback
cluster: replica descriptors, multi-buffer and range forms, upserts (also racing readers),
sessions, key listing by regex, the dummy client, segments and the asyncio wrapper. Return
values are the ones Mooncake 0.3.13.post1 answers (its codes: -600 invalid parameters, -704
not found, -705 already exists, -800 transfer failed, -1012 not supported)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import regolith.mooncake as mc
from cluster import pattern
from test_mooncake import SEED, _store_on

MiB = 1 << 20


@pytest.fixture
def store(cluster):
    yield from _store_on(cluster, 0)


@pytest.fixture
def store_b(cluster):
    yield from _store_on(cluster, 1)


def registered(store, n: int) -> np.ndarray:
    """A numpy buffer of `n` bytes registered with `store` (LMCache's way)."""
    a = np.zeros(n, dtype=np.uint8)
    assert store.register_buffer(a.ctypes.data, n) == 0
    return a


# ---------------------------------------------------------------- replica descriptors


def test_replica_descriptors_name_the_holding_node(store, store_b, key):
    k, k2, missing = key(), key(), key("missing")
    here = mc.ReplicateConfig()
    here.preferred_segment = store.get_hostname()
    there = mc.ReplicateConfig()
    there.preferred_segment = store_b.get_hostname()
    assert store.put(k, pattern(5000), here) == 0
    assert store.put(k2, pattern(64), there) == 0

    descs = store.get_replica_desc(k)
    assert len(descs) == 1
    d = descs[0]
    assert d.is_memory_replica() and not d.is_disk_replica() and not d.is_local_disk_replica()
    assert d.status == mc.ReplicaStatus.COMPLETE
    buf = d.get_memory_descriptor().buffer_descriptor
    assert buf.transport_endpoint == store.get_hostname()
    assert buf.size == 5000
    assert isinstance(buf.buffer_address, int)
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        d.get_disk_descriptor()
    assert store.get_replica_desc(missing) == []

    batch = store_b.batch_get_replica_desc([k2, missing, k])
    assert list(batch) == sorted([k, k2]), "missing keys are absent; keys sorted"
    assert batch[k2][0].get_memory_descriptor().buffer_descriptor.transport_endpoint == (
        store_b.get_hostname()
    )


def test_two_replicas_are_two_descriptors_on_two_nodes(store, key):
    k = key()
    cfg = mc.ReplicateConfig()
    cfg.replica_num = 2
    assert store.put(k, b"twice", cfg) == 0
    nodes = {
        d.get_memory_descriptor().buffer_descriptor.transport_endpoint
        for d in store.get_replica_desc(k)
    }
    assert len(nodes) == 2


# ---------------------------------------------------------------- multi-buffer forms


def test_multi_buffers_round_trip_with_a_missing_key_in_the_middle(store, store_b, key):
    keys = [key(), key(), key()]
    src = registered(store, 3 * MiB)
    src[:] = np.frombuffer(pattern(3 * MiB, seed=7), dtype=np.uint8)
    base = src.ctypes.data
    # Pieces that do not start on 64 KiB chunk boundaries, of several sizes.
    layouts = [[(0, 100), (1000, 70_000)], [(200_000, 5), (300_000, 1 << 20)], [(2 * MiB, 1)]]
    ptrs = [[base + off for off, _ in lay] for lay in layouts]
    sizes = [[n for _, n in lay] for lay in layouts]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0, 0]
    # An existing key answers 0 and keeps its value (Mooncake's put convention).
    assert store.batch_put_from_multi_buffers(keys[:1], [[base + 5]], [[170]]) == [0]

    want = [b"".join(bytes(src[o : o + n]) for o, n in lay) for lay in layouts]
    for k, w in zip(keys, want):
        assert store_b.get(k) == w

    dst = registered(store_b, 3 * MiB)
    dbase = dst.ctypes.data
    get_keys = [keys[0], key("missing"), keys[1]]
    # Each key's object scattered over buffers of other sizes than it was put from.
    out_layouts = [
        [(0, 50), (60, 70_050)],
        [(100_000, 10)],
        [(1 * MiB, 300_000), (2 * MiB, 5 + (1 << 20) - 300_000)],
    ]
    out_ptrs = [[dbase + off for off, _ in lay] for lay in out_layouts]
    out_sizes = [[n for _, n in lay] for lay in out_layouts]
    got = store_b.batch_get_into_multi_buffers(get_keys, out_ptrs, out_sizes)
    assert got == [len(want[0]), -704, len(want[1])]
    for w, lay in ((want[0], out_layouts[0]), (want[1], out_layouts[2])):
        assert b"".join(bytes(dst[o : o + n]) for o, n in lay) == w


def test_multi_buffer_sizes_must_add_up_to_the_object(store, key):
    k = key()
    assert store.put(k, b"1234567") == 0
    dst = registered(store, 64)
    p = dst.ctypes.data
    assert store.batch_get_into_multi_buffers([k], [[p, p + 8]], [[2, 3]]) == [-600]
    assert store.batch_get_into_multi_buffers([k], [[p, p + 8]], [[4, 8]]) == [-800]
    assert store.batch_get_into_multi_buffers([k], [[p, p + 8]], [[4, 3]]) == [7]
    assert bytes(dst[:4]) + bytes(dst[8:11]) == b"1234567"
    # Shapes that do not match answer -600 for every key.
    assert store.batch_get_into_multi_buffers([k, k], [[p]], [[7]]) == [-600, -600]
    assert store.batch_put_from_multi_buffers([key()], [[p, p]], [[1]]) == [-600]


def test_get_into_ranges(store, store_b, key):
    k1, k2 = key(), key()
    assert store.put(k1, b"0123456789") == 0
    assert store.put(k2, b"abcdefghij") == 0
    a = registered(store_b, 32)
    b = registered(store_b, 32)
    unregistered = np.zeros(32, dtype=np.uint8)
    res = store_b.get_into_ranges(
        [a.ctypes.data, b.ctypes.data, unregistered.ctypes.data],
        [[k1, k2], [key("missing")], [k1]],
        [[[0, 10], [20]], [[0]], [[0]]],
        [[[2, 5], [9]], [[0]], [[0]]],
        [[[4, 3], [1]], [[2]], [[2]]],
    )
    assert res == [[[4, 3], [1]], [[-704]], [[-600]]]
    assert bytes(a[0:4]) == b"2345" and bytes(a[10:13]) == b"567" and bytes(a[20:21]) == b"j"
    # A range past the object's end.
    assert store_b.get_into_ranges([a.ctypes.data], [[k1]], [[[0]]], [[[8]]], [[[3]]]) == [[[-600]]]
    # Lists of different lengths: -600 everywhere, shaped by the destination offsets.
    assert store_b.get_into_ranges([a.ctypes.data], [[k1]], [[[0, 1]]], [[[0]]], [[[1]]]) == [
        [[-600, -600]]
    ]


def test_put_and_get_sessions_with_ranges(store, store_b, key):
    k, existing = key(), key()
    assert store.put(existing, b"x") == 0
    src = registered(store, 64)
    src[:12] = np.frombuffer(b"hello world!", dtype=np.uint8)
    p = src.ctypes.data
    assert store.batch_put_session_start([k, existing], [12, 3]) == [0, -705]
    assert store.is_exist(k) == 0, "invisible until the session ends"
    assert store.batch_put_from_multi_buffer_ranges([k], [[p + 6, p]], [[6, 6]], [[6, 0]]) == [12]
    assert store.batch_put_from_multi_buffer_ranges([k], [[p]], [[6]], [[7]]) == [-600]
    assert store.batch_put_session_end([k, key("none")]) == [0, -600]
    assert store_b.get(k) == b"hello world!"

    dst = registered(store_b, 64)
    d = dst.ctypes.data
    assert store_b.batch_get_session_start([k, key("missing")]) == [0, -704]
    assert store_b.batch_get_into_multi_buffer_ranges([k], [[d, d + 10]], [[5, 5]], [[6, 0]]) == [10]
    assert bytes(dst[:5]) == b"world" and bytes(dst[10:15]) == b"hello"
    assert store_b.batch_get_session_end([k]) == 0
    assert store_b.batch_get_into_multi_buffer_ranges([k], [[d]], [[5]], [[0]]) == [-600]

    revoked = key("revoked")
    assert store.batch_put_session_start([revoked], [4]) == [0]
    assert store.batch_put_session_revoke([revoked]) == [0]
    assert store.batch_put_session_revoke([revoked]) == [-600], "no session any more"
    assert store.is_exist(revoked) == 0


# ---------------------------------------------------------------- upserts


# A replacing put made through one node is seen at once through that node, and through another
# node's index within its staleness bound (docs/sidecar.md: 2 s; milliseconds on a healthy
# stream), meanwhile only as a value put under the key before, never other bytes.
STALE_BOUND_S = 2.5


def seen_by(store, k: str, want: bytes, *earlier: bytes) -> None:
    deadline = time.monotonic() + STALE_BOUND_S
    while True:
        got = store.get(k)
        if got == want:
            return
        assert got in earlier, f"{k}: {got!r} was never put under the key (want {want!r})"
        assert time.monotonic() < deadline, f"{k}: still {got!r} after {STALE_BOUND_S} s"
        time.sleep(0.01)


def test_upsert_family_replaces_values(store, store_b, key):
    k, k2, k3, k4 = key(), key(), key(), key()
    assert store.upsert(k, b"first") == 0, "an absent key is inserted"
    assert store.upsert(k, b"second value, longer") == 0
    assert store.get(k) == b"second value, longer", "read-your-writes on the writer's node"
    seen_by(store_b, k, b"second value, longer", b"first")
    assert store.put(k, b"ignored") == 0 and store_b.get(k) == b"second value, longer"

    src = registered(store, 1024)
    src[:6] = np.frombuffer(b"abcdef", dtype=np.uint8)
    assert store.upsert_from(k2, src.ctypes.data, 6) == 0
    assert store.upsert_from(k2, src.ctypes.data, 3) == 0
    assert store.get(k2) == b"abc"
    seen_by(store_b, k2, b"abc", b"abcdef")
    assert store.upsert_from(k2, src.ctypes.data, 0) == 0, "size 0: nothing stored"
    assert store_b.get(k2) == b"abc"

    assert store.upsert_parts(k3, b"ab", bytearray(b"cd")) == 0
    assert store.upsert_parts(k3, b"x", b"y", memoryview(b"z")) == 0
    assert store.get(k3) == b"xyz"
    seen_by(store_b, k3, b"xyz", b"abcd")

    assert store.upsert_batch([k, k4], [b"b1", b"b2"]) == 0
    assert [store.get(x) for x in (k, k4)] == [b"b1", b"b2"]
    seen_by(store_b, k, b"b1", b"second value, longer")
    seen_by(store_b, k4, b"b2")
    assert store.upsert_batch([k], [b"1", b"2"]) == -600

    assert store.batch_upsert_from([k, k2], [src.ctypes.data, src.ctypes.data + 1], [2, 2]) == [0, 0]
    assert [store.get(x) for x in (k, k2)] == [b"ab", b"bc"]
    seen_by(store_b, k, b"ab", b"b1")
    seen_by(store_b, k2, b"bc", b"abc")


def test_upserts_racing_readers_see_whole_values(store, store_b, key):
    """Readers on the other node see one of the written values whole, never a mix and never a
    miss, while the value is replaced again and again (sizes change too)."""
    k = key()
    values = [bytes([i]) * (100_000 + 4096 * i) for i in range(1, 9)]
    assert store.upsert(k, values[0]) == 0
    stop = threading.Event()
    seen: list[int] = []
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            v = store_b.get(k)
            if v not in values:
                bad.append(f"{len(v)} bytes, first {v[:1]!r}, last {v[-1:]!r}")
            else:
                seen.append(values.index(v))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for round_ in range(6):
            for v in values[1:] + values[:1]:
                assert store.upsert(k, v) == 0
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not bad, bad[:5]
    assert len(set(seen)) > 1, "the readers saw the value change"


# ---------------------------------------------------------------- keys


def test_remove_by_regex_and_batch_replica_clear(store, store_b, key):
    k = key()
    prefix = k.split("/")[0]
    keys = [f"{prefix}/layer{i}/chunk" for i in range(5)] + [f"{prefix}/other"]
    for x in keys:
        assert store.put(x, b"v") == 0
    assert store.remove_by_regex("([") == -600
    assert store.remove_by_regex(f"^{prefix}/layer[0-2]/") == 3
    assert [store.is_exist(x) for x in keys] == [0, 0, 0, 1, 1, 1]
    # A search, not a full match: "other" matches anywhere in the key.
    assert store.remove_by_regex(f"{prefix}.*her") == 1
    assert store.remove_by_regex(f"^{prefix}/nothing$") == 0

    here = mc.ReplicateConfig()
    here.preferred_segment = store.get_hostname()
    there = mc.ReplicateConfig()
    there.preferred_segment = store_b.get_hostname()
    a, b = key(), key()
    assert store.put(a, b"a", here) == 0 and store.put(b, b"b", there) == 0
    assert store.batch_replica_clear([a, b, key("missing")], store_b.get_hostname()) == [b]
    assert store.is_exist(a) == 1 and store.is_exist(b) == 0
    assert store.batch_replica_clear([a, "", key("missing")]) == [a]
    assert store.is_exist(a) == 0


# ---------------------------------------------------------------- configuration


def test_replicate_config_has_every_mooncake_field(store, key):
    cfg = mc.ReplicateConfig()
    assert cfg.soft_pin_ttl_ms is None and cfg.soft_pin_action == mc.SoftPinAction.PRESERVE
    cfg.soft_pin_action = mc.SoftPinAction.ENABLE
    cfg.soft_pin_ttl_ms = 60_000
    cfg.nof_replica_num = 0
    cfg.dfs_replica_num = 0
    cfg.preferred_nof_segments = []
    cfg.data_type = mc.ObjectDataType.KVCACHE
    cfg.group_ids = ["g"]
    assert store.put(key(), b"x", cfg) == 0
    assert "soft_pin_action=1" in repr(cfg)
    cfg.soft_pin_ttl_ms = None
    assert cfg.soft_pin_ttl_ms is None


# ---------------------------------------------------------------- the dummy client, memory


def test_a_tenant_id_is_said_to_share_the_key_space(cluster, caplog):
    s = mc.MooncakeDistributedStore()
    with caplog.at_level("WARNING", logger="regolith.mooncake"):
        assert s.setup(dict(SEED, sidecar_socket=cluster.socket(0), tenant_id="team-b")) == 0
    s.close()
    assert any("one key space for every tenant" in r.getMessage() for r in caplog.records)


def test_setup_dummy_uses_the_nodes_sidecar(cluster, monkeypatch, key):
    monkeypatch.setenv("REGOLITH_SOCKET", cluster.socket(1))
    s = mc.MooncakeDistributedStore()
    assert s.setup_dummy(0, 16 * MiB, "127.0.0.1:50052") == 0
    try:
        k = key()
        addr = s.alloc_from_mem_pool(MiB)
        assert addr != 0
        # Memory from the pool needs no register_buffer and skips the staging copy.
        payload = pattern(MiB, seed=3)
        s.client.write_into(addr, payload)
        assert s.put_from(k, addr, MiB) == 0
        assert s.get(k) == payload
    finally:
        s.close()
    monkeypatch.setenv("REGOLITH_SOCKET", "/nonexistent/regolith.sock")
    assert mc.MooncakeDistributedStore().setup_dummy(0, MiB, "127.0.0.1:50052") == -1


def test_segment_calls_are_not_supported_and_say_so_once(store, caplog, monkeypatch):
    monkeypatch.setattr(mc, "_UNSUPPORTED_NOTED", set())  # this test's own "once"
    with caplog.at_level("WARNING", logger="regolith.mooncake"):
        assert store.mount_segment("/dev/shm/x", MiB) == {"ret": -1012, "segment_ids": []}
        assert store.unmount_segment(["a"]) == -1012
        assert store.unmount_segment(["b"]) == -1012
        assert store.allocate_and_mount_segment(MiB)["ret"] == -1012
        assert store.unmount_and_free_segment(["a"]) == -1012
    assert store.unmount_local_disk_segment() == 0
    said = [r for r in caplog.records if "unmount_segment is not supported" in r.getMessage()]
    assert len(said) == 1, "once per method and process"
    assert "sidecar owns the memory" in said[0].getMessage()


# ---------------------------------------------------------------- asyncio


def test_async_store_wraps_every_method(cluster, key):
    async def main() -> None:
        s = mc.MooncakeDistributedStoreAsync()
        assert s.setup(dict(SEED, sidecar_socket=cluster.socket(0))) == 0
        try:
            k = key()
            assert await s.async_put(k, b"async value") == 0
            got, exists = await asyncio.gather(s.async_get(k), s.async_is_exist(k))
            assert (got, exists) == (b"async value", 1)
            assert await s.async_upsert(k, b"v2") == 0
            assert await s.async_get(k) == b"v2"
            with pytest.raises(AttributeError, match="async_nothing"):
                s.async_nothing
        finally:
            s.close()

    asyncio.run(main())


def test_the_shim_provides_the_new_names():
    import importlib

    store = importlib.import_module("mooncake.store")
    for name in (
        "ReplicaDescriptor",
        "ReplicaStatus",
        "SoftPinAction",
        "ObjectDataType",
        "MooncakeHostMemAllocator",
    ):
        assert getattr(store, name) is getattr(mc, name)
    async_store = importlib.import_module("mooncake.async_store")
    assert async_store.MooncakeDistributedStoreAsync is mc.MooncakeDistributedStoreAsync


def test_put_from_with_metadata_and_tasks(store, key):
    k = key()
    buf = registered(store, 64)
    buf[:4] = np.frombuffer(b"META", dtype=np.uint8)
    buf[32:37] = np.frombuffer(b"data!", dtype=np.uint8)
    p = buf.ctypes.data
    assert store.put_from_with_metadata(k, p + 32, p, 5, 4) == 0
    assert store.get(k) == b"METAdata!"
    assert store.put_from_with_metadata(key(), p + 32, p, 0, 4) == 0
    assert store.put_from_with_metadata(key(), 12345, p, 5, 4) == 600, "Mooncake negates it"
    assert store.create_copy_task(k, ["node-1"]) == ((0, 0), -1012)
    assert store.query_task((1, 2)) == (None, -1012)
    assert store.get_offload_rpc_read_count() == 0


def test_host_memory_allocator_and_probe(store, key):
    a = mc.MooncakeHostMemAllocator()
    p = a.alloc(1 << 20)
    assert p != 0
    assert store.register_buffer(p, 1 << 20) == 0
    store.client.write_into(p, b"from allocator memory")
    k = key()
    assert store.put_from(k, p, 21) == 0
    assert store.get(k) == b"from allocator memory"
    assert store.batch_probe_key([k, key("missing")]) == [1, 0]
    assert store.unregister_buffer(p) == 0
    assert a.free(p) == 0
    assert a.free(p) == -1
    assert a.alloc(0) == 0
