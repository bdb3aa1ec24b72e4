"""The topic registry's ZooKeeper writes when another instance acts between two
of them (a real ZooKeeper; the interleaving is forced, not hoped for)."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooClient

from partition_svc.topics import TopicRegistry
from services.tooling.cluster import LocalCluster, zookeeper_counters


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("topic-registry") / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local.state.zookeeper
    local.down(grace_s=5)


class ControllerFinishesFirst(KazooClient):
    """A session whose first ``set`` of ``path`` comes just after the
    controller (another session) finished that reassignment and deleted its
    node: the interleaving the hostile fuzzer hit by chance."""

    def __init__(self, hosts: str, path: str, controller: KazooClient):
        super().__init__(hosts=hosts)
        self.path, self.controller, self.raced = path, controller, False

    def set_async(self, path, value, version=-1):
        if path == self.path and not self.raced:
            self.raced = True
            self.controller.delete(path)
        return super().set_async(path, value, version)


def test_a_reassignment_requested_while_the_previous_one_completes_is_recorded(zookeeper):
    root = "/topic-registry-race"
    controller = KazooClient(hosts=zookeeper)
    controller.start(timeout=30)
    path = f"{root}/reassignments/t/0"
    requester = ControllerFinishesFirst(zookeeper, path, controller)
    requester.start(timeout=30)
    try:
        controller.create(path, b'{"target": [1]}', makepath=True)
        registry = TopicRegistry(requester, root)

        asyncio.run(registry.request_reassignment("t", 0, (0, 2)))

        assert requester.raced
        assert asyncio.run(registry.reassignments()) == {("t", 0): (0, 2)}
    finally:
        requester.stop()
        requester.close()
        controller.delete(root, recursive=True)
        controller.stop()
        controller.close()


def test_an_unknown_topic_is_asked_of_zookeeper_once_until_it_is_created(zookeeper):
    from services.coordination import zk
    from txlog.two_phase import wait_until

    root = "/topic-registry-absent"
    reader, writer = zk.connect(zookeeper), zk.connect(zookeeper)
    try:
        registry = TopicRegistry(reader, root)
        assert asyncio.run(registry.get("later")) is None
        before = zookeeper_counters(zookeeper)["zk_packets_received"]
        for _ in range(200):
            assert asyncio.run(registry.get("later")) is None
        assert zookeeper_counters(zookeeper)["zk_packets_received"] - before < 20, "unknown names answered from memory"
        writer.create(f"{root}/topics/later", b'{"partitions": 1, "configs": {}, "replicas": [[0]], "internal": false}',
                      makepath=True)
        wait_until(lambda: asyncio.run(registry.get("later")) is not None, 30, "the topic created elsewhere seen")
        assert asyncio.run(registry.get("later")).partition_count == 1
    finally:
        for client in (reader, writer):
            client.stop()
            client.close()
        cleanup = zk.connect(zookeeper)
        cleanup.delete(root, recursive=True)
        cleanup.stop()
        cleanup.close()


def test_the_names_remembered_absent_are_bounded_oldest_first(zookeeper, monkeypatch):
    from partition_svc import topics
    from services.coordination import zk

    monkeypatch.setattr(topics, "ABSENT_NAMES_MAX", 3)
    client = zk.connect(zookeeper)
    try:
        registry = TopicRegistry(client, "/topic-registry-bounded")
        for name in ("a", "b", "c", "d", "e"):
            assert asyncio.run(registry.get(name)) is None
        assert list(registry._absent) == ["c", "d", "e"]
    finally:
        client.stop()
        client.close()
