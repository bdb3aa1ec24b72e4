"""Instances cut off from their peers while clients still reach them (issue 36;
the chaos run's partition_peers and partition_minority), through the real
services: every path between two instances is a proxy of the test's own, one
per direction (each instance's --peer-routes-file names them), turned into a
black hole and healed.

A leader cut off from its followers but not from ZooKeeper stays the leader
(its session lives, so nobody is elected in its place), drops its followers
from the ISR and then refuses acks=all writes below min.insync.replicas: it
acknowledges nothing that only it holds. A leader on a minority side (cut off
from its peers and from ZooKeeper) is replaced by the majority's controller
and acknowledges nothing either, since it can neither reach its followers nor
shrink its ISR. After the heal every acknowledged record is there once."""

from __future__ import annotations

import uuid

import pytest
from grpc_health.v1 import health_pb2

from services.tooling.chaos.proxy import PeerPaths, ZookeeperRoutes
from services.tooling.cluster import LocalCluster
from tests.faults.network import SESSION, elected_instead, first_acknowledged, health, partition_zero, produce
from tests.integ.raw import Raw
from txlog.two_phase import wait_until


@pytest.fixture
def cut_able(tmp_path):
    routes = ZookeeperRoutes()
    peers = PeerPaths(tmp_path / "peer-routes")
    cluster = LocalCluster(tmp_path / "cluster", zookeeper_route=routes.route, peer_routes_file=peers.routes_file)
    cluster.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=0, service_args={"partition_svc": SESSION})
    peers.connect(cluster.state.services)
    raw = Raw(cluster)
    yield cluster, routes, peers, raw
    raw.close()
    peers.heal()
    routes.heal()
    cluster.down(grace_s=5)
    peers.close()
    routes.close()


def replicated_topic(cluster: LocalCluster, peers: PeerPaths, raw: Raw):
    """A new topic (3 replicas, min.insync.replicas 2) in sync, its leader's process name and its followers',
    once both followers fetch through the test's proxies (the routes files are read within a second)."""
    topic = f"cut-{uuid.uuid4().hex[:8]}"
    raw.create_topic(topic, 1, **{"min.insync.replicas": "2"})
    wait_until(lambda: len(partition_zero(raw, topic).isr) == 3, 60, "every replica in sync")
    meta = partition_zero(raw, topic)
    leader = next(n for n, p in cluster.state.services.items() if p.address == meta.leader_address)
    followers = [n for n, p in cluster.state.services.items() if p.kind == "partition_svc" and n != leader]
    wait_until(lambda: all(peers.proxies[(f, leader)].accepted for f in followers), 60,
               "the followers fetching through the proxies")
    return topic, meta, leader, followers


def healed_and_read(raw: Raw, topic: str) -> list[bytes]:
    wait_until(lambda: len(partition_zero(raw, topic).isr) == 3, 90, "every replica back in sync")
    return [r.value for r in raw.read_all(topic, 0)]


def test_a_leader_cut_off_from_its_peers_keeps_leading_and_refuses_what_only_it_would_hold(cut_able):
    cluster, _, peers, raw = cut_able
    topic, old, leader, followers = replicated_topic(cluster, peers, raw)
    before = first_acknowledged(raw, old.leader_address, topic, "before")  # a loaded machine may need more than one

    peers.cut({leader})
    wait_until(lambda: list(partition_zero(raw, topic, old.leader_address).isr) == [old.leader_id], 60,
               "the leader, alone, dropping its followers from the ISR")
    assert produce(raw, old.leader_address, topic, b"alone") == "NOT_ENOUGH_REPLICAS"
    assert health(old.leader_address) == health_pb2.HealthCheckResponse.SERVING  # ZooKeeper still reaches it
    for name in (leader, *followers):  # its session lives: no instance sees another leader or a new epoch
        seen = partition_zero(raw, topic, cluster.state.services[name].address)
        assert (seen.leader_id, seen.leader_epoch) == (old.leader_id, old.leader_epoch), (name, seen)

    peers.heal()
    wait_until(lambda: produce(raw, old.leader_address, topic, b"after") == "NONE", 60,
               "the leader acknowledging again once a follower is back")
    values = healed_and_read(raw, topic)
    assert values.count(before) == 1 and b"alone" not in values and b"after" in values, values


def test_a_leader_on_a_minority_side_is_replaced_and_acknowledges_nothing(cut_able):
    cluster, routes, peers, raw = cut_able
    topic, old, leader, followers = replicated_topic(cluster, peers, raw)
    before = first_acknowledged(raw, old.leader_address, topic, "before")  # a loaded machine may need more than one

    peers.cut({leader})
    routes.cut(leader)

    new = elected_instead(raw, topic, old, cluster.state.services[followers[0]].address)
    assert new.leader_epoch > old.leader_epoch
    acknowledged = first_acknowledged(raw, new.leader_address, topic, "majority")
    for attempt in range(3):
        answer = produce(raw, old.leader_address, topic, f"minority-{attempt}".encode())
        assert answer != "NONE", "the leader cut off on the minority side acknowledged an acks=all write"

    peers.heal()
    routes.heal(leader)
    wait_until(lambda: health(old.leader_address) == health_pb2.HealthCheckResponse.SERVING, 60, "the instance back")
    values = healed_and_read(raw, topic)
    assert values.count(before) == 1 and values.count(acknowledged) == 1, values
    assert not any(v.startswith(b"minority-") for v in values), values
