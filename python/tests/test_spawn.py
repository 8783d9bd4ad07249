"""`setup` starting a private sidecar when none answers (regolith_spawn_sidecar /
REGOLITH_SPAWN_SIDECAR=1): it joins the cluster with global_segment_size bytes, serves this
process, and is stopped at close()."""

from __future__ import annotations

import os

import pytest

import regolith
import regolith.mooncake as mc
from cluster import binary


@pytest.fixture
def spawn_env(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("REGOLITH_SIDECAR_BIN", str(binary("regolith-sidecar")))
    monkeypatch.setenv("REGOLITH_CLUSTER_TOKEN_FILE", str(cluster.token_file))
    monkeypatch.setenv("REGOLITH_SOCKET", str(tmp_path / "no-sidecar-here.sock"))
    monkeypatch.delenv("REGOLITH_SPAWN_SIDECAR", raising=False)
    return cluster


def _config(cluster, **extra):
    return {
        "local_hostname": "spawned-node",
        "metadata_server": "http://localhost:8080/metadata",
        "global_segment_size": "64MiB",
        "local_buffer_size": "0",
        "protocol": "tcp",
        "device_name": "",
        "master_server_address": cluster.metad_addrs,
        **extra,
    }


def test_spawned_sidecar_joins_the_cluster_and_stops_at_close(spawn_env, client, key):
    s = mc.MooncakeDistributedStore()
    assert s.setup(_config(spawn_env, regolith_spawn_sidecar="true")) == 0
    sidecar = s._sidecar
    assert sidecar is not None and sidecar.running()
    assert s.get_hostname() == "spawned-node"
    segs = {x["node_name"]: x for x in client.list_segments()}
    assert segs["spawned-node"]["capacity"] == 64 << 20

    cfg = mc.ReplicateConfig()
    cfg.preferred_segment = "spawned-node"
    k = key()
    assert s.put(k, b"held by the spawned node", cfg) == 0
    assert client.get(k) == b"held by the spawned node"  # read from another node

    assert s.close() == 0
    assert not sidecar.running()
    assert not os.path.exists(sidecar.socket)


def test_spawn_from_the_environment(spawn_env, monkeypatch):
    monkeypatch.setenv("REGOLITH_SPAWN_SIDECAR", "1")
    s = mc.MooncakeDistributedStore()
    assert s.setup(_config(spawn_env, local_hostname="spawned-env")) == 0
    assert s.get_hostname() == "spawned-env"
    assert s.put("spawned-env-key", b"v") == 0
    s.close()


def test_protocol_and_device_name_become_the_sidecars_transport_flags():
    from regolith._spawn import transport_args

    assert transport_args("tcp", "mlx5_0") == ["--transport", "tcp"]
    assert transport_args("rdma", " mlx5_0, mlx5_1 ") == [
        "--transport",
        "auto",
        "--rdma-device",
        "mlx5_0,mlx5_1",
    ]
    assert transport_args("RDMA", "") == ["--transport", "auto"]
    assert transport_args("", "mlx5_0") == []


def test_spawned_sidecar_with_protocol_rdma_serves_over_tcp_without_a_device(spawn_env, client):
    # LMCache's `protocol: "rdma"` and `device_name` reach the spawned sidecar as
    # `--transport auto --rdma-device mlx5_0`; on a machine without that device it serves over
    # TCP (and says why in /status) instead of failing.
    s = mc.MooncakeDistributedStore()
    cfg = _config(
        spawn_env,
        local_hostname="spawned-rdma",
        protocol="rdma",
        device_name="mlx5_0",
        regolith_spawn_sidecar="true",
    )
    assert s.setup(cfg) == 0
    rc = mc.ReplicateConfig()
    rc.preferred_segment = "spawned-rdma"
    assert s.put("spawned-rdma-key", b"over tcp", rc) == 0
    assert client.get("spawned-rdma-key") == b"over tcp"
    log = s._sidecar.log.read_text()
    assert "over TCP only" in log, log[-2000:]
    s.close()


def test_spawn_without_a_binary_fails_clearly(spawn_env, monkeypatch):
    import regolith._spawn

    monkeypatch.setenv("REGOLITH_SIDECAR_BIN", "/nonexistent/regolith-sidecar")
    monkeypatch.setenv("PATH", "/nonexistent")
    # Not the binary the installed wheel carries either.
    monkeypatch.setattr(regolith._spawn, "_search_dirs", lambda: [])
    s = mc.MooncakeDistributedStore()
    with pytest.raises(regolith.ConnectError, match="REGOLITH_SIDECAR_BIN"):
        s.setup(_config(spawn_env, regolith_spawn_sidecar=True))


def test_spawn_needs_master_server_address(spawn_env):
    s = mc.MooncakeDistributedStore()
    with pytest.raises(regolith.ConnectError, match="master_server_address"):
        s.setup(_config(spawn_env, regolith_spawn_sidecar=1, master_server_address=""))


def test_storage_root_dir_gives_the_spawned_sidecar_a_disk_tier(spawn_env, tmp_path, monkeypatch):
    """LMCache's `storage_root_dir` (a setup key, or $MOONCAKE_STORAGE_ROOT_DIR as its Mooncake
    connector sets it) becomes the spawned sidecar's --disk, one directory per node under it."""
    s = mc.MooncakeDistributedStore()
    root = tmp_path / "ssd"
    cfg = _config(
        spawn_env, local_hostname="spawned-disk", regolith_spawn_sidecar="true",
        storage_root_dir=str(root),
    )
    assert s.setup(cfg) == 0
    disk = root / "regolith-spawned-disk"
    assert (disk / "regolith-disk.json").exists()
    assert "--disk" in " ".join(s._sidecar.popen.args)
    s.close()

    monkeypatch.setenv("MOONCAKE_STORAGE_ROOT_DIR", str(tmp_path / "env-ssd"))
    s = mc.MooncakeDistributedStore()
    assert s.setup(_config(spawn_env, local_hostname="spawned-disk-env", regolith_spawn_sidecar="1")) == 0
    assert (tmp_path / "env-ssd" / "regolith-spawned-disk-env" / "regolith-disk.json").exists()
    s.close()
