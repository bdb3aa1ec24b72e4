"""The idempotent producer's per-partition state machine: sequence numbers, the
in-flight window, the order of re-sends, held batches and the reset."""

import pytest

from txlog.accumulator import BatchState, ProducerBatch
from txlog.protocol import SEQUENCE_MODULUS
from txlog.sequences import IllegalStateError, PartitionSequences
from txlog.structs import TopicPartition, encode_record

TP = TopicPartition("t", 0)
PID, EPOCH = 7, 0


def _batch(records=1, created_ms=0.0):
    batch = ProducerBatch(TP, created_ms)
    for _ in range(records):
        batch.add(encode_record(None, b"v", None, None)[0])
    return batch


def _sent(sequences, *record_counts):
    batches = []
    for count in record_counts:
        batch = _batch(count)
        sequences.assign(batch, PID, EPOCH)
        batches.append(batch)
    return batches


def test_sequences_are_contiguous_per_partition_and_wrap_after_int32_max():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b = _sent(sequences, 3, 2)
    assert (a.base_sequence, b.base_sequence, sequences.next_sequence) == (0, 3, 5)
    assert (a.producer_id, a.producer_epoch) == (PID, EPOCH)
    sequences.on_acked(a)
    sequences.on_acked(b)
    sequences.next_sequence = SEQUENCE_MODULUS - 2
    (c,) = _sent(sequences, 3)
    assert c.base_sequence == SEQUENCE_MODULUS - 2
    assert sequences.next_sequence == 1  # 2^31-2, 2^31-1, 0 -> next is 1


def test_at_most_max_in_flight_batches_per_partition():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=2)
    first, _ = _sent(sequences, 1, 1)
    assert not sequences.can_send_new()
    with pytest.raises(IllegalStateError):
        sequences.assign(_batch(), PID, EPOCH)
    sequences.on_acked(first)
    assert sequences.can_send_new()


def test_retries_go_out_one_at_a_time_in_sequence_order():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b, c = _sent(sequences, 1, 1, 1)
    sequences.on_retriable(b, now_ms=0, backoff_ms=10)
    assert sequences.next_resend(now_ms=100) is None  # a is still unresolved: b waits
    assert not sequences.can_send_new()  # nothing new while a retry is pending
    sequences.on_retriable(a, now_ms=0, backoff_ms=10)
    assert sequences.next_resend(now_ms=5) is None  # back-off
    assert sequences.next_resend(now_ms=10) is a
    sequences.mark_resent(a)
    assert sequences.next_resend(now_ms=100) is None  # b waits for a's answer
    with pytest.raises(IllegalStateError):
        sequences.mark_resent(b)
    sequences.on_acked(a)
    assert sequences.next_resend(now_ms=100) is b
    sequences.mark_resent(b)
    assert (b.attempts, b.base_sequence) == (2, 1)  # same sequence on every attempt
    sequences.on_acked(b)
    sequences.on_acked(c)
    assert sequences.can_send_new() and not sequences.unresolved


def test_out_of_order_behind_an_unresolved_batch_is_retried_not_held():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b = _sent(sequences, 1, 1)
    sequences.on_rejected(b, now_ms=0, backoff_ms=0)
    assert b.state is BatchState.AWAITING_RETRY and not sequences.broken
    sequences.on_acked(a)
    assert sequences.next_resend(now_ms=0) is b


def test_out_of_order_with_nothing_unresolved_before_it_holds_the_batch_and_breaks_the_partition():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b, c = _sent(sequences, 1, 1, 1)
    sequences.on_retriable(c, now_ms=0, backoff_ms=0)
    sequences.on_acked(a)
    sequences.on_rejected(b, now_ms=0, backoff_ms=0)
    assert sequences.broken
    assert (b.state, c.state) == (BatchState.HELD, BatchState.HELD)  # c can never land behind b's gap
    assert sequences.quiescent() and not sequences.can_send_new()


def test_a_failed_unappended_batch_holds_the_batches_behind_it():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b, c = _sent(sequences, 1, 1, 1)
    sequences.on_retriable(b, now_ms=0, backoff_ms=0)
    sequences.on_failed(a, maybe_appended=False)
    assert sequences.broken and b.state is BatchState.HELD
    sequences.on_retriable(c, now_ms=0, backoff_ms=0)  # c's answer was lost: still never appended
    assert c.state is BatchState.HELD


def test_a_batch_that_may_have_been_appended_keeps_later_retries_alive():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b = _sent(sequences, 1, 1)
    sequences.on_retriable(b, now_ms=0, backoff_ms=0)
    sequences.on_failed(a, maybe_appended=True)  # its outcome is unknown: b may still land
    assert sequences.broken and b.state is BatchState.AWAITING_RETRY
    assert sequences.next_resend(now_ms=0) is b


def test_reset_gives_held_batches_new_sequences_from_zero_in_their_old_order():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b, c = _sent(sequences, 2, 3, 1)
    sequences.on_acked(a)
    sequences.on_rejected(b, now_ms=0, backoff_ms=0)
    with pytest.raises(IllegalStateError):
        sequences.reset(PID, EPOCH + 1)  # c is still in flight
    sequences.on_rejected(c, now_ms=0, backoff_ms=0)
    sequences.reset(PID, EPOCH + 1)
    assert not sequences.broken
    assert [(x.base_sequence, x.producer_epoch, x.state) for x in (b, c)] == [
        (0, EPOCH + 1, BatchState.AWAITING_RETRY), (3, EPOCH + 1, BatchState.AWAITING_RETRY)]
    assert sequences.next_sequence == 4
    assert sequences.next_resend(now_ms=0) is b


def test_expire_fails_waiting_batches_past_the_delivery_timeout_with_their_outcome():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    a, b = _sent(sequences, 1, 1)
    a.created_ms = b.created_ms = 0
    sequences.on_retriable(a, now_ms=0, backoff_ms=0)
    assert sequences.expire(now_ms=50, delivery_timeout_ms=100) == []
    assert sequences.expire(now_ms=100, delivery_timeout_ms=100) == [(a, True)]
    assert b.state is BatchState.IN_FLIGHT  # in flight: its answer decides
    assert sequences.broken


def test_illegal_transitions_raise():
    sequences = PartitionSequences(TP, idempotent=True, max_in_flight=5)
    (a,) = _sent(sequences, 1)
    sequences.on_acked(a)
    with pytest.raises(IllegalStateError):
        sequences.on_acked(a)
    with pytest.raises(IllegalStateError):
        sequences.on_retriable(_batch(), now_ms=0, backoff_ms=0)  # never sent here
    plain = PartitionSequences(TP, idempotent=False, max_in_flight=5)
    (b,) = _sent(plain, 1)
    with pytest.raises(IllegalStateError):
        plain.on_rejected(b, now_ms=0, backoff_ms=0)


def test_without_idempotence_batches_carry_no_sequence_and_retry_independently():
    sequences = PartitionSequences(TP, idempotent=False, max_in_flight=5)
    a, b = _sent(sequences, 1, 1)
    assert (a.producer_id, a.base_sequence) == (-1, -1)
    sequences.on_retriable(b, now_ms=0, backoff_ms=0)
    assert sequences.next_resend(now_ms=0) is b  # no ordering between retries without sequences
    sequences.on_failed(a, maybe_appended=False)
    assert not sequences.broken
