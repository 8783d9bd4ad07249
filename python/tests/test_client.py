"""The native API (`regolith.Client`) against a real loopback cluster."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import regolith
from cluster import pattern

MiB = 1 << 20


# ---------------------------------------------------------------- puts and gets


def test_put_get_roundtrip_of_bytes_like_values(client, key):
    values = [b"hello", bytearray(b"bytearray"), memoryview(b"view"), np.arange(100, dtype=np.float32)]
    for v in values:
        k = key()
        client.put(k, v)
        assert client.get(k) == bytes(memoryview(v).cast("B"))


def test_get_from_another_node(client, client_b, key):
    k = key()
    client.put(k, b"x" * 100_000)
    assert client_b.get(k) == b"x" * 100_000


def test_empty_value_is_refused(client, key):
    with pytest.raises(regolith.InvalidArgumentError) as e:
        client.put(key(), b"")
    assert e.value.code == -600


def test_missing_key_raises_not_found_with_key_reason_code(client, key):
    k = key("missing")
    with pytest.raises(regolith.NotFoundError) as e:
        client.get(k)
    assert e.value.key == k
    assert e.value.code == -704
    assert e.value.reason == "not found"
    assert k in str(e.value)
    assert isinstance(e.value, regolith.RegolithError)


def test_put_of_existing_key_raises_already_exists(client, key):
    k = key()
    client.put(k, b"first")
    with pytest.raises(regolith.AlreadyExistsError) as e:
        client.put(k, b"second")
    assert e.value.code == -705 and e.value.key == k
    assert client.get(k) == b"first"


def test_put_parts_concatenates(client, key):
    k = key()
    client.put_parts(k, [b"head:", bytearray(b"body"), memoryview(b":tail")])
    assert client.get(k) == b"head:body:tail"


def test_object_of_32_mib_local_and_remote(client, client_b, key):
    data = pattern(32 * MiB, seed=7)
    k = key("big")
    client.put(k, data)
    assert client.get_size(k) == len(data)
    assert client.get(k) == data
    assert client_b.get(k) == data
    out = bytearray(len(data))
    assert client_b.get_into(k, out) == len(data)
    assert out == data


def test_get_into_buffer_too_small(client, key):
    k = key()
    client.put(k, b"0123456789")
    with pytest.raises(regolith.BufferTooSmallError) as e:
        client.get_into(k, bytearray(4))
    assert e.value.code == -10


def test_get_buffer_is_a_private_copy(client, key):
    k = key()
    client.put(k, b"original")
    h = client.get_buffer(k)
    assert h.size() == len(h) == 8
    assert bytes(memoryview(h)) == b"original"
    memoryview(h)[:4] = b"XXXX"
    assert bytes(h) == b"XXXXinal"
    assert client.get(k) == b"original"
    assert ctypes.string_at(h.ptr(), h.size()) == b"XXXXinal"


def test_batch_get_buffer_with_misses(client, client_b, key):
    keys = [key() for _ in range(3)]
    client.put(keys[0], b"zero")
    client.put(keys[2], pattern(3 * MiB))
    res = client_b.batch_get_buffer(keys)
    assert bytes(res[0]) == b"zero"
    assert isinstance(res[1], regolith.NotFoundError) and res[1].key == keys[1]
    assert bytes(res[2]) == pattern(3 * MiB)


# ---------------------------------------------------------------- keys


def test_exists_size_remove(client, key):
    a, b, missing = key(), key(), key("missing")
    client.put(a, b"aaaa")
    client.put(b, b"bb")
    assert client.exists(a) and not client.exists(missing)
    assert client.batch_exists([a, missing, b]) == [True, False, True]
    sizes = client.batch_get_size([a, missing, b])
    assert sizes[0] == 4 and sizes[2] == 2
    assert isinstance(sizes[1], regolith.NotFoundError)
    with pytest.raises(regolith.NotFoundError):
        client.get_size(missing)
    client.remove(a)
    assert not client.exists(a)
    with pytest.raises(regolith.NotFoundError):
        client.remove(a)
    res = client.batch_remove([b, missing])
    assert res[0] is None and isinstance(res[1], regolith.NotFoundError)
    assert client.batch_exists([b]) == [False]


def test_remove_all(client, client_b, key):
    ks = [key() for _ in range(5)]
    for k in ks:
        client.put(k, b"v")
    assert client_b.remove_all() >= 5
    # Through the node that removed them: at once (read-your-writes).
    assert client_b.batch_exists(ks) == [False] * 5
    # Through another node: once its object index hears of it, which its 2 s staleness bound
    # caps (docs/sidecar.md, "The object index"; milliseconds here).
    end = time.monotonic() + 2.5
    while client.batch_exists(ks) != [False] * 5 and time.monotonic() < end:
        time.sleep(0.01)
    assert client.batch_exists(ks) == [False] * 5


def test_stats_segments_node_name(client, client_b):
    assert client.node_name == "node-0"
    assert client_b.node_name == "node-1"
    s = client.stats()
    assert s["node_name"] == "node-0" and s["bytes_total"] >= 512 * MiB
    segs = {x["node_name"]: x for x in client.list_segments()}
    assert set(segs) >= {"node-0", "node-1"}
    assert segs["node-0"]["local"] and segs["node-0"]["alive"]


def test_replicate_config_places_replicas(client, key):
    def objects():
        return {s["node_name"]: s["objects"] for s in client.list_segments()}

    before = objects()
    cfg = regolith.ReplicateConfig(replica_num=2)
    client.put(key(), b"two copies", cfg)
    after = objects()
    assert after["node-0"] == before["node-0"] + 1 and after["node-1"] == before["node-1"] + 1

    cfg = regolith.ReplicateConfig()
    cfg.preferred_segment = "node-1"
    client.put(key(), b"on b", cfg)
    again = objects()
    assert again["node-1"] == after["node-1"] + 1 and again["node-0"] == after["node-0"]

    cfg = regolith.ReplicateConfig(prefer_alloc_in_same_node=True, with_soft_pin=True)
    client.put(key(), b"local", cfg)
    assert objects()["node-0"] == again["node-0"] + 1


def test_replicate_config_attributes():
    cfg = regolith.ReplicateConfig()
    assert cfg.replica_num == 1 and cfg.preferred_segment == "" and cfg.preferred_segments == []
    cfg.replica_num = 3
    cfg.preferred_segments = ["a", "b"]
    cfg.with_hard_pin = True
    cfg.with_soft_pin = True
    cfg.prefer_alloc_in_same_node = True
    assert "replica_num=3" in repr(cfg) and cfg.preferred_segments == ["a", "b"]


# ---------------------------------------------------------------- shared memory


def test_alloc_buffer_is_writable_shared_memory(client, client_b, key):
    buf = client.alloc_buffer(4 * MiB)
    assert buf.size == len(buf) == 4 * MiB and buf.address != 0
    mv = memoryview(buf)
    assert not mv.readonly and mv.nbytes == 4 * MiB
    arr = np.frombuffer(buf, dtype=np.uint8)
    assert arr.flags.writeable
    arr[:] = np.frombuffer(pattern(4 * MiB, seed=3), dtype=np.uint8)
    k = key()
    client.put_from(k, buf.address, 4 * MiB)
    assert client_b.get(k) == pattern(4 * MiB, seed=3)

    # get_into an offset of the buffer, by address, from a remote replica
    k2 = key()
    client_b.put(k2, b"abcdef", regolith.ReplicateConfig(preferred_segment="node-1"))
    assert client.get_into(k2, buf.address + 100, 6) == 6
    assert bytes(mv[100:106]) == b"abcdef"

    # slices and numpy views of the buffer are accepted as buffer objects
    k3 = key()
    client.put(k3, mv[100:106])
    assert client.get(k3) == b"abcdef"
    buf.free()


def test_alloc_buffer_get_into_view_too_small(client, key):
    buf = client.alloc_buffer(MiB)
    k = key()
    client.put(k, b"z" * 5000)
    with pytest.raises(regolith.BufferTooSmallError):
        client.get_into(k, np.frombuffer(buf, dtype=np.uint8)[:100])
    assert client.get_into(k, np.frombuffer(buf, dtype=np.uint8)[10:6000]) == 5000
    assert bytes(memoryview(buf)[10:5010]) == b"z" * 5000


def test_freed_buffer_is_refused_but_stays_readable(client, key):
    buf = client.alloc_buffer(MiB)
    memoryview(buf)[:3] = b"abc"
    buf.free()
    assert not buf.registered
    with pytest.raises(regolith.InvalidArgumentError):
        client.put_from(key(), buf.address, 3)
    assert bytes(memoryview(buf)[:3]) == b"abc"
    buf.free()  # idempotent


def test_torch_frombuffer(client, key):
    torch = pytest.importorskip("torch")
    buf = client.alloc_buffer(MiB)
    t = torch.frombuffer(buf, dtype=torch.float32)
    t[:] = torch.arange(t.numel(), dtype=torch.float32)
    k = key()
    client.put_from(k, buf.address, MiB)
    out = torch.zeros(t.numel(), dtype=torch.float32)
    client.register_buffer(out.data_ptr(), MiB)
    assert client.get_into(k, out.data_ptr(), MiB) == MiB
    assert torch.equal(out, t)
    h = client.get_buffer(k)
    assert torch.equal(torch.frombuffer(h, dtype=torch.float32), t)


# ---------------------------------------------------------------- registered memory


def test_registered_numpy_and_ctypes_buffers(client, client_b, key):
    src = np.frombuffer(pattern(2 * MiB, seed=5), dtype=np.uint8).copy()
    dst = np.zeros(2 * MiB, dtype=np.uint8)
    client.register_buffer(src.ctypes.data, src.nbytes)
    client_b.register_buffer(dst.ctypes.data, dst.nbytes)
    k = key()
    client.put_from(k, src.ctypes.data, src.nbytes)
    assert client_b.get_into(k, dst.ctypes.data, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)

    cbuf = ctypes.create_string_buffer(64)
    client.register_buffer(ctypes.addressof(cbuf), 64)
    k2 = key()
    client.put(k2, b"ctypes!")
    assert client.get_into(k2, ctypes.addressof(cbuf) + 10, 20) == 7
    assert cbuf.raw[10:17] == b"ctypes!"
    client.unregister_buffer(ctypes.addressof(cbuf))
    with pytest.raises(regolith.InvalidArgumentError):
        client.get_into(k2, ctypes.addressof(cbuf), 20)


PAGE = 4096
REGISTER_SHM = 'regolith_sidecar_op_seconds_count{op="register_shm"}'


class PrivateMemory:
    """Fresh private anonymous memory at an offset into a page, as numpy hands out: a heap
    array's placement depends on what earlier tests freed (pages of a range another client
    shared and that was freed unregistered are not plain memory, and are not shared again)."""

    def __init__(self, n: int, offset: int = 16):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
        ]  # fmt: skip
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.size = n + offset + PAGE
        self.base = self.libc.mmap(None, self.size, 0x3, 0x22, -1, 0)  # rw, private | anonymous
        assert self.base not in (None, ctypes.c_void_p(-1).value)
        raw = (ctypes.c_uint8 * n).from_address(self.base + offset)
        self.array = np.frombuffer(raw, dtype=np.uint8)

    def free(self) -> None:
        self.array = None
        self.libc.munmap(self.base, self.size)


def test_registered_memory_moves_onto_shared_memory_in_place(cluster, client, key):
    """register_buffer moves the range's whole pages onto shared memory at the same address
    with the same bytes; gets into it and puts from it then use that memory directly (the
    sidecar maps it: one register_shm, no staging), and unregister_buffer moves it back."""
    n = 4 * MiB
    src_mem, dst_mem = PrivateMemory(n + 2 * PAGE), PrivateMemory(n + 2 * PAGE)
    src, dst = src_mem.array, dst_mem.array
    src[:] = np.frombuffer(pattern(n + 2 * PAGE, seed=31), dtype=np.uint8)
    before_src, src_addr = src.copy(), src.ctypes.data
    client.register_buffer(src.ctypes.data, src.nbytes)
    client.register_buffer(dst.ctypes.data, dst.nbytes)
    assert client.buffer_sharing(src.ctypes.data) == "shared"
    assert client.buffer_sharing(dst.ctypes.data) == "shared"
    assert src.ctypes.data == src_addr and np.array_equal(src, before_src)

    # Written through numpy after registration: that is what the put reads.
    src[PAGE + 123] ^= 0xFF
    off = PAGE  # whole pages lie inside [addr, addr + n + 2 pages) from here on
    remote = regolith.ReplicateConfig()
    remote.preferred_segment = "node-1"
    k_remote, k_local = key(), key()
    registered = cluster.metric(0, REGISTER_SHM)
    client.put_from(k_remote, src.ctypes.data + off, n, remote)
    client.put_from(k_local, src.ctypes.data + off, n)
    assert cluster.metric(0, REGISTER_SHM) == registered + 1, "the put did not read shared memory"
    assert client.get_into(k_remote, dst.ctypes.data + off, n) == n
    assert cluster.metric(0, REGISTER_SHM) == registered + 2, "the get did not write shared memory"
    assert np.array_equal(dst[off : off + n], src[off : off + n])
    dst[off : off + n] = 0
    assert client.get_into(k_local, dst.ctypes.data + off, n) == n
    assert np.array_equal(dst[off : off + n], src[off : off + n])
    # A destination that reaches into a partial page still works (through staging).
    assert client.get_into(k_local, dst.ctypes.data + 8, n) == n
    assert np.array_equal(dst[8 : 8 + n], src[off : off + n])

    # Back onto private memory with every byte; the range is plain memory again.
    kept = dst.copy()
    client.unregister_buffer(dst.ctypes.data)
    assert client.buffer_sharing(dst.ctypes.data) is None
    assert np.array_equal(dst, kept)
    dst[:] = 7
    assert int(dst.sum()) == 7 * dst.nbytes
    client.register_buffer(dst.ctypes.data, dst.nbytes)
    assert client.buffer_sharing(dst.ctypes.data) == "shared"
    assert client.get_into(k_remote, dst.ctypes.data + off, n) == n
    assert np.array_equal(dst[off : off + n], src[off : off + n])
    client.unregister_buffer(dst.ctypes.data)
    client.unregister_buffer(src.ctypes.data)
    src, dst = None, None
    src_mem.free()
    dst_mem.free()


def test_memory_registered_again_at_the_address_of_a_freed_range_gets_the_bytes(client, key):
    """A caller frees a registered (shared) range without unregistering it, gets new memory at
    the same address and registers that: gets land in the new memory, not in the old pages."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rw, private_anon, fixed = 0x3, 0x22, 0x10
    n = 4 * MiB
    addr = libc.mmap(None, n, rw, private_anon, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        client.register_buffer(addr, n)
        assert client.buffer_sharing(addr) == "shared"
        data = pattern(MiB, seed=41)
        k = key()
        client.put(k, data)
        assert libc.mmap(addr, n, rw, private_anon | fixed, -1, 0) == addr  # "freed", new memory
        client.register_buffer(addr, n)
        assert client.buffer_sharing(addr) == "shared"
        assert client.get_into(k, addr, MiB) == MiB
        assert ctypes.string_at(addr, MiB) == data
        client.unregister_buffer(addr)
    finally:
        libc.munmap(addr, n)


def test_registered_memory_stays_private_where_it_must(cluster, client, key):
    """Small ranges, memory that is already shared, and REGOLITH_SHARE_REGISTERED=0 keep the
    staging path, and still work."""
    import mmap

    small = np.zeros(64 * 1024, dtype=np.uint8)
    client.register_buffer(small.ctypes.data, small.nbytes)
    assert client.buffer_sharing(small.ctypes.data) != "shared"
    m = mmap.mmap(-1, 4 * MiB)  # MAP_SHARED
    view = np.frombuffer(m, dtype=np.uint8)
    client.register_buffer(view.ctypes.data, view.nbytes)
    assert client.buffer_sharing(view.ctypes.data) == "not plain private anonymous memory"
    k = key()
    client.put(k, pattern(MiB, seed=3))
    assert client.get_into(k, view.ctypes.data, MiB) == MiB
    assert bytes(view[:MiB]) == pattern(MiB, seed=3)
    client.unregister_buffer(view.ctypes.data)
    del view
    m.close()
    env = cluster.env(0)
    env["REGOLITH_SHARE_REGISTERED"] = "0"
    script = textwrap.dedent(f"""
        import hashlib, numpy as np, regolith
        c = regolith.Client()
        a = np.zeros(8 << 20, dtype=np.uint8)
        c.register_buffer(a.ctypes.data, a.nbytes)
        print(c.buffer_sharing(a.ctypes.data).replace(" ", "_"))
        print(c.get_into({k!r}, a.ctypes.data + 4096, {MiB}))
        print(hashlib.sha256(bytes(a[4096:4096 + {MiB}])).hexdigest())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    want = hashlib.sha256(pattern(MiB, seed=3)).hexdigest()
    assert out == ["REGOLITH_SHARE_REGISTERED=0", str(MiB), want]


def test_bad_pointers_are_refused(client, key):
    k = key()
    client.put(k, b"data")
    arr = np.zeros(1024, dtype=np.uint8)
    client.register_buffer(arr.ctypes.data, arr.nbytes)
    bad = [
        (0x1000, 8),  # never registered
        (arr.ctypes.data + 1000, 100),  # runs past the registered range
        (arr.ctypes.data - 8, 16),  # starts before it
    ]
    for addr, size in bad:
        with pytest.raises(regolith.InvalidArgumentError) as e:
            client.get_into(k, addr, size)
        assert e.value.code == -600
        with pytest.raises(regolith.InvalidArgumentError):
            client.put_from(key(), addr, size)
    with pytest.raises(regolith.InvalidArgumentError):
        client.put_from(key(), arr.ctypes.data)  # an address needs a size
    with pytest.raises(regolith.InvalidArgumentError):
        client.get_into(k, -5, 4)
    with pytest.raises(regolith.InvalidArgumentError):
        client.register_buffer(0, 10)
    with pytest.raises(regolith.InvalidArgumentError):
        client.unregister_buffer(0x1234)
    with pytest.raises(TypeError):
        client.get_into(k, "not memory", 4)
    with pytest.raises(BufferError):
        client.get_into(k, b"read-only bytes")


def test_batch_put_from_and_get_into(client, client_b, key):
    n, size = 16, 64 * 1024
    src = np.frombuffer(pattern(n * size, seed=9), dtype=np.uint8).copy()
    dst = np.zeros(n * size, dtype=np.uint8)
    client.register_buffer(src.ctypes.data, src.nbytes)
    client_b.register_buffer(dst.ctypes.data, dst.nbytes)
    keys = [key() for _ in range(n)]
    res = client.batch_put_from(keys, [src.ctypes.data + i * size for i in range(n)], [size] * n)
    assert res == [None] * n
    got = client_b.batch_get_into(keys, [dst.ctypes.data + i * size for i in range(n)], [size] * n)
    assert got == [size] * n
    assert np.array_equal(src, dst)


def test_batch_calls_report_per_item_errors(client, key):
    arr = np.zeros(4096, dtype=np.uint8)
    client.register_buffer(arr.ctypes.data, arr.nbytes)
    existing, fresh, bad = key(), key(), key()
    client.put(existing, b"old")
    res = client.batch_put_from(
        [existing, fresh, bad], [arr.ctypes.data, arr.ctypes.data + 100, 0x10], [10, 10, 10]
    )
    assert isinstance(res[0], regolith.AlreadyExistsError) and res[0].key == existing
    assert res[1] is None
    assert isinstance(res[2], regolith.InvalidArgumentError)
    got = client.batch_get_into(
        [fresh, key("missing"), existing, fresh],
        [arr.ctypes.data, arr.ctypes.data + 100, 0x10, arr.ctypes.data + 5],
        [10, 10, 10, 10],
    )
    # first and last destinations overlap: both refused
    assert isinstance(got[0], regolith.InvalidArgumentError)
    assert isinstance(got[3], regolith.InvalidArgumentError)
    assert isinstance(got[1], regolith.NotFoundError)
    assert isinstance(got[2], regolith.InvalidArgumentError)
    with pytest.raises(regolith.InvalidArgumentError):
        client.batch_put_from([fresh], [], [])
    assert client.batch_put([key(), key()], [b"a", b"b"]) == [None, None]


# ---------------------------------------------------------------- lifecycle


def test_closed_client(cluster, key):
    c = regolith.Client(cluster.socket(0))
    buf = c.alloc_buffer(4096)
    memoryview(buf)[:2] = b"ok"
    c.close()
    assert c.closed
    for call in (lambda: c.get("x"), lambda: c.put(key(), b"v"), lambda: c.exists("x"), c.stats):
        with pytest.raises(regolith.ClosedError):
            call()
    c.close()  # idempotent
    assert bytes(memoryview(buf)[:2]) == b"ok"
    buf.free()
    with regolith.Client(cluster.socket(0)) as c2:
        assert c2.exists("x") is False
    assert c2.closed


def test_default_socket_from_env(cluster, monkeypatch):
    monkeypatch.setenv("REGOLITH_SOCKET", cluster.socket(1))
    with regolith.Client() as c:
        assert c.node_name == "node-1"
        assert c.socket == cluster.socket(1)


def test_connect_error(tmp_path):
    with pytest.raises(regolith.ConnectError) as e:
        regolith.Client(str(tmp_path / "nothing.sock"))
    assert e.value.code == -900 and "nothing.sock" in str(e.value)


def test_gil_is_released_while_waiting_for_the_sidecar(cluster, key):
    """A call blocked on a paused sidecar must not stop other Python threads."""
    c = regolith.Client(cluster.socket(1))
    k = key()
    c.put(k, b"v")
    pid = cluster.sidecars[1].pid
    done = threading.Event()
    result = []

    def blocked_call():
        result.append(c.exists(k))
        done.set()

    os.kill(pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=blocked_call)
        t.start()
        time.sleep(0.05)
        spins = 0
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            spins += 1
        assert not done.is_set()
        assert spins > 10_000
    finally:
        os.kill(pid, signal.SIGCONT)
    t.join(10)
    assert result == [True]
    c.close()


def test_two_processes_share_the_cache(cluster, client, key):
    k_parent, k_child = key("parent"), key("child")
    client.put(k_parent, pattern(100_000, seed=11))
    script = textwrap.dedent(
        f"""
        import hashlib, regolith, sys
        c = regolith.Client()
        data = c.get({k_parent!r})
        sys.stdout.write(str(len(data)) + " " + hashlib.sha256(data).hexdigest() + "\\n")
        c.put({k_child!r}, b"from the child " + data[:10])
        """
    )
    out = cluster.run_python(script, 1)
    assert out == ["100000", hashlib.sha256(pattern(100_000, seed=11)).hexdigest()]
    assert client.get(k_child) == b"from the child " + pattern(100_000, seed=11)[:10]
