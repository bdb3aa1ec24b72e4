"""The coordinator's state machine: every legal and illegal edge, two-phase transitions."""

import itertools
import json

import pytest

from coordinator_svc.transaction_state import (
    PRODUCER_EPOCH_MAX,
    VALID_PREVIOUS_STATES,
    IllegalStateError,
    TransactionMetadata,
    TransactionRecord,
    TransactionState,
    abandon_transition,
    bumped_epoch,
    complete_transition,
    prepare_transition,
)

S = TransactionState
ALL_EDGES = list(itertools.product(S, S))


def meta_in(state):
    return TransactionMetadata("tid", producer_id=7, producer_epoch=3, txn_timeout_ms=60_000, state=state)


@pytest.mark.parametrize("source, target", [(a, b) for a, b in ALL_EDGES if a in VALID_PREVIOUS_STATES[b]])
def test_every_legal_transition_prepares_then_completes(source, target):
    meta = meta_in(source)
    record = prepare_transition(meta, target, producer_epoch=4)
    assert meta.state is source and meta.pending_state is target  # nothing applied before the write
    complete_transition(meta, record)
    assert (meta.state, meta.producer_epoch, meta.pending_state) == (target, 4, None)


@pytest.mark.parametrize("source, target", [(a, b) for a, b in ALL_EDGES if a not in VALID_PREVIOUS_STATES[b]])
def test_every_illegal_transition_raises_and_changes_nothing(source, target):
    meta = meta_in(source)
    with pytest.raises(IllegalStateError):
        prepare_transition(meta, target)
    assert meta.state is source and meta.pending_state is None


def test_a_second_transition_while_one_is_pending_is_refused():
    meta = meta_in(S.ONGOING)
    prepare_transition(meta, S.PREPARE_COMMIT)
    with pytest.raises(IllegalStateError):
        prepare_transition(meta, S.PREPARE_ABORT)


def test_an_abandoned_transition_leaves_the_state_as_it_was():
    meta = meta_in(S.ONGOING)
    prepare_transition(meta, S.PREPARE_COMMIT, producer_epoch=4)
    abandon_transition(meta)
    assert (meta.state, meta.producer_epoch, meta.pending_state) == (S.ONGOING, 3, None)
    prepare_transition(meta, S.PREPARE_ABORT)  # free again


def test_completing_a_record_that_is_not_pending_is_a_bug():
    meta = meta_in(S.ONGOING)
    record = prepare_transition(meta, S.PREPARE_COMMIT)
    other = meta_in(S.ONGOING)
    with pytest.raises(IllegalStateError):
        complete_transition(other, record)


def test_records_round_trip_through_the_log_format():
    meta = meta_in(S.ONGOING)
    record = prepare_transition(meta, S.PREPARE_COMMIT, partitions=frozenset({("a", 0), ("b", 3)}), txn_start_ms=5)
    assert TransactionRecord.decode("tid", record.encode()) == record
    assert TransactionMetadata.from_record(record).record() == record


def test_a_prepared_record_with_its_metadata_and_check_count_round_trips():
    meta = meta_in(S.PREPARED)
    record = prepare_transition(meta, S.PREPARED, prepared_ms=1_000, prepared_timeout_ms=60_000,
                                prepare_metadata=b"\x00db-tx-41\xff", checks_done=2, last_check_ms=7_000)
    assert TransactionRecord.decode("tid", record.encode()) == record
    assert TransactionMetadata.from_record(record).record() == record
    complete_transition(meta, record)
    assert (meta.prepare_metadata, meta.checks_done, meta.last_check_ms) == (b"\x00db-tx-41\xff", 2, 7_000)


def test_a_version_2_record_written_before_the_check_back_reads_as_never_checked():
    old = (b'{"version":2,"pid":7,"prev_pid":-1,"epoch":3,"last_epoch":-1,"timeout_ms":60000,"state":"Prepared",'
           b'"partitions":[["a",0]],"start_ms":5,"update_ms":9,"prepared_ms":9,"prepared_timeout_ms":60000}')
    record = TransactionRecord.decode("tid", old)
    assert (record.state, record.prepared_ms, record.partitions) == (S.PREPARED, 9, frozenset({("a", 0)}))
    assert (record.prepare_metadata, record.checks_done, record.last_check_ms) == (b"", 0, -1)
    # and a record with none of them writes none of their keys: it reads the same in a version that lacks them
    assert TransactionRecord.decode("tid", record.encode()) == record
    assert not {"prepare_metadata", "checks", "last_check_ms"} & set(json.loads(record.encode()))


def test_epochs_bump_until_exhausted():
    assert bumped_epoch(7, 3) == (7, 4)
    assert bumped_epoch(7, PRODUCER_EPOCH_MAX - 2) == (7, PRODUCER_EPOCH_MAX - 1)
    assert bumped_epoch(7, PRODUCER_EPOCH_MAX - 1) is None


def test_a_new_transaction_starts_from_a_complete_state_or_from_a_decision_whose_completion_it_carries():
    starts = {s for s in S if s.is_complete}
    folded = {S.PREPARE_COMMIT, S.PREPARE_ABORT}  # transaction_core.decide_completion_into_next
    assert starts | folded == VALID_PREVIOUS_STATES[S.ONGOING] - {S.ONGOING}


def test_markers_carry_the_bumped_epoch_or_the_old_id_at_the_last_epoch_after_exhaustion():
    from coordinator_svc.transaction_state import is_retried_end, marker_producer

    normal = TransactionMetadata("tid", producer_id=7, producer_epoch=4, txn_timeout_ms=1, state=S.PREPARE_COMMIT, last_producer_epoch=3)
    assert marker_producer(normal) == (7, 4)
    assert is_retried_end(normal, 7, 3) and not is_retried_end(normal, 7, 4) and not is_retried_end(normal, 8, 3)
    exhausted = TransactionMetadata(
        "tid", producer_id=9, producer_epoch=0, txn_timeout_ms=1, state=S.PREPARE_COMMIT,
        previous_producer_id=7, last_producer_epoch=PRODUCER_EPOCH_MAX - 1,
    )
    assert marker_producer(exhausted) == (7, PRODUCER_EPOCH_MAX)
    assert is_retried_end(exhausted, 7, PRODUCER_EPOCH_MAX - 1)
    assert not is_retried_end(exhausted, 9, PRODUCER_EPOCH_MAX - 1)
