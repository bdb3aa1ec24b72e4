"""Fixtures shared by every kind of test: real ZooKeeper and real service
processes, started by the same LocalCluster code that `txlog cluster` uses."""

from __future__ import annotations

import pytest

from services.cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path):
    """A ZooKeeper of its own (no services yet); add them with ``add_service``."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local
    local.down(grace_s=5)


@pytest.fixture
def txlog_cluster(tmp_path):
    """ZooKeeper, one producer_id_svc and two partition_svc (no coordinator); retention runs every 200 ms."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=0, service_args={"partition_svc": ["--retention-check-interval-ms", "200"]})
    yield local
    local.down(grace_s=5)


@pytest.fixture
def txn_cluster(tmp_path):
    """The full cluster: ZooKeeper, producer_id_svc, two partition_svc, two coordinator_svc,
    once the coordinators have settled who owns which transaction log partition."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300"]})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)
