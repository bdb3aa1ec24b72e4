"""The topic registry's ZooKeeper writes when another instance acts between two
of them (a real ZooKeeper; the interleaving is forced, not hoped for)."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooClient

from partition_svc.topics import TopicRegistry
from services.cluster import LocalCluster


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
