"""A partition's transactional bookkeeping on a real RocksDB: markers, the LSO,
the aborted index, read_committed reads, offsets pending in a transaction, and
all of it after reopening the store."""

import asyncio

import pytest
from scripted_writer import ScriptedWriter

from partition_svc import log_format, partition_core, validation
from partition_svc.log_store import LogStore
from partition_svc.partition import Partition, Produced
from partition_svc.producer_state import APPEND, Reject
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000


def batch(pid, epoch, seq, values, transactional=True):
    return common_pb2.RecordBatch(
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
        records=[common_pb2.Record(value=v.encode()) for v in values],
    )


class Harness:
    def __init__(self, path):
        self.path = path
        self.store = LogStore(path)
        self.writer = ScriptedWriter(self.store)
        self.partition = Partition("t", 0, CONFIGS, self.store, self.writer)

    async def durable(self, outcome):
        """A door's outcome, written and acknowledged when it is a write."""
        if isinstance(outcome, asyncio.Future):
            await self.writer.settle()
            await outcome
            return "written"
        return outcome

    async def produce(self, b):
        assert partition_core.check_produce(self.partition.derived, b) == APPEND
        produced = self.partition.produce(b, NOW, LIMITS)
        assert isinstance(produced, Produced) and not produced.duplicate
        await self.durable(produced.durable)
        return produced.base_offset

    async def marker(self, pid, epoch, committed, coordinator_epoch=0):
        return await self.durable(self.partition.write_marker(pid, epoch, coordinator_epoch, committed, NOW))

    async def txn_offsets(self, pid, epoch, offsets):
        return await self.durable(self.partition.commit_txn_offsets(pid, epoch, offsets, NOW))

    def read(self, committed):
        payloads, _, _ = self.partition.read(0, self.partition.last_stable_offset if committed else self.partition.high_watermark,
                                             1 << 30, 1 << 30, take_first=True, committed=committed)
        return [r.value.decode() for p in payloads for r in common_pb2.RecordBatch.FromString(p).records]

    def reopen(self):
        self.store.close()
        self.__init__(self.path)


def run(coroutine):
    return asyncio.run(coroutine)


def test_commit_and_abort_markers_drive_the_lso_and_read_committed(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(-1, -1, -1, ["plain"], transactional=False))
        await h.produce(batch(1, 0, 0, ["a1", "a2"]))           # txn A, offsets 1-2
        await h.produce(batch(2, 0, 0, ["b1"]))                 # txn B, offset 3
        assert h.partition.last_stable_offset == 1               # A is open
        assert h.read(committed=True) == ["plain"]
        assert await h.marker(2, 1, committed=True) == "written"  # B commits (epoch bumped, V2)
        assert h.partition.last_stable_offset == 1               # A still holds the LSO
        assert h.read(committed=True) == ["plain"]
        assert await h.marker(1, 1, committed=False) == "written"  # A aborts
        assert h.partition.last_stable_offset == h.partition.high_watermark == 6
        assert h.read(committed=True) == ["plain", "b1"]
        assert h.read(committed=False) == ["plain", "a1", "a2", "b1"]  # markers never returned
        return h

    h = run(scenario())
    h.reopen()
    assert h.partition.aborted == {1: [(1, 5)]}
    assert h.partition.last_stable_offset == 6
    assert h.read(committed=True) == ["plain", "b1"]
    assert h.partition.producers[1].producer_epoch == 1 and h.partition.producers[1].coordinator_epoch == 0


def test_a_marker_from_an_older_coordinator_epoch_is_fenced(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["x"]))
        assert await h.marker(1, 1, committed=False, coordinator_epoch=5) == "written"
        await h.produce(batch(1, 1, 0, ["y"]))
        refused = await h.marker(1, 2, committed=True, coordinator_epoch=4)
        assert isinstance(refused, Reject) and refused.code == ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED")
        assert h.partition.last_stable_offset == 2  # the transaction is still open
        return h

    run(scenario())


def test_a_retried_marker_is_applied_once_and_late_batches_of_the_old_epoch_are_fenced(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["x"]))
        assert await h.marker(1, 1, committed=True) == "written"
        hw = h.partition.high_watermark
        assert await h.marker(1, 1, committed=True) is None  # the coordinator retried after a crash
        assert h.partition.high_watermark == hw
        late = partition_core.check_produce(h.partition.derived, batch(1, 0, 1, ["late"]))
        assert isinstance(late, Reject) and late.code == ErrorCode.Value("PRODUCER_FENCED")
        assert partition_core.check_produce(h.partition.derived, batch(1, 1, 0, ["next txn"])) == APPEND  # the next transaction starts at 0
        stale = await h.marker(1, 0, committed=False)
        assert isinstance(stale, Reject) and stale.code == ErrorCode.Value("INVALID_PRODUCER_EPOCH")

    run(scenario())


def test_offsets_committed_in_a_transaction_apply_only_with_its_commit(tmp_path):
    group_key = log_format.group_offset_key("g", "src", 0)

    async def scenario():
        h = Harness(str(tmp_path / "db"))
        assert await h.txn_offsets(7, 0, [(group_key, b'{"offset": 10}')]) == "written"
        assert h.partition.has_pending_offsets(log_format.group_prefix("g"))
        assert h.store.get(group_key) is None
        assert h.partition.last_stable_offset == 0
        return h

    h = run(scenario())
    h.reopen()  # pending offsets survive a restart
    assert h.partition.has_pending_offsets(log_format.group_prefix("g"))

    async def commit():
        assert await h.marker(7, 1, committed=True) == "written"

    run(commit())
    assert h.store.get(group_key) == b'{"offset": 10}'
    assert not h.partition.has_pending_offsets(log_format.group_prefix("g"))

    async def aborted_then_fenced():
        assert await h.txn_offsets(7, 1, [(group_key, b'{"offset": 20}')]) == "written"
        assert await h.marker(7, 2, committed=False) == "written"
        stale = await h.txn_offsets(7, 1, [(group_key, b'{"offset": 30}')])
        assert isinstance(stale, Reject) and stale.code == ErrorCode.Value("PRODUCER_FENCED")

    run(aborted_then_fenced())
    assert h.store.get(group_key) == b'{"offset": 10}'


@pytest.mark.parametrize("committed", [True, False])
def test_retention_keeps_the_aborted_index_only_for_the_log_it_covers(tmp_path, committed):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["x"]))
        await h.marker(1, 1, committed=committed)
        await h.produce(batch(-1, -1, -1, ["later"], transactional=False))
        h.partition.configs = dict(CONFIGS, **{"retention.bytes": "0"})
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        return h

    h = run(scenario())
    assert h.partition.log_start_offset == 3  # everything below the LSO (the high watermark) went
    assert h.partition.aborted == {}
    h.reopen()
    assert h.partition.aborted == {} and h.partition.log_start_offset == 3


def test_the_aborted_index_lookup_finds_exactly_the_aborted_spans(tmp_path):
    h = Harness(str(tmp_path / "db"))
    h.partition.derived.aborted = {1: [(10, 12), (20, 25), (40, 40)]}
    inside = {o for o in range(60) if h.partition.is_aborted(1, o)}
    assert inside == {10, 11, 12, *range(20, 26), 40}
    assert not h.partition.is_aborted(2, 11)


def keyed(pid, epoch, seq, pairs, transactional=True):
    return common_pb2.RecordBatch(
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
        records=[common_pb2.Record(key=k.encode(), value=v.encode()) for k, v in pairs],
    )


def test_compaction_keeps_a_committed_record_that_only_an_aborted_one_supersedes(tmp_path):
    """Found in review: an aborted record of the same key made compaction delete the committed
    one, so the key vanished for read_committed readers; and every marker (all keyed b"") but
    the newest was compacted away."""
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        h.partition.configs = validation.topic_configs({"cleanup.policy": "compact"}, 1 << 20)
        await h.produce(keyed(1, 0, 0, [("k", "committed")]))       # offset 0
        assert await h.marker(1, 1, committed=True) == "written"     # offset 1 (the marker carries the bumped epoch)
        await h.produce(keyed(1, 1, 0, [("k", "aborted")]))         # offset 2
        assert await h.marker(1, 2, committed=False) == "written"    # offset 3
        await h.produce(keyed(-1, -1, -1, [("other", "x")], transactional=False))  # offset 4
        assert h.read(committed=True) == ["committed", "x"]
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        assert h.read(committed=True) == ["committed", "x"]           # the committed value of k survives
        assert h.read(committed=False) == ["committed", "x"]          # the aborted batch is gone
        assert sorted(offset for offset, _ in h.store.batches(h.partition.pkey, 0)) == [0, 1, 3, 4]  # markers kept
        assert h.partition.log_start_offset == 0
    run(scenario())



def test_compaction_forgets_the_aborted_spans_of_the_transactions_it_removed(tmp_path):
    """Found by the hour's soak: on a compacted topic (__consumer_offsets, where every
    aborted transaction with offsets leaves a span) compaction removed the aborted
    batches but kept their spans, in memory and on disk, for ever: 11,408 of them on
    one partition_svc after an hour, loaded again at every start."""
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        h.partition.configs = validation.topic_configs({"cleanup.policy": "compact"}, 1 << 20)
        await h.produce(keyed(1, 0, 0, [("a", "aborted-1")]))       # offset 0
        assert await h.marker(1, 1, committed=False) == "written"    # offset 1
        await h.produce(keyed(2, 0, 0, [("b", "committed")]))        # offset 2
        assert await h.marker(2, 1, committed=True) == "written"     # offset 3
        await h.produce(keyed(1, 1, 0, [("c", "aborted-2")]))       # offset 4
        assert await h.marker(1, 2, committed=False) == "written"    # offset 5
        await h.produce(keyed(2, 1, 0, [("d", "open")]))             # offset 6: open, so the LSO is 6
        assert h.partition.aborted == {1: [(0, 1), (4, 5)]}
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        assert h.partition.aborted == {}  # both aborted transactions' batches are gone, and their spans with them
        assert sorted(offset for offset, _ in h.store.batches(h.partition.pkey, 0)) == [1, 2, 3, 5, 6]  # markers kept
        assert not list(h.store.items(b"A" + h.partition.pkey))
        assert h.read(committed=True) == ["committed"] and h.read(committed=False) == ["committed", "open"]
        h.reopen()
        assert h.partition.aborted == {} and h.read(committed=True) == ["committed"]
        assert await h.marker(2, 2, committed=False) == "written"    # offset 7: the open one aborts, above the compacted part
        assert h.partition.aborted == {2: [(6, 7)]} and h.read(committed=True) == ["committed"]
    run(scenario())

def test_offsets_a_commit_marker_decided_stay_unstable_until_the_marker_is_durable(tmp_path):
    """Found in review: the marker dropped its pending offsets at once, before their G keys were
    written, so OffsetFetch(require_stable) could answer the old offset in between (a consumer
    restarting there would process the committed input again)."""
    group_key = log_format.group_offset_key("g", "src", 0)

    async def scenario():
        h = Harness(str(tmp_path / "db"))
        assert await h.txn_offsets(7, 0, [(group_key, b'{"offset": 10}')]) == "written"
        marker = h.partition.write_marker(7, 1, 0, True, NOW)
        assert h.store.get(group_key) is None  # not written yet
        assert h.partition.has_pending_offsets(log_format.group_prefix("g"))  # so still unstable
        h.writer.write()
        assert h.store.get(group_key) is not None  # written, not acknowledged: still unstable
        assert h.partition.has_pending_offsets(log_format.group_prefix("g"))
        assert await h.durable(marker) == "written"
        assert h.store.get(group_key) == b'{"offset": 10}'
        assert not h.partition.has_pending_offsets(log_format.group_prefix("g"))

    run(scenario())


def test_pending_offsets_make_only_their_own_partitions_unstable(tmp_path):
    """As Kafka's require_stable: a transaction holding offsets of one partition does not make
    OffsetFetch wait for the group's other partitions (tasks of one job would wait on each other)."""
    mine, other = log_format.group_offset_key("g", "src", 0), log_format.group_offset_key("g", "src", 1)

    async def scenario():
        h = Harness(str(tmp_path / "db"))
        assert await h.txn_offsets(7, 0, [(mine, b'{"offset": 10}')]) == "written"
        prefix = log_format.group_prefix("g")
        assert h.partition.has_pending_offsets(prefix, [mine])
        assert not h.partition.has_pending_offsets(prefix, [other])
        assert h.partition.has_pending_offsets(prefix)  # asking for every partition of the group

    run(scenario())


def test_a_marker_ends_only_a_transaction_of_a_lower_epoch(tmp_path):
    """Found in review (defect 1): with Transactions V2, transaction N's markers carry epoch e+1 and
    N+1 writes at e+1, so a late copy of N's marker closed N+1."""
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["n"]))
        assert await h.marker(1, 1, committed=True) == "written"  # N, at the bumped epoch
        await h.produce(batch(1, 1, 0, ["m"]))                     # N+1 at that same epoch
        late = await h.marker(1, 1, committed=True)
        assert isinstance(late, Reject) and ErrorCode.Name(late.code) == "INVALID_TXN_STATE"
        assert h.read(committed=True) == ["n"] and h.partition.last_stable_offset == 2
        assert await h.marker(1, 2, committed=False) == "written"
        assert h.read(committed=True) == ["n"]
        assert await h.marker(1, 2, committed=False) is None       # re-sent with nothing open: a no-op
    run(scenario())


def test_a_re_applied_marker_records_a_higher_coordinator_epoch(tmp_path):
    """Found in review (defect 2): the no-op path left the old coordinator epoch, so a paused
    old owner's late re-send was not fenced."""
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["a"]))
        assert await h.marker(1, 1, committed=True, coordinator_epoch=3) == "written"
        end = h.partition.next_offset
        # written again (so that every replica records the higher epoch), changing nothing else
        assert await h.marker(1, 1, committed=True, coordinator_epoch=4) == "written"
        assert h.partition.next_offset == end + 1
        h.reopen()
        assert h.partition.producers[1].coordinator_epoch == 4
        fenced = await h.marker(1, 1, committed=True, coordinator_epoch=3)
        assert ErrorCode.Name(fenced.code) == "TRANSACTION_COORDINATOR_FENCED"
    run(scenario())


def test_the_lso_waits_for_the_marker_to_be_durable(tmp_path):
    """Suspected in review, and real: the LSO moved when a marker was applied in memory, so a
    crash before the marker was durable moved it backwards."""
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["a"]))
        assert h.partition.last_stable_offset == 0
        h.partition.write_marker(1, 1, 0, True, NOW)
        assert h.partition.last_stable_offset == 0  # applied in memory, not durable: still held
        h.reopen()  # the crash: the marker's changes were never written
        assert h.partition.last_stable_offset == 0 and h.read(committed=True) == []
        assert await h.marker(1, 1, committed=True) == "written"
        assert h.partition.last_stable_offset == h.partition.high_watermark == 2
        assert h.read(committed=True) == ["a"]
    run(scenario())


def test_a_sealed_transaction_takes_no_more_records_or_offsets_until_its_marker(tmp_path):
    """Found in review (defect 3): a zombie appended to a prepared transaction."""
    group_key = log_format.group_offset_key("g", "src", 0)

    async def scenario():
        h = Harness(str(tmp_path / "db"))
        await h.produce(batch(1, 0, 0, ["a"]))
        assert h.partition.check_seal(1, 0, 0) is None
        assert await h.durable(h.partition.seal_prepared(1, 0, 0, NOW)) == "written"
        assert h.partition.seal_prepared(1, 0, 0, NOW) is None  # sealed already
        h.reopen()
        assert ErrorCode.Name(partition_core.check_produce(h.partition.derived, batch(1, 0, 1, ["z"])).code) == "INVALID_TXN_STATE"
        refused = await h.txn_offsets(1, 0, [(group_key, b'{"offset": 9}')])
        assert ErrorCode.Name(refused.code) == "INVALID_TXN_STATE"
        assert await h.marker(1, 1, committed=True) == "written"
        assert h.read(committed=True) == ["a"]
        assert partition_core.check_produce(h.partition.derived, batch(1, 1, 0, ["next"])) == APPEND  # the next transaction is not sealed
        assert ErrorCode.Name(h.partition.check_seal(1, 0, 0).code) == "INVALID_PRODUCER_EPOCH"  # late seal: settled
    run(scenario())


def test_a_late_txn_offset_commit_never_moves_a_pending_offset_back(tmp_path):
    group_key = log_format.group_offset_key("g", "src", 0)

    async def scenario():
        h = Harness(str(tmp_path / "db"))
        assert await h.txn_offsets(7, 0, [(group_key, b'{"offset": 10}')]) == "written"
        assert await h.txn_offsets(7, 0, [(group_key, b'{"offset": 4}')]) is None  # behind the pending one: nothing
        assert h.partition.pending_offsets[7][group_key] == b'{"offset": 10}'
    run(scenario())
