"""Parsing of Mooncake's ``setup`` arguments: the 7-argument positional form, keyword arguments
and ``setup(dict)``, with both spellings of the renamed keys and values given as strings
(LMCache passes strings) or numbers."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Order of Mooncake's positional ``setup`` arguments.
POSITIONAL = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "device_name",
    "master_server_address",
)

#: Later positional arguments of the legacy form, accepted and ignored.
IGNORED_POSITIONAL = (
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
)

#: Other spellings of the same key (Mooncake renamed these).
ALIASES = {
    "master_server_addr": "master_server_address",
    "rdma_devices": "device_name",
}

#: Mooncake's default segment size for the dict form (16 MB).
DEFAULT_SEGMENT = 16 * 1024 * 1024

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(name: str, value: Any, default: int) -> int:
    """A size in bytes from an int, an integral float or a string (``"21474836480"``,
    ``"20GiB"``); ``""``/None give the default."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)) and m[2].lower() in _UNITS:
        n = int(float(m[1]) * _UNITS[m[2].lower()])
    else:
        raise ValueError(f"{name}: expected a size in bytes (e.g. 1073741824 or 1GiB), got {value!r}")
    if n < 0:
        raise ValueError(f"{name}: a size cannot be negative ({value!r})")
    return n


def parse_flag(name: str, value: Any) -> bool:
    """A boolean from a bool, a number or a string (``true``/``1``/``yes``/``on``)."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)):
        return value != 0
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass
class SetupConfig:
    local_hostname: str = ""
    metadata_server: str = ""
    global_segment_size: int = DEFAULT_SEGMENT
    local_buffer_size: int = 0
    protocol: str = "tcp"
    device_name: str = ""
    master_server_address: str = ""
    #: The sidecar's socket (setup key ``sidecar_socket``), else ``$REGOLITH_SOCKET``.
    sidecar_socket: str = ""
    #: Start a sidecar when none answers (``regolith_spawn_sidecar``/``$REGOLITH_SPAWN_SIDECAR``).
    spawn_sidecar: bool = False
    #: The sidecar binary for spawning (``regolith_sidecar_bin``), else the usual search.
    sidecar_bin: str = ""
    #: Keys Regolith does not use (kept for logging).
    ignored: dict = field(default_factory=dict)


def _normalized(raw: Mapping) -> dict:
    out: dict = {}
    for k, v in raw.items():
        key = ALIASES.get(str(k), str(k))
        # The canonical spelling wins over an alias given beside it.
        if key in out and str(k) != key:
            continue
        out[key] = v
    return out


def _from_positional(args: tuple, kwargs: dict) -> dict:
    names = POSITIONAL + IGNORED_POSITIONAL
    if len(args) > len(names):
        raise TypeError(f"setup() takes at most {len(names)} positional arguments ({len(args)} given)")
    raw = dict(zip(names, args))
    for k, v in _normalized(kwargs).items():
        if k in raw:
            raise TypeError(f"setup() got multiple values for argument {k!r}")
        raw[k] = v
    return raw


def raw_setup_args(args: tuple, kwargs: dict) -> dict:
    """The setup arguments as one dict, whichever form was used."""
    if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
        return _normalized(args[0])
    if args and isinstance(args[0], Mapping):
        raise TypeError("setup(config: dict) takes the dict alone")
    return _from_positional(args, kwargs)


def parse_setup(args: tuple, kwargs: dict) -> SetupConfig:
    raw = raw_setup_args(args, kwargs)
    known = set(POSITIONAL) | {"sidecar_socket", "regolith_spawn_sidecar", "regolith_sidecar_bin"}
    spawn = raw.get("regolith_spawn_sidecar", os.environ.get("REGOLITH_SPAWN_SIDECAR"))
    return SetupConfig(
        local_hostname=_text(raw.get("local_hostname")),
        metadata_server=_text(raw.get("metadata_server")),
        global_segment_size=parse_size(
            "global_segment_size", raw.get("global_segment_size"), DEFAULT_SEGMENT
        ),
        local_buffer_size=parse_size("local_buffer_size", raw.get("local_buffer_size"), 0),
        protocol=_text(raw.get("protocol")) or "tcp",
        device_name=_text(raw.get("device_name")),
        master_server_address=_text(raw.get("master_server_address")),
        sidecar_socket=_text(raw.get("sidecar_socket")),
        spawn_sidecar=parse_flag("regolith_spawn_sidecar", spawn),
        sidecar_bin=_text(raw.get("regolith_sidecar_bin")),
        ignored={k: v for k, v in raw.items() if k not in known},
    )
