"""The controller's batched partition-state writes against a real ZooKeeper:
chunks of STATE_WRITES_PER_TRANSACTION, each write still conditional on the
version it was decided on and on the controller epoch, a state moved by
someone else in the middle of a chunk left to the next decision, and a
leader's own ISR change announced to every instance (the interleavings are
forced, not hoped for). And its states kept in memory: an idle pass reads
none, a state another writes is read alone (its watch) and announced, a
dropped connection or a new election reads every one again, and the sweep
reads each within its passes. And nothing taken is left unannounced: a pass
that fails after writing or reading a change announces it with the next
pass, and an instance the announce failed to tell gets every state then."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.protocol.serialization import GetData, Transaction

from partition_svc import controller as controller_mod
from partition_svc.controller import Controller
from partition_svc.election import LeaderAndIsr
from partition_svc.topics import TopicInfo, TopicRegistry
from services.tooling.cluster import LocalCluster
from txlog.two_phase import wait_until

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
    """A real session that counts the transactions it sends and the nodes it
    reads, and, once, lets ``before_first_transaction`` act (another
    session's write) just before its first transaction goes out."""

    def __init__(self, hosts: str):
        super().__init__(hosts=hosts)
        self.transactions_sent = 0
        self.reads: list[str] = []  # the path of every GetData sent
        self.requests_sent = 0
        self.before_first_transaction = None

    def _call(self, request, async_object):
        self.requests_sent += 1
        if isinstance(request, GetData):
            self.reads.append(request.path)
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

    def __init__(self, zookeeper: str, **controller_options):
        self.root = f"/controller-zk-{next(roots)}"
        self.other = KazooClient(hosts=zookeeper)  # another instance: a leader writing its ISR, a registration
        self.other.start(timeout=30)
        self.client = CountingClient(zookeeper)
        self.client.start(timeout=30)
        self.topics = TopicRegistry(self.client, self.root)
        self.announced: list[tuple[int, list[tuple[str, int, LeaderAndIsr]], set[int]]] = []

        async def announce(epoch, addresses, changed, newcomers, everything):
            self.announced.append((epoch, [(info.name, index, state) for info, index, state in changed], set(newcomers)))

        self.controller = Controller(self.client, self.root, 0, KIND, self.topics, announce, **controller_options)
        info = TopicInfo("t", PARTITIONS, {}, tuple((0, 1) for _ in range(PARTITIONS)), False)
        asyncio.run(self.topics.create(info, 0))
        self.other.create(f"{self.root}/services/{KIND}/1", json.dumps({"node_id": 1, "address": "127.0.0.1:1"}).encode(),
                          ephemeral=True, makepath=True)
        self.client.transactions_sent = 0  # the topic's creation was one

    def state_reads(self) -> list[str]:
        """The state nodes the controller read since the last call."""
        reads, self.client.reads = self.client.reads, []
        return [path for path in reads if path.endswith("/state")]

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
    # as a leader writes it: the follower it lets in recorded with the storage its fetches said (0: unmarked)
    grown = LeaderAndIsr(1, 0, (1, 0), written.controller_epoch, isr_storage=written.isr_storage).with_storage({0: 0})
    setup.other.set(setup.topics.state_path("u", 0), grown.encode(), version=written.zk_version)  # leader 1 lets node 0 in

    setup.run_pass()

    (_, changed, newcomers), = setup.announced
    assert newcomers == set()
    assert [(name, index, brief(state)) for name, index, state in changed] == [("u", 0, (1, 0, (1, 0)))]
    assert changed[0][2].zk_version == written.zk_version + 1


@pytest.fixture
def kept(zookeeper):
    """A Setup whose controller never sweeps (every read below is one a watch, a new node or a dropped connection asked for),
    past its first two passes: every partition moved to node 1, then each state it wrote read once (its watch fired)."""
    made = Setup(zookeeper, sweep_passes=1_000_000)
    made.run_pass()
    assert len(made.state_reads()) == PARTITIONS, "a new controller reads every state"
    made.run_pass()
    assert len(made.state_reads()) == PARTITIONS, "each state it wrote once more: its watch fired for that write"
    assert len(made.announced) == 1, "its own writes are not announced again"
    made.announced.clear()
    yield made
    made.close()


def test_an_idle_controller_reads_no_partition_state(kept):
    requests_before = kept.client.requests_sent

    for _ in range(3):
        kept.run_pass()

    assert kept.state_reads() == []
    per_pass = (kept.client.requests_sent - requests_before) / 3
    # the controller node, the deletion marks, the live instances (list, one node), the topics, the reassignments
    assert per_pass <= 8, f"{per_pass} ZooKeeper requests a pass with {PARTITIONS} partitions kept"
    assert kept.announced == []


def test_a_state_another_writes_is_read_alone_and_announced_with_the_next_pass(kept):
    written = kept.state(7)
    shrunk = LeaderAndIsr(1, written.leader_epoch, (1,), written.controller_epoch)
    kept.other.set(kept.topics.state_path("t", 7), shrunk.encode(), version=written.zk_version)  # leader 1 writes its ISR

    kept.run_pass()

    assert kept.state_reads() == [kept.topics.state_path("t", 7)]
    (_, changed, newcomers), = kept.announced
    assert newcomers == set()
    assert [(name, index) for name, index, _ in changed] == [("t", 7)]
    assert changed[0][2] == kept.state(7), "announced as ZooKeeper holds it, version and zxid included"
    assert kept.controller.cache.states[("t", 7)] == kept.state(7)


def test_a_running_controller_announces_a_leaders_isr_change_within_its_pass_interval(zookeeper):
    made = Setup(zookeeper, pass_interval_ms=200, sweep_passes=1_000_000)
    stop = threading.Event()

    def run() -> None:
        async def until_stopped() -> None:
            task = asyncio.ensure_future(made.controller.run_forever())
            await asyncio.to_thread(stop.wait)
            task.cancel()
        asyncio.run(until_stopped())

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: made.controller.active and made.announced and made.state(0).leader == 1, 30, "the moves written")
        written = made.state(PARTITIONS - 1)
        grown = LeaderAndIsr(1, written.leader_epoch, (1, 0), written.controller_epoch)  # node 0 is not live; no matter
        made.other.set(made.topics.state_path("t", PARTITIONS - 1), grown.encode(), version=written.zk_version)

        wait_until(lambda: any(("t", PARTITIONS - 1, made.state(PARTITIONS - 1)) in [(n, i, s) for n, i, s in changed]
                               for _, changed, _ in made.announced), 10, "the leader's ISR change announced")
    finally:
        stop.set()
        runner.join(timeout=30)
        made.close()


def test_a_dropped_connection_reads_every_state_again_and_misses_no_change(kept):
    written = kept.state(3)
    dropped = threading.Event()
    kept.client.add_listener(lambda state: dropped.set() if state != KazooState.CONNECTED else None)
    kept.client._connection._socket.shutdown(socket.SHUT_RDWR)  # the server and the session stay; kazoo drops every watch
    wait_until(lambda: dropped.is_set() and kept.client.state == KazooState.CONNECTED, 30, "the connection dropped and back")
    # a leader's write while the controller's watches are gone: only a full read can see it
    kept.other.set(kept.topics.state_path("t", 3), LeaderAndIsr(1, written.leader_epoch, (1,), 0, isr_storage=written.isr_storage).encode(),
                   version=written.zk_version)

    kept.run_pass()

    assert len(kept.state_reads()) == PARTITIONS
    (_, changed, _), = kept.announced
    assert [(name, index) for name, index, _ in changed] == [("t", 3)]
    kept.announced.clear()
    kept.run_pass()
    assert kept.state_reads() == [], "the watches are set again"


def test_a_controller_elected_again_reads_every_state_again(kept):
    kept.other.delete(f"{kept.root}/controller")  # its node gone (its session expired, say): it is deposed at its next pass
    kept.run_pass()
    assert not kept.controller.active and kept.controller.cache.states == {}

    kept.run_pass()

    assert kept.controller.active
    assert len(kept.state_reads()) == PARTITIONS


def test_the_sweep_reads_every_state_once_within_its_passes(zookeeper):
    sweep = 5
    made = Setup(zookeeper, sweep_passes=sweep)
    try:
        made.run_pass()
        made.run_pass()  # the states it wrote, once (their watches fired)
        made.state_reads()
        per_pass = []
        for _ in range(sweep):
            made.run_pass()
            per_pass.append(made.state_reads())
        swept = [path for reads in per_pass for path in reads]
        assert sorted(swept) == sorted(made.topics.state_path("t", i) for i in range(PARTITIONS)), "each once"
        assert max(len(reads) for reads in per_pass) <= 2 * PARTITIONS // sweep, "spread over the passes"
    finally:
        made.close()


def test_states_written_in_a_pass_whose_announce_raised_are_announced_with_the_next_pass(setup):
    recording = setup.controller.announce

    async def unreachable(*_):
        setup.controller.announce = recording
        raise RuntimeError("the announce failed")

    setup.controller.announce = unreachable
    with pytest.raises(RuntimeError):
        setup.run_pass()
    assert all(setup.state(index).leader == 1 for index in range(PARTITIONS)), "the moves were written"
    assert setup.announced == []

    setup.run_pass()  # decides nothing new: every state is as wanted, as kept in memory

    (_, changed, newcomers), = setup.announced
    assert newcomers == {1}, "not told in the failed pass: still new"
    assert sorted(index for _, index, _ in changed) == list(range(PARTITIONS))
    for _, index, state in changed:
        assert state == setup.state(index)
    setup.announced.clear()
    setup.run_pass()
    assert setup.announced == [], "announced once"


def test_a_state_another_wrote_is_announced_after_a_pass_that_failed_once_it_had_read_it(kept):
    written = kept.state(7)
    kept.other.set(kept.topics.state_path("t", 7), LeaderAndIsr(1, written.leader_epoch, (1,), 0).encode(),
                   version=written.zk_version)  # leader 1 writes its ISR
    reassignments = kept.topics.reassignments

    async def unreadable():
        kept.topics.reassignments = reassignments
        raise RuntimeError("ZooKeeper out of reach")

    kept.topics.reassignments = unreadable  # after the pass read state 7 again (its watch), before it announced it
    with pytest.raises(RuntimeError):
        kept.run_pass()
    assert kept.controller.cache.states[("t", 7)] == kept.state(7), "the pass took the change"

    kept.run_pass()

    (_, changed, newcomers), = kept.announced
    assert newcomers == set()
    assert [(name, index, state) for name, index, state in changed] == [("t", 7, kept.state(7))]


def test_an_instance_the_announce_failed_to_tell_gets_every_state_with_the_next_pass(setup):
    calls: list[tuple[set[int], int, list]] = []  # (newcomers, states in everything, changed)
    untold = [{1}]

    async def announce(epoch, addresses, changed, newcomers, everything):
        calls.append((set(newcomers), len(everything), [(info.name, index) for info, index, _ in changed]))
        return untold.pop() if untold else set()

    setup.controller.announce = announce
    setup.run_pass()  # moves every partition to node 1, and fails to tell node 1
    assert calls == [({1}, PARTITIONS, [("t", i) for i in range(PARTITIONS)])]

    setup.run_pass()

    assert calls[1] == ({1}, PARTITIONS, []), "node 1 new again: told every state"
    setup.run_pass()
    assert len(calls) == 2, "told: nothing more to announce"
