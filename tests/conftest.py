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


def wait_until_coordinators_settle(local: LocalCluster, timeout_s: float = 60) -> None:
    """Until every __transaction_state partition is owned by the coordinator the
    balancing rule names (the first coordinator up takes them all, the second its
    share a moment later) and both coordinators answer for what they own."""
    import json
    import posixpath
    import time

    import grpc

    from services import coordinators, zk
    from services.stubs.txlog.v1 import coordinator_pb2, coordinator_pb2_grpc

    nodes = sorted(int(n.rsplit("-", 1)[1]) for n, p in local.state.services.items() if p.kind == "coordinator_svc")
    addresses = [p.address for p in local.state.services.values() if p.kind == "coordinator_svc"]
    client = zk.connect(local.state.zookeeper)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                owners_path = coordinators.owners_path(local.state.zookeeper_root)
                topic = json.loads(client.get(posixpath.join(local.state.zookeeper_root, "topics", coordinators.TRANSACTION_STATE_TOPIC))[0])
                owners = [coordinators.PartitionOwner.decode(client.get(posixpath.join(owners_path, str(i)))[0]).node_id
                          for i in range(topic["partitions"])]
                if owners == [nodes[i % len(nodes)] for i in range(len(owners))]:
                    for address in addresses:
                        with grpc.insecure_channel(address) as channel:
                            coordinator_pb2_grpc.CoordinatorServiceStub(channel).ListTransactions(
                                coordinator_pb2.ListTransactionsRequest(local_only=True), timeout=5)
                    return
            except Exception:  # not created, not owned, or still loading: look again
                pass
            assert time.monotonic() < deadline, "the coordinators did not settle who owns which transaction log partition"
            time.sleep(0.2)
    finally:
        client.stop()
        client.close()


@pytest.fixture
def txn_cluster(tmp_path):
    """The full cluster: ZooKeeper, producer_id_svc, two partition_svc, two coordinator_svc,
    once the coordinators have settled who owns which transaction log partition."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300"]})
    wait_until_coordinators_settle(local)
    yield local
    local.down(grace_s=5)
