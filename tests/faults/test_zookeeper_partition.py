"""A partition_svc cut off from ZooKeeper while clients still reach it (issue
36; the chaos run's partition_zookeeper), through the real services: its path
to ZooKeeper is the run's own proxy, turned into a black hole and healed.

The split brain: the cut leader still answers, but once the controller has
elected another leader it must not acknowledge an acks=all write (its
followers follow the new leader, and it cannot shrink the ISR without
ZooKeeper); the new leader acknowledges; after the heal every acknowledged
record is there once and the old leader follows."""

from __future__ import annotations

import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.tooling.chaos.proxy import ZookeeperRoutes
from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw
from tests.support.errors import error_name
from txlog.protocol import errors
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2

SESSION = ["--zookeeper-session-timeout-s", "4", "--replica-lag-time-max-ms", "2000",
           "--controller-pass-interval-ms", "1000", "--partition-state-refresh-ms", "1000", "--min-insync-replicas", "2"]


@pytest.fixture
def routed(tmp_path):
    routes = ZookeeperRoutes()
    cluster = LocalCluster(tmp_path / "cluster", zookeeper_route=routes.route)
    cluster.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=0, service_args={"partition_svc": SESSION})
    yield cluster, routes
    routes.heal()
    cluster.down(grace_s=5)
    routes.close()


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def produce(raw: Raw, address: str, topic: str, value: bytes) -> str:
    """The error code an acks=all produce of ``value`` is answered with (NONE: acknowledged)."""
    try:
        reply = raw.stub(address).Produce(partition_pb2.ProduceRequest(acks=-1, timeout_ms=3_000, batches=[
            partition_pb2.PartitionBatch(topic=topic, partition=0, batch=common_pb2.RecordBatch(
                records=[common_pb2.Record(value=value)]))]), timeout=30)
    except grpc.RpcError as exc:
        return errors.from_rpc_error(exc).name
    return error_name(reply.results[0])


def test_a_leader_cut_off_from_zookeeper_stops_acknowledging_once_another_leads(routed):
    cluster, routes = routed
    raw = Raw(cluster)
    topic = f"split-{uuid.uuid4().hex[:8]}"
    raw.create_topic(topic, 1, **{"min.insync.replicas": "2"})
    wait_until(lambda: len(raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0].isr) == 3,
               60, "every replica in sync")
    old = raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0]
    assert produce(raw, old.leader_address, topic, b"before") == "NONE"
    name = next(n for n, p in cluster.state.services.items() if p.address == old.leader_address)

    routes.cut(name)
    wait_until(lambda: health(old.leader_address) == health_pb2.HealthCheckResponse.NOT_SERVING, 60,
               "the cut instance telling its probes it lost ZooKeeper (it still answers them)")

    def elected():
        meta = raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0]
        return meta if meta.leader_id not in (-1, old.leader_id) else None

    wait_until(lambda: elected() is not None, 60, "another leader elected")
    new = elected()
    attempts = iter(range(1000))
    acknowledged = []

    def new_leader_acknowledges() -> bool:
        value = f"after-{next(attempts)}".encode()  # each attempt its own value: one timed out may be there too
        if produce(raw, new.leader_address, topic, value) == "NONE":
            acknowledged.append(value)
        return bool(acknowledged)

    wait_until(new_leader_acknowledges, 60, "the new leader acknowledging")
    for attempt in range(3):
        answer = produce(raw, old.leader_address, topic, f"split-{attempt}".encode())
        assert answer != "NONE", "the deposed leader, cut from ZooKeeper, acknowledged an acks=all write"

    routes.heal(name)
    wait_until(lambda: health(old.leader_address) == health_pb2.HealthCheckResponse.SERVING, 60, "the instance back")
    wait_until(lambda: len(raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0].isr) == 3,
               90, "the old leader back in sync")
    values = [r.value for r in raw.read_all(topic, 0)]
    assert values.count(b"before") == 1 and values.count(acknowledged[0]) == 1, values
    assert not any(v.startswith(b"split-") for v in values), values
    raw.close()
