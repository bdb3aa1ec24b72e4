"""RecordFuture and a batch's settling (accumulator.py): one condition shared
by many records' futures, resolved under one acquisition, must still behave
as concurrent.futures.Future does for every way a caller waits on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.client.accumulator import (
    HEADER_FIELDS_BYTES_MAX,
    RECORD_FIELDS_BYTES_MAX,
    RECORD_FRAMING_BYTES,
    ProducerBatch,
    RecordFuture,
    record_size_bytes,
)
from services.client.structs import RecordMetadata, TopicPartition, build_record
from services.stubs.txlog.v1 import common_pb2

TP = TopicPartition("t", 3)


def batch_of(count: int, condition: threading.Condition) -> ProducerBatch:
    batch = ProducerBatch(TP, 0.0)
    for i in range(count):
        batch.records.append(common_pb2.Record(value=b"v", timestamp_ms=1000 + i if i % 2 else 0))
        batch.futures.append(RecordFuture(condition))
    return batch


def test_a_completed_batch_gives_each_record_its_offset_and_timestamp():
    condition = threading.Condition()
    batch = batch_of(3, condition)
    assert [f.running() for f in batch.futures] == [True] * 3 and not batch.futures[0].cancel()
    batch.complete(40, log_append_time_ms=777)
    assert [f.result(timeout=0) for f in batch.futures] == [
        RecordMetadata("t", 3, 40, 777), RecordMetadata("t", 3, 41, 1001), RecordMetadata("t", 3, 42, 777)]
    assert batch.done.done()


def test_waiters_of_every_kind_wake_callbacks_run_once_and_failures_reach_all():
    condition = threading.Condition()
    first, second = batch_of(2, condition), batch_of(2, condition)
    called = []
    first.futures[0].add_done_callback(lambda f: called.append(f.result()))
    blocked = concurrent.futures.ThreadPoolExecutor(2)
    result_waiter = blocked.submit(first.futures[1].result, 30)
    wait_all = blocked.submit(concurrent.futures.wait, first.futures + second.futures, 30)
    wrapped = asyncio.new_event_loop()
    try:
        async def awaited():
            return await asyncio.wrap_future(second.futures[1])

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
        assert [f.exception(0) for f in second.futures] == [error, error]
        assert sorted(f.result().offset for f in concurrent.futures.as_completed(first.futures, timeout=5)) == [0, 1]
        first.complete(9)  # settled twice (a late answer): the first outcome stays
        assert [f.result().offset for f in first.futures] == [0, 1] and len(called) == 1
    finally:
        wrapped.close()
        blocked.shutdown()


def test_a_batch_holding_other_futures_resolves_them_one_by_one():
    batch = ProducerBatch(TP, 0.0)
    plain = concurrent.futures.Future()
    batch.records += [common_pb2.Record(value=b"a"), common_pb2.Record(value=b"b")]
    batch.futures += [RecordFuture(threading.Condition()), plain]
    batch.complete(5)
    assert [f.result(0).offset for f in batch.futures] == [5, 6]


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(st.none(), st.binary(max_size=300)), value=st.one_of(st.none(), st.binary(max_size=70_000)),
       headers=st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=200))), max_size=4),
       timestamp_ms=st.one_of(st.none(), st.integers(1, 2 ** 63 - 1)))
def test_a_records_counted_size_bounds_what_it_takes_in_a_request(key, value, headers, timestamp_ms):
    record = build_record(key, value, headers, timestamp_ms)
    wire = record.ByteSize() + RECORD_FRAMING_BYTES
    counted = record_size_bytes(record)
    assert wire <= counted <= wire + RECORD_FIELDS_BYTES_MAX + HEADER_FIELDS_BYTES_MAX * len(headers)
