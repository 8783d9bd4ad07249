"""`python -m mooncake.mooncake_store_service --config=config.json` on Regolith (issue 13 item
3): Mooncake's standalone store process, as SGLang's docs start it, becomes a regolith-sidecar
contributing `global_segment_size` bytes under `local_hostname`, with Mooncake's REST API in
front; SIGTERM stops both. Real processes against the loopback cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

import pytest

import regolith
from cluster import binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def service(cluster, tmp_path):
    node = f"svc-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "config.json"
    # SGLang's README example, pointed at this cluster's metad replicas.
    cfg.write_text(
        json.dumps(
            {
                "local_hostname": node,
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": cluster.metad_addrs,
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "64mb",
                "local_buffer_size": 0,
            }
        )
    )
    port = free_port()
    sock = tmp_path / "run" / "sidecar.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mooncake.mooncake_store_service",
            f"--config={cfg}",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--socket",
            str(sock),
            "--sidecar-bin",
            str(binary("regolith-sidecar")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "REGOLITH_CLUSTER_TOKEN_FILE": str(cluster.token_file)},
    )
    try:
        lines = []
        while not any("REST API on" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines) + "(the service exited before it served)"
            lines.append(line)
        yield proc, f"http://127.0.0.1:{port}", node, sock
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the service stops its sidecar, then exits
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_rest_api_and_the_sidecar_behind_it(service, client):
    proc, url, node, sock = service
    key = f"svc/{uuid.uuid4().hex}"
    path = quote(key, safe="")  # a "/" in a key travels encoded, as with Mooncake's aiohttp routes
    assert call("PUT", f"{url}/api/put", {"key": key, "value": "hello store"}) == (
        200,
        b'{"status": "success"}',
    )
    assert call("GET", f"{url}/api/get/{path}") == (200, b"hello store")
    assert call("GET", f"{url}/api/exist/{path}") == (200, b'{"exists": true}')
    assert call("GET", f"{url}/api/get/nope-{path}")[0] == 404
    assert call("PUT", f"{url}/api/put", {"key": key})[0] == 400
    assert call("POST", f"{url}/api/mount", {"size": 1})[0] == 501

    # The node's memory is in the cluster under local_hostname, and its socket serves clients.
    names = {s["node_name"]: s for s in client.list_segments()}
    assert names[node]["capacity"] == 64 << 20, "64mb is 64 MiB in Mooncake's config"
    with regolith.Client(str(sock)) as c:
        assert c.node_name == node
        assert c.get(key) == b"hello store"

    assert call("DELETE", f"{url}/api/remove/{path}")[0] == 200
    assert call("GET", f"{url}/api/exist/{path}") == (200, b'{"exists": false}')

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    end = time.monotonic() + 30
    while node in {s["node_name"] for s in client.list_segments()} and time.monotonic() < end:
        time.sleep(0.2)
    assert node not in {s["node_name"] for s in client.list_segments()}, "unmounted on SIGTERM"


def test_config_sizes_read_as_mooncake_reads_them():
    from regolith.store_service import config_size

    assert config_size("s", "4gb", 0) == 4 << 30
    assert config_size("s", "512M", 0) == 512 << 20
    assert config_size("s", "1.5k", 0) == 1536
    assert config_size("s", 3355443200, 0) == 3355443200
    assert config_size("s", "1GiB", 0) == 1 << 30
    with pytest.raises(ValueError):
        config_size("s", "lots", 0)


def test_missing_config_keys_fail_with_their_names(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"local_hostname": "x"}))
    r = subprocess.run(
        [sys.executable, "-m", "mooncake.mooncake_store_service", f"--config={cfg}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "metadata_server" in r.stderr and "master_server_address" in r.stderr
