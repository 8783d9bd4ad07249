"""The wheel's console entry points (regolith._bin): the CLI and both daemons run from the
installed package with no Rust toolchain (the whole suite runs through them with
REGOLITH_BINARIES=wheel, python/ci/test.sh), and a package built without its binaries says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import regolith._bin as rbin
from cluster import binary, from_wheel


@pytest.mark.skipif(not from_wheel(), reason="runs against an installed wheel (REGOLITH_BINARIES=wheel)")
def test_the_wheel_carries_the_cli_and_both_daemons():
    for name in ("regolith", "regolith-metad", "regolith-sidecar"):
        script = binary(name)
        # The console script sits beside this interpreter; the binary inside the package.
        assert script.parent == Path(sys.executable).parent
        assert rbin.path(name).is_file(), f"the wheel has no {name} in {rbin.BIN}"
        out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "Usage" in out.stdout
    version = subprocess.run(
        [str(binary("regolith")), "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and version.stdout.startswith("regolith "), version


def test_an_installation_without_binaries_says_what_to_do(tmp_path):
    script = (
        "import sys, regolith._bin as b, pathlib; "
        f"b.BIN = pathlib.Path({str(tmp_path / 'bin')!r}); b.sidecar()"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 127
    assert "carries no regolith-sidecar binary" in out.stderr
    assert "cargo build" in out.stderr
