"""A loopback Regolith cluster of real processes for the Python tests: three ``regolith-metad``
replicas and N ``regolith-sidecar``s (each with two NIC addresses of its own in 127.0.0.0/8, a
cluster token and temp dirs), as ``e2e/src/lib.rs`` starts it. Everything it starts it stops.

Binaries: ``$REGOLITH_METAD_BIN`` / ``$REGOLITH_SIDECAR_BIN``, else the workspace's
``target/release`` (``$CARGO_TARGET_DIR`` when set; build them with
``cargo build --release -p regolith-metad -p regolith-sidecar``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def binary(name: str) -> Path:
    env = os.environ.get(f"REGOLITH_{name.split('-')[1].upper()}_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "release" / name
    if not path.exists():
        raise RuntimeError(
            f"{path} not found: build it with "
            "`cargo build --release -p regolith-metad -p regolith-sidecar` "
            f"or set REGOLITH_{name.split('-')[1].upper()}_BIN"
        )
    return path


def pattern(n: int, seed: int = 1) -> bytes:
    """`n` reproducible pseudo-random bytes."""
    import random

    return random.Random(seed).randbytes(n)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(addr: str, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


@dataclass
class Proc:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen | None = None

    def start(self, env: dict | None = None) -> None:
        with open(self.log, "ab") as log:
            self.popen = subprocess.Popen(
                self.args,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


@dataclass
class Sidecar:
    name: str
    socket: Path
    http: str
    proc: Proc


@dataclass
class Cluster:
    dir: Path
    token_file: Path
    metad: list[tuple[str, str, Proc]] = field(default_factory=list)  # (grpc, http, proc)
    sidecars: list[Sidecar] = field(default_factory=list)

    @property
    def metad_addrs(self) -> str:
        return ",".join(g for g, _, _ in self.metad)

    def socket(self, i: int = 0) -> str:
        return str(self.sidecars[i].socket)

    def env(self, i: int = 0) -> dict:
        """Environment for a process that uses sidecar `i`."""
        env = dict(os.environ)
        env["REGOLITH_SOCKET"] = self.socket(i)
        return env

    def logs(self) -> str:
        procs = [p for _, _, p in self.metad] + [s.proc for s in self.sidecars]
        return "\n".join(f"----- {p.name} -----\n{p.tail()}" for p in procs)

    def stop(self) -> None:
        for s in self.sidecars:
            s.proc.stop()
        for _, _, p in self.metad:
            p.stop()


def _metad(c: Cluster, i: int, peers: str, grpc: str, http: str) -> Proc:
    return Proc(
        f"metad-{i}",
        [
            str(binary("regolith-metad")),
            "--id", str(i),
            "--listen", grpc,
            "--advertise", grpc,
            "--metrics-addr", http,
            "--peers", peers,
            "--bootstrap",
            "--worker-threads", "1",
            "--data-dir", str(c.dir / f"metad-{i}"),
            "--cluster-token-file", str(c.token_file),
        ],
        c.dir / f"metad-{i}.log",
    )  # fmt: skip


def _sidecar(c: Cluster, i: int, size: str) -> Sidecar:
    name = f"node-{chr(ord('a') + i)}"
    sock = c.dir / f"{name}.sock"
    http = f"127.0.0.1:{free_port()}"
    nics = [f"127.0.{100 + i}.1", f"127.0.{100 + i}.2"]
    args = [
        str(binary("regolith-sidecar")),
        "--node-name", name,
        "--metad", c.metad_addrs,
        "--segment-size", size,
        "--data-port", str(free_port()),
        "--metrics-addr", http,
        "--worker-threads", "2",
        "--socket", str(sock),
        "--state-dir", str(c.dir / f"{name}-state"),
        "--cluster-token-file", str(c.token_file),
    ]  # fmt: skip
    for n in nics:
        args += ["--nic", n]
    return Sidecar(name, sock, http, Proc(name, args, c.dir / f"{name}.log"))


def _wait(what: str, c: Cluster, ok, timeout: float, alive=None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return
        if alive is not None and not alive():
            raise RuntimeError(f"{what} exited during start-up\n{c.logs()}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready within {timeout}s\n{c.logs()}")


def _leader_ready(c: Cluster) -> bool:
    for _, http, _ in c.metad:
        s = http_json(http, "/status")
        if s and s.get("role") == "leader" and s.get("leader_ready"):
            return True
    return False


def _serves(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def start(segment_sizes: list[str], base_dir: str | None = None) -> Cluster:
    """Starts 3 metad replicas and one sidecar per entry of `segment_sizes`."""
    d = Path(tempfile.mkdtemp(prefix="regolith-pytest-", dir=base_dir))
    token = d / "token"
    token.write_text(f"pytest-{secrets.token_hex(8)}\n")
    c = Cluster(d, token)
    try:
        addrs = [(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}") for _ in range(3)]
        peers = ",".join(f"{i + 1}={g}" for i, (g, _) in enumerate(addrs))
        for i, (grpc, http) in enumerate(addrs):
            p = _metad(c, i + 1, peers, grpc, http)
            p.start()
            c.metad.append((grpc, http, p))
        _wait("metad leader", c, lambda: _leader_ready(c), 30)
        for i, size in enumerate(segment_sizes):
            s = _sidecar(c, i, size)
            s.proc.start()
            c.sidecars.append(s)
        for s in c.sidecars:
            _wait(s.name, c, lambda s=s: _serves(s.socket), 60, s.proc.running)
    except BaseException:
        c.stop()
        raise
    return c


def cleanup(c: Cluster) -> None:
    c.stop()
    shutil.rmtree(c.dir, ignore_errors=True)
