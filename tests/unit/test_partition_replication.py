"""A leader's and a follower's Partition on real RocksDB stores (issue 14):
the follower stores the leader's batches byte for byte and rebuilds every
state derived from the log (producer states, the aborted index, pending and
committed group offsets, seals) exactly as the leader has it; truncation
replays what is left; the high watermark and acks=all wait for the ISR."""

from __future__ import annotations

import asyncio

from partition_svc import log_format, validation
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition
from partition_svc.producer_state import Reject
from txlog.protocol import CONSUMER_OFFSETS_TOPIC
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000
LEADER, FOLLOWER = 0, 1


def batch(pid, epoch, seq, values, transactional=False):
    return common_pb2.RecordBatch(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
                                  records=[common_pb2.Record(value=v.encode()) for v in values])


def replica(tmp_path, name: str, node_id: int, topic: str = "t") -> Partition:
    store = LogStore(str(tmp_path / name))
    partition = Partition(topic, 0, CONFIGS, store, GroupCommitWriter(store), node_id=node_id, sole_replica=False)
    return partition


async def ship(leader: Partition, follower: Partition) -> None:
    """One follower fetch: the follower's progress counted, the leader's batches stored (once durable there)."""
    if leader.next_offset:
        await leader.wait_durable(leader.next_offset - 1)
    leader.follower_fetched(FOLLOWER, follower.next_offset, NOW)
    batches = [(base, leader.epochs.epoch_at(base), value) for base, value in leader.store.batches(leader.pkey, follower.next_offset)
               if base < leader.durable_end]
    written = follower.append_replicated(batches, leader.high_watermark)
    if written is not None:
        await written
    leader.follower_fetched(FOLLOWER, follower.next_offset, NOW)


async def drained(*partitions: Partition) -> None:
    """Every write submitted is done (asyncio.run would cancel a write in flight, which stops the process)."""
    for partition in partitions:
        await partition.queue.writer.drain()


async def compacted(partition: Partition, passes: int = 1) -> None:
    """Retention and compaction run ``passes`` times, each waited for (a pass that changes nothing writes nothing)."""
    for _ in range(passes):
        written = partition.enforce_retention(NOW + 1)
        if written is not None:
            await written


def derived(partition: Partition) -> tuple:
    return (partition.producers, partition.aborted, partition.pending_offsets, partition.next_offset,
            list(partition.store.items(b"G")), partition.epochs.entries)


def test_a_follower_rebuilds_producer_state_markers_and_seals_and_acks_wait_for_it(tmp_path):
    async def scenario():
        leader, follower = replica(tmp_path, "leader", LEADER), replica(tmp_path, "follower", FOLLOWER)
        leader.become_leader(3, frozenset({LEADER, FOLLOWER}), NOW)
        follower.become_follower(3)
        plain = leader.produce(batch(7, 0, 0, ["a", "b"]), NOW, LIMITS)
        await plain.durable
        assert not plain.replicated.done() and leader.high_watermark == 0  # on the leader only: not acknowledged
        await ship(leader, follower)
        assert await plain.replicated and leader.high_watermark == 2
        txn = leader.produce(batch(8, 0, 0, ["t1"], transactional=True), NOW, LIMITS)
        sealed = leader.seal_prepared(9, 2, 1, NOW)
        aborted = leader.write_marker(8, 1, 1, False, NOW)
        await ship(leader, follower)
        await ship(leader, follower)
        assert await txn.replicated and await sealed and await aborted
        assert derived(follower) == derived(leader)
        assert follower.aborted == {8: [(2, 4)]} and follower.producers[9].txn_prepared
        assert follower.high_watermark == leader.high_watermark == 5
        # the follower leads now, with the leader's answers: a duplicate, a fenced epoch, a sealed transaction
        follower.become_leader(4, frozenset({FOLLOWER}), NOW)
        retry = follower.produce(batch(7, 0, 0, ["a", "b"]), NOW, LIMITS)
        assert retry.duplicate and retry.base_offset == 0
        fenced = follower.produce(batch(8, 0, 1, ["late"], transactional=True), NOW, LIMITS)
        zombie = follower.produce(batch(9, 2, 0, ["zombie"], transactional=True), NOW, LIMITS)
        assert isinstance(fenced, Reject) and isinstance(zombie, Reject)
        assert ErrorCode.Name(zombie.code) == "INVALID_TXN_STATE"
        await drained(leader, follower)
    asyncio.run(scenario())


def test_group_offsets_committed_in_and_out_of_transactions_are_rebuilt_on_a_follower(tmp_path):
    async def scenario():
        leader = replica(tmp_path, "leader", LEADER, CONSUMER_OFFSETS_TOPIC)
        follower = replica(tmp_path, "follower", FOLLOWER, CONSUMER_OFFSETS_TOPIC)
        leader.become_leader(1, frozenset({LEADER, FOLLOWER}), NOW)
        follower.become_follower(1)
        key = log_format.group_offset_key("g", "t", 0)
        plain = leader.commit_offsets([(key, log_format.group_offset_value(5, "", NOW))], NOW, LIMITS)
        pending = leader.commit_txn_offsets(4, 0, [(key, log_format.group_offset_value(9, "m", NOW))], NOW)
        await ship(leader, follower)
        assert await plain and await pending
        assert follower.store.group_offsets("g") == [("t", 0, 5, "")] and follower.pending_offsets == leader.pending_offsets
        committed = leader.write_marker(4, 1, 0, True, NOW)
        await ship(leader, follower)
        await ship(leader, follower)
        assert await committed
        assert follower.store.group_offsets("g") == leader.store.group_offsets("g") == [("t", 0, 9, "m")]
        assert follower.pending_offsets == {}
        await drained(leader, follower)
    asyncio.run(scenario())


def test_a_deleted_groups_tombstones_delete_its_offsets_on_the_leader_and_the_follower(tmp_path):
    async def scenario():
        leader = replica(tmp_path, "leader", LEADER, CONSUMER_OFFSETS_TOPIC)
        follower = replica(tmp_path, "follower", FOLLOWER, CONSUMER_OFFSETS_TOPIC)
        leader.become_leader(1, frozenset({LEADER, FOLLOWER}), NOW)
        follower.become_follower(1)
        kept, gone = log_format.group_offset_key("stays", "t", 0), log_format.group_offset_key("g", "t", 0)
        written = leader.commit_offsets([(kept, log_format.group_offset_value(3, "", NOW)), (gone, log_format.group_offset_value(5, "", NOW))],
                                        NOW, LIMITS)
        await ship(leader, follower)
        assert await written
        deleted = leader.commit_offsets([(gone, None)], NOW, LIMITS)
        await ship(leader, follower)
        await ship(leader, follower)
        assert await deleted
        for partition in (leader, follower):
            assert partition.store.group_offsets("g") == [] and partition.store.group_offsets("stays") == [("t", 0, 3, "")]
            assert partition.store.group_ids() == {"stays"}
        await drained(leader, follower)
    asyncio.run(scenario())


def test_truncation_removes_a_diverging_tail_and_replays_what_is_left(tmp_path):
    async def scenario():
        old, new = replica(tmp_path, "old", LEADER), replica(tmp_path, "new", FOLLOWER)
        old.become_leader(1, frozenset({LEADER, FOLLOWER}), NOW)
        new.become_follower(1)
        await old.produce(batch(7, 0, 0, ["a"]), NOW, LIMITS).durable
        await ship(old, new)
        # the old leader takes a transaction nobody else sees, then loses leadership
        await old.produce(batch(8, 0, 0, ["lost"], transactional=True), NOW, LIMITS).durable
        await old.produce(batch(7, 0, 1, ["lost-too"]), NOW, LIMITS).durable
        old.become_follower(2)
        new.become_leader(2, frozenset({FOLLOWER}), NOW)
        await new.produce(batch(7, 0, 1, ["b"]), NOW, LIMITS).durable
        assert old.last_stable_offset <= 1 and 8 in old.producers
        epoch, end = new.epochs.end_offset_for(old.epochs.latest_epoch, new.durable_end)
        assert (epoch, end) == (1, 1)
        await old.truncate_to(end)
        assert old.next_offset == 1 and 8 not in old.producers and old.producers[7].last_sequence == 0
        reopened = Partition("t", 0, CONFIGS, old.store, old.queue.writer, node_id=LEADER, sole_replica=False)
        assert derived(reopened) == derived(old)  # what truncation wrote is what a restart finds
        old.leader_high_watermark = 0
        written = old.append_replicated([(base, new.epochs.epoch_at(base), value) for base, value in new.store.batches(new.pkey, 1)], 2)
        await written
        assert [h.producer_id for h in old.headers()] == [7, 7] and old.epochs.entries == new.epochs.entries
        assert old.producers == new.producers
        await drained(old, new)
    asyncio.run(scenario())


def test_a_leader_that_loses_leadership_tells_its_waiters_and_drops_its_lso_holds(tmp_path):
    async def scenario():
        leader = replica(tmp_path, "leader", LEADER)
        leader.become_leader(1, frozenset({LEADER, FOLLOWER}), NOW)
        produced = leader.produce(batch(7, 0, 0, ["a"]), NOW, LIMITS)
        await produced.durable
        assert leader.check_enough_replicas() is None
        leader.configs = dict(CONFIGS, **{"min.insync.replicas": "3"})
        assert ErrorCode.Name(leader.check_enough_replicas().code) == "NOT_ENOUGH_REPLICAS"
        leader.become_follower(2)
        assert await produced.replicated is False
        assert await leader.wait_replicated(0) is False
        # a request that found it leading and awaited something meanwhile must not append to a follower's log
        key = log_format.group_offset_key("g", "t", 0)
        for refused in (leader.produce(batch(7, 0, 1, ["late"]), NOW, LIMITS), leader.write_marker(7, 1, 0, True, NOW),
                        leader.seal_prepared(7, 0, 0, NOW), leader.commit_offsets([(key, b"{}")], NOW, LIMITS),
                        leader.commit_txn_offsets(7, 0, [(key, b"{}")], NOW)):
            assert isinstance(refused, Reject) and ErrorCode.Name(refused.code) == "NOT_LEADER", refused
        assert leader.next_offset == 1
        await drained(leader)
    asyncio.run(scenario())


def test_a_follower_takes_a_compacted_log_with_its_gaps(tmp_path):
    """Found by the chaos run: compaction on the leader removes batches from the middle of the log, so the
    batch after a follower's log end may start further on; it is stored there, the gap staying a gap."""
    async def scenario():
        configs = validation.topic_configs({"cleanup.policy": "compact"}, 1 << 20)
        leader, follower = replica(tmp_path, "leader", LEADER), replica(tmp_path, "follower", FOLLOWER)
        leader.configs = follower.configs = configs
        leader.become_leader(1, frozenset({LEADER}), NOW)
        follower.become_follower(1)
        for value in ("old", "new", "other"):
            keyed = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,  # no producer
                                           records=[common_pb2.Record(key=b"k" if value != "other" else b"o", value=value.encode())])
            await leader.produce(keyed, NOW, LIMITS).durable
        await leader.enforce_retention(NOW)
        assert [h.base_offset for h in leader.headers(0)] == [1, 2]  # "old" compacted away at offset 0
        await ship(leader, follower)
        assert follower.next_offset == 3 and [h.base_offset for h in follower.headers(0)] == [1, 2]
        payloads, _, _ = follower.read(0, 3, 1 << 20, 100, take_first=True)
        assert [r.value for p in payloads for r in common_pb2.RecordBatch.FromString(p).records] == [b"new", b"other"]
        await drained(leader, follower)
    asyncio.run(scenario())


def test_fetched_batches_say_the_leader_epoch_they_were_written_in(tmp_path):
    """KIP-320's input: every batch read carries partition_leader_epoch, on the
    leader that wrote it and on a follower that copied it; a producer cannot set it."""
    async def scenario():
        leader, follower = replica(tmp_path, "leader", LEADER), replica(tmp_path, "follower", FOLLOWER)
        leader.become_leader(3, frozenset({LEADER}), NOW)
        follower.become_follower(3)
        forged = batch(-1, -1, -1, ["a"])
        forged.partition_leader_epoch = 99
        await leader.produce(forged, NOW, LIMITS).durable
        leader.become_follower(5)
        leader.become_leader(5, frozenset({LEADER}), NOW)
        await leader.produce(batch(-1, -1, -1, ["b", "c"]), NOW, LIMITS).durable
        await ship(leader, follower)
        for partition in (leader, follower):
            payloads, next_offset, _ = partition.read(0, 3, 1 << 20, 100, take_first=True)
            read = [common_pb2.RecordBatch.FromString(p) for p in payloads]
            assert [(b.base_offset, b.partition_leader_epoch) for b in read] == [(0, 3), (1, 5)] and next_offset == 3
            assert partition.epochs.end_offset_for(4, 3) == (3, 1)  # EpochEndOffsets: epoch 3 ends where 5 starts
        await drained(leader, follower)
    asyncio.run(scenario())


def test_the_storage_mark_survives_a_reopen_and_only_an_empty_store_is_new(tmp_path):
    store = LogStore(str(tmp_path / "fresh"))
    assert store.is_empty() and store.storage_zxid() is None
    store.mark_storage(42)
    store.close()
    reopened = LogStore(str(tmp_path / "fresh"))
    assert reopened.storage_zxid() == 42 and not reopened.is_empty()
    reopened.close()
    legacy = LogStore(str(tmp_path / "legacy"))
    legacy.write([(log_format.meta_key(log_format.partition_key("t", 0)), b"{}")])
    assert not legacy.is_empty() and legacy.storage_zxid() is None
    legacy.close()


def test_markers_are_removed_only_below_what_every_replica_holds(tmp_path):
    """A follower out of the ISR that copied a transaction's batch but not yet its marker would hold the
    transaction open for good if the marker went first (its LSO stuck, and a hanging transaction once it
    leads): compaction removes a marker only below the offsets every replica fetched from, and a follower
    only below what its leader last said of them."""
    async def scenario():
        configs = validation.topic_configs({"cleanup.policy": "compact", "delete.retention.ms": "0"}, 1 << 20)
        leader, follower = replica(tmp_path, "leader", LEADER), replica(tmp_path, "follower", FOLLOWER)
        leader.configs = follower.configs = configs
        leader.replicas = follower.replicas = (LEADER, FOLLOWER)
        leader.become_leader(1, frozenset({LEADER}), NOW)  # the follower is out of the ISR
        follower.become_follower(1)

        def keyed(value: str, pid: int = -1, transactional: bool = False) -> common_pb2.RecordBatch:
            return common_pb2.RecordBatch(producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
                                          is_transactional=transactional, records=[common_pb2.Record(key=b"k", value=value.encode())])

        await leader.produce(keyed("v1", 8, transactional=True), NOW, LIMITS).durable
        await ship(leader, follower)  # the follower holds the transaction's batch, not its marker
        await leader.write_marker(8, 1, 1, True, NOW)
        await leader.produce(keyed("v2"), NOW, LIMITS).durable  # supersedes v1: the transaction has no batch left
        await compacted(leader, passes=2)  # the first pass marks the marker emptied, the second would remove it
        assert [h.base_offset for h in leader.headers(0)] == [1, 2]  # v1 gone; its marker kept for the follower
        await ship(leader, follower)
        assert follower.last_stable_offset == follower.high_watermark == 3  # the marker ended the transaction there
        await compacted(leader)
        assert [h.base_offset for h in leader.headers(0)] == [2]  # every replica has fetched past it: it goes
        await compacted(follower, passes=2)
        assert [h.base_offset for h in follower.headers(0)] == [1, 2]  # the leader has not said so to the follower yet
        assert follower.append_replicated([], leader.high_watermark, leader.marker_end) is None
        await compacted(follower)
        assert [h.base_offset for h in follower.headers(0)] == [2]
        await drained(leader, follower)
    asyncio.run(scenario())
