"""The transactional producer's state machine (txlog/transactions.py),
pure: every call in every state as the one table says, every transition legal
or not, and the bookkeeping of partitions and sends."""

import threading

import pytest

from txlog.errors import (
    AbortableError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition
from txlog.transactions import (
    CALLS,
    VALID_PREVIOUS_STATES,
    Call,
    IllegalStateError,
    TransactionManager,
    TxnState,
    Verdict,
)

E = ErrorCode.Value
S = TxnState
TP = TopicPartition("t", 0)
FENCED = ProducerFencedError(E("PRODUCER_FENCED"), "fenced in a test")
ABORTABLE = InvalidTxnStateError(E("INVALID_TXN_STATE"), "refused in a test")


def manager_in(state: TxnState, implicit_partition_adds: bool = False) -> TransactionManager:
    """A manager brought to ``state`` by legal moves only (explicit partition adds unless asked)."""
    txn = TransactionManager("tid", 60_000, implicit_partition_adds)
    if state is S.UNINITIALIZED:
        return txn
    txn.start(Call.INIT)
    if state is S.INITIALIZING:
        return txn
    if state is S.FATAL_ERROR:
        txn.on_fatal_error(FENCED)
        return txn
    txn.initialized(7, 0)
    if state is S.READY:
        return txn
    txn.start(Call.BEGIN)
    if state is S.COMMITTING:
        txn.start(Call.COMMIT)
    elif state is S.ABORTING:
        txn.start(Call.ABORT)
    elif state is S.ABORTABLE_ERROR:
        txn.on_abortable_error(ABORTABLE)
    elif state in (S.PREPARING, S.PREPARED):
        txn.start(Call.PREPARE)
        if state is S.PREPARED:
            txn.operation.set_result(None)
            txn.prepared(("tid", 7, 0))
    return txn


def test_the_call_table_covers_every_call_in_every_state():
    assert set(CALLS) == set(TxnState)
    for state, calls in CALLS.items():
        assert set(calls) == set(Call), state


@pytest.mark.parametrize("state", list(TxnState))
@pytest.mark.parametrize("call", list(Call))
def test_every_call_in_every_state_does_what_the_table_says(state, call):
    txn = manager_in(state)
    assert txn.state is state
    expected = CALLS[state][call]
    if isinstance(expected, str):
        with pytest.raises(TransactionStateError) as caught:
            txn.start(call)
        assert state.name in str(caught.value) and call.value in str(caught.value)
        assert expected in str(caught.value)
        assert txn.state is state  # a refused call changes nothing
    elif expected is Verdict.RAISE:
        with pytest.raises(Exception) as caught:
            txn.start(call)
        if state is S.FATAL_ERROR:
            assert caught.value is FENCED
        else:
            assert isinstance(caught.value, TransactionAbortableError)
            assert caught.value.__cause__ is ABORTABLE and "abort_transaction()" in str(caught.value)
        assert txn.state is state
    elif isinstance(expected, Verdict):
        assert txn.start(call) is expected
        assert txn.state is state
    else:
        assert txn.start(call) is Verdict.STARTED
        assert txn.state is expected


def test_commit_without_begin_says_to_begin_first():
    txn = manager_in(S.READY)
    with pytest.raises(TransactionStateError, match=r"no transaction is open: call begin_transaction\(\) first"):
        txn.start(Call.COMMIT)


def test_calls_before_init_say_to_call_init_transactions():
    txn = manager_in(S.UNINITIALIZED)
    for call in (Call.BEGIN, Call.SEND, Call.COMMIT, Call.ABORT, Call.SEND_OFFSETS):
        with pytest.raises(TransactionStateError, match=r"call it once after creating the producer"):
            txn.start(call)


def test_operations_that_move_the_state_get_a_fresh_future_and_resume_waits_for_the_same():
    txn = manager_in(S.IN_TRANSACTION)
    assert txn.start(Call.COMMIT) is Verdict.STARTED
    first = txn.operation
    assert first is not None and not first.done()
    assert txn.start(Call.COMMIT) is Verdict.RESUME
    assert txn.operation is first


@pytest.mark.parametrize("to_state", list(TxnState))
@pytest.mark.parametrize("from_state", list(TxnState))
def test_every_transition_is_legal_exactly_when_the_table_lists_it(from_state, to_state):
    txn = TransactionManager("tid", 60_000)
    txn._state = from_state  # white box: put the machine anywhere, then try one edge
    if from_state in VALID_PREVIOUS_STATES[to_state]:
        txn.transition_to(to_state)
        assert txn.state is to_state
    else:
        with pytest.raises(IllegalStateError, match=f"{from_state.name} -> {to_state.name}"):
            txn.transition_to(to_state)
        assert txn.state is from_state


def test_the_first_abortable_error_counts_and_aborting_ignores_later_ones():
    txn = manager_in(S.IN_TRANSACTION)
    first = AbortableError(E("RECORD_TOO_LARGE"), "first")
    txn.on_abortable_error(first)
    txn.on_abortable_error(AbortableError(E("INVALID_RECORD"), "second"))
    assert txn.state is S.ABORTABLE_ERROR and txn.abortable_error is first
    txn.start(Call.ABORT)
    txn.on_abortable_error(AbortableError(E("INVALID_RECORD"), "late"))
    assert txn.state is S.ABORTING
    assert txn.completed(7, 1)
    assert txn.state is S.READY and txn.abortable_error is None and txn.producer_epoch == 1


def test_an_abortable_error_outside_a_transaction_changes_nothing():
    txn = manager_in(S.READY)
    txn.on_abortable_error(ABORTABLE)
    assert txn.state is S.READY


@pytest.mark.parametrize("state", [s for s in TxnState if s is not S.UNINITIALIZED])
def test_fencing_makes_every_state_fatal_and_every_later_call_raises_it(state):
    txn = manager_in(state)
    txn.on_fatal_error(FENCED)
    txn.on_fatal_error(ProducerFencedError(E("PRODUCER_FENCED"), "a second one"))
    assert txn.state is S.FATAL_ERROR and txn.fatal_error is FENCED
    for call in Call:
        with pytest.raises(ProducerFencedError) as caught:
            txn.start(call)
        assert caught.value is FENCED
    assert not txn.completed(7, 5)  # an operation finishing after the fence changes nothing
    assert txn.state is S.FATAL_ERROR


def test_coordinator_errors_sort_into_fatal_and_abortable():
    txn = manager_in(S.IN_TRANSACTION)
    txn.on_coordinator_error(ABORTABLE)
    assert txn.state is S.ABORTABLE_ERROR
    txn = manager_in(S.IN_TRANSACTION)
    txn.on_coordinator_error(FENCED)
    assert txn.state is S.FATAL_ERROR


def test_a_partition_takes_batches_only_once_added_and_forgets_it_at_the_end():
    txn = manager_in(S.IN_TRANSACTION)
    assert txn.maybe_add_partition(TP) and not txn.maybe_add_partition(TP)
    assert not txn.may_send(TP) and txn.has_pending_partitions() and not txn.coordinator_touched
    assert txn.take_pending_partitions() == [TP]
    assert not txn.has_pending_partitions() and txn.coordinator_touched and not txn.may_send(TP)
    assert not txn.maybe_add_partition(TP)  # being added
    txn.partitions_added([TP])
    assert txn.may_send(TP) and txn.partitions == {TP}
    txn.start(Call.COMMIT)
    assert txn.may_send(TP)  # a commit still sends what is queued
    txn.completed(7, 1)
    assert not txn.may_send(TP) and txn.partitions == frozenset() and not txn.coordinator_touched


def test_with_implicit_adds_a_partition_takes_batches_at_once_and_the_coordinator_counts_as_touched():
    txn = manager_in(S.IN_TRANSACTION, implicit_partition_adds=True)
    assert not txn.maybe_add_partition(TP)  # nothing for the sender to add: the leader adds it
    assert txn.may_send(TP) and not txn.has_pending_partitions() and txn.coordinator_touched and txn.partitions == {TP}
    txn.start(Call.COMMIT)
    txn.completed(7, 1)
    assert not txn.may_send(TP) and txn.partitions == frozenset() and not txn.coordinator_touched
    failed = manager_in(S.IN_TRANSACTION, implicit_partition_adds=True)
    failed.on_abortable_error(ABORTABLE)
    assert not failed.maybe_add_partition(TP) and not failed.may_send(TP)


def test_no_partition_is_added_or_sent_once_the_transaction_failed():
    txn = manager_in(S.IN_TRANSACTION)
    txn.maybe_add_partition(TP)
    txn.on_abortable_error(ABORTABLE)
    assert not txn.has_pending_partitions() and txn.take_pending_partitions() == []
    assert not txn.may_send(TP)


def test_commit_waits_for_sends_that_passed_their_state_check():
    txn = manager_in(S.IN_TRANSACTION)
    txn.enter_send()
    txn.start(Call.COMMIT)
    with pytest.raises(TransactionStateError, match="being committed"):
        txn.enter_send()  # later sends are refused
    assert not txn.wait_sends_done(timeout_s=0.01)
    threading.Timer(0.05, txn.exit_send).start()
    assert txn.wait_sends_done(timeout_s=5)


def test_error_unless_names_what_an_operation_must_raise():
    txn = manager_in(S.IN_TRANSACTION)
    txn.start(Call.COMMIT)
    assert txn.error_unless(S.COMMITTING) is None
    txn.on_abortable_error(ABORTABLE)
    error = txn.error_unless(S.COMMITTING)
    assert isinstance(error, TransactionAbortableError) and error.__cause__ is ABORTABLE
    txn.on_fatal_error(FENCED)
    assert txn.error_unless(S.COMMITTING) is FENCED


def test_a_prepare_keeps_its_metadata_and_is_resumed_only_with_the_same_bytes():
    txn = manager_in(S.IN_TRANSACTION)
    assert txn.start(Call.PREPARE, b"db-tx-7") is Verdict.STARTED and txn.prepare_metadata == b"db-tx-7"
    with pytest.raises(ValueError, match="other metadata"):
        txn.start(Call.PREPARE, b"db-tx-8")
    assert txn.start(Call.PREPARE, b"db-tx-7") is Verdict.RESUME and txn.state is S.PREPARING
