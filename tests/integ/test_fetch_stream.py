"""FetchStream through a real partition_svc: the chunks are what consecutive
Fetch calls answer, within the request's budgets; a refused request fails the
call as Fetch's does; a refused partition is answered once, then left out."""

from __future__ import annotations

import uuid

import grpc
import pytest

from tests.integ.raw import Raw
from tests.support.errors import error_name
from txlog.protocol import batch_format
from txlog.v1 import common_pb2, partition_pb2

BATCHES = 12
RECORDS_PER_BATCH = 10
VALUE = b"v" * 1000  # a batch is about 10 KB


@pytest.fixture(scope="module")
def raw(shared_txlog_cluster):
    with Raw(shared_txlog_cluster) as client:
        yield client


@pytest.fixture(scope="module")
def topic(raw) -> str:
    """Four partitions (on two leaders), each of BATCHES batches of RECORDS_PER_BATCH records."""
    name = f"stream-{uuid.uuid4().hex[:8]}"
    raw.create_topic(name, 4)
    for partition in range(4):
        for b in range(BATCHES):
            records = common_pb2.RecordBatch(records=[
                common_pb2.Record(key=f"{partition}-{b}-{i}".encode(), value=VALUE, timestamp_ms=1) for i in range(RECORDS_PER_BATCH)])
            result = raw.produce_encoded(name, partition, batch_format.encode(records.SerializeToString(), RECORDS_PER_BATCH, max_timestamp_ms=1))
            assert error_name(result) == "NONE", result
    return name


def request(topic, partitions=(0,), offsets=None, **fields) -> partition_pb2.FetchRequest:
    offsets = offsets or {}
    return partition_pb2.FetchRequest(
        partitions=[partition_pb2.FetchPartition(topic=topic, partition=p, fetch_offset=offsets.get(p, 0)) for p in partitions],
        batch_format=partition_pb2.BATCH_FORMAT_ENCODED, **fields)


def stream(raw, topic, wanted, chunk_bytes=0) -> list[partition_pb2.FetchStreamResponse]:
    return list(raw.leader(topic, wanted.partitions[0].partition).FetchStream(
        partition_pb2.FetchStreamRequest(fetch=wanted, chunk_bytes=chunk_bytes), timeout=30))


def keys_of(responses, partition) -> list[tuple[int, bytes]]:
    """(offset, key) of every record the responses return for ``partition``, the offsets base + index."""
    read = []
    for response in responses:
        for result in response.results:
            if result.partition != partition:
                continue
            for data in result.encoded_batches:
                header = batch_format.verified_header(data)
                records = batch_format.open_records(data, header, 1 << 30).records
                read += [(header.base_offset + i, r.key) for i, r in enumerate(records)]
    return read


def expected_keys(partition, first_batch=0, batches=BATCHES):
    return [(b * RECORDS_PER_BATCH + i, f"{partition}-{b}-{i}".encode())
            for b in range(first_batch, first_batch + batches) for i in range(RECORDS_PER_BATCH)]


def batches_per_chunk(responses, partition) -> list[int]:
    return [sum(len(r.encoded_batches) for r in response.results if r.partition == partition) for response in responses]


def test_the_first_chunk_is_a_fetch_and_each_next_one_holds_a_chunks_bytes(raw, topic):
    chunk = 25_000  # two batches and a bit: a Fetch of it holds two; a later chunk takes a third to reach it
    responses = stream(raw, topic, request(topic, max_bytes=10**8), chunk)
    fetched = raw.leader(topic, 0).Fetch(request(topic, max_bytes=chunk), timeout=30)
    assert responses[0].SerializeToString() == fetched.SerializeToString()
    assert batches_per_chunk(responses, 0) == [2, 3, 3, 3, 1]
    assert keys_of(responses, 0) == expected_keys(0)
    ends = [r.results[0].next_fetch_offset for r in responses]
    assert ends == [20, 50, 80, 110, 120] and all(r.results[0].high_watermark == 120 for r in responses)


def test_the_stream_keeps_to_max_bytes_max_records_and_each_partitions_share(raw, topic):
    by_bytes = stream(raw, topic, request(topic, max_bytes=45_000), 25_000)
    assert keys_of(by_bytes, 0) == expected_keys(0, batches=4), "two batches, then two more: a fifth was past max_bytes"
    by_records = stream(raw, topic, request(topic, max_records=3 * RECORDS_PER_BATCH), 25_000)
    assert keys_of(by_records, 0) == expected_keys(0, batches=3)
    leaders = raw.leaders(topic)
    first, second = [p for p in sorted(leaders) if leaders[p] == leaders[0]][:2]  # a FetchStream reads from one leader
    shares = request(topic, partitions=(first, second), max_bytes=10**8)
    shares.partitions[0].partition_max_bytes = 35_000  # three batches for the first partition
    responses = stream(raw, topic, shares, 25_000)
    assert keys_of(responses, first) == expected_keys(first, batches=3)
    assert keys_of(responses, second) == expected_keys(second)


def test_a_stream_starts_where_it_is_asked_and_ends_at_the_end_of_the_log(raw, topic):
    responses = stream(raw, topic, request(topic, offsets={0: 5 * RECORDS_PER_BATCH}), 25_000)
    assert keys_of(responses, 0) == expected_keys(0, first_batch=5, batches=BATCHES - 5)
    at_end = stream(raw, topic, request(topic, offsets={0: BATCHES * RECORDS_PER_BATCH}))
    assert len(at_end) == 1 and not at_end[0].results[0].encoded_batches and error_name(at_end[0].results[0]) == "NONE"


def test_a_refused_partition_is_answered_once_and_the_others_are_streamed(raw, topic):
    wanted = request(topic, partitions=(0,))
    wanted.partitions.add(topic=topic, partition=7, fetch_offset=0)
    responses = stream(raw, topic, wanted, 25_000)
    refused = [r for response in responses for r in response.results if r.partition == 7]
    assert [error_name(r) for r in refused] == ["UNKNOWN_TOPIC_OR_PARTITION"]
    assert keys_of(responses, 0) == expected_keys(0)


@pytest.mark.parametrize(("fields", "chunk_bytes", "said"), [
    ({}, -1, "chunk_bytes must not be negative"),
    ({"max_bytes": -5}, 0, "must not be negative"),
    ({"isolation_level": 7}, 0, "unknown isolation_level 7"),
])
def test_a_bad_request_fails_the_call_with_invalid_request(raw, topic, fields, chunk_bytes, said):
    with pytest.raises(grpc.RpcError) as failure:
        stream(raw, topic, request(topic, **fields), chunk_bytes)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in failure.value.details()


def test_the_first_chunk_is_a_long_poll(raw, shared_txlog_cluster):
    name = f"stream-poll-{uuid.uuid4().hex[:8]}"
    raw.create_topic(name, 1)
    calls = raw.leader(name, 0).FetchStream(partition_pb2.FetchStreamRequest(fetch=request(name, max_wait_ms=20_000)), timeout=60)

    def produced() -> bool:
        records = common_pb2.RecordBatch(records=[common_pb2.Record(value=b"late", timestamp_ms=1)])
        return error_name(raw.produce_encoded(name, 0, batch_format.encode(records.SerializeToString(), 1, max_timestamp_ms=1))) == "NONE"

    assert produced()
    responses = list(calls)
    assert [key for _, key in keys_of(responses, 0)] == [b""] and responses[0].results[0].high_watermark == 1
