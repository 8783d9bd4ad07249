"""The one workload of the side-by-side benchmark: the calls LMCache's Mooncake connector makes,
through whichever ``mooncake.store`` this interpreter imports (Mooncake's wheel, or Regolith's
drop-in through the ``regolith-mooncake-shim``). ``driver.py`` runs it once in each virtual
environment and merges the two reports.

    python workload.py run --system NAME --remote SEGMENT --master ADDRS --out FILE [--duration S]
    python workload.py hold --master ADDR --name-file FILE     (Mooncake's holder process)

Rows: (mode, size, op). ``local`` puts name the client's own segment as ``preferred_segment``
(``get_hostname()``), ``remote`` puts name ``--remote`` (the holder's segment for Mooncake, the
other sidecar's node for Regolith). Every put's placement is checked after the row (untimed),
every byte a get returns is compared with what was put (untimed); a wrong byte, a misplaced
object or a failed call counts as an error. Only the calls themselves are timed: rates are
items over the sum of call times.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import deque

import numpy as np
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = [4 * KiB, 256 * KiB, 16 * MiB, 32 * MiB]
PUT_OPS = ["put", "put_from", "batch_put_from"]
READ_OPS = ["get", "get_into", "batch_get_into", "is_exist", "batch_is_exist"]
EXIST_OPS = ("is_exist", "batch_is_exist")  # size-independent: run on the 4 KiB ring only
RING_BYTES = 128 * MiB  # values kept alive per row (more than the last-level cache)
SEGMENT = 1 * GiB  # global_segment_size: what the client (and the holder) contribute
LOCAL_BUFFER = 512 * MiB  # local_buffer_size: Mooncake's transfer buffer, Regolith's staging


def batch_of(size: int) -> int:
    return 64 if size <= 256 * KiB else 4


def human(size: int) -> str:
    return f"{size // MiB}MiB" if size >= MiB else f"{size // KiB}KiB"


def setup(store: MooncakeDistributedStore, master: str, segment: int) -> None:
    # Mooncake's positional form, as LMCache calls it: local_hostname, metadata_server,
    # global_segment_size, local_buffer_size, protocol, device_name, master_server_address.
    rc = store.setup(
        "127.0.0.1", "http://127.0.0.1:8080/metadata", segment, LOCAL_BUFFER, "tcp", "", master
    )
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")


# ---------------------------------------------------------------------------------- values


class Values:
    """Value of key index k: a window of one random block at a k-dependent offset, with k
    stamped in its first 8 bytes. Writing a source and checking a result are memcpy/memcmp."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.span = 64 * MiB
        self.base = rng.integers(0, 256, self.span + 32 * MiB, dtype=np.uint8)

    def _off(self, k: int) -> int:
        return (k * 2654435761 * 64) % self.span

    def write(self, dst: np.ndarray, k: int, size: int) -> None:
        o = self._off(k)
        np.copyto(dst[:size], self.base[o : o + size])
        dst[:8] = np.frombuffer(int(k).to_bytes(8, "little"), dtype=np.uint8)

    def ok(self, got: np.ndarray, k: int, size: int) -> bool:
        if got.size != size:
            return False
        o = self._off(k)
        return bytes(got[:8]) == int(k).to_bytes(8, "little") and np.array_equal(
            got[8:size], self.base[o + 8 : o + size]
        )

    def blob(self, k: int, size: int) -> bytes:
        a = np.empty(size, dtype=np.uint8)
        self.write(a, k, size)
        return a.tobytes()


# ---------------------------------------------------------------------------------- bench


class Latencies(list):
    """Call times with their running sum: the loop's stop test must not cost O(samples) per
    call (a `sum()` of the list did, which put hundreds of µs of harness work between the
    calls of a row's later half and so measured a cold system there)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0.0

    def append(self, x: float) -> None:
        self.total += x
        super().append(x)


class Bench:
    def __init__(self, store, system: str, remote: str, duration: float, only: list[str]):
        self.s = store
        self.system = system
        self.me = store.get_hostname()
        self.remote = remote
        self.duration = duration
        self.only = only
        self.vals = Values(seed=12345)
        self.run = int(time.time() * 1000) % 1_000_000
        self.next_k = 1
        # One registered buffer: sources of a call in the first half, destinations in the second.
        self.half = 4 * 32 * MiB
        self.buf = np.zeros(2 * self.half, dtype=np.uint8)
        self.addr = self.buf.ctypes.data
        rc = store.register_buffer(self.addr, self.buf.nbytes)
        if rc != 0:
            raise SystemExit(f"register_buffer failed: {rc}")

    # -- placement

    def cfg(self, mode: str) -> ReplicateConfig:
        c = ReplicateConfig()
        c.replica_num = 1
        c.preferred_segment = self.me if mode == "local" else self.remote
        return c

    def segment_objects(self) -> dict[str, int]:
        """Regolith only: objects per node (placement is checked by the counts)."""
        return {s["node_name"]: s["objects"] for s in self.s.client.list_segments()}

    def misplaced(self, mode: str, keys: list[str], before: dict[str, int] | None) -> int:
        target = self.me if mode == "local" else self.remote
        if self.system == "mooncake":
            bad = 0
            for key in keys:
                eps = [
                    d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                    for d in self.s.get_replica_desc(key)
                    if d.is_memory_replica()
                ]
                bad += eps != [target]
            return bad
        after = self.segment_objects()
        bad = 0
        for node, n in after.items():
            grew = n - (before or {}).get(node, 0)
            want = len(keys) if node == target else 0
            bad += abs(grew - want)
        return bad

    def remove(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 256):
            part = keys[i : i + 256]
            rcs = self.s.batch_remove(part, True)
            if any(rc != 0 for rc in rcs):
                # One by one, for a precise message.
                for key, rc in zip(part, rcs):
                    if rc != 0 and self.s.remove(key, True) != 0:
                        print(f"warning: remove {key} failed: {rc}", file=sys.stderr)

    # -- rows

    def wanted(self, mode: str, size: int, op: str) -> bool:
        if not self.only:
            return True
        return any(
            all(p in ("", mode, op, human(size)) for p in f.split("/")) for f in self.only
        )

    def key(self, mode: str, size: int, op: str, k: int) -> str:
        return f"vsmc/{self.run}/{mode}/{human(size)}/{op}/{k}"

    def rows(self):
        for mode in ("local", "remote"):
            for size in SIZES:
                for op in PUT_OPS:
                    if self.wanted(mode, size, op):
                        yield self.put_row(mode, size, op)
                reads = [
                    op
                    for op in READ_OPS
                    if self.wanted(mode, size, op) and (op not in EXIST_OPS or size == SIZES[0])
                ]
                if reads:
                    yield from self.read_rows(mode, size, reads)

    def _finish(self, mode, size, op, batch, lat, items, errors):
        t = sum(lat)
        lat_sorted = sorted(lat)

        def pct(p):
            return lat_sorted[round((len(lat_sorted) - 1) * p)] * 1e6 if lat_sorted else 0.0

        row = {
            "mode": mode,
            "size": size,
            "op": op,
            "batch": batch,
            "calls": len(lat),
            "ops_per_s": items / t if t else 0.0,
            "gbps": (0.0 if "exist" in op else items * size / t / 1e9) if t else 0.0,
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
            "errors": errors,
        }
        print(
            f"  {self.system:8} {mode:6} {human(size):>6} {op:15} {row['ops_per_s']:10.0f}/s "
            f"{row['gbps']:6.2f} GB/s p50 {row['p50_us']:8.0f} us  errors {errors}",
            file=sys.stderr,
            flush=True,
        )
        return row

    def _done(self, lat: "Latencies", started) -> bool:
        # Timed time reaches the duration; the wall clock (with untimed work) is capped too.
        return lat.total >= self.duration or time.monotonic() - started >= 4 * self.duration + 5

    def put_row(self, mode: str, size: int, op: str):
        batch = batch_of(size) if op.startswith("batch") else 1
        cfg = self.cfg(mode)
        src = self.buf[: self.half]
        before = self.segment_objects() if self.system == "regolith" else None
        ring: deque[str] = deque()
        limit = max(RING_BYTES, 2 * batch * size)
        lat = Latencies()
        items = errors = 0
        started = time.monotonic()
        while not self._done(lat, started):
            ks = list(range(self.next_k, self.next_k + batch))
            self.next_k += batch
            keys = [self.key(mode, size, op, k) for k in ks]
            if op == "put":
                blob = self.vals.blob(ks[0], size)
                t = time.perf_counter()
                rcs = [self.s.put(keys[0], blob, cfg)]
                lat.append(time.perf_counter() - t)
            else:
                for i, k in enumerate(ks):
                    self.vals.write(src[i * size :], k, size)
                ptrs = [self.addr + i * size for i in range(batch)]
                if op == "put_from":
                    t = time.perf_counter()
                    rcs = [self.s.put_from(keys[0], ptrs[0], size, cfg)]
                    lat.append(time.perf_counter() - t)
                else:
                    t = time.perf_counter()
                    rcs = self.s.batch_put_from(keys, ptrs, [size] * batch, cfg)
                    lat.append(time.perf_counter() - t)
            for key, rc in zip(keys, rcs):
                if rc == 0:
                    ring.append(key)
                    items += 1
                else:
                    errors += 1
            if len(ring) * size > limit:
                old = [ring.popleft() for _ in range(len(ring) // 2)]
                self.remove(old)
        live = list(ring)
        errors += self.misplaced(mode, live, before)
        self.remove(live)
        return self._finish(mode, size, op, batch, lat, items, errors)

    def read_rows(self, mode: str, size: int, ops: list[str]):
        batch = batch_of(size)
        n = max(batch, min(1024, RING_BYTES // size))
        cfg = self.cfg(mode)
        ks = list(range(self.next_k, self.next_k + n))
        self.next_k += n
        keys = [self.key(mode, size, "read", k) for k in ks]
        src = self.buf[: self.half]
        before = self.segment_objects() if self.system == "regolith" else None
        bad = 0
        for i in range(0, n, batch):
            part = ks[i : i + batch]
            for j, k in enumerate(part):
                self.vals.write(src[j * size :], k, size)
            rcs = self.s.batch_put_from(
                keys[i : i + batch], [self.addr + j * size for j in range(len(part))],
                [size] * len(part), cfg,
            )  # fmt: skip
            bad += sum(rc != 0 for rc in rcs)
        bad += self.misplaced(mode, keys, before)
        if bad:
            print(f"warning: {bad} errors putting the read ring", file=sys.stderr)
        for op in ops:
            yield self.read_row(mode, size, op, ks, keys, bad)
        self.remove(keys)

    def read_row(self, mode, size, op, ks, keys, ring_errors):
        batch = batch_of(size) if op.startswith("batch") else 1
        n = len(keys)
        dst = self.buf[self.half :]
        dst_addr = self.addr + self.half
        lat = Latencies()
        items = 0
        errors = ring_errors
        i = 0
        started = time.monotonic()
        while not self._done(lat, started):
            idx = [(i + j) % n for j in range(batch)]
            i += batch
            bk = [keys[x] for x in idx]
            if op == "get":
                t = time.perf_counter()
                data = self.s.get(bk[0])
                lat.append(time.perf_counter() - t)
                ok = self.vals.ok(np.frombuffer(data, dtype=np.uint8), ks[idx[0]], size)
                errors += not ok
                items += ok
            elif op == "get_into":
                dst[:8] = 0
                t = time.perf_counter()
                rc = self.s.get_into(bk[0], dst_addr, size)
                lat.append(time.perf_counter() - t)
                ok = rc == size and self.vals.ok(dst[:size], ks[idx[0]], size)
                errors += not ok
                items += ok
            elif op == "batch_get_into":
                for j in range(batch):
                    dst[j * size : j * size + 8] = 0
                ptrs = [dst_addr + j * size for j in range(batch)]
                t = time.perf_counter()
                rcs = self.s.batch_get_into(bk, ptrs, [size] * batch)
                lat.append(time.perf_counter() - t)
                for j, rc in enumerate(rcs):
                    got = dst[j * size : (j + 1) * size]
                    ok = rc == size and self.vals.ok(got, ks[idx[j]], size)
                    errors += not ok
                    items += ok
            elif op == "is_exist":
                t = time.perf_counter()
                rc = self.s.is_exist(bk[0])
                lat.append(time.perf_counter() - t)
                errors += rc != 1
                items += rc == 1
            elif op == "batch_is_exist":
                t = time.perf_counter()
                rcs = self.s.batch_is_exist(bk)
                lat.append(time.perf_counter() - t)
                good = sum(rc == 1 for rc in rcs)
                errors += len(bk) - good
                items += good
        return self._finish(mode, size, op, batch, lat, items, errors)


def version(system: str) -> str:
    from importlib import metadata

    name = "mooncake-transfer-engine-non-cuda" if system == "mooncake" else "regolith-kvcache"
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def cmd_run(a) -> None:
    store = MooncakeDistributedStore()
    setup(store, a.master, SEGMENT)
    b = Bench(store, a.system, a.remote, a.duration, [f for f in a.filter.split(",") if f])
    print(f"{a.system}: client segment {b.me}, remote segment {b.remote}", file=sys.stderr)
    # A warm-up put and get in each mode (connections, first-touch of the segments), untimed.
    for mode in ("local", "remote"):
        k = f"vsmc/{b.run}/warmup/{mode}"
        b.vals.write(b.buf, 0, 1 * MiB)
        store.put_from(k, b.addr, 1 * MiB, b.cfg(mode))
        store.get_into(k, b.addr + b.half, 1 * MiB)
        store.remove(k, True)
    rows = list(b.rows())
    report = {"system": a.system, "version": version(a.system), "segment": b.me,
              "remote_segment": b.remote, "duration_s": a.duration, "rows": rows}  # fmt: skip
    with open(a.out, "w") as f:
        json.dump(report, f)
    store.close()


def cmd_hold(a) -> None:
    """A Mooncake client that contributes a segment and does nothing else: where remote puts
    land."""
    store = MooncakeDistributedStore()
    setup(store, a.master, SEGMENT)
    tmp = a.name_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(store.get_hostname())
    os.replace(tmp, a.name_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--system", required=True, choices=["mooncake", "regolith"])
    r.add_argument("--remote", required=True, help="segment name of the other node")
    r.add_argument("--master", required=True, help="master_server_address")
    r.add_argument("--out", required=True)
    r.add_argument("--duration", type=float, default=2.0, help="timed seconds per row")
    r.add_argument("--filter", default="", help="MODE/SIZE/OP,... (parts may be empty)")
    h = sub.add_parser("hold")
    h.add_argument("--master", required=True)
    h.add_argument("--name-file", required=True)
    a = p.parse_args()
    cmd_run(a) if a.cmd == "run" else cmd_hold(a)


if __name__ == "__main__":
    main()
