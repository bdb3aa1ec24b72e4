"""A leader that stops leading may still have appends queued for the writer.
Truncation (and a replica's deletion) read what to delete from the store: an
append written after that read survived the deletions, so an unreplicated
batch and its producer's state came back at the next restart (the KIP-101
case truncation exists for). The follower's fetcher and Partition.delete now
wait until everything queued before is written. A leader Partition on a real
RocksDB store whose writes happen when the test says (ScriptedWriter)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from partition_svc import validation
from partition_svc.log_store import LogStore
from partition_svc.partition import Partition
from partition_svc.replica_fetcher import Followed, ReplicaFetcher
from tests.unit.scripted_writer import ScriptedWriter
from txlog.protocol.errors import ErrorCode, error_proto
from txlog.v1 import common_pb2, replication_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000
ZOMBIE = 7


def batch(producer_id: int, value: str) -> common_pb2.RecordBatch:
    sequence = 0 if producer_id >= 0 else -1
    return common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1, base_sequence=sequence,
                                  records=[common_pb2.Record(value=value.encode())])


async def deposed_leader(store: LogStore, writer: ScriptedWriter) -> Partition:
    """Led at epoch 1 with offset 0 replicated, then took producer 7's batch at
    offset 1 and lost its leadership before that append was written."""
    partition = Partition("t", 0, CONFIGS, store, writer, node_id=0, sole_replica=False)
    partition.replicas = (0, 1)
    partition.become_leader(1, frozenset({0, 1}), NOW)
    partition.produce(batch(-1, "kept"), NOW, LIMITS)
    await writer.settle()
    partition.produce(batch(ZOMBIE, "never replicated"), NOW, LIMITS)
    partition.become_follower(2)
    return partition


async def until_done(task: asyncio.Task, writer: ScriptedWriter) -> None:
    """Lets the task run to its first wait before anything queued is written, then writes until it ends."""
    await asyncio.sleep(0)
    while not task.done():
        await writer.settle()
    await task


class NewLeader:
    """The new leader's side of OffsetForLeaderEpoch (the network is not what is tested): epoch 1 ends at offset 1."""

    async def OffsetForLeaderEpoch(self, request):
        return replication_pb2.OffsetForLeaderEpochResponse(results=[
            replication_pb2.OffsetForLeaderEpochResult(topic=p.topic, partition=p.partition, leader_epoch=1, end_offset=1)
            for p in request.partitions])


def stored(store: LogStore, partition: Partition) -> tuple[list[int], list[bytes]]:
    return [base for base, _ in store.batches(partition.pkey, 0)], [key for key, _ in store.items(b"P")]


def test_the_fetcher_truncates_a_deposed_leaders_queued_append_for_good(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"), sync=False)
        writer = ScriptedWriter(store)
        partition = await deposed_leader(store, writer)
        fetcher = ReplicaFetcher(SimpleNamespace(node_id=0), leader_id=1)
        await fetcher.close()  # only its truncation step is driven here
        fetcher.followed[("t", 0)] = followed = Followed(partition, 2)
        await until_done(asyncio.ensure_future(fetcher._truncate(NewLeader())), writer)
        assert followed.truncated and partition.next_offset == 1
        assert stored(store, partition) == ([0], [])
        store.close()
        reopened = LogStore(str(tmp_path / "db"), sync=False)
        again = Partition("t", 0, CONFIGS, reopened, ScriptedWriter(reopened), node_id=0, sole_replica=False)
        assert again.next_offset == 1 and ZOMBIE not in again.producers
        reopened.close()

    asyncio.run(scenario())


def test_a_deleted_replica_leaves_nothing_of_a_queued_append(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"), sync=False)
        writer = ScriptedWriter(store)
        partition = await deposed_leader(store, writer)
        await until_done(asyncio.ensure_future(partition.delete()), writer)
        assert stored(store, partition) == ([], [])
        store.close()

    asyncio.run(scenario())


class LeaderPastRetention:
    """The new leader's ReplicaFetch answer: its retention deleted everything below offset 5."""

    async def ReplicaFetch(self, request, timeout=None):
        return replication_pb2.ReplicaFetchResponse(results=[replication_pb2.ReplicaFetchPartitionResult(
            topic=p.topic, partition=p.partition, log_start_offset=5,
            error=error_proto(ErrorCode.Value("OFFSET_OUT_OF_RANGE"), "below the log start"))
            for p in request.partitions])


def test_a_replica_starting_over_at_the_leaders_log_start_keeps_nothing_of_a_queued_append(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"), sync=False)
        writer = ScriptedWriter(store)
        partition = await deposed_leader(store, writer)
        fetcher = ReplicaFetcher(SimpleNamespace(node_id=0, fetch_wait_ms=0, fetch_bytes_max=1 << 20, storage_zxid=None), leader_id=1)
        await fetcher.close()  # only its fetch step is driven here
        fetcher.followed[("t", 0)] = Followed(partition, 2, truncated=True)
        await until_done(asyncio.ensure_future(fetcher._fetch(LeaderPastRetention())), writer)
        assert partition.next_offset == partition.log_start_offset == 5
        assert stored(store, partition) == ([], [])
        store.close()

    asyncio.run(scenario())


def test_truncating_or_starting_over_with_an_append_not_written_yet_is_refused_and_changes_nothing(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"), sync=False)
        writer = ScriptedWriter(store)
        partition = await deposed_leader(store, writer)
        for step in (lambda: partition.truncate_to(1), lambda: partition.restart_log_at(5)):
            with pytest.raises(RuntimeError, match="settle_writes first"):
                step()
            assert partition.next_offset == 2 and len(writer.unwritten) == 1  # nothing applied, nothing submitted
        await writer.settle()
        store.close()

    asyncio.run(scenario())
