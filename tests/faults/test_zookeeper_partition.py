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

import pytest
from grpc_health.v1 import health_pb2

from services.tooling.chaos.proxy import ZookeeperRoutes
from services.tooling.cluster import LocalCluster
from tests.faults.network import SESSION, elected_instead, first_acknowledged, health, produce
from tests.integ.raw import Raw
from txlog.two_phase import wait_until
from txlog.v1 import partition_pb2


@pytest.fixture
def routed(tmp_path):
    routes = ZookeeperRoutes()
    cluster = LocalCluster(tmp_path / "cluster", zookeeper_route=routes.route)
    cluster.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=0, service_args={"partition_svc": SESSION})
    yield cluster, routes
    routes.heal()
    cluster.down(grace_s=5)
    routes.close()


def test_a_leader_cut_off_from_zookeeper_stops_acknowledging_once_another_leads(routed):
    cluster, routes = routed
    raw = Raw(cluster)
    topic = f"split-{uuid.uuid4().hex[:8]}"
    raw.create_topic(topic, 1, **{"min.insync.replicas": "2"})
    wait_until(lambda: len(raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0].isr) == 3,
               60, "every replica in sync")
    old = raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0]
    before = first_acknowledged(raw, old.leader_address, topic, "before")  # a loaded machine may need more than one
    name = next(n for n, p in cluster.state.services.items() if p.address == old.leader_address)

    routes.cut(name)
    wait_until(lambda: health(old.leader_address) == health_pb2.HealthCheckResponse.NOT_SERVING, 60,
               "the cut instance telling its probes it lost ZooKeeper (it still answers them)")

    # asked of a follower: the cut instance's Metadata needs ZooKeeper (its live instances) and fails only at the
    # caller's 10 s deadline, so each poll that asked it first took 10 s of the minute the election is given
    follower = next(p.address for n, p in cluster.state.services.items()
                    if n.startswith("partition_svc") and p.address != old.leader_address)
    new = elected_instead(raw, topic, old, follower)
    acknowledged = first_acknowledged(raw, new.leader_address, topic, "after")
    for attempt in range(3):
        answer = produce(raw, old.leader_address, topic, f"split-{attempt}".encode())
        assert answer != "NONE", "the deposed leader, cut from ZooKeeper, acknowledged an acks=all write"

    routes.heal(name)
    wait_until(lambda: health(old.leader_address) == health_pb2.HealthCheckResponse.SERVING, 60, "the instance back")
    wait_until(lambda: len(raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0].isr) == 3,
               90, "the old leader back in sync")
    values = [r.value for r in raw.read_all(topic, 0)]
    assert values.count(before) == 1 and values.count(acknowledged) == 1, values
    assert not any(v.startswith(b"split-") for v in values), values
    raw.close()
