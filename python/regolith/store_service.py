"""Mooncake's standalone store process on Regolith: ``python -m mooncake.mooncake_store_service
--config=config.json`` (SGLang's docs start it this way) reads the same JSON keys and flags as
Mooncake's, starts a ``regolith-sidecar`` that contributes ``global_segment_size`` bytes of this
node's memory to the cluster at ``master_server_address`` (the metad replicas), and serves
Mooncake's small REST API in front of it (``PUT /api/put``, ``GET /api/get/{key}``,
``GET /api/exist/{key}``, ``DELETE /api/remove/{key}``, ``DELETE /api/remove_all``; the segment
mount endpoints answer 501: the sidecar owns its memory).

Other processes on the node reach the same memory through the sidecar's socket (``--socket``,
printed at start: ``export REGOLITH_SOCKET=...``). SIGTERM or SIGINT stops the REST server and
then the sidecar (which unmounts its segment gracefully).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ._setup import parse_size
from ._spawn import SpawnedSidecar
from .mooncake import MooncakeDistributedStore

logger = logging.getLogger("regolith.store_service")

#: Mooncake's request body limit (aiohttp's client_max_size there).
MAX_BODY = 100 * 1024 * 1024


@dataclass
class ServiceConfig:
    """Mooncake's ``MooncakeConfig`` keys, with its defaults."""

    local_hostname: str = ""
    metadata_server: str = ""
    master_server_address: str = ""
    global_segment_size: int = 3355443200
    local_buffer_size: int = 1073741824
    protocol: str = "tcp"
    device_name: str = ""
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    REQUIRED = ("local_hostname", "metadata_server", "master_server_address")

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "ServiceConfig":
        """Known keys of ``values`` (unknown ones are ignored, as Mooncake does), sizes parsed
        ("4gb", "512MB", bytes); ValueError naming a missing or malformed key."""
        cfg = cls()
        for f in fields(cls):
            if f.name in values and values[f.name] is not None:
                setattr(cfg, f.name, _coerce(f.name, values[f.name], getattr(cfg, f.name)))
        missing = [k for k in cls.REQUIRED if not str(getattr(cfg, k)).strip()]
        if missing:
            raise ValueError(f"missing required config keys: {', '.join(missing)}")
        cfg.protocol = cfg.protocol.lower()
        return cfg


#: Size suffixes of Mooncake's config (``mooncake_config.py``): binary, "gb" as "g".
_SUFFIXES = [("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40)]
_SUFFIXES += [(k[0], v) for k, v in _SUFFIXES] + [("b", 1)]


def config_size(name: str, value: Any, default: int) -> int:
    """A size as Mooncake's config reads one: bytes, or a number with k/m/g/t[b] (powers of
    1024, any case: "4gb" is 4 GiB); other spellings ("1GiB") as ``setup`` reads them."""
    if isinstance(value, str):
        text = value.strip().lower()
        for suffix, unit in _SUFFIXES:
            number = text[: -len(suffix)].strip()
            if text.endswith(suffix) and number.replace(".", "", 1).isdigit():
                return int(float(number) * unit)
    return parse_size(name, value, default)


def _coerce(name: str, value: Any, default: Any) -> Any:
    if name in ("global_segment_size", "local_buffer_size"):
        return config_size(name, value, default)
    if isinstance(default, bool):
        return str(value).strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: {value!r} is not an integer") from None
    return str(value)


_ENV = {
    "local_hostname": "MOONCAKE_LOCAL_HOSTNAME",
    "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
    "master_server_address": "MOONCAKE_MASTER",
    "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE",
    "protocol": "MOONCAKE_PROTOCOL",
    "device_name": "MOONCAKE_DEVICE",
    "enable_ssd_offload": "MOONCAKE_OFFLOAD_ENABLED",
    "ssd_offload_path": "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "tenant_id": "MOONCAKE_TENANT_ID",
    "enable_client_http_server": "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
    "client_http_port": "MOONCAKE_CLIENT_HTTP_PORT",
}


def load_config(path: str | None, overrides: dict[str, str]) -> ServiceConfig:
    """The config file (``--config``, else ``$MOONCAKE_CONFIG_PATH``), else the ``MOONCAKE_*``
    environment (``MOONCAKE_MASTER`` required; ``local_hostname`` defaults to localhost and
    ``metadata_server`` to P2PHANDSHAKE there, as in Mooncake), then ``-D key=value``."""
    path = path or os.environ.get("MOONCAKE_CONFIG_PATH")
    if path:
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"config file {path}: {e}") from None
        if not isinstance(values, dict):
            raise ValueError(f"config file {path}: a JSON object is expected")
    else:
        if not os.environ.get("MOONCAKE_MASTER"):
            raise ValueError("no --config, no MOONCAKE_CONFIG_PATH and no MOONCAKE_MASTER set")
        values = {k: os.environ[v] for k, v in _ENV.items() if v in os.environ}
        values.setdefault("local_hostname", "localhost")
        values.setdefault("metadata_server", "P2PHANDSHAKE")
    values.update(overrides)
    return ServiceConfig.from_mapping(values)


def parse_defines(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if eq and key:
            out[key] = value
        else:
            logger.warning("ignoring -D %r: key=value expected", item)
    return out


class Service:
    """The sidecar and the REST server in front of it."""

    def __init__(self, cfg: ServiceConfig, socket: str, sidecar_bin: str = "") -> None:
        self.cfg = cfg
        self.sidecar = SpawnedSidecar.start(
            node_name=cfg.local_hostname,
            metad=cfg.master_server_address,
            segment_size=cfg.global_segment_size,
            binary=sidecar_bin,
            protocol=cfg.protocol,
            device_name=cfg.device_name,
            socket_path=socket or None,
        )
        self.store = MooncakeDistributedStore()
        try:
            self.store.setup(
                {
                    "local_hostname": cfg.local_hostname,
                    "sidecar_socket": str(self.sidecar.socket),
                    "local_buffer_size": cfg.local_buffer_size,
                    "master_server_address": cfg.master_server_address,
                }
            )
        except BaseException:
            self.sidecar.stop()
            raise

    def stop(self) -> None:
        self.store.close()
        self.sidecar.stop()


def _handler(store: MooncakeDistributedStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            logger.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def _key(self, prefix: str) -> str | None:
            rest = self.path[len(prefix) :] if self.path.startswith(prefix) else ""
            return unquote(rest) if rest and "/" not in rest else None

        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != "/api/put":
                return self._json(404, {"error": "Not found"})
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                return self._json(413, {"error": f"body over {MAX_BODY} bytes"})
            try:
                data = json.loads(self.rfile.read(n) or b"null")
                key, value = data.get("key"), data.get("value")
            except (ValueError, AttributeError):
                return self._json(400, {"error": "Missing key or value"})
            if not key or value is None:
                return self._json(400, {"error": "Missing key or value"})
            if store.put(str(key), str(value).encode()) != 0:
                return self._json(500, {"error": "PUT operation failed"})
            self._json(200, {"status": "success"})

        def do_GET(self) -> None:  # noqa: N802
            if (key := self._key("/api/get/")) is not None:
                exists = store.is_exist(key)
                if exists == 0:
                    return self._json(404, {"error": "Key not found"})
                if exists < 0:
                    return self._json(500, {"error": "Exist check failed"})
                value = store.get(key)
                if value == b"" and store.is_exist(key) == 0:
                    return self._json(404, {"error": "Key not found"})
                return self._send(200, value, "application/octet-stream")
            if (key := self._key("/api/exist/")) is not None:
                exists = store.is_exist(key)
                if exists < 0:
                    return self._json(500, {"error": "Exist check failed"})
                return self._json(200, {"exists": exists > 0})
            self._json(404, {"error": "Not found"})

        def do_DELETE(self) -> None:  # noqa: N802
            if self.path == "/api/remove_all":
                n = store.remove_all()
                if n < 0:
                    return self._json(500, {"error": "RemoveAll operation failed"})
                return self._json(200, {"status": f"success removed {n} keys"})
            if (key := self._key("/api/remove/")) is not None:
                if store.remove(key) != 0:
                    return self._json(500, {"error": "Remove operation failed"})
                return self._json(200, {"status": "success"})
            self._json(404, {"error": "Not found"})

        def do_POST(self) -> None:  # noqa: N802
            mounts = ("/api/reconfigure", "/api/mount_shm", "/api/unmount_shm", "/api/mount")
            if self.path in mounts + ("/api/unmount", "/api/unmount_local_disk"):
                return self._json(
                    501,
                    {
                        "error": "not supported on Regolith: the node's sidecar owns the memory "
                        "it contributes (global_segment_size at start)"
                    },
                )
            self._json(404, {"error": "Not found"})

    return Handler


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Mooncake Store Service with REST API, on Regolith (a regolith-sidecar)"
    )
    p.add_argument("--config", help="Path to Mooncake config file")
    p.add_argument(
        "-D", "--define", action="append", default=[], help="Override a config key: key=value"
    )
    p.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080)")
    p.add_argument(
        "--max-wait-time",
        type=float,
        default=60,
        help="Longest wait for the sidecar to serve, in seconds (default: 60)",
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="Address the REST API binds (default: 0.0.0.0, as Mooncake)"
    )
    p.add_argument(
        "--socket",
        default=os.environ.get("REGOLITH_SOCKET", ""),
        help="Where the sidecar listens for this node's clients "
        "(default: $REGOLITH_SOCKET, else a private path, printed at start)",
    )
    p.add_argument("--sidecar-bin", default="", help="The regolith-sidecar binary to run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s"
    )
    args = parse_arguments(argv)
    try:
        cfg = load_config(args.config, parse_defines(args.define))
    except ValueError as e:
        logger.error("configuration: %s", e)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        service = Service(cfg, args.socket, args.sidecar_bin)
    except Exception as e:  # noqa: BLE001 - any start-up failure ends the process with its reason
        logger.error("the store service did not start: %s", e)
        return 1
    try:
        server = ThreadingHTTPServer((args.host, args.port), _handler(service.store))
    except OSError as e:
        logger.error("REST API on %s:%d: %s", args.host, args.port, e)
        service.stop()
        return 1
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rest", daemon=True).start()
    print(
        f"Mooncake store service on Regolith: node {cfg.local_hostname} contributes "
        f"{cfg.global_segment_size} bytes; REST API on http://{args.host}:{server.server_port}; "
        f"export REGOLITH_SOCKET={service.sidecar.socket}",
        flush=True,
    )
    stop.wait()
    logger.info("stopping: the REST API, then the sidecar")
    server.shutdown()
    server.server_close()
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
