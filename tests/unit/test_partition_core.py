"""The partition's pure cores without a store, a writer or an event loop:
partition_core.py (checks and effects of the transactional rules, the LSO)
and log_core.py (an append's offsets and stored form, retention,
compaction, DeleteRecords, the log start)."""

from __future__ import annotations

import pytest

from partition_svc import log_core, log_format, partition_core, validation
from partition_svc.log_core import MoveLogStart
from partition_svc.partition_core import UNCHANGED, DerivedState, WriteControl
from partition_svc.producer_state import APPEND, Duplicate, Reject
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2

PKEY = log_format.partition_key("t", 0)
WHERE = "t-0"
NOW = 1_700_000_000_000
CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
GROUP_KEY = log_format.group_offset_key("g", "src", 0)


def code(outcome) -> str:
    assert isinstance(outcome, Reject), outcome
    return ErrorCode.Name(outcome.code)


def batch(pid: int, epoch: int, seq: int, count: int, transactional: bool = True) -> common_pb2.RecordBatch:
    return common_pb2.RecordBatch(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
                                  records=[common_pb2.Record(value=f"v{i}".encode()) for i in range(count)])


def with_open_transaction(pid: int = 1, epoch: int = 0, first: int = 10) -> DerivedState:
    state = DerivedState()
    partition_core.effect_data(state, PKEY, pid, epoch, 0, 2, first, NOW, True, appended_ms=NOW)
    return state


def test_a_data_batch_opens_a_transaction_and_its_retry_is_a_duplicate():
    state = with_open_transaction(first=10)
    assert state.producers[1].current_txn_first_offset == 10
    assert partition_core.check_produce(state, batch(1, 0, 0, 2)) == Duplicate(10, 11)
    assert partition_core.check_produce(state, batch(1, 0, 2, 1)) == APPEND
    assert code(partition_core.check_produce(state, batch(1, 0, 2, 1, transactional=False))) == "INVALID_TXN_STATE"
    assert partition_core.check_produce(state, batch(-1, -1, -1, 1, transactional=False)) == APPEND


def test_a_marker_ends_only_a_transaction_of_a_lower_epoch():
    state = with_open_transaction(epoch=3)
    assert code(partition_core.decide_marker(state, WHERE, 1, 3, 0, committed=True)) == "INVALID_TXN_STATE"
    assert partition_core.decide_marker(state, WHERE, 1, 4, 0, committed=True) == WriteControl(common_pb2.CONTROL_TYPE_COMMIT)
    assert partition_core.decide_marker(state, WHERE, 1, 4, 0, committed=False) == WriteControl(common_pb2.CONTROL_TYPE_ABORT)
    assert code(partition_core.decide_marker(state, WHERE, 1, 2, 0, committed=True)) == "INVALID_PRODUCER_EPOCH"


def test_an_abort_marker_enters_the_aborted_index_and_closes_the_transaction():
    state = with_open_transaction(first=10)
    changes = partition_core.effect_marker(state, PKEY, 1, 1, 5, False, offset=14, timestamp_ms=NOW)
    assert state.aborted == {1: [(10, 14)]}
    entry = state.producers[1]
    assert (entry.producer_epoch, entry.current_txn_first_offset, entry.coordinator_epoch, entry.batches) == (1, -1, 5, ())
    assert (log_format.aborted_key(PKEY, 1, 10), log_format.aborted_span_value(10, 14)) in changes
    assert state.is_aborted(1, 12) and state.aborted_span(1, 14) == (10, 14)
    assert not state.is_aborted(1, 15) and not state.is_aborted(2, 12)
    # the same marker again: nothing open, same coordinator epoch: nothing to write
    assert partition_core.decide_marker(state, WHERE, 1, 1, 5, committed=False) is UNCHANGED
    # from a newer coordinator: written again to record its epoch; an older one is fenced
    assert partition_core.decide_marker(state, WHERE, 1, 1, 6, committed=False) == WriteControl(common_pb2.CONTROL_TYPE_ABORT)
    assert code(partition_core.decide_marker(state, WHERE, 1, 1, 4, committed=False)) == "TRANSACTION_COORDINATOR_FENCED"


def test_a_commit_makes_the_pending_offsets_the_groups_and_an_abort_drops_them():
    for committed in (True, False):
        state = DerivedState()
        offsets = [(GROUP_KEY, log_format.group_offset_value(7, "", NOW))]
        decided = partition_core.decide_txn_offsets(state, 1, 0, offsets)
        assert decided == partition_core.WriteTxnOffsets(offsets)
        partition_core.effect_txn_offsets(state, PKEY, 1, 0, offsets, base=3, timestamp_ms=NOW)
        assert state.producers[1].current_txn_first_offset == 3 and state.pending_offsets == {1: dict(offsets)}
        changes = partition_core.effect_marker(state, PKEY, 1, 1, 0, committed, offset=4, timestamp_ms=NOW)
        assert state.pending_offsets == {}
        assert ((GROUP_KEY, offsets[0][1]) in changes) == committed
        assert (log_format.pending_offset_key(PKEY, 1, GROUP_KEY), None) in changes


def test_a_late_txn_offset_commit_never_moves_a_pending_offset_back():
    state = DerivedState()
    later = [(GROUP_KEY, log_format.group_offset_value(9, "", NOW))]
    partition_core.effect_txn_offsets(state, PKEY, 1, 0, later, base=0, timestamp_ms=NOW)
    earlier = [(GROUP_KEY, log_format.group_offset_value(5, "", NOW))]
    assert partition_core.decide_txn_offsets(state, 1, 0, earlier) is UNCHANGED
    assert code(partition_core.decide_txn_offsets(state, 1, 1, later)) == "INVALID_TXN_STATE"  # epoch 0's is still open


def test_a_sealed_transaction_takes_nothing_more_of_its_epoch():
    state = with_open_transaction(epoch=2)
    assert partition_core.decide_seal(state, WHERE, 1, 2, 0) == WriteControl(common_pb2.CONTROL_TYPE_PREPARED)
    partition_core.effect_seal(state, PKEY, 1, 2, 0, NOW)
    assert partition_core.decide_seal(state, WHERE, 1, 2, 0) is UNCHANGED
    assert code(partition_core.check_produce(state, batch(1, 2, 2, 1))) == "INVALID_TXN_STATE"
    assert code(partition_core.decide_txn_offsets(state, 1, 2, [(GROUP_KEY, b"{}")])) == "INVALID_TXN_STATE"
    assert state.producers[1].current_txn_first_offset == 10  # still open: it holds the LSO until its marker


@pytest.mark.parametrize(("high_watermark", "first_open", "closing", "lso"),
                         [(20, None, [], 20), (20, 12, [], 12), (20, None, [15], 15), (20, 12, [9], 9), (5, 12, [], 5)])
def test_the_lso_is_the_oldest_open_or_closing_transaction_else_the_high_watermark(high_watermark, first_open, closing, lso):
    assert partition_core.last_stable_offset(high_watermark, first_open, closing) == lso


def test_replaying_the_stored_batches_rebuilds_what_the_leader_derived():
    leader, replayed = DerivedState(), DerivedState()
    stored = []
    base = 0
    for pid, epoch, seq in ((1, 0, 0), (2, 0, 0), (1, 0, 2)):
        b = batch(pid, epoch, seq, 2)
        encoded = log_core.encode_append(b, base, NOW, "t", CONFIGS, LIMITS)
        partition_core.effect_data(leader, PKEY, pid, epoch, seq, 2, base, encoded.max_timestamp_ms, True, appended_ms=NOW)
        stored.append((base, encoded.value))
        base += 2
    marker, flags = log_core.control_batch(1, 1, 0, common_pb2.CONTROL_TYPE_ABORT, NOW)
    encoded = log_core.encode_internal(marker, base, flags, NOW)
    partition_core.effect_control(leader, PKEY, marker, base, NOW)
    stored.append((base, encoded.value))
    for offset, value in stored:
        partition_core.effect_stored(replayed, PKEY, False, offset, value, appended_ms=NOW)
    assert dict(replayed.producers) == dict(leader.producers) and replayed.aborted == leader.aborted == {1: [(0, 6)]}


def test_expiry_keeps_producers_with_a_transaction_open():
    state = with_open_transaction(pid=1)
    partition_core.effect_data(state, PKEY, 2, 0, 0, 1, 20, NOW, False, appended_ms=NOW)
    assert partition_core.expired_producers(state, NOW + 10_000, 1_000) == [2]


def test_leadership_checks():
    assert code(partition_core.not_leading(WHERE)) == "NOT_LEADER"
    assert code(partition_core.check_enough_replicas(WHERE, 1, 2)) == "NOT_ENOUGH_REPLICAS"
    assert partition_core.check_enough_replicas(WHERE, 2, 2) is None
    assert ErrorCode.Name(partition_core.check_leader_epoch(WHERE, 3, 4).code) == "FENCED_LEADER_EPOCH"
    assert ErrorCode.Name(partition_core.check_leader_epoch(WHERE, 5, 4).code) == "UNKNOWN_LEADER_EPOCH"
    assert partition_core.check_leader_epoch(WHERE, 4, 4) is None


# --- log_core -------------------------------------------------------------------------------


def test_an_append_gets_offsets_and_timestamps_from_its_base():
    b = batch(-1, -1, -1, 3, transactional=False)
    b.records[1].timestamp_ms = NOW - 5
    encoded = log_core.encode_append(b, 40, NOW, "t", CONFIGS, LIMITS)
    header = log_format.decode_header(40, encoded.value)
    assert (header.last_offset, header.record_count, header.max_timestamp_ms, encoded.record_count) == (42, 3, NOW, 3)
    stored = common_pb2.RecordBatch.FromString(log_format.payload_of(encoded.value))
    assert [(r.offset, r.timestamp_ms) for r in stored.records] == [(40, NOW), (41, NOW - 5), (42, NOW)]


def test_an_append_to_a_compressed_topic_is_stored_compressed_and_read_back_with_offsets():
    configs = validation.topic_configs({"compression.type": "gzip"}, 1 << 20)
    encoded = log_core.encode_append(batch(-1, -1, -1, 3, transactional=False), 7, NOW, "t", configs, LIMITS)
    header = log_format.decode_header(7, encoded.value)
    assert header.compression == common_pb2.COMPRESSION_GZIP
    assert [r.offset for r in log_core.records_of(encoded.value)] == [7, 8, 9]


def test_a_bad_record_is_refused_before_anything_is_given():
    b = batch(-1, -1, -1, 1, transactional=False)
    b.records[0].timestamp_ms = -5
    with pytest.raises(TxlogError):
        log_core.encode_append(b, 0, NOW, "t", CONFIGS, LIMITS)


def headers(*spans, timestamp_ms=NOW, stored_bytes=100, transactional=False, producer_id=-1):
    return [log_format.StoredBatchHeader(base, last, timestamp_ms, producer_id, 0,
                                         log_format.FLAG_TRANSACTIONAL if transactional else 0, last - base + 1, stored_bytes)
            for base, last in spans]


def test_retention_deletes_whole_old_or_oversized_batches_never_at_the_lso():
    old = headers((0, 4), (5, 9), timestamp_ms=NOW - 10_000) + headers((10, 14))
    assert log_core.retention_end(old, NOW, 5_000, -1, 300, lso=20) == 10
    assert log_core.retention_end(old, NOW, 5_000, -1, 300, lso=7) == 5  # the batch holding the LSO stays
    assert log_core.retention_end(headers((0, 4), (5, 9), (10, 14)), NOW, -1, 150, 300, lso=20) == 10
    assert log_core.retention_end(old, NOW, -1, -1, 300, lso=20) is None


def test_delete_records_moves_the_log_start_at_most_to_the_lso():
    assert log_core.decide_delete_records(WHERE, 5, lso=8, log_start_offset=2) == MoveLogStart(5)
    assert log_core.decide_delete_records(WHERE, -1, lso=8, log_start_offset=2) == MoveLogStart(8)
    assert log_core.decide_delete_records(WHERE, 2, lso=8, log_start_offset=2) is UNCHANGED
    assert code(log_core.decide_delete_records(WHERE, 9, lso=8, log_start_offset=2)) == "OFFSET_OUT_OF_RANGE"
    assert log_core.batches_below(headers((0, 4), (5, 9), (10, 14)), 7) == headers((0, 4))


def test_a_follower_takes_its_leaders_log_start_within_its_high_watermark():
    assert log_core.follower_log_start(10, high_watermark=6, log_start_offset=2) == 6
    assert log_core.follower_log_start(4, high_watermark=6, log_start_offset=2) == 4
    assert log_core.follower_log_start(1, high_watermark=6, log_start_offset=2) is None


def keyed(base: int, *keys: bytes, producer_id: int = -1, transactional: bool = False):
    b = common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=0, base_sequence=0, is_transactional=transactional,
                               records=[common_pb2.Record(key=k, value=b"x") for k in keys])
    value = log_core.encode_append(b, base, NOW, "t", CONFIGS, LIMITS).value
    return log_format.decode_header(base, value), value


def test_compaction_keeps_the_newest_record_of_each_key_and_drops_aborted_batches():
    stored = [keyed(0, b"a", b"b"), keyed(2, b"a"), keyed(3, b"c", producer_id=4, transactional=True), keyed(4, b"b"),
              keyed(5, b"a")]
    plan = log_core.compaction_plan(stored, lso=10, is_aborted=lambda pid, offset: pid == 4)
    assert sorted(h.base_offset for h in plan.doomed) == [0, 2, 3]
    assert plan.log_start == 4
    plan = log_core.compaction_plan(stored, lso=2, is_aborted=lambda pid, offset: False)
    assert plan.doomed == [] and plan.log_start is None  # nothing below the LSO has a newer copy below it


def marker(base: int, producer_id: int, control_type: int = common_pb2.CONTROL_TYPE_COMMIT, written_ms: int = NOW,
           emptied_ms: int | None = None):
    control, flags = log_core.control_batch(producer_id, 0, 0, control_type, written_ms)
    value = log_core.encode_internal(control, base, flags, written_ms).value
    if emptied_ms is not None:
        value = log_format.emptied_marker(value, emptied_ms)
    return log_format.decode_header(base, value), value


DAY_MS = validation.DELETE_RETENTION_MS_DEFAULT


def offsets(headers) -> list[int]:
    return sorted(h.base_offset for h in headers)


def test_compaction_marks_a_transactions_marker_emptied_once_none_of_its_batches_is_left_and_removes_it_a_retention_later():
    # producer 4 commits a (superseded later) and prepares then commits b (superseded); producer 5 commits c, kept
    def log(emptied_ms=None):
        return [keyed(0, b"a", producer_id=4, transactional=True), marker(1, 4, emptied_ms=emptied_ms),
                keyed(2, b"b", producer_id=4, transactional=True), marker(3, 4, common_pb2.CONTROL_TYPE_PREPARED),
                marker(4, 4, emptied_ms=emptied_ms), keyed(5, b"c", producer_id=5, transactional=True), marker(6, 5),
                keyed(7, b"a", b"b")]
    never = lambda pid, offset: False  # noqa: E731
    # the pass that finds the transactions empty marks their completing markers, however old, and removes none
    plan = log_core.compaction_plan(log(), lso=9, is_aborted=never, now_ms=NOW + 10 * DAY_MS, delete_retention_ms=DAY_MS,
                                    marker_end=9)
    assert offsets(plan.doomed) == [0, 2] and plan.log_start == 1
    assert offsets(h for h, _ in plan.emptied) == [1, 4]  # c's marker is not: c is still there
    emptied = [log_format.decode_header(h.base_offset, log_format.emptied_marker(v, NOW)) for h, v in plan.emptied]
    assert all(h.is_emptied and h.max_timestamp_ms == NOW and h.is_control for h in emptied)
    # a retention after they were marked, below the replicated end, they go with the PREPARED marker before them
    plan = log_core.compaction_plan(log(emptied_ms=NOW), lso=9, is_aborted=never, now_ms=NOW + DAY_MS,
                                    delete_retention_ms=DAY_MS, marker_end=9)
    assert offsets(plan.doomed) == [0, 1, 2, 3, 4] and plan.log_start == 5 and plan.emptied == []
    # not before, and not at or above the replicated end (then the PREPARED one stays too)
    for now_ms, marker_end, gone in ((NOW + DAY_MS - 1, 9, [0, 2]), (NOW + DAY_MS, 4, [0, 1, 2])):
        plan = log_core.compaction_plan(log(emptied_ms=NOW), lso=9, is_aborted=never, now_ms=now_ms,
                                        delete_retention_ms=DAY_MS, marker_end=marker_end)
        assert offsets(plan.doomed) == gone
    # -1 keeps every marker, unmarked, as compaction did before delete.retention.ms
    plan = log_core.compaction_plan(log(emptied_ms=NOW), lso=9, is_aborted=never, now_ms=NOW * 2)
    assert offsets(plan.doomed) == [0, 2] and plan.emptied == []


def test_compaction_keeps_a_marker_whose_transaction_ends_past_the_lso_or_still_has_a_batch():
    # producer 4's aborted batch went in an earlier pass (nothing left before its marker): its marker goes;
    # producer 6's transaction is committed past the LSO, so its batch below it stays, with no marker in view;
    # producer 7 committed a batch with a key nothing supersedes: its marker stays, unmarked
    stored = [keyed(0, b"x", producer_id=6, transactional=True), marker(1, 4, common_pb2.CONTROL_TYPE_ABORT, emptied_ms=NOW),
              keyed(2, b"k", producer_id=7, transactional=True), marker(3, 7), keyed(4, b"x")]
    plan = log_core.compaction_plan(stored, lso=5, is_aborted=lambda pid, offset: False,
                                    now_ms=NOW + DAY_MS, delete_retention_ms=DAY_MS, marker_end=5)
    assert offsets(plan.doomed) == [0, 1] and plan.emptied == []
    assert plan.log_start == 2
