"""The live-instance lists services read (ServiceRegistry.live) against a real
ZooKeeper: served from memory between changes, yet every change (an instance
coming, going, registering again with another address) seen through watches."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest
from kazoo.client import KazooState

from services.coordination import zk
from services.tooling.cluster import LocalCluster, zookeeper_counters
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.two_phase import wait_until

ROOT = "/live-instances"


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("live-instances") / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local.state.zookeeper
    local.down(grace_s=5)


@pytest.fixture
def sessions(zookeeper):
    made = []

    def session():
        client = zk.connect(zookeeper)
        made.append(client)
        return client

    yield session
    for client in made:
        client.stop()
        client.close()


def test_instances_coming_going_and_moving_are_seen(sessions):
    reader = zk.ServiceRegistry(sessions(), ROOT)
    assert reader.live("kind") == {}  # the folder does not exist yet
    first = zk.ServiceRegistry(sessions(), ROOT)
    first.register("kind", 1, "10.0.0.1:1")
    wait_until(lambda: reader.live("kind") == {1: "10.0.0.1:1"}, 30, "the first instance seen")
    second_session = sessions()
    zk.ServiceRegistry(second_session, ROOT).register("kind", 2, "10.0.0.2:2")
    wait_until(lambda: reader.live("kind") == {1: "10.0.0.1:1", 2: "10.0.0.2:2"}, 30, "the second instance seen")
    first.register("kind", 1, "10.0.0.9:9")  # registered again elsewhere: same child name, new data
    wait_until(lambda: reader.live("kind")[1] == "10.0.0.9:9", 30, "the new address seen")
    second_session.stop()  # its session ends: the ephemeral node goes
    wait_until(lambda: reader.live("kind") == {1: "10.0.0.9:9"}, 30, "the second instance gone")


def test_between_changes_the_list_is_served_without_asking_zookeeper(zookeeper, sessions):
    zk.ServiceRegistry(sessions(), ROOT + "-quiet").register("kind", 1, "10.0.0.1:1")
    reader = zk.ServiceRegistry(sessions(), ROOT + "-quiet")
    assert reader.live("kind") == {1: "10.0.0.1:1"}
    before = zookeeper_counters(zookeeper)["zk_packets_received"]
    for _ in range(300):
        assert reader.live("kind") == {1: "10.0.0.1:1"}
    # Uncached, each call would be 2 requests (the children, the one instance): 600. Pings of the
    # test's sessions and the mntr connection itself are the few that remain.
    assert zookeeper_counters(zookeeper)["zk_packets_received"] - before < 30


def test_a_connection_problem_makes_the_next_read_ask_zookeeper_again(sessions):
    owner = zk.ServiceRegistry(sessions(), ROOT + "-blip")
    owner.register("kind", 1, "10.0.0.1:1")
    reader_session = sessions()
    reader = zk.ServiceRegistry(reader_session, ROOT + "-blip")
    assert reader.live("kind") == {1: "10.0.0.1:1"}
    view = reader._live["kind"]
    assert not view.stale
    reader._on_state(KazooState.SUSPENDED)  # what kazoo tells its listeners when the connection drops
    assert view.stale
    assert reader.live("kind") == {1: "10.0.0.1:1"} and not view.stale


def test_a_watched_node_follows_creation_change_and_deletion_and_otherwise_asks_nothing(zookeeper, sessions):
    import asyncio

    writer, reader = sessions(), sessions()
    node = zk.WatchedNode(reader, ROOT + "-node/owner")

    def seen():
        value = asyncio.run(node.get())
        return None if value is None else value[0]

    assert seen() is None
    writer.create(ROOT + "-node/owner", b"one", makepath=True)
    wait_until(lambda: seen() == b"one", 30, "the creation seen")
    writer.set(ROOT + "-node/owner", b"two")
    wait_until(lambda: seen() == b"two", 30, "the change seen")
    before = zookeeper_counters(zookeeper)["zk_packets_received"]
    for _ in range(300):
        assert seen() == b"two"
    assert zookeeper_counters(zookeeper)["zk_packets_received"] - before < 30
    assert asyncio.run(node.get(fresh=True))[0] == b"two"
    writer.delete(ROOT + "-node/owner")
    wait_until(lambda: seen() is None, 30, "the deletion seen")


def test_callers_during_a_read_wait_for_it_instead_of_taking_the_value_before_it(sessions):
    import asyncio

    writer, reader = sessions(), sessions()
    writer.create(ROOT + "-concurrent/owner", b"one", makepath=True)
    node = zk.WatchedNode(reader, ROOT + "-concurrent/owner")

    async def both():
        return await asyncio.gather(node.get(), node.get(), node.get())

    assert [value[0] for value in asyncio.run(both())] == [b"one"] * 3
    writer.set(ROOT + "-concurrent/owner", b"two")
    wait_until(lambda: node.stale, 30, "the change's watch")
    assert [value[0] for value in asyncio.run(both())] == [b"two"] * 3


def test_a_read_zookeeper_does_not_answer_gives_up_at_its_deadline_instead_of_waiting_for_ever(tmp_path, monkeypatch):
    """kazoo drops the requests still queued when a session expires, without a
    word to their waiters: every wait for an answer is bounded (zk.REPLY_TIMEOUT_S),
    or a reader would hold its thread and the view's lock for ever. Here the
    answer never comes because ZooKeeper is stopped (SIGSTOP) under a session
    long enough that kazoo itself would wait 40 s before it gave up."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    client = zk.connect(local.state.zookeeper, session_timeout_s=60)
    try:
        zk.ServiceRegistry(client, ROOT + "-stopped").register("kind", 1, "10.0.0.1:1")
        monkeypatch.setattr(zk, "REPLY_TIMEOUT_S", 1.0)
        local.kill("zookeeper", signal.SIGSTOP)
        try:
            outcomes: list[BaseException | dict] = []

            def read() -> None:
                try:
                    outcomes.append(zk.ServiceRegistry(client, ROOT + "-stopped").live("kind"))
                except BaseException as exc:  # what the caller would get
                    outcomes.append(exc)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout=10)  # kazoo's own ping timeout would be 40 s
            assert not reader.is_alive(), "the read still waits for ZooKeeper"
            assert isinstance(outcomes[0], TxlogError) and outcomes[0].code == ErrorCode.Value("ZOOKEEPER_UNAVAILABLE"), outcomes
            with pytest.raises(TxlogError) as awaited:
                asyncio.run(zk.call(client, "get", ROOT + "-stopped"))
            assert awaited.value.code == ErrorCode.Value("ZOOKEEPER_UNAVAILABLE")
        finally:
            local.kill("zookeeper", signal.SIGCONT)
        wait_until(lambda: zk.ServiceRegistry(client, ROOT + "-stopped").live("kind") == {1: "10.0.0.1:1"}, 60,
                   "read again once ZooKeeper answers")
    finally:
        client.stop()
        client.close()
        local.down(grace_s=5)
