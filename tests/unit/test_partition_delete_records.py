"""DeleteRecords' core (issue 17) on real RocksDB stores: the leader moves its
log start (whole batches below it deleted, one it falls inside kept and
trimmed by reads), never past the last stable offset; a refused request
changes nothing; followers take the leader's log start up to their high
watermark, and the leader's low watermark follows them; a follower that
restarts at a log start inside a batch gets that batch whole."""

from __future__ import annotations

import asyncio

from test_partition_replication import CONFIGS, FOLLOWER, LEADER, LIMITS, NOW, batch

from partition_svc import log_format
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition, RecordsDeleted
from partition_svc.producer_state import Reject
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

OPENED: list[Partition] = []


def replica(tmp_path, name: str, node_id: int = LEADER, *, sole: bool = True) -> Partition:
    store = LogStore(str(tmp_path / name))
    OPENED.append(Partition("t", 0, CONFIGS, store, GroupCommitWriter(store), node_id=node_id, sole_replica=sole))
    return OPENED[-1]


def run(scenario):
    """Runs the scenario; a failed one first lets every write in flight finish (asyncio.run would
    cancel it, which stops the process before pytest can report)."""
    async def guarded():
        try:
            return await scenario()
        finally:
            for partition in OPENED:
                await partition.queue.writer.drain()
            OPENED.clear()
    return asyncio.run(guarded())


def reopened(partition: Partition) -> Partition:
    path = partition.store.db.path()
    partition.store.close()
    store = LogStore(path)
    return Partition("t", 0, CONFIGS, store, GroupCommitWriter(store), node_id=partition.node_id)


async def produce(partition: Partition, b) -> int:
    produced = partition.produce(b, NOW, LIMITS)
    assert not isinstance(produced, Reject), produced
    await produced.durable
    return produced.base_offset


def values(partition: Partition, from_offset: int, committed: bool = False) -> list[tuple[int, str]]:
    upper = partition.last_stable_offset if committed else partition.high_watermark
    payloads, _, _ = partition.read(from_offset, upper, 1 << 30, 1 << 30, take_first=True, committed=committed)
    return [(r.offset, r.value.decode()) for p in payloads for r in common_pb2.RecordBatch.FromString(p).records]


def stored(partition: Partition) -> list[int]:
    return [base for base, _ in partition.store.batches(partition.pkey, 0)]


async def deleted(partition: Partition, offset: int) -> int:
    outcome = partition.delete_records(offset)
    assert isinstance(outcome, RecordsDeleted), outcome
    assert await partition.wait_log_start_followed(outcome)
    return outcome.log_start_offset


def test_the_log_start_moves_inside_a_batch_which_stays_and_reads_trim(tmp_path):
    async def scenario():
        p = replica(tmp_path, "db")
        for values_ in (["a", "b"], ["c", "d", "e"], ["f"]):  # batches at 0, 2, 5
            await produce(p, batch(-1, -1, -1, values_))
        size_before = p.size_bytes
        first_batch_bytes = len(p.store.batch(p.pkey, 0))
        assert await deleted(p, 3) == 3
        assert p.log_start_offset == 3 and stored(p) == [2, 5]  # the batch at 0 went, the one holding 3 stays
        assert p.size_bytes == size_before - first_batch_bytes
        assert values(p, 3) == [(3, "d"), (4, "e"), (5, "f")]  # nothing at or above the log start lost, nothing below read
        assert [h.base_offset for h in p.headers()] == [2, 5]
        assert p.offset_for_timestamp(0) == (3, NOW)  # the first record at or after the log start, not 2
        await p.queue.writer.drain()
        return reopened(p)

    p = run(scenario)
    assert p.log_start_offset == 3 and values(p, 3) == [(3, "d"), (4, "e"), (5, "f")]


def test_a_delete_past_the_last_stable_offset_is_refused_and_changes_nothing(tmp_path):
    async def scenario():
        p = replica(tmp_path, "db")
        await produce(p, batch(-1, -1, -1, ["a", "b"]))            # 0-1
        await produce(p, batch(7, 0, 0, ["t1"], transactional=True))  # 2: an open transaction holds the LSO
        await produce(p, batch(-1, -1, -1, ["c"]))                 # 3
        assert p.last_stable_offset == 2 and p.high_watermark == 4
        keys_before = list(p.store.items(b""))
        for offset in (3, 4, 99, -2):
            refused = p.delete_records(offset)
            assert isinstance(refused, Reject) and ErrorCode.Name(refused.code) == "OFFSET_OUT_OF_RANGE", offset
        await p.queue.writer.drain()
        assert list(p.store.items(b"")) == keys_before and p.log_start_offset == 0
        assert await deleted(p, -1) == 2  # -1: the LSO, which the open transaction holds
        assert stored(p) == [2, 3] and p.producers[7].current_txn_first_offset == 2
        again = p.delete_records(1)  # at or below the log start: nothing changes
        assert isinstance(again, RecordsDeleted) and again.written is None and again.log_start_offset == 2
        assert p.write_marker(7, 1, 0, True, NOW) is not None
        await p.queue.writer.drain()
        assert p.last_stable_offset == 5
        assert await deleted(p, -1) == 5 and stored(p) == []  # the marker committed it: everything below the LSO may go
        assert values(p, 5) == []

    run(scenario)


def test_the_aborted_index_below_the_log_start_is_forgotten_and_producers_still_deduplicate(tmp_path):
    async def scenario():
        p = replica(tmp_path, "db")
        await produce(p, batch(7, 0, 0, ["x"], transactional=True))  # 0
        assert p.write_marker(7, 1, 0, False, NOW) is not None         # 1: aborted
        await produce(p, batch(8, 0, 0, ["y"], transactional=True))  # 2
        assert p.write_marker(8, 1, 0, False, NOW) is not None         # 3: aborted
        await produce(p, batch(9, 0, 0, ["i1", "i2"]))               # 4-5, idempotent
        await p.queue.writer.drain()
        assert p.aborted == {7: [(0, 1)], 8: [(2, 3)]}
        assert await deleted(p, 2) == 2
        assert p.aborted == {8: [(2, 3)]} and list(p.store.items(b"A" + p.pkey)) == [
            (log_format.aborted_key(p.pkey, 8, 2), log_format.aborted_span_value(2, 3))]
        assert await deleted(p, 5) == 5  # inside the idempotent batch
        retry = p.produce(batch(9, 0, 0, ["i1", "i2"]), NOW, LIMITS)
        assert retry.duplicate and retry.base_offset == 4  # the producer's state stays: a retry is still a duplicate
        assert values(p, 5, committed=True) == [(5, "i2")]
        await p.queue.writer.drain()

    run(scenario)


def test_retention_after_a_delete_inside_a_batch_deletes_that_batch(tmp_path):
    async def scenario():
        p = replica(tmp_path, "db")
        await produce(p, batch(-1, -1, -1, ["a", "b", "c"]))  # 0-2
        await produce(p, batch(-1, -1, -1, ["d"]))            # 3
        assert await deleted(p, 1) == 1
        p.configs = dict(CONFIGS, **{"retention.bytes": "0"})
        assert p.enforce_retention(NOW) is not None
        await p.queue.writer.drain()
        assert p.log_start_offset == 4 and stored(p) == [] and p.size_bytes == 0

    run(scenario)


async def fetch(leader: Partition, follower: Partition) -> None:
    """One ReplicaFetch round as replication.py and replica_fetcher.py make it: the leader counts the
    follower's fetch offset, answers batches, its high watermark and log start; the follower stores the
    batches, then takes the log start, durably, before its next fetch."""
    if leader.next_offset:
        await leader.wait_durable(leader.next_offset - 1)
    if follower.next_offset < leader.log_start_offset:  # OFFSET_OUT_OF_RANGE: the follower starts over at the log start
        await follower.restart_log_at(leader.log_start_offset)
        return
    leader.follower_fetched(FOLLOWER, follower.next_offset, NOW, follower.log_start_offset)
    batches = [(base, leader.epochs.epoch_at(base), value)
               for base, value in leader.store.batches_holding(leader.pkey, follower.next_offset)
               if base < leader.durable_end]
    written = follower.append_replicated(batches, leader.high_watermark)
    if written is not None:
        await written
    moved = follower.follow_log_start(leader.log_start_offset)
    if moved is not None:
        await moved


def test_followers_take_the_leaders_log_start_and_the_delete_waits_for_the_isr(tmp_path):
    async def scenario():
        leader, follower = replica(tmp_path, "leader", sole=False), replica(tmp_path, "follower", FOLLOWER, sole=False)
        leader.become_leader(1, frozenset({LEADER, FOLLOWER}), NOW)
        follower.become_follower(1)
        for values_ in (["a", "b"], ["c", "d"]):  # 0-1, 2-3
            leader.produce(batch(-1, -1, -1, values_), NOW, LIMITS)
        await fetch(leader, follower)
        await fetch(leader, follower)
        assert leader.high_watermark == follower.high_watermark == 4
        outcome = leader.delete_records(3)
        assert isinstance(outcome, RecordsDeleted) and leader.log_start_offset == 3
        waiting = asyncio.ensure_future(leader.wait_log_start_followed(outcome))
        await asyncio.shield(outcome.written)  # durable here: what the delete waits for next is the in-sync follower
        for _ in range(10):  # the waiter's turns after the write (callbacks only, no I/O)
            await asyncio.sleep(0)
        assert not waiting.done() and leader.low_watermark == 0  # the follower has not moved yet
        await fetch(leader, follower)  # the answer tells it; it moves
        assert follower.log_start_offset == 3 and stored(follower) == [2]
        assert not waiting.done()  # the leader knows only from the follower's next fetch
        await fetch(leader, follower)
        assert await asyncio.wait_for(waiting, 5) and leader.low_watermark == 3
        # the follower leads after a failover: the log start stays, nothing above it is lost
        leader.become_follower(2)
        follower.become_leader(2, frozenset({FOLLOWER}), NOW)
        assert follower.log_start_offset == 3 and values(follower, 3) == [(3, "d")]
        await leader.queue.writer.drain()
        await follower.queue.writer.drain()

    run(scenario)


def test_a_follower_takes_the_log_start_only_up_to_its_high_watermark(tmp_path):
    async def scenario():
        follower = replica(tmp_path, "follower", FOLLOWER, sole=False)
        follower.become_follower(1)
        source = replica(tmp_path, "source")
        for values_ in (["a", "b"], ["c", "d"]):
            await produce(source, batch(-1, -1, -1, values_))
        written = follower.append_replicated([(base, 0, value) for base, value in source.store.batches(source.pkey, 0)], 2)
        await written
        assert follower.high_watermark == 2
        await follower.follow_log_start(3)
        assert follower.log_start_offset == 2 and stored(follower) == [2]  # not past what it knows is replicated
        assert follower.follow_log_start(1) is None and follower.log_start_offset == 2  # never backwards
        await follower.queue.writer.drain()
        await source.queue.writer.drain()

    run(scenario)


def test_a_follower_restarting_at_a_log_start_inside_a_batch_gets_that_batch_whole(tmp_path):
    async def scenario():
        leader, follower = replica(tmp_path, "leader", sole=False), replica(tmp_path, "follower", FOLLOWER, sole=False)
        leader.become_leader(1, frozenset({LEADER}), NOW)  # the follower is out of the ISR, far behind
        follower.become_follower(1)
        for values_ in (["a", "b"], ["c", "d", "e"], ["f"]):  # 0-1, 2-4, 5
            await produce(leader, batch(-1, -1, -1, values_))
        await leader.wait_replicated(5)
        assert await deleted(leader, 3) == 3
        await fetch(leader, follower)  # out of range: starts over at 3
        assert follower.log_start_offset == follower.next_offset == 3
        await fetch(leader, follower)
        assert stored(follower) == [2, 5] and follower.next_offset == 6 and follower.log_start_offset == 3
        follower.become_leader(2, frozenset({FOLLOWER}), NOW)
        assert values(follower, 3) == [(3, "d"), (4, "e"), (5, "f")]
        await leader.queue.writer.drain()
        await follower.queue.writer.drain()

    run(scenario)
