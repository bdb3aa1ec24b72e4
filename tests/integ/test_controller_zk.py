"""The controller's batched partition-state writes against a real ZooKeeper:
chunks of STATE_WRITES_PER_TRANSACTION, each write still conditional on the
version it was decided on and on the controller epoch, a state moved by
someone else in the middle of a chunk left to the next decision, and a
leader's own ISR change announced to every instance (the interleavings are
forced, not hoped for)."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.serialization import Transaction

from partition_svc import controller as controller_mod
from partition_svc.controller import Controller
from partition_svc.election import LeaderAndIsr
from partition_svc.topics import TopicInfo, TopicRegistry
from services.cluster import LocalCluster

PARTITIONS = 2 * controller_mod.STATE_WRITES_PER_TRANSACTION + 50  # three chunks, the last one short
KIND = "partition_svc"
roots = itertools.count()


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("controller-zk") / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local.state.zookeeper
    local.down(grace_s=5)


def brief(state: LeaderAndIsr) -> tuple:
    return state.leader, state.leader_epoch, state.isr


def full(state: LeaderAndIsr) -> tuple:
    return state.leader, state.leader_epoch, state.isr, state.controller_epoch


class CountingClient(KazooClient):
    """A real session that counts the transactions it sends and, once, lets
    ``before_first_transaction`` act (another session's write) just before
    its first transaction goes out."""

    def __init__(self, hosts: str):
        super().__init__(hosts=hosts)
        self.transactions_sent = 0
        self.before_first_transaction = None

    def _call(self, request, async_object):
        if isinstance(request, Transaction):
            self.transactions_sent += 1
            if self.before_first_transaction is not None:
                act, self.before_first_transaction = self.before_first_transaction, None
                act()
        return super()._call(request, async_object)


class Setup:
    """A topic of PARTITIONS partitions on replicas (0, 1), all led by node 0
    as created; then only node 1 registers (after the states were written:
    restarted), so the controller moves every partition to node 1."""

    def __init__(self, zookeeper: str):
        self.root = f"/controller-zk-{next(roots)}"
        self.other = KazooClient(hosts=zookeeper)  # another instance: a leader writing its ISR, a registration
        self.other.start(timeout=30)
        self.client = CountingClient(zookeeper)
        self.client.start(timeout=30)
        self.topics = TopicRegistry(self.client, self.root)
        self.announced: list[tuple[int, list[tuple[str, int, LeaderAndIsr]], set[int]]] = []

        async def announce(epoch, addresses, changed, newcomers, everything):
            self.announced.append((epoch, [(info.name, index, state) for info, index, state in changed], set(newcomers)))

        self.controller = Controller(self.client, self.root, 0, KIND, self.topics, announce)
        info = TopicInfo("t", PARTITIONS, {}, tuple((0, 1) for _ in range(PARTITIONS)), False)
        asyncio.run(self.topics.create(info, 0))
        self.other.create(f"{self.root}/services/{KIND}/1", json.dumps({"node_id": 1, "address": "127.0.0.1:1"}).encode(),
                          ephemeral=True, makepath=True)
        self.client.transactions_sent = 0  # the topic's creation was one

    def state(self, index: int) -> LeaderAndIsr:
        return self.state_of("t", index)

    def state_of(self, topic: str, index: int) -> LeaderAndIsr:
        data, stat = self.other.get(self.topics.state_path(topic, index))
        return LeaderAndIsr.decode(data, stat.version, stat.mzxid)

    def run_pass(self) -> None:
        async def run() -> None:
            if not self.controller.active:
                await self.controller._try_to_become_controller()
            self.controller._wake.clear()
            await self.controller.run_pass()
        asyncio.run(run())

    def close(self) -> None:
        self.other.delete(self.root, recursive=True)
        for client in (self.client, self.other):
            client.stop()
            client.close()


@pytest.fixture
def setup(zookeeper):
    made = Setup(zookeeper)
    yield made
    made.close()


def test_a_pass_writes_every_decided_state_in_chunks_each_conditional_on_its_version(setup):
    setup.run_pass()

    chunks = -(-PARTITIONS // controller_mod.STATE_WRITES_PER_TRANSACTION)
    assert setup.client.transactions_sent == chunks, "one ZooKeeper transaction per chunk, not one per partition"
    epoch = setup.controller.epoch
    for index in range(PARTITIONS):
        assert full(setup.state(index)) == (1, 2, (1,), epoch), index
    (announced_epoch, changed, newcomers), = setup.announced
    assert announced_epoch == epoch and newcomers == {1}
    assert [(name, index) for name, index, _ in changed] == [("t", i) for i in range(PARTITIONS)]
    for _, index, state in changed:  # what the replicas are told is what ZooKeeper holds, version and zxid included
        assert state == setup.state(index)
    assert not setup.controller._wake.is_set()


def test_a_state_moved_by_a_leader_mid_chunk_is_not_overwritten_and_is_decided_again(setup):
    moved = controller_mod.STATE_WRITES_PER_TRANSACTION // 2 + 3  # in the middle of the first chunk
    path = setup.topics.state_path("t", moved)
    leaders_write = LeaderAndIsr(0, 0, (0,), 0)  # node 0 shrinking its ISR, on the version the controller read
    setup.client.before_first_transaction = lambda: setup.other.set(path, leaders_write.encode(), version=0)

    setup.run_pass()

    assert full(setup.state(moved)) == (0, 0, (0,), 0), "the controller's write was decided on a stale version"
    for index in set(range(PARTITIONS)) - {moved}:
        assert brief(setup.state(index)) == (1, 2, (1,)), index
    assert setup.controller._wake.is_set(), "the partition that moved is decided again at once"
    assert moved not in [index for _, index, _ in setup.announced[0][1]]

    setup.run_pass()  # decided again, on what the leader wrote: node 0 gone, node 1 outside the ISR, so offline

    assert full(setup.state(moved)) == (-1, 1, (0,), setup.controller.epoch)
    assert setup.state(moved).zk_version == 2


def test_a_deposed_controller_writes_no_state(setup):
    setup.run_pass()
    before = [setup.state(i) for i in range(PARTITIONS)]
    setup.other.delete(f"{setup.root}/services/{KIND}/1")  # node 1 gone: every partition would go offline
    data, _ = setup.other.get(f"{setup.root}/controller_epoch")
    setup.other.set(f"{setup.root}/controller_epoch", str(int(data) + 1).encode())  # another controller's epoch

    setup.run_pass()

    assert [setup.state(i) for i in range(PARTITIONS)] == before


def test_a_leaders_isr_change_reaches_every_instance_with_the_next_pass(setup):
    led_by_1 = TopicInfo("u", 1, {}, ((1, 0),), False)  # node 1 is its preferred leader: letting node 0 in moves nothing
    asyncio.run(setup.topics.create(led_by_1, 0))
    setup.run_pass()  # node 0 not live: it leaves u's ISR
    setup.other.create(f"{setup.root}/services/{KIND}/0", json.dumps({"node_id": 0, "address": "127.0.0.1:2"}).encode(),
                       ephemeral=True)
    setup.run_pass()  # node 0 registers: it gets every state
    written = setup.state_of("u", 0)
    assert brief(written) == (1, 0, (1,))
    setup.announced.clear()
    grown = LeaderAndIsr(1, 0, (1, 0), written.controller_epoch)
    setup.other.set(setup.topics.state_path("u", 0), grown.encode(), version=written.zk_version)  # leader 1 lets node 0 in

    setup.run_pass()

    (_, changed, newcomers), = setup.announced
    assert newcomers == set()
    assert [(name, index, brief(state)) for name, index, state in changed] == [("u", 0, (1, 0, (1, 0)))]
    assert changed[0][2].zk_version == written.zk_version + 1
