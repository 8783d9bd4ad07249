"""A loopback Regolith cluster for the Python tests, started with ``regolith up`` (three
``regolith-metad`` replicas and N ``regolith-sidecar``s with their own sockets, loopback NICs,
cluster token and state, in a temp dir, on a free block of ports). It is stopped with SIGTERM
(``up`` stops its children) and its directory removed.

Binaries: with ``REGOLITH_BINARIES=wheel``, the console scripts the installed wheel put beside
this interpreter (``regolith``, ``regolith-metad``, ``regolith-sidecar``: the wheel's own
binaries; ``regolith up`` then finds the daemons beside itself). Otherwise
``$REGOLITH_CLI_BIN`` / ``$REGOLITH_METAD_BIN`` / ``$REGOLITH_SIDECAR_BIN``, else the
workspace's ``target/release``, else ``target/debug`` (``$CARGO_TARGET_DIR`` when set;
``REGOLITH_BIN_PROFILE=debug`` picks one). Build them with
``cargo build --release -p regolith-cli -p regolith-metad -p regolith-sidecar``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from regolith._launch import up_args

REPO = Path(__file__).resolve().parents[2]
READY = "ready: Ctrl-C or SIGTERM stops the cluster"
_ENV = {"regolith": "REGOLITH_CLI_BIN", "regolith-metad": "REGOLITH_METAD_BIN",
        "regolith-sidecar": "REGOLITH_SIDECAR_BIN"}  # fmt: skip


def from_wheel() -> bool:
    """Whether the tests run the installed wheel's binaries (``REGOLITH_BINARIES=wheel``)."""
    return os.environ.get("REGOLITH_BINARIES") == "wheel"


def binary(name: str) -> Path:
    if from_wheel():
        exe = shutil.which(name, path=str(Path(sys.executable).parent))
        if exe is None:
            raise RuntimeError(
                f"REGOLITH_BINARIES=wheel but no {name} console script beside {sys.executable}: "
                "is the regolith-kvcache wheel (built with its binaries) installed here?"
            )
        return Path(exe)
    env = os.environ.get(_ENV[name])
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    profile = os.environ.get("REGOLITH_BIN_PROFILE")
    # The named profile, else a release build when there is one, else the debug build.
    dirs = [target / profile] if profile else [target / "release", target / "debug"]
    for d in dirs:
        if (d / name).exists():
            return d / name
    raise RuntimeError(
        f"{name} not found in {', '.join(map(str, dirs))}: build it with `cargo build "
        f"--release -p regolith-cli -p regolith-metad -p regolith-sidecar` or set {_ENV[name]}"
    )


def pattern(n: int, seed: int = 1) -> bytes:
    """`n` reproducible pseudo-random bytes."""
    return random.Random(seed).randbytes(n)


@dataclass
class Sidecar:
    name: str
    socket: Path
    pid: int
    metrics: str = ""


@dataclass
class Cluster:
    dir: Path
    token_file: Path
    metad: list[str]
    up: subprocess.Popen
    log: Path
    sidecars: list[Sidecar] = field(default_factory=list)
    # The metad replicas' metrics addresses (HOST:PORT), in replica order.
    metad_metrics: list[str] = field(default_factory=list)

    @property
    def metad_addrs(self) -> str:
        return ",".join(self.metad)

    def socket(self, i: int = 0) -> str:
        return str(self.sidecars[i].socket)

    def env(self, i: int = 0) -> dict:
        """Environment for a process that uses sidecar `i`."""
        env = dict(os.environ)
        env["REGOLITH_SOCKET"] = self.socket(i)
        return env

    def metric(self, i: int, series: str) -> float:
        """The value of one series (name with its labels, as exposed) of sidecar `i`; 0 if absent."""
        return scrape(self.sidecars[i].metrics, series)

    def metad_metric(self, series: str) -> float:
        """The highest value of one series over the metad replicas that answer (a replica's
        applied state may lag the leader's); 0 if absent."""
        values = []
        for addr in self.metad_metrics:
            try:
                values.append(scrape(addr, series))
            except OSError:
                continue
        return max(values, default=0.0)

    def run_python(self, script: str, i: int = 0) -> list[str]:
        """Runs `script` in a fresh Python process that uses sidecar `i`; its stdout, split."""
        return subprocess.run(
            [sys.executable, "-c", script],
            env=self.env(i),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()

    def logs(self) -> str:
        parts = [f"----- regolith up -----\n{_tail(self.log)}"]
        for f in sorted((self.dir / "logs").glob("*.log")):
            parts.append(f"----- {f.stem} -----\n{_tail(f)}")
        return "\n".join(parts)

    def stop(self, timeout: float = 60) -> None:
        if self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)
                self.up.wait()


def scrape(addr: str, series: str) -> float:
    """The value of one series (name with its labels, as exposed) at the Prometheus endpoint
    ``addr`` (HOST:PORT); 0 if absent."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    return 0.0


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _ports_free(base: int) -> bool:
    for port in range(base, base + 50):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _base_port() -> int:
    # Below the ephemeral range: ports there are never a connection's source port, so none of
    # the cluster's own connections can take one before its daemon binds it.
    # (10000..20000 is where single free ports are picked, regolith._spawn.)
    top = max(_ephemeral_low(), 20100) - 50
    for _ in range(50):
        base = random.randrange(20000, top, 50)
        if _ports_free(base):
            return base
    raise RuntimeError("no free block of 50 ports for regolith up")


def _launch(d: Path, sidecars: int, segment_size: str) -> tuple[subprocess.Popen, Path]:
    log = d / "up.log"
    # From the wheel, `regolith up` finds the daemons beside itself, as a user's would.
    bins = {} if from_wheel() else {
        "metad_bin": binary("regolith-metad"), "sidecar_bin": binary("regolith-sidecar"),
    }  # fmt: skip
    args = [str(binary("regolith"))] + up_args(
        d, sidecars=sidecars, segment_size=segment_size, base_port=_base_port(), **bins
    )
    with open(log, "ab") as f:
        up = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return up, log


def _wait_ready(up: subprocess.Popen, log: Path, timeout: float) -> bool:
    """True once `up` printed its ready line; False when it exited first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if READY in log.read_text(errors="replace"):
            return True
        if up.poll() is not None:
            return False
        time.sleep(0.05)
    raise RuntimeError(f"regolith up not ready within {timeout}s:\n{_tail(log)}")


def _describe(d: Path, up: subprocess.Popen, log: Path) -> Cluster:
    info = json.loads((d / "cluster.json").read_text())
    c = Cluster(d, Path(info["token_file"]), [m["grpc"] for m in info["metad"]], up, log)
    c.metad_metrics = [m.get("metrics", "") for m in info["metad"] if m.get("metrics")]
    c.sidecars = [
        Sidecar(s["name"], Path(s["socket"]), s["pid"], s.get("metrics", ""))
        for s in info["sidecars"]
    ]
    return c


def start(sidecars: int = 2, segment_size: str = "256MiB", timeout: float = 90) -> Cluster:
    """`regolith up` in a fresh temp dir, on a free block of ports (retried when a port was
    taken in between)."""
    for _ in range(3):
        d = Path(tempfile.mkdtemp(prefix="regolith-pytest-"))
        up, log = _launch(d, sidecars, segment_size)
        try:
            if _wait_ready(up, log, timeout):
                return _describe(d, up, log)
        except BaseException:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
            raise
        text = _tail(log)
        shutil.rmtree(d, ignore_errors=True)
        if "cannot listen" not in text:
            raise RuntimeError(f"regolith up exited during start-up:\n{text}")
    raise RuntimeError(f"regolith up could not find free ports:\n{text}")


def cleanup(c: Cluster) -> None:
    c.stop()
    shutil.rmtree(c.dir, ignore_errors=True)
