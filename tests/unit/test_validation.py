import pytest

from partition_svc import validation
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2

LIMITS = validation.BatchLimits(records_per_batch_max=100, batch_bytes_max=10_000)


def code(call, *args):
    with pytest.raises(TxlogError) as info:
        call(*args)
    return ErrorCode.Name(info.value.code)


@pytest.mark.parametrize("name", ["", "a" * 250, "bad name", "é", ".", "..", "a/b", "x\x00"])
def test_bad_topic_names(name):
    assert code(validation.check_topic_name, name) == "INVALID_TOPIC"


@pytest.mark.parametrize("name", ["a", "orders.v1", "A-b_c.9", "a" * 249])
def test_good_topic_names(name):
    assert validation.check_topic_name(name) == name


def test_group_ids():
    assert validation.check_group_id("etl-job.1") == "etl-job.1"
    assert code(validation.check_group_id, "") == "INVALID_GROUP_ID"
    assert code(validation.check_group_id, "g" * 256) == "INVALID_GROUP_ID"


@pytest.mark.parametrize("count", [0, -1, 1001])
def test_partition_counts(count):
    assert code(validation.check_partition_count, count, 1000) == "INVALID_PARTITIONS"


def test_topic_configs_fill_defaults_and_reject_unknown_keys_and_bad_values():
    merged = validation.topic_configs({"retention.ms": "1000"}, 1 << 20)
    assert merged["retention.ms"] == "1000" and merged["retention.bytes"] == "-1"
    assert code(validation.topic_configs, {"retention.msec": "1"}, 1 << 20) == "INVALID_CONFIG"
    assert code(validation.topic_configs, {"retention.ms": "soon"}, 1 << 20) == "INVALID_CONFIG"
    assert code(validation.topic_configs, {"retention.bytes": "-2"}, 1 << 20) == "INVALID_CONFIG"
    assert code(validation.topic_configs, {"max.record.bytes": str(2 << 20)}, 1 << 20) == "INVALID_CONFIG"
    assert code(validation.topic_configs, {"cleanup.policy": "shred"}, 1 << 20) == "INVALID_CONFIG"


def test_delete_retention_is_a_topics_own_only_when_it_sets_one():
    assert "delete.retention.ms" not in validation.topic_configs({}, 1 << 20)  # the instance's setting applies
    assert validation.topic_configs({"delete.retention.ms": "0"}, 1 << 20)["delete.retention.ms"] == "0"
    for bad in ("-1", "a day", str(2**63)):
        assert code(validation.topic_configs, {"delete.retention.ms": bad}, 1 << 20) == "INVALID_CONFIG"


def batch(**fields):
    defaults = dict(producer_id=1, producer_epoch=0, base_sequence=0, records=[common_pb2.Record(value=b"v")])
    return common_pb2.RecordBatch(**{**defaults, **fields})


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"records": []}, "INVALID_REQUEST"),
        ({"records": [common_pb2.Record(value=b"v")] * 101}, "BATCH_TOO_LARGE"),
        ({"control_type": common_pb2.CONTROL_TYPE_COMMIT}, "INVALID_REQUEST"),
        ({"producer_id": -1}, "INVALID_REQUEST"),
        ({"producer_id": -7}, "INVALID_REQUEST"),
        ({"producer_epoch": 40000}, "INVALID_REQUEST"),
        ({"producer_epoch": -1}, "INVALID_REQUEST"),
        ({"base_sequence": -5}, "INVALID_REQUEST"),
    ],
)
def test_bad_batch_frames(fields, expected):
    assert code(validation.check_batch, batch(**fields), LIMITS) == expected


@pytest.mark.parametrize(
    "record, expected",
    [
        (common_pb2.Record(value=b"v", timestamp_ms=-1), "INVALID_TIMESTAMP"),
        (common_pb2.Record(value=b"v", timestamp_ms=2**60), "INVALID_TIMESTAMP"),
        (common_pb2.Record(value=b"v", headers=[common_pb2.Header(key="h")] * 1001), "INVALID_RECORD"),
    ],
)
def test_bad_records(record, expected):
    assert code(validation.check_record, 3, record) == expected


def test_sizes_of_batches_and_records():
    big = batch(records=[common_pb2.Record(value=b"v" * 5000)] * 3)
    assert code(validation.check_sizes, big, big.ByteSize(), LIMITS, 100_000) == "BATCH_TOO_LARGE"
    one = batch(records=[common_pb2.Record(value=b"v" * 2000)])
    assert code(validation.check_sizes, one, one.ByteSize(), LIMITS, 1000) == "RECORD_TOO_LARGE"
    two = batch(records=[common_pb2.Record(value=b"v" * 600)] * 2)
    validation.check_sizes(two, two.ByteSize(), LIMITS, 1000)  # the batch is larger than a record may be; each record is not
    # a record whose encoding (offset, timestamp, framing) is over the limit and whose key, value and headers are not
    framed = batch(records=[common_pb2.Record(offset=2**40, timestamp_ms=2**50, value=b"v" * 990)] * 2)
    assert framed.records[0].ByteSize() > 1000
    validation.check_sizes(framed, framed.ByteSize(), LIMITS, 1000)
    last = batch(records=[common_pb2.Record(value=b"v" * 10)] * 200 + [common_pb2.Record(key=b"k" * 500, value=b"v" * 501)])
    with pytest.raises(TxlogError, match="record 200 is 1001 bytes"):
        validation.check_sizes(last, last.ByteSize(), LIMITS, 1000)


def test_good_batches():
    validation.check_batch(batch(), LIMITS)
    validation.check_batch(batch(producer_id=-1, producer_epoch=-1, base_sequence=-1), LIMITS)
