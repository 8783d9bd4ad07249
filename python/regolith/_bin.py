"""The wheel's console entry points: ``regolith``, ``regolith-metad`` and ``regolith-sidecar``
run the binaries the wheel carries in ``regolith/bin/``, as ``pip install`` of Mooncake's wheel
gives its users the master and the metadata server. The process is replaced (``execv``):
signals, exit status, stdio and the process id are the binary's, so a service manager or
``regolith up`` sees the daemon itself. ``regolith up`` finds ``regolith-metad`` and
``regolith-sidecar`` beside the ``regolith`` binary, that is in the same directory.

A wheel built without the binaries (a developer's ``maturin develop``) says so and exits 127.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"


def path(name: str) -> Path:
    """Where the wheel keeps the binary ``name``."""
    return BIN / name


def _exec(name: str) -> None:
    exe = path(name)
    if not exe.is_file():
        sys.stderr.write(
            f"{name}: this installation of regolith-kvcache carries no {name} binary "
            f"({exe}). Install a wheel built with them (python/ci/common.sh, build_wheels), "
            f"or build it: cargo build --release -p regolith-cli -p regolith-metad "
            f"-p regolith-sidecar\n"
        )
        raise SystemExit(127)
    if not os.access(exe, os.X_OK):
        # A wheel installer that dropped the mode bits: restore them once.
        try:
            exe.chmod(exe.stat().st_mode | 0o111)
        except OSError as e:
            sys.stderr.write(f"{name}: {exe} is not executable and cannot be made so: {e}\n")
            raise SystemExit(126) from None
    os.execv(exe, [str(exe), *sys.argv[1:]])


def regolith() -> None:
    _exec("regolith")


def metad() -> None:
    _exec("regolith-metad")


def sidecar() -> None:
    _exec("regolith-sidecar")
