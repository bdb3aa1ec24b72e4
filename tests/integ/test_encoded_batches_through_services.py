"""Encoded batches through the real services: a hand-built one is stored,
deduplicated and read back in either form; a damaged one is refused and
stores nothing; the SDK's batches (encoded) read as records with offsets by
a reader of messages, and batches sent as messages read by the SDK."""

from __future__ import annotations

import uuid

import grpc
import pytest

from tests.support.errors import error_name
from tests.support.waiting import wait_until
from txlog import Consumer, Producer
from txlog.protocol import batch_format, errors
from txlog.v1 import common_pb2, partition_pb2

NOW = 1_700_000_000_000


def fresh_topic(raw) -> str:
    name = f"encoded-{uuid.uuid4().hex[:8]}"
    raw.create_topic(name, 1)
    return name


def encoded(values, producer_id=-1, epoch=-1, sequence=-1, timestamps=None) -> bytes:
    timestamps = timestamps or [NOW] * len(values)
    records = common_pb2.RecordBatch(records=[common_pb2.Record(value=v, timestamp_ms=t) for v, t in zip(values, timestamps, strict=True)])
    return batch_format.encode(records.SerializeToString(), len(values), producer_id=producer_id, producer_epoch=epoch,
                               base_sequence=sequence, max_timestamp_ms=max(timestamps), untimed=0 in timestamps)


def fetch_encoded(raw, topic, offset) -> list[bytes]:
    result = raw.fetch(topic, 0, offset, batch_format=partition_pb2.BATCH_FORMAT_ENCODED)
    assert error_name(result) == "NONE" and not result.batches, result
    return list(result.encoded_batches)


def latest(raw, topic) -> int:
    return raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_LATEST).offset


def test_an_encoded_batch_is_stored_deduplicated_and_read_in_either_form(shared_raw):
    raw, topic = shared_raw, fresh_topic(shared_raw)
    producer_id = raw.producer_id()
    sent = encoded([b"a", b"b", b"c"], producer_id, 0, 0, timestamps=[NOW, 0, NOW + 1])
    first = raw.produce_encoded(topic, 0, sent)
    assert error_name(first) == "NONE" and first.base_offset == 0, first
    assert raw.produce_encoded(topic, 0, sent).base_offset == 0  # a retry: its original offsets
    assert latest(raw, topic) == 3
    records = raw.read_all(topic, 0)  # a reader of messages: offsets, and the append time for timestamp 0
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert records[1].timestamp_ms == first.log_append_time_ms and records[2].timestamp_ms == NOW + 1
    [data] = fetch_encoded(raw, topic, 1)  # whole: the reader skips offset 0 itself
    header = batch_format.verified_header(data)
    assert (header.base_offset, header.record_count, header.producer_id, header.log_append_time_ms) == (
        0, 3, producer_id, first.log_append_time_ms)
    assert header.partition_leader_epoch >= 0 and data[batch_format.CRC_END:] == sent[batch_format.CRC_END:]


def test_a_damaged_batch_is_refused_as_corrupt_and_stores_nothing(shared_raw):
    raw, topic = shared_raw, fresh_topic(shared_raw)
    damaged = bytearray(encoded([b"x" * 100]))
    damaged[-3] ^= 0x01
    result = raw.produce_encoded(topic, 0, bytes(damaged))
    assert error_name(result) == "CORRUPT_MESSAGE" and "CRC32C" in result.error.message, result
    both = raw.leader(topic, 0).Produce(partition_pb2.ProduceRequest(batches=[partition_pb2.PartitionBatch(
        topic=topic, partition=0, encoded_batch=encoded([b"y"]), batch=common_pb2.RecordBatch(records=[common_pb2.Record()]))]),
        timeout=10).results[0]
    assert error_name(both) == "INVALID_REQUEST" and "exactly one" in both.error.message, both
    assert latest(raw, topic) == 0
    with pytest.raises(grpc.RpcError) as caught:
        raw.fetch(topic, 0, 0, batch_format=7)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.from_rpc_error(caught.value).name == "INVALID_REQUEST" and "batch_format" in caught.value.details()


def test_sdk_batches_read_as_messages_and_message_batches_read_by_the_sdk(shared_raw):
    raw, topic = shared_raw, fresh_topic(shared_raw)
    bootstrap = ",".join(raw.bootstrap)
    with Producer(bootstrap, enable_idempotence=True, compression_type="zstd") as producer:
        for i in range(5):
            producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode(), headers=[("h", b"x")], partition=0)
        producer.flush(timeout_s=30)
    assert [(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in raw.read_all(topic, 0)] == [
        (i, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x")]) for i in range(5)]
    assert error_name(raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"old")]))) == "NONE"
    seen = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        wait_until(lambda: seen.extend((r.offset, r.value) for r in consumer.poll(timeout_s=1)) or len(seen) >= 6, 60,
                   lambda: f"the SDK consumer read {seen}")
    assert seen == [(i, f"v{i}".encode()) for i in range(5)] + [(5, b"old")]
