"""The accumulator: batches per partition, sealed by size or by linger; memory bounded."""

import concurrent.futures
import threading
import time

import pytest

from txlog.accumulator import RecordAccumulator
from txlog.errors import BufferExhaustedError
from txlog.structs import TopicPartition, encode_record

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def _record(size_bytes=10):
    return encode_record(None, b"x" * size_bytes, None, None)[0]


def record_size_bytes(record):
    return len(record)  # what an encoded record takes in its batch, and of the buffer


def _append(acc, tp, now_ms, size_bytes=10, **kwargs):
    future, wake = acc.append(tp, _record(size_bytes), 0, now_ms, **kwargs)
    return wake, future


def _acc(**kwargs):
    options = {"batch_size_bytes": 1000, "linger_ms": 5, "buffer_memory_bytes": 100_000}
    options.update(kwargs)
    return RecordAccumulator(**options)


def test_a_batch_is_ready_only_once_it_has_lingered():
    acc = _acc(linger_ms=5)
    wake, _ = _append(acc, TP, now_ms=100)
    assert wake  # a new batch: its linger timer starts
    wake, _ = _append(acc, TP, now_ms=101)
    assert not wake
    ready, wait_ms = acc.ready(now_ms=103)
    assert ready == [] and wait_ms == pytest.approx(2)
    ready, wait_ms = acc.ready(now_ms=105)
    assert ready == [TP] and wait_ms is None
    batch = acc.drain(TP)
    assert batch.record_count == 2 and acc.drain(TP) is None


def test_a_full_batch_is_ready_at_once_and_the_next_record_starts_a_new_batch():
    acc = _acc(batch_size_bytes=100, linger_ms=10_000)
    size = record_size_bytes(_record(30))
    wakes = [_append(acc, TP, now_ms=0, size_bytes=30)[0] for _ in range(3)]
    assert size * 2 <= 100 < size * 3
    assert wakes == [True, False, True]  # the third record does not fit: a new batch
    ready, _ = acc.ready(now_ms=0)
    assert ready == [TP]  # the first batch cannot grow any more
    first = acc.drain(TP)
    assert first.record_count == 2
    assert acc.ready(now_ms=0)[0] == []  # the second still lingers
    assert acc.drain(TP).record_count == 1


def test_a_record_larger_than_the_batch_size_gets_a_batch_of_its_own():
    acc = _acc(batch_size_bytes=100, linger_ms=10_000)
    _append(acc, TP, now_ms=0, size_bytes=10)
    wake, _ = _append(acc, TP, now_ms=0, size_bytes=500)
    assert wake
    assert [acc.drain(TP).record_count, acc.drain(TP).record_count] == [1, 1]


def test_batch_records_max_seals_a_batch():
    acc = _acc(batch_size_bytes=1_000_000, linger_ms=10_000, batch_records_max=3)
    wakes = [_append(acc, TP, now_ms=0)[0] for _ in range(4)]
    assert wakes == [True, False, True, True]
    assert acc.ready(now_ms=0)[0] == [TP]
    assert acc.drain(TP).record_count == 3


def test_flush_and_close_make_every_batch_ready():
    acc = _acc(linger_ms=10_000)
    _append(acc, TP, now_ms=0)
    assert acc.ready(now_ms=1)[0] == []
    pending = acc.begin_flush()
    assert len(pending) == 1 and acc.ready(now_ms=1)[0] == [TP]
    acc.end_flush()
    assert acc.ready(now_ms=1)[0] == []
    acc.close()
    assert acc.ready(now_ms=1)[0] == [TP]


def test_partitions_batch_independently_and_drain_in_creation_order():
    acc = _acc(batch_size_bytes=30, linger_ms=0)
    for i in range(3):
        _append(acc, TP, now_ms=i, size_bytes=20)
        _append(acc, TP1, now_ms=i, size_bytes=20)
    ready, _ = acc.ready(now_ms=10)
    assert sorted(ready) == [TP, TP1]
    created = [acc.drain(TP).created_ms for _ in range(3)]
    assert created == [0, 1, 2]


def test_expire_removes_batches_older_than_the_delivery_timeout():
    acc = _acc(batch_size_bytes=30)
    _append(acc, TP, now_ms=0, size_bytes=20)
    _append(acc, TP, now_ms=50, size_bytes=20)
    expired = acc.expire(now_ms=100, delivery_timeout_ms=60)
    assert [b.created_ms for b in expired] == [0]
    assert acc.drain(TP).created_ms == 50


def test_full_buffer_fails_at_once_without_max_block_and_frees_on_release():
    size = record_size_bytes(_record(100))
    acc = _acc(buffer_memory_bytes=size * 2, batch_size_bytes=size * 2)
    _append(acc, TP, now_ms=0, size_bytes=100)
    _append(acc, TP, now_ms=0, size_bytes=100)
    assert acc.buffered_bytes == size * 2
    with pytest.raises(BufferExhaustedError) as caught:
        _append(acc, TP, now_ms=0, size_bytes=100)
    assert caught.value.name == "LIMIT_EXCEEDED"
    batch = acc.drain(TP)
    acc.release(batch)
    assert acc.buffered_bytes == 0
    _append(acc, TP, now_ms=0, size_bytes=100)


def test_append_waits_for_memory_until_a_batch_is_released():
    size = record_size_bytes(_record(100))
    waiting_for_room = threading.Event()

    def clock_ms() -> float:  # read only by an append that waits for room: its deadline, then before each wait
        waiting_for_room.set()
        return time.monotonic() * 1000

    acc = _acc(buffer_memory_bytes=size, batch_size_bytes=size, clock_ms=clock_ms)
    _append(acc, TP, now_ms=0, size_bytes=100)
    batch = acc.drain(TP)
    appended = concurrent.futures.Future()
    appender = threading.Thread(target=lambda: appended.set_result(_append(acc, TP, now_ms=0, size_bytes=100, max_block_ms=600_000)))
    appender.start()
    assert waiting_for_room.wait(timeout=60)
    assert not appended.done() and acc.buffered_bytes == size  # the buffer is full: it waits, holding no memory yet
    acc.release(batch)
    wake, _ = appended.result(timeout=60)  # returned because the memory came free, long before its max_block_ms
    appender.join()
    assert wake and acc.buffered_bytes == size


def test_append_gives_up_after_max_block_ms_when_no_memory_comes_free():
    size = record_size_bytes(_record(100))
    acc = _acc(buffer_memory_bytes=size, batch_size_bytes=size)
    _append(acc, TP, now_ms=0, size_bytes=100)
    started = time.monotonic()
    with pytest.raises(BufferExhaustedError, match="max_block_ms=100"):
        _append(acc, TP, now_ms=0, size_bytes=100, max_block_ms=100)
    assert time.monotonic() - started >= 0.09  # it did wait (a slower machine only waits longer)


def test_a_record_that_can_never_fit_the_buffer_fails_at_once():
    acc = _acc(buffer_memory_bytes=50, batch_size_bytes=50)
    with pytest.raises(BufferExhaustedError, match="can never fit"):
        _append(acc, TP, now_ms=0, size_bytes=100, max_block_ms=10_000)


def test_complete_resolves_each_record_with_consecutive_offsets():
    acc = _acc(linger_ms=0)
    futures = [_append(acc, TP, now_ms=0)[1] for _ in range(3)]
    batch = acc.drain(TP)
    batch.complete(base_offset=40, log_append_time_ms=1234)
    assert [f.result().offset for f in futures] == [40, 41, 42]
    assert {f.result().timestamp_ms for f in futures} == {1234}
    assert batch.done.done()
