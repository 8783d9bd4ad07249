"""The command-line flags Regolith's Python code starts processes with, in one place:
``regolith-sidecar``'s (the private sidecar of ``regolith._spawn``) and ``regolith up``'s (the
test clusters of ``tests/cluster.py``). Flag names are a contract with the binaries, never
renamed; ``cargo test`` parses every flag named in these tables with the binaries' own parsers
(``sidecar/src/args.rs``, ``cli/src/args.rs``), so a flag a binary does not accept fails there.
"""

from __future__ import annotations

# regolith-sidecar: keyword -> flag.
SIDECAR = {
    "metad": "--metad",
    "segment_size": "--segment-size",
    "socket": "--socket",
    "state_dir": "--state-dir",
    "node_name": "--node-name",
    "nic": "--nic",
    "data_port": "--data-port",
    "metrics_addr": "--metrics-addr",
    "transport": "--transport",
    "rdma_device": "--rdma-device",
    "disk": "--disk",
}

# `regolith --dir DIR up ...`: the global flag, the subcommand, its flags.
CLI_GLOBAL = {"dir": "--dir"}
UP_COMMAND = "up"
UP = {
    "sidecars": "--sidecars",
    "segment_size": "--segment-size",
    "base_port": "--base-port",
    "metad_bin": "--metad-bin",
    "sidecar_bin": "--sidecar-bin",
}


def flags(table: dict[str, str], **values: object) -> list[str]:
    """``[flag, value, ...]`` for each keyword of ``table`` given a value other than ``None``,
    in the order given (an unknown keyword is a ``KeyError``)."""
    out: list[str] = []
    for name, value in values.items():
        if value is not None:
            out += [table[name], str(value)]
    return out


def sidecar_args(**values: object) -> list[str]:
    """The arguments of ``regolith-sidecar`` (after the program) for these :data:`SIDECAR`
    keywords."""
    return flags(SIDECAR, **values)


def up_args(dir: object, **values: object) -> list[str]:
    """The arguments of ``regolith --dir DIR up ...`` (after the program) for these :data:`UP`
    keywords."""
    return flags(CLI_GLOBAL, dir=dir) + [UP_COMMAND] + flags(UP, **values)
