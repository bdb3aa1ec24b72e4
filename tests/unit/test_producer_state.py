"""The idempotent-append rules of docs/design.md, one by one, on the pure core."""

from dataclasses import replace

import pytest

from partition_svc.producer_state import (
    APPEND,
    DUPLICATE_CACHE_BATCHES,
    Duplicate,
    ProducerStateEntry,
    Reject,
    after_append,
    check_batch,
)
from txlog.protocol import SEQUENCE_MODULUS, last_sequence_of
from txlog.protocol.errors import ErrorCode

PID = 42


def appended(entry, epoch, base_sequence, count, base_offset, transactional=False):
    assert check_batch(entry, PID, epoch, base_sequence, count, transactional) == APPEND
    return after_append(entry, PID, epoch, base_sequence, count, base_offset, 1000, transactional)


def code(outcome):
    assert isinstance(outcome, Reject), outcome
    return ErrorCode.Name(outcome.code)


def test_a_new_producer_starts_at_sequence_zero():
    assert check_batch(None, PID, 0, 0, 10, False) == APPEND
    assert code(check_batch(None, PID, 0, 5, 10, False)) == "UNKNOWN_PRODUCER_ID"


def test_the_next_batch_continues_the_sequence():
    entry = appended(None, 0, 0, 10, 0)
    assert entry.last_sequence == 9
    assert check_batch(entry, PID, 0, 10, 5, False) == APPEND
    assert code(check_batch(entry, PID, 0, 11, 5, False)) == "OUT_OF_ORDER_SEQUENCE"


def test_each_of_the_last_five_batches_is_a_duplicate_with_its_original_offsets():
    entry = None
    for i in range(DUPLICATE_CACHE_BATCHES + 2):
        entry = appended(entry, 0, i * 10, 10, 100 + i * 10)
    cached = range(2, DUPLICATE_CACHE_BATCHES + 2)
    for i in cached:
        assert check_batch(entry, PID, 0, i * 10, 10, False) == Duplicate(100 + i * 10, 109 + i * 10)
    for i in (0, 1):  # older than the cache
        assert code(check_batch(entry, PID, 0, i * 10, 10, False)) == "DUPLICATE_SEQUENCE"


def test_a_range_that_matches_a_cached_start_but_not_its_end_is_not_a_duplicate():
    entry = appended(appended(None, 0, 0, 10, 0), 0, 10, 10, 10)
    assert code(check_batch(entry, PID, 0, 10, 5, False)) == "DUPLICATE_SEQUENCE"


def test_an_older_epoch_is_fenced_or_invalid():
    entry = appended(None, 3, 0, 1, 0)
    assert code(check_batch(entry, PID, 2, 1, 1, True)) == "PRODUCER_FENCED"
    assert code(check_batch(entry, PID, 2, 1, 1, False)) == "INVALID_PRODUCER_EPOCH"


def test_a_new_epoch_must_start_at_zero_and_resets_the_cache():
    entry = appended(None, 0, 0, 10, 0)
    assert code(check_batch(entry, PID, 1, 10, 1, False)) == "OUT_OF_ORDER_SEQUENCE"
    bumped = appended(entry, 1, 0, 3, 10)
    assert bumped.producer_epoch == 1 and len(bumped.batches) == 1
    # the old epoch's batch is no longer a duplicate: it is fenced
    assert code(check_batch(bumped, PID, 0, 0, 10, False)) == "INVALID_PRODUCER_EPOCH"


def test_sequences_wrap_after_int32_max():
    start = SEQUENCE_MODULUS - 3
    entry = ProducerStateEntry(PID, 0)
    entry = after_append(entry, PID, 0, start, 3, 0, 1, False)  # last sequence is 2^31 - 1
    assert entry.last_sequence == SEQUENCE_MODULUS - 1
    assert check_batch(entry, PID, 0, 0, 5, False) == APPEND
    entry = after_append(entry, PID, 0, 0, 5, 3, 1, False)
    assert entry.last_sequence == 4
    assert check_batch(entry, PID, 0, start, 3, False) == Duplicate(0, 2)
    assert code(check_batch(entry, PID, 0, SEQUENCE_MODULUS - 10, 1, False)) == "DUPLICATE_SEQUENCE"
    assert last_sequence_of(SEQUENCE_MODULUS - 1, 2) == 0


def test_a_transactional_batch_opens_a_transaction_at_its_first_offset():
    entry = appended(None, 0, 0, 2, 7, transactional=True)
    assert entry.current_txn_first_offset == 7
    entry = appended(entry, 0, 2, 2, 9, transactional=True)
    assert entry.current_txn_first_offset == 7


@pytest.mark.parametrize("transactional", [False, True])
def test_state_round_trips_through_its_stored_form(transactional):
    entry = appended(appended(None, 1, 0, 2, 7, transactional), 1, 2, 3, 9, transactional)
    assert ProducerStateEntry.from_json(entry.to_json()) == entry


def test_a_batch_straddling_the_last_sequence_is_out_of_order_not_a_duplicate():
    entry = appended(None, 0, 0, 14, 0)  # sequences 0..13
    assert code(check_batch(entry, PID, 0, 13, 2, False)) == "OUT_OF_ORDER_SEQUENCE"  # 14 was never appended
    assert code(check_batch(entry, PID, 0, 12, 2, True)) == "DUPLICATE_SEQUENCE"  # 12..13 lie wholly behind


def test_a_producer_with_a_transaction_open_sends_only_transactional_batches_of_its_epoch():
    entry = appended(None, 3, 0, 2, 100, transactional=True)
    assert entry.has_open_transaction
    assert code(check_batch(entry, PID, 3, 2, 1, False)) == "INVALID_TXN_STATE"  # a plain batch inside the transaction
    assert code(check_batch(entry, PID, 4, 0, 1, True)) == "INVALID_TXN_STATE"   # a newer epoch before the marker
    assert code(check_batch(entry, PID, 4, 0, 1, False)) == "INVALID_TXN_STATE"
    assert code(check_batch(entry, PID, 2, 0, 1, True)) == "PRODUCER_FENCED"     # an older epoch is fenced first
    assert check_batch(entry, PID, 3, 2, 1, True) == APPEND


def test_a_prepared_transaction_takes_no_more_batches_of_its_epoch_but_answers_duplicates():
    entry = replace(appended(None, 3, 0, 2, 100, transactional=True), txn_prepared=True)
    assert code(check_batch(entry, PID, 3, 2, 1, True)) == "INVALID_TXN_STATE"
    assert check_batch(entry, PID, 3, 0, 2, True) == Duplicate(100, 101)  # a retry of a batch written before the seal
    assert ProducerStateEntry.from_json(entry.to_json()).txn_prepared
    sealed_without_data = ProducerStateEntry(PID, 5, txn_prepared=True)
    assert code(check_batch(sealed_without_data, PID, 5, 0, 1, True)) == "INVALID_TXN_STATE"


def test_snapshots_written_before_the_seal_existed_still_load():
    raw = b'{"pid":42,"epoch":1,"batches":[],"ts":5,"coord_epoch":0,"txn_first":-1}'
    assert ProducerStateEntry.from_json(raw) == ProducerStateEntry(PID, 1, last_timestamp_ms=5, coordinator_epoch=0)


def test_a_producer_expires_only_after_the_window_by_the_later_of_the_two_clocks():
    entry = after_append(None, PID, 0, 0, 1, 0, timestamp_ms=1_000, is_transactional=False, appended_ms=50_000)
    assert not entry.expired(now_ms=50_000 + 9_999, expiration_ms=10_000)
    assert entry.expired(now_ms=50_000 + 10_000, expiration_ms=10_000)
    # A producer stamping old event times does not expire by them: its duplicates stay detected.
    republisher = after_append(None, PID, 0, 0, 1, 0, timestamp_ms=1, is_transactional=False, appended_ms=50_000)
    assert not republisher.expired(now_ms=50_001, expiration_ms=10_000)
    assert ProducerStateEntry.from_json(entry.to_json()).appended_ms == 50_000


def test_a_producer_with_a_transaction_open_or_prepared_never_expires():
    opened = after_append(None, PID, 0, 0, 1, 7, timestamp_ms=1, is_transactional=True, appended_ms=1)
    assert not opened.expired(now_ms=10 ** 15, expiration_ms=1)
    assert not ProducerStateEntry(PID, 0, txn_prepared=True).expired(now_ms=10 ** 15, expiration_ms=1)


def test_an_expired_producer_is_a_new_one_its_retries_past_zero_are_unknown():
    # What the partition answers once the entry is gone: the SDK then takes a new epoch (KIP-360).
    assert code(check_batch(None, PID, 0, 5, 1, False)) == "UNKNOWN_PRODUCER_ID"
    assert check_batch(None, PID, 0, 0, 1, False) == APPEND
