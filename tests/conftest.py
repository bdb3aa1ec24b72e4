"""Fixtures shared by every kind of test: real ZooKeeper and real service
processes, started by the same LocalCluster code that `txlog cluster` uses."""

from __future__ import annotations

import pytest

from services.cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path):
    """A ZooKeeper of its own (no services yet); add them with ``add_service``."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0)
    yield local
    local.down(grace_s=5)
