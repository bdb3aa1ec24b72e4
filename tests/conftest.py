"""Fixtures shared by every kind of test: real ZooKeeper and real service
processes, started by the same LocalCluster code that `txlog cluster` uses."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from services.cluster import PORT_COUNTER_ENV, PORT_RANGE_ENV, LocalCluster

# Ports the tests' services listen on: below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), so no
# outgoing connection holds one, split into one slice per pytest-xdist worker.
TEST_PORTS = (12000, 32768)

# Tests run several at a time (scripts/test.sh), so an example may take longer
# than hypothesis's 200 ms deadline without being wrong: speed is bench/'s concern.
settings.register_profile("txlog", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("txlog")


def pytest_configure(config):
    """Gives this process (an xdist worker, or the only one) its slice of
    TEST_PORTS from a random start, for free_port in it and in every process
    it starts, before test modules are imported (some pick ports then)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    size = (TEST_PORTS[1] - TEST_PORTS[0]) // workers
    low = TEST_PORTS[0] + worker * size
    handle, counter = tempfile.mkstemp(prefix="txlog-ports-")
    os.write(handle, str(random.randrange(low, low + size)).encode())
    os.close(handle)
    os.environ[PORT_RANGE_ENV] = f"{low}-{low + size}"
    os.environ[PORT_COUNTER_ENV] = config.txlog_port_counter = counter


def pytest_unconfigure(config):
    Path(config.txlog_port_counter).unlink(missing_ok=True)


def pytest_collection_modifyitems(config, items):
    """The Spark tests share one worker (with --dist loadgroup), so one JVM
    runs them rather than one per worker, each with its memory and threads."""
    spark_dir = Path(__file__).parent / "spark"
    for item in items:
        if spark_dir in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("spark"))


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
