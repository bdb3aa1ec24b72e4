"""Compressed batches (issue 17): the codecs and their bound, and the partition
core on a real RocksDB store: a compressed batch is checked exactly as a plain
one (its decompressed records), stored compressed (or as the topic's
compression.type says), read whole by a reader that accepts its codec and as
plain records with offsets by one that does not; compaction, timestamp lookup,
DeleteRecords and read_committed see its records."""

from __future__ import annotations

import asyncio
import json
import tracemalloc

import pytest
import test_partition_transactions
import zstandard
from scripted_writer import ScriptedWriter

from partition_svc import log_format, validation
from partition_svc.log_store import LogStore
from partition_svc.partition import Partition, Produced, RecordsDeleted
from partition_svc.producer_state import Reject
from txlog.accumulator import ProducerBatch
from txlog.config import ProducerConfig
from txlog.protocol import batch_format, compression
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.structs import TopicPartition, encode_record
from txlog.v1 import common_pb2, partition_pb2

LIMITS = validation.BatchLimits(10_000, 1 << 20)
NOW = 1_700_000_000_000
CODECS = sorted(compression.CODECS)
TEXT = b"".join(json.dumps({"user": i, "event": "click", "page": "/home", "ok": True}).encode() for i in range(200))


# --- codecs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_round_trips_and_shrinks_text(codec):
    packed = compression.compress(codec, TEXT)
    assert len(packed) < len(TEXT) / 3
    assert compression.decompress(codec, packed, len(TEXT)) == TEXT
    assert compression.decompress(codec, compression.compress(codec, b""), 0) == b""


@pytest.mark.parametrize("codec", CODECS)
def test_a_compression_bomb_is_refused_at_the_limit(codec):
    bomb = compression.compress(codec, bytes(64 << 20))  # 64 MiB of zeros: a few KiB compressed
    assert len(bomb) < 1 << 20
    with pytest.raises(compression.CompressionError, match="limit of 1048576"):
        compression.decompress(codec, bomb, 1 << 20)


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_never_takes_much_more_memory_than_the_limit(codec):
    bomb = compression.compress(codec, bytes(64 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(compression.CompressionError):
            compression.decompress(codec, bomb, 1 << 20)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 8 << 20, peak_bytes


def test_a_zstd_frame_that_does_not_declare_its_size_is_bounded_too():
    unsized = zstandard.ZstdCompressor(write_content_size=False)
    assert compression.decompress(common_pb2.COMPRESSION_ZSTD, unsized.compress(TEXT), len(TEXT)) == TEXT
    with pytest.raises(compression.CompressionError, match="limit of 1048576"):
        compression.decompress(common_pb2.COMPRESSION_ZSTD, unsized.compress(bytes(8 << 20)), 1 << 20)


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_and_truncated_input_are_refused(codec):
    packed = compression.compress(codec, TEXT)
    for bad in (b"garbage" * 10, packed[: len(packed) // 2], b""):
        with pytest.raises(compression.CompressionError):
            compression.decompress(codec, bad, 1 << 20)


def test_compression_type_names_are_kafkas():
    assert {name: compression.codec_named(name) for name in ("none", "gzip", "zstd", "lz4")} == {
        "none": common_pb2.COMPRESSION_NONE, "gzip": common_pb2.COMPRESSION_GZIP,
        "zstd": common_pb2.COMPRESSION_ZSTD, "lz4": common_pb2.COMPRESSION_LZ4}
    with pytest.raises(ValueError, match="none, gzip, zstd, lz4"):
        compression.codec_named("snappy")


def test_expand_gives_offsets_and_append_time_and_skips_below():
    inner = [common_pb2.Record(value=b"a"), common_pb2.Record(value=b"b", timestamp_ms=5), common_pb2.Record(value=b"c")]
    b = common_pb2.RecordBatch(base_offset=10, compression=common_pb2.COMPRESSION_ZSTD, log_append_time_ms=99,
                               compressed_records=compression.compress_records(common_pb2.COMPRESSION_ZSTD, inner))
    compression.expand(b, 1 << 20, from_offset=11)
    assert [(r.offset, r.timestamp_ms, r.value) for r in b.records] == [(11, 5, b"b"), (12, 99, b"c")]
    assert not b.compression and not b.compressed_records and not b.log_append_time_ms


# --- what the leader takes -----------------------------------------------------------------------------


def records(values, timestamp_ms=0, key=None):
    return [common_pb2.Record(key=(key or v).encode(), value=v.encode(), timestamp_ms=timestamp_ms) for v in values]


def compressed(codec, pid, epoch, seq, values, *, transactional=False, timestamp_ms=0, key=None):
    return common_pb2.RecordBatch(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
                                  compression=codec,
                                  compressed_records=compression.compress_records(codec, records(values, timestamp_ms, key)))


def plain(pid, epoch, seq, values, *, transactional=False, key=None):
    return common_pb2.RecordBatch(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
                                  records=records(values, key=key))


def refused(b, topic="t", limits=LIMITS) -> TxlogError:
    with pytest.raises(TxlogError) as caught:
        validation.check_batch(b, limits, topic)
    return caught.value


def test_bad_compressed_batches_are_clear_errors():
    gz = common_pb2.COMPRESSION_GZIP
    assert refused(common_pb2.RecordBatch(compression=gz, compressed_records=b"garbage")).code == ErrorCode.Value("INVALID_RECORD")
    bomb = common_pb2.RecordBatch(compression=gz, compressed_records=compression.compress(gz, bytes(8 << 20)))
    assert "limit of 1048576" in refused(bomb).message
    assert refused(common_pb2.RecordBatch(compression=9, compressed_records=b"x")).code == ErrorCode.Value("INVALID_REQUEST")
    assert refused(common_pb2.RecordBatch(compressed_records=b"x")).code == ErrorCode.Value("INVALID_REQUEST")
    both = compressed(gz, -1, -1, -1, ["a"])
    both.records.add(value=b"plain too")
    assert "records empty" in refused(both).message
    assert "internal topic" in refused(compressed(gz, -1, -1, -1, ["a"]), topic="__consumer_offsets").message
    empty = common_pb2.RecordBatch(compression=gz, compressed_records=compression.compress(gz, b""))
    assert "no records" in refused(empty).message
    smuggled = common_pb2.RecordBatch(compression=gz, compressed_records=compression.compress(
        gz, common_pb2.RecordBatch(producer_id=7, records=records(["a"])).SerializeToString()))
    assert "only records" in refused(smuggled).message
    too_many = compressed(gz, -1, -1, -1, ["v"] * 11)
    assert refused(too_many, limits=validation.BatchLimits(10, 1 << 20)).code == ErrorCode.Value("BATCH_TOO_LARGE")


def test_topic_compression_type_is_checked():
    assert validation.topic_configs({}, 1 << 20)["compression.type"] == "producer"
    for value in validation.TOPIC_COMPRESSION_TYPES:
        assert validation.topic_configs({"compression.type": value}, 1 << 20)["compression.type"] == value
    with pytest.raises(TxlogError, match="compression.type must be one of"):
        validation.topic_configs({"compression.type": "snappy"}, 1 << 20)


class Harness(test_partition_transactions.Harness):
    """The transactions tests' harness, on a topic of its own configs; batches checked as the server does first."""

    def __init__(self, path, configs=None, topic="t"):
        self.path = path
        self.store = LogStore(path)
        self.writer = ScriptedWriter(self.store)
        self.partition = Partition(topic, 0, validation.topic_configs(configs or {}, 1 << 20), self.store, self.writer)

    def produce_outcome(self, b, now_ms=NOW):
        validation.check_batch(b, LIMITS, self.partition.topic)
        return self.partition.produce(b, now_ms, LIMITS)

    async def produce(self, b, now_ms=NOW):
        produced = self.produce_outcome(b, now_ms)
        assert isinstance(produced, Produced), produced
        if not produced.duplicate:
            await self.durable(produced.durable)
        return produced.base_offset, produced.last_offset

    def read(self, from_offset=0, *, committed=False, accepted=frozenset()):
        p = self.partition
        payloads, next_offset, _ = p.read(from_offset, p.last_stable_offset if committed else p.high_watermark,
                                          1 << 30, 1 << 30, take_first=True, committed=committed, accepted=accepted)
        return [common_pb2.RecordBatch.FromString(payload) for payload in payloads], next_offset

    def values(self, from_offset=0, **kwargs):
        batches, _ = self.read(from_offset, **kwargs)
        return [(r.offset, r.value.decode(), r.timestamp_ms) for b in batches for r in b.records]

    def stored(self):
        return [log_format.decode_header(base, value) for base, value in self.store.batches(self.partition.pkey, 0)]


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_batch_is_stored_compressed_and_read_either_way(tmp_path, codec):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        values = [json.dumps({"n": i, "text": "the same words again " * 4}) for i in range(50)]
        assert await h.produce(plain(-1, -1, -1, values)) == (0, 49)
        assert await h.produce(compressed(codec, -1, -1, -1, values)) == (50, 99)
        plain_header, packed_header = h.stored()
        assert (plain_header.compression, packed_header.compression) == (0, codec)
        assert (packed_header.record_count, packed_header.last_offset) == (50, 99)
        assert packed_header.stored_bytes < plain_header.stored_bytes / 3
        # a reader that does not accept the codec: plain records with offsets, trimmed to its offset
        [b], next_offset = h.read(60)
        assert not b.compression and not b.compressed_records and next_offset == 100
        assert [(r.offset, r.value.decode(), r.timestamp_ms) for r in b.records] == [
            (50 + i, values[i], NOW) for i in range(10, 50)]
        # one that accepts it: the batch whole, as stored, its records without offsets
        [b], _ = h.read(60, accepted=frozenset({codec}))
        assert (b.compression, b.base_offset, b.log_append_time_ms, len(b.records)) == (codec, 50, NOW, 0)
        payloads, _, _ = h.partition.read(60, 100, 1 << 30, 1 << 30, take_first=True, accepted=frozenset({codec}))
        assert payloads[0].startswith(bytes(log_format.payload_of(h.store.batch(h.partition.pkey, 50))))  # the stored bytes
        compression.expand(b, 1 << 20, 60)
        assert [(r.offset, r.value.decode()) for r in b.records] == [(50 + i, values[i]) for i in range(10, 50)]
    run(scenario())


def test_a_compressed_batch_counts_its_records_for_sequences_and_duplicates(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        zstd = common_pb2.COMPRESSION_ZSTD
        assert await h.produce(compressed(zstd, 1, 0, 0, ["a", "b", "c"])) == (0, 2)
        assert await h.produce(compressed(zstd, 1, 0, 0, ["a", "b", "c"])) == (0, 2)  # the retry: a duplicate
        gap = h.produce_outcome(compressed(zstd, 1, 0, 4, ["e"]))  # 3 records took sequences 0..2: 3 is next
        assert isinstance(gap, Reject) and gap.code == ErrorCode.Value("OUT_OF_ORDER_SEQUENCE")
        assert await h.produce(compressed(zstd, 1, 0, 3, ["d"])) == (3, 3)
        assert [(o, v) for o, v, _ in h.values()] == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    run(scenario())


def test_a_compressed_batch_with_an_oversized_record_or_timestamp_changes_nothing(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"), {"max.record.bytes": "1000"})
        gzip = common_pb2.COMPRESSION_GZIP
        big = compressed(gzip, 1, 0, 0, ["small", "x" * 2000])  # compressed, far below 1000 bytes; decompressed, above
        assert len(big.compressed_records) < 1000
        outcome = h.produce_outcome(big)
        assert isinstance(outcome, Reject) and outcome.code == ErrorCode.Value("RECORD_TOO_LARGE")
        bad_time = compressed(gzip, 1, 0, 0, ["a"], timestamp_ms=2**60)
        outcome = h.produce_outcome(bad_time)
        assert isinstance(outcome, Reject) and outcome.code == ErrorCode.Value("INVALID_TIMESTAMP")
        assert h.stored() == [] and h.partition.next_offset == 0 and h.partition.producers.get(1) is None
        assert await h.produce(compressed(gzip, 1, 0, 0, ["ok"])) == (0, 0)  # sequence 0 is still next
    run(scenario())


def test_the_topic_codec_re_encodes_and_uncompressed_stores_plain(tmp_path):
    async def scenario():
        gz = Harness(str(tmp_path / "gz"), {"compression.type": "gzip"})
        await gz.produce(plain(-1, -1, -1, ["a", "b"]))
        await gz.produce(compressed(common_pb2.COMPRESSION_LZ4, -1, -1, -1, ["c"]))
        assert [h.compression for h in gz.stored()] == [common_pb2.COMPRESSION_GZIP] * 2
        assert [(o, v) for o, v, _ in gz.values()] == [(0, "a"), (1, "b"), (2, "c")]
        [first, _], _ = gz.read(accepted=frozenset({common_pb2.COMPRESSION_GZIP}))
        assert first.compression == common_pb2.COMPRESSION_GZIP and not first.records
        flat = Harness(str(tmp_path / "flat"), {"compression.type": "uncompressed"})
        await flat.produce(compressed(common_pb2.COMPRESSION_ZSTD, -1, -1, -1, ["a", "b"]))
        assert [h.compression for h in flat.stored()] == [0]
        [b], _ = flat.read(accepted=frozenset(CODECS))
        assert [(r.offset, r.value) for r in b.records] == [(0, b"a"), (1, b"b")] and not b.compressed_records
    run(scenario())


def test_an_internal_topic_stays_uncompressed_whatever_its_config(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"), {"compression.type": "zstd"}, topic="__consumer_offsets")
        await h.produce(plain(-1, -1, -1, ["a"]))
        assert [header.compression for header in h.stored()] == [0]
    run(scenario())


def test_timestamp_lookup_compaction_and_delete_records_see_compressed_records(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"), {"cleanup.policy": "compact"})
        zstd = common_pb2.COMPRESSION_ZSTD
        await h.produce(compressed(zstd, -1, -1, -1, ["a", "b", "c"], timestamp_ms=1000), now_ms=NOW)  # 0..2
        await h.produce(compressed(zstd, -1, -1, -1, ["a2"], key="a"), now_ms=NOW + 10)  # 3: supersedes a only
        await h.produce(compressed(zstd, -1, -1, -1, ["x"]), now_ms=NOW + 20)  # 4: timestamp 0 -> append time
        assert h.partition.offset_for_timestamp(500) == (0, 1000)
        assert h.partition.offset_for_timestamp(NOW + 15) == (4, NOW + 20)
        assert h.partition.offset_for_timestamp(NOW + 21) == (-1, -1)
        assert await h.durable(h.partition.enforce_retention(NOW)) is None  # b and c keep batch 0
        await h.produce(compressed(zstd, -1, -1, -1, ["b2", "c2"], key="b"), now_ms=NOW + 30)  # 5, 6 (keys b, b)
        await h.produce(compressed(zstd, -1, -1, -1, ["c3"], key="c"), now_ms=NOW + 30)  # 7
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        assert [header.base_offset for header in h.stored()] == [3, 4, 5, 7]  # batch 0 wholly superseded
        deleted = h.partition.delete_records(6)  # inside the batch at 5
        assert isinstance(deleted, RecordsDeleted)
        await h.writer.settle()
        assert [(o, v) for o, v, _ in h.values(6)] == [(6, "c2"), (7, "c3")]
    run(scenario())


def test_an_aborted_compressed_transaction_is_hidden_from_read_committed(tmp_path):
    async def scenario():
        h = Harness(str(tmp_path / "db"))
        lz4 = common_pb2.COMPRESSION_LZ4
        await h.produce(compressed(lz4, 1, 0, 0, ["kept1", "kept2"], transactional=True))
        assert await h.marker(1, 1, committed=True) == "written"
        await h.produce(compressed(lz4, 1, 1, 0, ["gone1", "gone2"], transactional=True))
        assert await h.marker(1, 2, committed=False) == "written"
        assert [v for _, v, _ in h.values(committed=True)] == ["kept1", "kept2"]
        assert [v for _, v, _ in h.values(committed=True, accepted=frozenset({lz4}))] == []  # whole, compressed
        batches, _ = h.read(committed=True, accepted=frozenset({lz4}))
        assert len(batches) == 1 and batches[0].compression == lz4
        assert [v for _, v, _ in h.values()] == ["kept1", "kept2", "gone1", "gone2"]
    run(scenario())


# --- the producer's batches ----------------------------------------------------------------------------


def producer_batch(values: list[bytes]) -> ProducerBatch:
    batch = ProducerBatch(TopicPartition("t", 0), 0.0)
    for value in values:
        batch.add(encode_record(None, value, None, None)[0])
    batch.producer_id, batch.producer_epoch, batch.base_sequence = 5, 0, 0
    return batch


def sent(batch: ProducerBatch, **kwargs) -> common_pb2.RecordBatch:
    """What the producer puts in a Produce request for ``batch`` (its PartitionBatch, decoded)."""
    entry = partition_pb2.PartitionBatch.FromString(b"".join(batch.encode(7, **kwargs)))
    assert (entry.topic, entry.partition, entry.leader_epoch) == ("t", 0, 7) and not entry.HasField("batch")
    header = batch_format.verified_header(entry.encoded_batch)
    return batch_format.to_message(entry.encoded_batch, header, keep_codecs=frozenset(CODECS))


def test_a_producer_batch_is_compressed_once_and_a_retry_sends_the_same_bytes():
    b = producer_batch([b"a", b"b", b"c"])
    first = sent(b, compression=common_pb2.COMPRESSION_LZ4)
    b.add(encode_record(None, b"never in a drained batch", None, None)[0])  # would show a second compression
    retry = sent(b, compression=common_pb2.COMPRESSION_LZ4)
    assert first == retry and not first.records and first.compression == common_pb2.COMPRESSION_LZ4
    assert (retry.producer_id, retry.producer_epoch, retry.base_sequence) == (5, 0, 0)
    validation.check_batch(retry, LIMITS)
    assert [r.value for r in retry.records] == [b"a", b"b", b"c"]
    plain_batch = sent(producer_batch([b"a"]))
    assert not plain_batch.compression and [r.value for r in plain_batch.records] == [b"a"]
    assert ProducerConfig(compression_type="zstd").compression == common_pb2.COMPRESSION_ZSTD
    with pytest.raises(ValueError, match="none, gzip, zstd, lz4"):
        ProducerConfig(compression_type="snappy")
