"""A private ``regolith-sidecar`` started by ``MooncakeDistributedStore.setup`` when no sidecar
answers and spawning is enabled: the zero-extra-process experience of Mooncake's embedded
client. Its socket and state live in a private temp dir; it is stopped at ``close()`` and at
interpreter exit."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ._launch import sidecar_args
from ._native import ConnectError

logger = logging.getLogger("regolith.spawn")

_live: set["SpawnedSidecar"] = set()
_live_lock = threading.Lock()


def _search_dirs() -> list[Path]:
    """Where an installed package keeps the sidecar: the wheel's ``regolith/bin/`` (its own
    binary), the package directory, the interpreter's bin directory (console scripts)."""
    here = Path(__file__).resolve().parent
    return [here / "bin", here, Path(sys.executable).parent]


def find_binary(explicit: str = "") -> Path:
    """``explicit``, else ``$REGOLITH_SIDECAR_BIN``, else next to the package, else the
    interpreter's bin dir, else ``PATH``."""
    candidates = [explicit, os.environ.get("REGOLITH_SIDECAR_BIN", "")]
    candidates += [str(d / "regolith-sidecar") for d in _search_dirs()]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return Path(c)
    found = shutil.which("regolith-sidecar")
    if found:
        return Path(found)
    raise ConnectError(
        "cannot start a sidecar: the regolith-sidecar binary was not found "
        "(set REGOLITH_SIDECAR_BIN, or put it next to the regolith package or on PATH)"
    )


_next_port = 0


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port() -> int:
    """A loopback port that was free a moment ago, below the kernel's ephemeral range: a port
    from ``bind(0)`` may be handed to any outgoing connection as its source port before the
    sidecar binds it (as regolith_test_support::ports does for the Rust harnesses)."""
    global _next_port
    # 10000..20000: above it, up to the ephemeral range, the tests reserve port blocks.
    floor, top = 10000, min(_ephemeral_low(), 20000)
    if top >= floor + 1000:
        span = top - floor
        start = (os.getpid() * 7919) % span
        for _ in range(span):
            port = floor + (start + _next_port) % span
            _next_port += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nic_for(hostname: str) -> str:
    """The data-plane address: what ``local_hostname`` resolves to (Mooncake's meaning of it:
    the address other nodes reach this one at), else loopback."""
    if not hostname:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return "127.0.0.1"


def _serves(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def transport_args(protocol: str, device_name: str) -> list[str]:
    """The sidecar's transport flags for Mooncake's ``protocol`` and ``device_name``:
    ``tcp`` keeps it on TCP; ``rdma`` lets it use RDMA where both ends can (``--transport auto``:
    TCP to peers without it, and on a machine without a device), on the devices named in
    ``device_name`` (``"mlx5_0,mlx5_1"``, in rail order) or every device with an active port.
    Anything else is left to the sidecar's defaults (``--transport auto``)."""
    p = protocol.strip().lower()
    if p == "tcp":
        return sidecar_args(transport="tcp")
    if p != "rdma":
        return []
    devices = ",".join(d.strip() for d in device_name.split(",") if d.strip())
    return sidecar_args(transport="auto", rdma_device=devices or None)


class SpawnedSidecar:
    """A running private sidecar."""

    def __init__(self, popen: subprocess.Popen, tmp: Path, sock: Path, log: Path):
        self.popen = popen
        self.dir = tmp
        self.socket = sock
        self.log = log

    @classmethod
    def start(
        cls,
        *,
        node_name: str,
        metad: str,
        segment_size: int,
        binary: str = "",
        timeout: float | None = None,
        protocol: str = "",
        device_name: str = "",
        socket_path: str | None = None,
        disk: str | None = None,
    ) -> "SpawnedSidecar":
        """Starts one and waits until it serves. Its socket is private (in its temp dir)
        unless ``socket_path`` names one for other processes of the node to use."""
        if not metad:
            raise ConnectError(
                "cannot start a sidecar: master_server_address (the metad replicas, "
                "HOST:PORT,...) is not set"
            )
        exe = find_binary(binary)
        tmp = Path(tempfile.mkdtemp(prefix="regolith-sidecar-"))
        sock, log = (Path(socket_path) if socket_path else tmp / "sidecar.sock"), tmp / "sidecar.log"
        if socket_path:
            sock.parent.mkdir(parents=True, exist_ok=True)
            if _serves(sock):
                shutil.rmtree(tmp, ignore_errors=True)
                raise ConnectError(f"a sidecar already serves at {sock}")
        args = cls._args(exe, node_name, metad, segment_size, sock, tmp / "state")
        args += transport_args(protocol, device_name)
        if disk:
            # The node's disk tier (docs/ssd.md): LMCache's storage_root_dir.
            args += sidecar_args(disk=disk)
        logger.info("starting a private sidecar: %s", " ".join(args))
        with open(log, "ab") as f:
            popen = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True
            )
        me = cls(popen, tmp, sock, log)
        with _live_lock:
            _live.add(me)
        # Pre-faulting the segment is the slow part of start-up (about 0.5 GB/s here and there).
        limit = timeout if timeout is not None else 60 + segment_size / (256 << 20)
        me._wait_ready(limit)
        return me

    @staticmethod
    def _args(exe: Path, node: str, metad: str, size: int, sock: Path, state: Path) -> list[str]:
        args = [str(exe)]
        args += sidecar_args(metad=metad, segment_size=size, socket=sock, state_dir=state)
        if node:
            args += sidecar_args(node_name=node)
        # The sidecar reads these from the environment when set; choose free ones otherwise.
        if not os.environ.get("REGOLITH_NIC"):
            args += sidecar_args(nic=_nic_for(node))
        if not os.environ.get("REGOLITH_DATA_PORT"):
            args += sidecar_args(data_port=_free_port())
        if not os.environ.get("REGOLITH_METRICS_ADDR"):
            args += sidecar_args(metrics_addr=f"127.0.0.1:{_free_port()}")
        return args

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if _serves(self.socket):
                logger.info("private sidecar ready at %s (pid %d)", self.socket, self.popen.pid)
                return
            if self.popen.poll() is not None:
                tail = _tail(self.log)
                self.stop()
                raise ConnectError(f"the private sidecar exited during start-up:\n{tail}")
            time.sleep(0.05)
        tail = _tail(self.log)
        self.stop()
        raise ConnectError(f"the private sidecar did not serve within {timeout:.0f}s:\n{tail}")

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM (the sidecar unmounts its segment gracefully), SIGKILL after `timeout`."""
        with _live_lock:
            _live.discard(self)
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        live = list(_live)
    for s in live:
        s.stop()
