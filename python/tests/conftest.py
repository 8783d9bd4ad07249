"""Fixtures: one loopback cluster (3 metad + 2 sidecars) for the whole session, clients of its
two sidecars, and unique keys per test."""

from __future__ import annotations

import os
import uuid

import pytest

import regolith

import cluster as _cluster


@pytest.fixture(scope="session")
def cluster():
    c = _cluster.start(sidecars=2, segment_size="256MiB")
    # Code that connects by default (REGOLITH_SOCKET) reaches node-0.
    old = os.environ.get("REGOLITH_SOCKET")
    os.environ["REGOLITH_SOCKET"] = c.socket(0)
    yield c
    if old is None:
        os.environ.pop("REGOLITH_SOCKET", None)
    else:
        os.environ["REGOLITH_SOCKET"] = old
    _cluster.cleanup(c)


@pytest.fixture
def client(cluster):
    c = regolith.Client(cluster.socket(0))
    yield c
    c.close()


@pytest.fixture
def client_b(cluster):
    c = regolith.Client(cluster.socket(1))
    yield c
    c.close()


@pytest.fixture
def key():
    """A function returning fresh keys, unique to the test."""
    prefix = uuid.uuid4().hex[:12]
    n = iter(range(1_000_000))
    return lambda name="k": f"{prefix}/{name}/{next(n)}"

