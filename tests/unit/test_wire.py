"""Fetch and ReplicaFetch responses spliced from stored bytes parse exactly as
messages built field by field, and the store's one-pass scan finds the same
batches as the two scans it replaces."""

import asyncio

import pytest

from partition_svc import log_format, validation, wire
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition
from partition_svc.replication import ReplicationServicer
from txlog.protocol import compression, protowire
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2, partition_pb2, replication_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000


def batch(base, n, size):
    return common_pb2.RecordBatch(
        base_offset=base, producer_id=3, producer_epoch=1, base_sequence=base,
        records=[common_pb2.Record(offset=base + i, value=b"x" * size, key=b"k") for i in range(n)],
    )


def test_spliced_response_equals_the_built_one():
    batches = [batch(0, 2, 10), batch(2, 300, 200)]  # the second needs multi-byte length varints
    epochs = [0, 2**31 - 1]
    result = partition_pb2.FetchPartitionResult(topic="t", partition=4, high_watermark=302, last_stable_offset=302, next_fetch_offset=302)
    error_result = partition_pb2.FetchPartitionResult(topic="u", partition=0)
    error_result.error.code = 16
    empty_result = partition_pb2.FetchPartitionResult(topic="v", partition=1, high_watermark=7, next_fetch_offset=7)
    encoded = wire.fetch_response([
        wire.partition_result(result, [wire.record_batch(memoryview(b.SerializeToString()), e) for b, e in zip(batches, epochs, strict=True)]),
        wire.partition_result(error_result, []),
        wire.partition_result(empty_result, []),
    ])
    expected = partition_pb2.FetchResponse()
    built = expected.results.add()
    built.CopyFrom(result)
    for b, epoch in zip(batches, epochs, strict=True):
        built.batches.add().CopyFrom(b)
        built.batches[-1].partition_leader_epoch = epoch
    expected.results.add().CopyFrom(error_result)
    expected.results.add().CopyFrom(empty_result)
    assert partition_pb2.FetchResponse.FromString(encoded) == expected


def test_an_encoded_message_knows_its_length_without_being_joined():
    inner = wire.partition_result(partition_pb2.FetchPartitionResult(topic="t"), [wire.record_batch(b"\x08\x05", 3)] * 200)
    assert inner.size == len(b"".join(inner.parts)) and len(inner.parts) == 1 + 3 * 200


def test_a_leader_epoch_overrides_one_already_in_the_stored_bytes():
    stored = common_pb2.RecordBatch(base_offset=5, partition_leader_epoch=99, records=[common_pb2.Record(value=b"v")])
    spliced = b"".join(wire.record_batch(stored.SerializeToString(), 4).parts)
    assert common_pb2.RecordBatch.FromString(spliced).partition_leader_epoch == 4


def test_spliced_replica_fetch_response_equals_the_built_one():
    values = [log_format.encode_batch(1, NOW, -1, -1, 0, 2, batch(0, 2, 10).SerializeToString()),
              log_format.encode_batch(301, NOW, 3, 1, 0, 300, batch(2, 300, 200).SerializeToString())]
    ok = replication_pb2.ReplicaFetchPartitionResult(topic="t", partition=0, high_watermark=302, log_start_offset=0)
    refused = replication_pb2.ReplicaFetchPartitionResult(topic="t", partition=1, log_start_offset=9)
    refused.error.code = ErrorCode.Value("OFFSET_OUT_OF_RANGE")
    diverging = replication_pb2.ReplicaFetchPartitionResult(topic="u", partition=0, high_watermark=4,
                                                            diverging_epoch=replication_pb2.EpochEndOffset(epoch=2, end_offset=3))
    encoded = wire.replica_fetch_response([
        wire.replica_fetch_result(ok, [wire.stored_batch(0, 0, values[0]), wire.stored_batch(2, 7, values[1])]),
        wire.replica_fetch_result(refused, []),
        wire.replica_fetch_result(diverging, []),
    ])
    expected = replication_pb2.ReplicaFetchResponse(results=[ok, refused, diverging])
    expected.results[0].batches.add(base_offset=0, leader_epoch=0, value=values[0])
    expected.results[0].batches.add(base_offset=2, leader_epoch=7, value=values[1])
    assert replication_pb2.ReplicaFetchResponse.FromString(encoded) == expected


def test_varint_refuses_what_it_cannot_encode_and_field_tags_know_their_wire_types():
    for value in (-1, 2**64):
        with pytest.raises(ValueError):
            protowire.varint(value)
    assert protowire.varint(2**64 - 1) == b"\xff" * 9 + b"\x01"
    assert protowire.field_tag(common_pb2.RecordBatch, "records") == bytes([8 << 3 | 2])
    assert protowire.field_tag(common_pb2.RecordBatch, "producer_id") == bytes([2 << 3 | 0])


def test_varint():
    assert [protowire.varint(v) for v in (0, 1, 127, 128, 300, 16383, 16384, 2**32)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\xff\x7f", b"\x80\x80\x01", b"\x80\x80\x80\x80\x10"
    ]


# --- against real stores ---------------------------------------------------------------------


def leader(tmp_path, index: int = 0, name: str = "db", store: LogStore | None = None) -> Partition:
    store = store or LogStore(str(tmp_path / name))
    partition = Partition("t", index, CONFIGS, store, GroupCommitWriter(store), node_id=0, sole_replica=True)
    partition.become_leader(3, frozenset({0}), NOW)
    return partition


def records(values, codec=common_pb2.COMPRESSION_NONE) -> common_pb2.RecordBatch:
    built = common_pb2.RecordBatch(records=[common_pb2.Record(value=v.encode()) for v in values])
    if codec:
        built.compression = codec
        built.compressed_records = compression.compress(codec, common_pb2.RecordBatch(records=built.records).SerializeToString())
        del built.records[:]
    return built


async def produce(partition: Partition, *batches: common_pb2.RecordBatch) -> None:
    for b in batches:
        validation.check_batch(b, LIMITS, partition.topic)
        await partition.produce(b, NOW, LIMITS).durable


def test_a_response_built_from_encoded_reads_equals_one_built_from_the_read_batches(tmp_path):
    """Epochs, a first batch trimmed to the fetch offset, a compressed batch
    whole or decompressed, several partitions and an error: the spliced
    response parses as the FetchResponse built field by field from read()."""
    gzip = common_pb2.COMPRESSION_GZIP

    async def scenario():
        one, two = leader(tmp_path, 0, "one"), leader(tmp_path, 1, "two")
        await produce(one, records(["a", "b", "c"]))
        one.become_follower(5)
        one.become_leader(5, frozenset({0}), NOW)
        await produce(one, records(["d", "e"], gzip), records(["f"]))
        await produce(two, records(["x", "y"]))
        for accepted in (frozenset(), frozenset({gzip})):
            wanted = [(one, 1), (two, 0)]
            encoded, expected = [], partition_pb2.FetchResponse()
            for partition, offset in wanted:
                head = partition_pb2.FetchPartitionResult(topic="t", partition=partition.index, high_watermark=partition.high_watermark)
                args = (offset, partition.high_watermark, 1 << 20, 100)
                batches, next_offset, _ = partition.read_encoded(*args, take_first=True, accepted=accepted)
                payloads, next_again, _ = partition.read(*args, take_first=True, accepted=accepted)
                assert next_offset == next_again == partition.high_watermark
                encoded.append(wire.partition_result(head, batches))
                built = expected.results.add()
                built.CopyFrom(head)
                built.batches.extend(common_pb2.RecordBatch.FromString(p) for p in payloads)
            error_head = partition_pb2.FetchPartitionResult(topic="gone", partition=0)
            error_head.error.code = ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION")
            encoded.append(wire.partition_result(error_head, []))
            expected.results.add().CopyFrom(error_head)
            response = partition_pb2.FetchResponse.FromString(wire.fetch_response(encoded))
            assert response == expected
            first = response.results[0].batches
            assert [(b.base_offset, b.partition_leader_epoch) for b in first] == [(0, 3), (3, 5), (5, 5)]
            assert [r.offset for r in first[0].records] == [1, 2]  # trimmed to the fetch offset
            assert first[1].compression == (gzip if accepted else common_pb2.COMPRESSION_NONE)
        for p in (one, two):
            await p.queue.writer.drain()

    asyncio.run(scenario())


def test_reads_stop_at_bytes_and_records_as_before(tmp_path):
    async def scenario():
        p = leader(tmp_path)
        await produce(p, *(records([f"{i}-{j}" for j in range(3)]) for i in range(5)))
        first, second = (log_format.decode_header(base, p.store.batch(p.pkey, base)).stored_bytes for base in (0, 3))
        assert p.read(0, 15, first + second, 100, take_first=True)[1:] == (6, 6)
        assert p.read(0, 15, first + second - 1, 100, take_first=True)[1:] == (3, 3)
        assert p.read(0, 15, 1, 100, take_first=True)[1:] == (3, 3)  # the first whatever its size
        assert p.read(0, 15, 1, 100, take_first=False)[1:] == (0, 0)
        assert p.read(1, 15, 1 << 20, 5, take_first=True)[1:] == (6, 5)  # 2 of the first batch, 3 of the next
        assert p.read(1, 15, 1 << 20, 4, take_first=True)[1:] == (3, 2)
        assert p.read(4, 9, 1 << 20, 100, take_first=True)[1:] == (9, 5)
        await p.queue.writer.drain()

    asyncio.run(scenario())


def test_the_one_pass_scan_finds_what_the_two_scans_found(tmp_path):
    """batches_holding(offset, end) == batch_at_or_before + batches() below end,
    for offsets inside batches, in gaps, before and after the log, with other
    partitions' batches on either side of the key range."""
    store = LogStore(str(tmp_path / "db"))
    layout = {0: [(0, 2), (3, 3), (10, 14)], 1: [(5, 9), (20, 20)], 2: [(0, 0)]}  # (base, last) per partition
    pkeys = {index: log_format.partition_key("t", index) for index in layout}
    store.write([(log_format.log_key(pkeys[index], base), log_format.encode_batch(last, NOW, -1, -1, 0, last - base + 1, b"p"))
                 for index, spans in layout.items() for base, last in spans])

    def two_scans(pkey, offset, end):
        found = store.batch_at_or_before(pkey, offset)
        start = found[0] if found is not None and log_format.decode_header(*found).last_offset >= offset else offset
        return [(base, value) for base, value in store.batches(pkey, start) if base < end]

    for index, pkey in pkeys.items():
        for offset in range(0, 23):
            for end in (offset, offset + 1, 11, 2**63 - 1):
                assert list(store.batches_holding(pkey, offset, end)) == two_scans(pkey, offset, end), (index, offset, end)
    store.close()


@pytest.mark.parametrize("bytes_max", [0, 1, 1 << 20])
def test_a_follower_fetch_gets_whole_stored_values_up_to_the_written_end(tmp_path, bytes_max):
    async def scenario():
        p = leader(tmp_path)
        await produce(p, *(records([f"{i}-{j}" for j in range(3)]) for i in range(4)))
        other = leader(tmp_path, 1, store=p.store)
        await produce(other, records(["o"]))
        servicer = ReplicationServicer(None, 1000)
        gone = replication_pb2.ReplicaFetchPartition(topic="t", partition=7)
        leading = [(replication_pb2.ReplicaFetchPartition(topic="t", partition=0, fetch_offset=4), p, None),
                   (gone, None, TxlogError(ErrorCode.Value("NOT_LEADER"), "not here")),
                   (replication_pb2.ReplicaFetchPartition(topic="t", partition=1, fetch_offset=0), other, None)]
        encoded, answered = servicer._collect(leading, bytes_max)
        reply = replication_pb2.ReplicaFetchResponse.FromString(encoded)
        assert answered
        stored = {base: value for base, value in p.store.batches(p.pkey, 0)}
        first = [(b.base_offset, b.leader_epoch, b.value) for b in reply.results[0].batches]
        taken = 1 if bytes_max == 1 else 3  # the batch holding offset 4 whole, then while bytes are left (0: no limit)
        assert first == [(base, 3, stored[base]) for base in (3, 6, 9)[:taken]]
        assert (reply.results[0].high_watermark, reply.results[0].log_start_offset) == (12, 0)
        assert reply.results[1].error.code == ErrorCode.Value("NOT_LEADER") and not reply.results[1].batches
        assert [b.base_offset for b in reply.results[2].batches] == [0]  # every partition gets one batch at least
        caught_up = [(replication_pb2.ReplicaFetchPartition(topic="t", partition=0, fetch_offset=12), p, None)]
        encoded, answered = servicer._collect(caught_up, bytes_max)
        assert not answered and not replication_pb2.ReplicaFetchResponse.FromString(encoded).results[0].batches
        for partition in (p, other):
            await partition.queue.writer.drain()

    asyncio.run(scenario())
