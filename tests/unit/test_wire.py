"""Fetch responses spliced from stored bytes parse exactly as messages built field by field."""

from partition_svc import wire
from services.stubs.txlog.v1 import common_pb2, partition_pb2


def batch(base, n, size):
    return common_pb2.RecordBatch(
        base_offset=base, producer_id=3, producer_epoch=1, base_sequence=base,
        records=[common_pb2.Record(offset=base + i, value=b"x" * size, key=b"k") for i in range(n)],
    )


def test_spliced_response_equals_the_built_one():
    batches = [batch(0, 2, 10), batch(2, 300, 200)]  # the second needs multi-byte length varints
    result = partition_pb2.FetchPartitionResult(topic="t", partition=4, high_watermark=302, last_stable_offset=302, next_fetch_offset=302)
    error_result = partition_pb2.FetchPartitionResult(topic="u", partition=0)
    error_result.error.code = 16
    encoded = wire.fetch_response([
        wire.partition_result(result, [b.SerializeToString() for b in batches]),
        wire.partition_result(error_result, []),
    ])
    expected = partition_pb2.FetchResponse()
    built = expected.results.add()
    built.CopyFrom(result)
    built.batches.extend(batches)
    expected.results.add().CopyFrom(error_result)
    assert partition_pb2.FetchResponse.FromString(encoded) == expected


def test_varint():
    assert [wire.varint(v) for v in (0, 1, 127, 128, 300, 2**32)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\x80\x80\x80\x80\x10"
    ]
