"""WatchedStates, the controller's memory of topic nodes and partition
states: which a pass reads again (marked by a watch, never read, everything
after a dropped connection or an election, its sweep slot), and that a
mark set while a pass reads is kept for the next one."""

from __future__ import annotations

from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

from partition_svc.controller import WatchedStates
from partition_svc.election import LeaderAndIsr
from partition_svc.topics import TopicInfo

BASE = "/txlog/topics"
NEVER = 1_000_000  # sweep passes: no sweep in these tests unless asked for


def changed(path: str | None, kind: str = EventType.CHANGED) -> WatchedEvent:
    return WatchedEvent(kind, KeeperState.CONNECTED, path)


def state(mzxid: int, version: int = 0) -> LeaderAndIsr:
    return LeaderAndIsr(1, 0, (1,), 0, version, mzxid)


def kept(partitions: int = 3, sweep_passes: int = NEVER) -> WatchedStates:
    """Topic t of ``partitions`` partitions, every node read once, no mark left."""
    cache = WatchedStates(BASE, sweep_passes)
    cache.take()
    cache.took_topic("t", (TopicInfo("t", partitions, {}, ((1,),) * partitions, False), 0))
    for index in range(partitions):
        cache.took_state(("t", index), state(mzxid=100 + index))
    return cache


def due_states(cache: WatchedStates, partitions: int = 3) -> list[int]:
    rereads = cache.take()
    return [index for index in range(partitions) if cache.state_due(rereads, ("t", index))]


def test_a_new_cache_reads_everything():
    cache = WatchedStates(BASE, NEVER)
    rereads = cache.take()
    assert rereads.everything
    assert not cache.take().everything, "taken once"


def test_nothing_is_read_again_without_a_mark():
    cache = kept()
    rereads = cache.take()
    assert not cache.topic_due(rereads, "t")
    assert due_states(cache) == []


def test_a_fired_state_watch_marks_only_its_partition():
    cache = kept()
    cache.state_changed(changed(f"{BASE}/t/partitions/2/state"))
    assert due_states(cache) == [2]
    assert due_states(cache) == [], "a mark is taken once"


def test_a_fired_topic_watch_marks_the_topic_not_its_states():
    cache = kept()
    cache.topic_changed(changed(f"{BASE}/t", EventType.DELETED))
    rereads = cache.take()
    assert cache.topic_due(rereads, "t")
    assert [i for i in range(3) if cache.state_due(rereads, ("t", i))] == []


def test_a_watch_reset_or_a_connection_change_marks_everything():
    for mark in (lambda c: c.state_changed(changed(None, EventType.NONE)),  # kazoo drops every watcher so when the connection drops
                 lambda c: c.topic_changed(changed(None, EventType.NONE)),
                 lambda c: c.connection_changed(False),
                 lambda c: c.connection_changed(True),
                 lambda c: c.state_changed(changed(f"{BASE}/t/partitions/x/state")),  # not a state path: no guessing
                 lambda c: c.clear()):
        cache = kept()
        mark(cache)
        assert cache.take().everything


def test_a_mark_set_during_a_pass_is_kept_for_the_next():
    cache = kept()
    cache.state_changed(changed(f"{BASE}/t/partitions/0/state"))
    rereads = cache.take()  # the pass begins: marks taken before its reads
    cache.state_changed(changed(f"{BASE}/t/partitions/0/state"))  # changed again while the pass reads it
    assert cache.state_due(rereads, ("t", 0))
    assert due_states(cache) == [0]


def test_a_pass_that_fails_gives_its_marks_back():
    cache = kept()
    cache.state_changed(changed(f"{BASE}/t/partitions/1/state"))
    cache.connection_changed(False)
    cache.give_back(cache.take())
    rereads = cache.take()
    assert rereads.everything and ("t", 1) in rereads.states


def test_a_partition_never_read_is_due():
    cache = kept(partitions=2)
    cache.took_topic("t", (TopicInfo("t", 3, {}, ((1,),) * 3, False), 1))  # CreatePartitions grew it
    assert due_states(cache) == [2]


def test_only_a_write_by_another_counts_as_moved():
    cache = kept()
    assert not cache.took_state(("t", 0), state(mzxid=100)), "read again as written here (its watch fired for that write)"
    assert cache.took_state(("t", 0), state(mzxid=200, version=1)), "another wrote it"
    assert not cache.took_state(("t", 9), state(mzxid=300)), "never read: new, not moved"
    assert not cache.took_state(("t", 0), None) and ("t", 0) not in cache.states


def test_topics_no_longer_listed_are_forgotten_with_their_states():
    cache = kept()
    cache.took_topic("u", (TopicInfo("u", 1, {}, ((1,),), False), 0))
    cache.took_state(("u", 0), state(mzxid=7))
    cache.retain(["u"])
    assert set(cache.topics) == {"u"} and set(cache.states) == {("u", 0)}
    cache.took_topic("u", None)  # gone when read
    assert cache.topics == {} and cache.states == {}


def test_the_sweep_reads_each_node_once_within_its_passes_spread_evenly():
    partitions, sweep = 1_000, 10
    cache = kept(partitions, sweep)
    seen: list[int] = []
    topic_reads = 0
    for _ in range(sweep):
        rereads = cache.take()
        due = [i for i in range(partitions) if cache.state_due(rereads, ("t", i))]
        assert len(due) == partitions // sweep
        seen += due
        topic_reads += cache.topic_due(rereads, "t")
    assert sorted(seen) == list(range(partitions))
    assert topic_reads == 1
