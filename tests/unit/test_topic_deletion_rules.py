"""Topic deletion's rules (partition_svc/topic_deletion.py), the registry's
view of deletion marks, and the wipe of a deleted topic's partition on a
real RocksDB store: every key of it goes, every key of its neighbours stays."""

from __future__ import annotations

import asyncio

import pytest

from partition_svc import topic_deletion, validation
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition
from partition_svc.producer_state import Reject
from partition_svc.topics import TopicInfo, TopicRegistry
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000


def topic(replicas) -> TopicInfo:
    return TopicInfo("t", len(replicas), {}, tuple(tuple(r) for r in replicas), False)


@pytest.mark.parametrize(("requested_ms", "wanted_ms"), [
    (0, topic_deletion.DELETE_TOPICS_TIMEOUT_MS_DEFAULT),
    (1, 1),
    (45_000, 45_000),
    (2**31 - 1, topic_deletion.DELETE_TOPICS_TIMEOUT_MS_MAX),
])
def test_the_wait_is_the_default_for_zero_and_cut_at_the_limit(requested_ms, wanted_ms):
    assert topic_deletion.timeout_ms_of(requested_ms) == wanted_ms


def test_a_negative_wait_is_an_invalid_request():
    with pytest.raises(TxlogError) as refused:
        topic_deletion.timeout_ms_of(-1)
    assert refused.value.code == ErrorCode.Value("INVALID_REQUEST") and "-1" in refused.value.message


@pytest.mark.parametrize(("name", "code"), [
    ("__consumer_offsets", "INVALID_REQUEST"),
    ("__transaction_state", "INVALID_REQUEST"),
    ("__anything", "INVALID_REQUEST"),
    ("", "UNKNOWN_TOPIC_OR_PARTITION"),
    ("bad/name", "UNKNOWN_TOPIC_OR_PARTITION"),
    ("x" * 10_000, "UNKNOWN_TOPIC_OR_PARTITION"),
])
def test_internal_topics_and_impossible_names_are_refused_saying_why(name, code):
    refused = topic_deletion.refusal(name)
    assert refused is not None and refused.code == ErrorCode.Value(code) and refused.message
    assert len(refused.message) < 1000


@pytest.mark.parametrize("name", ["events", "_single", "a.b-c_d", "x" * 249])
def test_ordinary_topics_may_be_deleted(name):
    assert topic_deletion.refusal(name) is None


def test_a_deletion_awaits_every_replica_and_every_offsets_leader_but_no_missing_leader():
    info = topic([(0, 1), (1, 2), (2, 0)])
    assert topic_deletion.awaited_nodes(info, []) == {0, 1, 2}
    assert topic_deletion.awaited_nodes(topic([(0,)]), [3, -1, 3]) == {0, 3}
    assert topic_deletion.awaited_nodes(None, [1, -1]) == {1}  # the topic's node already gone: the offsets leaders only
    assert topic_deletion.awaited_nodes(None, []) == frozenset()


def test_marks_hide_topics_and_drop_their_cached_nodes():
    registry = TopicRegistry(client=None, root="/txlog")
    registry._cache["t"] = topic([(0,)])
    registry._cache["kept"] = TopicInfo("kept", 1, {}, ((0,),), False)
    assert registry.marks_seen({"t"}) == {"t"}
    assert registry.deleting == {"t"} and registry.cached("t") is None and registry.cached("kept") is not None
    assert asyncio.run(registry.get("t")) is None  # unknown at once, without a ZooKeeper read
    assert registry.marks_seen({"t"}) == set()  # seen before: not new
    assert registry.marks_seen(set()) == set() and registry.deleting == frozenset()


def test_wiping_a_deleted_topics_partition_leaves_none_of_its_keys_and_all_of_its_neighbours(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"))
        writer = GroupCommitWriter(store)
        doomed = Partition("t", 0, CONFIGS, store, writer)
        neighbour = Partition("t", 1, CONFIGS, store, writer)
        prefixed = Partition("t2", 0, CONFIGS, store, writer)  # a name that starts like the doomed one
        for partition in (doomed, neighbour, prefixed):
            partition.become_leader(1, frozenset({0}), NOW)
            for pid, transactional in ((7, False), (8, True)):
                produced = partition.produce(common_pb2.RecordBatch(
                    producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=transactional,
                    records=[common_pb2.Record(value=b"v")]), NOW, LIMITS)
                await produced.durable
            marker = partition.write_marker(8, 1, 1, False, NOW)  # an aborted transaction: the aborted index holds it
            assert not isinstance(marker, Reject), marker
            await marker
        before = sorted(key for key, _ in store.items(b""))
        doomed_keys = [key for key in before if key[1:].startswith(doomed.pkey)]
        assert {key[:1] for key in doomed_keys} >= {b"L", b"E", b"M", b"P", b"A"}
        await writer.submit(store.wipe_changes(doomed.pkey))
        after = sorted(key for key, _ in store.items(b""))
        assert after == [key for key in before if key not in doomed_keys]
        assert not [key for key in after if key[1:].startswith(doomed.pkey)]
        await writer.drain()
        store.close()

    asyncio.run(scenario())
