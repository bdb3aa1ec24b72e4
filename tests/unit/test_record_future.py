"""RecordFuture and a batch's settling (accumulator.py): one condition shared
by many records' futures, resolved under one acquisition, must still behave
as concurrent.futures.Future does for every way a caller waits on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txlog.accumulator import ProducerBatch, RecordAccumulator, RecordFuture
from txlog.structs import RecordMetadata, TopicPartition, encode_record
from txlog.v1 import common_pb2

TP = TopicPartition("t", 3)


def batch_of(count: int, condition: threading.Condition) -> tuple[ProducerBatch, list[RecordFuture]]:
    batch = ProducerBatch(TP, 0.0, condition=condition)
    futures = []
    for i in range(count):
        timestamp_ms = 1000 + i if i % 2 else 0
        futures.append(batch.add(encode_record(None, b"v", None, timestamp_ms or None)[0], timestamp_ms))
    return batch, futures


def test_a_completed_batch_gives_each_record_its_offset_and_timestamp():
    condition = threading.Condition()
    batch, futures = batch_of(3, condition)
    assert [f.running() for f in futures] == [True] * 3 and not futures[0].cancel()
    batch.complete(40, log_append_time_ms=777)
    assert [f.result(timeout=0) for f in futures] == [
        RecordMetadata("t", 3, 40, 777), RecordMetadata("t", 3, 41, 1001), RecordMetadata("t", 3, 42, 777)]
    assert batch.done.done()


def test_waiters_of_every_kind_wake_callbacks_run_once_and_failures_reach_all():
    condition = threading.Condition()
    (first, first_futures), (second, second_futures) = batch_of(2, condition), batch_of(2, condition)
    called = []
    first_futures[0].add_done_callback(lambda f: called.append(f.result()))
    blocked = concurrent.futures.ThreadPoolExecutor(2)
    result_waiter = blocked.submit(first_futures[1].result, 30)
    wait_all = blocked.submit(concurrent.futures.wait, first_futures + second_futures, 30)
    wrapped = asyncio.new_event_loop()
    try:
        async def awaited():
            return await asyncio.wrap_future(second_futures[1])

        task = wrapped.create_task(awaited())
        first.complete(0)
        assert result_waiter.result(30).offset == 1
        assert called == [RecordMetadata("t", 3, 0, -1)]
        error = RuntimeError("the partition refused the batch")
        second.fail(error)
        done, not_done = wait_all.result(30)
        assert len(done) == 4 and not not_done
        with pytest.raises(RuntimeError):
            wrapped.run_until_complete(task)
        assert [f.exception(0) for f in second_futures] == [error, error]
        assert sorted(f.result().offset for f in concurrent.futures.as_completed(first_futures, timeout=5)) == [0, 1]
        first.complete(9)  # settled twice (a late answer): the first outcome stays
        assert [f.result().offset for f in first_futures] == [0, 1] and len(called) == 1
    finally:
        wrapped.close()
        blocked.shutdown()


def test_a_future_resolved_on_its_own_keeps_its_outcome_when_its_batch_settles():
    batch, futures = batch_of(3, threading.Condition())
    mine = RuntimeError("resolved by its holder")
    futures[1].set_exception(mine)
    assert futures[1].done() and not futures[0].done()
    batch.complete(5)
    assert futures[1].exception(0) is mine
    assert [futures[0].result(0).offset, futures[2].result(0).offset] == [5, 7]
    with pytest.raises(concurrent.futures.InvalidStateError):
        futures[0].set_result(None)


def test_a_failed_batch_fails_every_future_and_each_callback_runs_once():
    batch, futures = batch_of(4, threading.Condition())
    calls = []
    for index, future in enumerate(futures[:2]):
        future.add_done_callback(lambda f, index=index: calls.append((index, type(f.exception()).__name__)))
    error = ValueError("INVALID_RECORD")
    batch.fail(error)
    batch.fail(RuntimeError("a second outcome"))
    batch.complete(0)
    futures[3].add_done_callback(lambda f: calls.append((3, type(f.exception()).__name__)))  # after: at once
    assert calls == [(0, "ValueError"), (1, "ValueError"), (3, "ValueError")]
    assert all(f.exception(0) is error for f in futures)
    with pytest.raises(ValueError):
        futures[2].result(0)


def test_acks_without_offsets_give_minus_one_and_the_append_time_when_no_timestamp():
    batch, futures = batch_of(2, threading.Condition())
    batch.complete(-1, log_append_time_ms=-1)
    assert [f.result(0) for f in futures] == [RecordMetadata("t", 3, -1, -1), RecordMetadata("t", 3, -1, 1001)]


class EnteredWaitCondition(threading.Condition):
    """A Condition that says (``entered``, a semaphore released per call) each
    time a thread starts waiting on it: a test knows a waiter is parked in
    ``wait`` -- and, once it can take the condition, that the waiter released
    it inside ``wait`` and will be woken by a notify_all -- without sleeping."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Semaphore(0)
        self.timeouts: list[float | None] = []  # what each wait was given

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        self.entered.release()
        return super().wait(timeout)


def start_waiter(call, condition: EnteredWaitCondition) -> tuple[threading.Thread, list]:
    """Runs ``call`` in a thread; the list gets ("returned", value) or ("raised", error).
    Its end also releases ``condition.entered``: who waits for a waiter to wait
    again learns at once when it returned instead."""
    outcome = []

    def run():
        try:
            outcome.append(("returned", call()))
        except BaseException as error:  # noqa: BLE001 -- the test asserts on what was raised
            outcome.append(("raised", error))
        finally:
            condition.entered.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_futures_of_two_partitions_share_one_condition():
    accumulator = RecordAccumulator(batch_size_bytes=1 << 20, linger_ms=0, buffer_memory_bytes=1 << 20)
    a, _ = accumulator.append(TopicPartition("t", 0), b"a", 0, 0.0)
    b, _ = accumulator.append(TopicPartition("t", 1), b"b", 0, 0.0)
    assert a._condition is b._condition  # so settling one partition's batch wakes the waiters of the other


def test_a_waiter_is_not_woken_by_another_batch_settling_on_the_shared_condition():
    condition = EnteredWaitCondition()
    (batch_a, futures_a), (batch_b, futures_b) = batch_of(2, condition), batch_of(1, condition)
    waiters = [start_waiter(lambda: futures_a[1].result(timeout=30), condition),
               start_waiter(lambda: futures_a[1].exception(timeout=30), condition),
               start_waiter(lambda: futures_a[0].result(), condition)]  # no timeout: must never time out
    try:
        for _ in waiters:
            assert condition.entered.acquire(timeout=30), "a waiter never started waiting"
        batch_b.complete(100)  # takes the condition: every waiter is inside wait(), and is notified
        assert futures_b[0].result(0).offset == 100
        for _ in waiters:  # each was woken by B's settle and waits again (or returned: the bug)
            assert condition.entered.acquire(timeout=30)
        with condition:  # (parked again, or returned)
            assert [outcome for _, outcome in waiters] == [[], [], []]
            assert all(thread.is_alive() for thread, _ in waiters)
        batch_a.complete(40, log_append_time_ms=777)
        for thread, _ in waiters:
            thread.join(30)
        assert [outcome for _, outcome in waiters] == [
            [("returned", RecordMetadata("t", 3, 41, 1001))], [("returned", None)],
            [("returned", RecordMetadata("t", 3, 40, 777))]]
    finally:
        batch_a.fail(RuntimeError("test over"))  # (a no-op once completed) frees waiters left behind


def test_a_waiter_of_a_failing_batch_gets_its_error_not_a_timeout_when_another_settles():
    condition = EnteredWaitCondition()
    (batch_a, futures_a), (batch_b, _) = batch_of(1, condition), batch_of(1, condition)
    error = ValueError("INVALID_RECORD")
    waiter, outcome = start_waiter(lambda: futures_a[0].result(timeout=30), condition)
    try:
        assert condition.entered.acquire(timeout=30)
        batch_b.fail(RuntimeError("another batch"))
        assert condition.entered.acquire(timeout=30)  # waits again (or returned)
        with condition:
            assert outcome == [] and waiter.is_alive()
        batch_a.fail(error)
        waiter.join(30)
        assert outcome == [("raised", error)]
    finally:
        batch_a.fail(error)


@pytest.mark.parametrize("method", ["result", "exception"])
def test_an_unsettled_future_times_out_after_its_timeout(method):
    _, futures = batch_of(1, threading.Condition())
    started = time.monotonic()
    with pytest.raises(concurrent.futures.TimeoutError):
        getattr(futures[0], method)(timeout=0.05)
    assert time.monotonic() - started >= 0.05  # it did wait (a slower machine only waits longer)
    with pytest.raises(concurrent.futures.TimeoutError):
        getattr(futures[0], method)(timeout=0)
    with pytest.raises(concurrent.futures.TimeoutError):
        getattr(futures[0], method)(timeout=-1)


def test_the_timeout_counts_from_the_call_while_other_batches_settle():
    condition = EnteredWaitCondition()
    (_, futures_a), (batch_b, _), (batch_c, _) = batch_of(1, condition), batch_of(1, condition), batch_of(1, condition)
    timeout_s = 0.3
    started = time.monotonic()
    waiter, outcome = start_waiter(lambda: futures_a[0].result(timeout=timeout_s), condition)
    assert condition.entered.acquire(timeout=30)
    batch_b.complete(0)
    assert condition.entered.acquire(timeout=30)  # it waits again, for what is left of its timeout (or returned)
    batch_c.complete(0)
    waiter.join(30)
    elapsed_s = time.monotonic() - started
    assert len(outcome) == 1 and outcome[0][0] == "raised"
    assert isinstance(outcome[0][1], concurrent.futures.TimeoutError)
    # each wait after a wake-up is given what is left of the one timeout, never the whole timeout again
    first, *later = condition.timeouts
    assert first <= timeout_s and later and all(b < a for a, b in zip(condition.timeouts, later, strict=False)), condition.timeouts
    assert elapsed_s >= timeout_s  # it did wait its timeout (a slower machine only waits longer)


def count_callbacks_racing_a_settle(batch: ProducerBatch, futures: list[RecordFuture]) -> list[int]:
    """Adds a callback to every future from another thread while ``batch`` completes; the calls per future."""
    counts = [0] * len(futures)

    def count(future):
        counts[future._index] += 1

    def add_callbacks():
        for future in futures:
            future.add_done_callback(count)

    adder = threading.Thread(target=add_callbacks)
    adder.start()
    batch.complete(0)
    adder.join(30)
    return counts


def test_callbacks_added_while_the_batch_settles_run_exactly_once():
    for _ in range(20):
        batch, futures = batch_of(200, threading.Condition())
        assert count_callbacks_racing_a_settle(batch, futures) == [1] * len(futures)


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(st.none(), st.binary(max_size=300)), value=st.one_of(st.none(), st.binary(max_size=70_000)),
       headers=st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=200))), max_size=4),
       timestamp_ms=st.one_of(st.none(), st.integers(1, 2 ** 63 - 1)))
def test_an_encoded_record_is_what_protobuf_makes_of_it_in_a_batch(key, value, headers, timestamp_ms):
    record = common_pb2.Record(headers=[common_pb2.Header(key=name, value=data) for name, data in headers])
    if key is not None:
        record.key = key
    if value is not None:
        record.value = value
    if timestamp_ms is not None:
        record.timestamp_ms = timestamp_ms
    encoded, payload_bytes = encode_record(key, value, headers, timestamp_ms)
    assert encoded == common_pb2.RecordBatch(records=[record]).SerializeToString()
    assert payload_bytes == len(record.key) + len(record.value) + sum(len(h.key.encode()) + len(h.value)
                                                                     for h in record.headers)


def test_bad_record_fields_are_refused():
    for headers, timestamp_ms, error in (([(1, b"v")], None, TypeError), ([("h", 5)], None, TypeError),
                                         (None, 0, ValueError), (None, "1", ValueError)):
        with pytest.raises(error):
            encode_record(b"k", b"v", headers, timestamp_ms)


def test_an_encoded_batch_holds_its_records_once_and_a_retry_sends_the_same_bytes():
    batch, futures = batch_of(5, threading.Condition())
    first = b"".join(batch.encode(leader_epoch=2))
    assert batch.records == [] and batch.record_count == 5 and batch.sent_records is not None
    assert b"".join(batch.encode(leader_epoch=2)) == first
    sent = common_pb2.RecordBatch.FromString(batch.sent_records)
    assert [r.value for r in sent.records] == [b"v"] * 5
    batch.complete(10)
    assert [f.result(timeout=0).offset for f in futures] == [10, 11, 12, 13, 14]
