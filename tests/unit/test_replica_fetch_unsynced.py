"""A leader's followers fetch what it has written before its own sync ends
(partition.py's written_end): their write and sync overlap the leader's. The
high watermark, and so every acks=all answer, still waits for the leader's
own sync (durable_end). A leader Partition on a real RocksDB store whose
writes and syncs happen when the test says (ScriptedWriter), answered through
ReplicationServicer's own checks and reads."""

from __future__ import annotations

import asyncio

from partition_svc import validation
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition
from partition_svc.replication import ReplicationServicer
from tests.unit.scripted_writer import ScriptedWriter
from txlog.v1 import common_pb2, replication_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000
LEADER, FOLLOWER = 0, 1


class Replicas:
    """What ReplicationServicer asks of the replica manager here: count a follower's fetch."""

    def follower_fetched(self, partition: Partition, follower: int, log_end_offset: int, log_start_offset: int = 0,
                         storage_zxid: int | None = None) -> None:
        partition.follower_fetched(follower, log_end_offset, NOW, log_start_offset, storage_zxid)


def plain(values):
    return common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  records=[common_pb2.Record(value=v.encode()) for v in values])


def fetch(servicer: ReplicationServicer, leader: Partition, offset: int, last_epoch: int = -1):
    wanted = replication_pb2.ReplicaFetchPartition(topic="t", partition=0, leader_epoch=leader.leader_epoch,
                                                   fetch_offset=offset, last_fetched_epoch=last_epoch)
    outcome = servicer._progress(FOLLOWER, wanted, leader, storage_zxid=None)
    encoded, _ = servicer._collect([(wanted, leader, outcome)], 1 << 20)
    return replication_pb2.ReplicaFetchResponse.FromString(encoded).results[0]


def test_a_follower_fetches_a_written_batch_before_the_leader_syncs_it_and_acks_wait_for_both(tmp_path):
    async def scenario():
        leader_store, follower_store = LogStore(str(tmp_path / "leader"), sync=False), LogStore(str(tmp_path / "follower"))
        writer = ScriptedWriter(leader_store)
        leader = Partition("t", 0, CONFIGS, leader_store, writer, node_id=LEADER, sole_replica=False)
        follower = Partition("t", 0, CONFIGS, follower_store, GroupCommitWriter(follower_store), node_id=FOLLOWER, sole_replica=False)
        leader.replicas = follower.replicas = (LEADER, FOLLOWER)
        leader.become_leader(2, frozenset({LEADER, FOLLOWER}), NOW)
        await writer.settle()  # the epoch's start
        follower.become_follower(2)
        servicer = ReplicationServicer(Replicas(), 1000)
        waiting = leader.written_end_moved()

        produced = leader.produce(plain(["a", "b"]), NOW, LIMITS)
        assert not fetch(servicer, leader, 0).batches  # applied in memory only: nothing to read yet
        writer.write()  # in RocksDB, not synced
        await asyncio.sleep(0)
        assert waiting.is_set() and (leader.written_end, leader.durable_end) == (2, 0)  # a waiting ReplicaFetch wakes
        result = fetch(servicer, leader, 0)
        assert [(b.base_offset, b.leader_epoch) for b in result.batches] == [(0, 2)] and result.high_watermark == 0

        written = follower.append_replicated([(b.base_offset, b.leader_epoch, b.value) for b in result.batches], result.high_watermark)
        await written
        result = fetch(servicer, leader, follower.next_offset, follower.epochs.latest_epoch)  # past the leader's durable end
        assert not result.HasField("diverging_epoch") and not result.error.code and not result.batches
        assert leader.replica_set.followers[FOLLOWER].log_end_offset == 2  # counted...
        assert leader.high_watermark == 0 and not produced.replicated.done()  # ...but the leader has not synced it

        writer.acknowledge()
        await asyncio.sleep(0)
        assert leader.durable_end == 2 and leader.high_watermark == 2 and await produced.replicated
        await follower.queue.writer.drain()
        follower_store.close()
        leader_store.close()

    asyncio.run(scenario())


def test_the_written_end_leads_the_durable_end_and_a_reopened_store_starts_both_at_its_log_end(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "db"), sync=False)
        writer = ScriptedWriter(store)
        leader = Partition("t", 0, CONFIGS, store, writer, node_id=LEADER, sole_replica=False)
        leader.become_leader(1, frozenset({LEADER}), NOW)
        await writer.settle()  # the epoch's start
        leader.produce(plain(["a"]), NOW, LIMITS)
        leader.produce(plain(["b", "c"]), NOW, LIMITS)
        writer.write(1)
        writer.acknowledge()  # readable, then durable: the writer completes them in that order
        await asyncio.sleep(0)
        assert (leader.written_end, leader.durable_end) == (1, 1)
        writer.write()
        await asyncio.sleep(0)
        assert (leader.written_end, leader.durable_end, leader.next_offset) == (3, 1, 3)
        writer.acknowledge()
        await asyncio.sleep(0)
        assert leader.written_end == leader.durable_end == leader.high_watermark == 3
        store.close()
        reopened = LogStore(str(tmp_path / "db"), sync=False)
        again = Partition("t", 0, CONFIGS, reopened, ScriptedWriter(reopened), node_id=LEADER, sole_replica=False)
        assert again.written_end == again.durable_end == again.next_offset == 3
        reopened.close()

    asyncio.run(scenario())
