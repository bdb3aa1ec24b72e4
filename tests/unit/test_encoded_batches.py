"""Encoded batches in a partition on a real RocksDB store: stored as the
producer sent them (only the leader's own fields written), read back in
either form, under the same producer rules, size limits, compression.type,
retention, compaction, timestamp lookup and read_committed as message batches."""

from __future__ import annotations

import asyncio

import pytest
from test_compression_codecs import NOW, Harness

from partition_svc import log_format, validation
from partition_svc.partition import Produced
from partition_svc.producer_state import Reject
from txlog.protocol import batch_format, compression
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

LIMITS = validation.BatchLimits(10_000, 1 << 20)
ZSTD = common_pb2.COMPRESSION_ZSTD


def encoded(values, *, producer=(-1, -1, -1), transactional=False, timestamps=None, key=None, codec=0) -> bytes:
    timestamps = timestamps or [0] * len(values)
    records = common_pb2.RecordBatch(records=[
        common_pb2.Record(value=v.encode(), timestamp_ms=t, **({"key": key.encode()} if key else {}))
        for v, t in zip(values, timestamps, strict=True)]).SerializeToString()
    producer_id, epoch, sequence = producer
    return batch_format.encode(compression.compress(codec, records) if codec else records, len(values), producer_id=producer_id,
                               producer_epoch=epoch, base_sequence=sequence, transactional=transactional, codec=codec,
                               max_timestamp_ms=max(timestamps), untimed=0 in timestamps)


class EncodedHarness(Harness):
    def produce_outcome(self, b, now_ms=NOW):
        if isinstance(b, bytes):
            return self.partition.produce(validation.check_encoded(b, LIMITS, self.partition.topic), now_ms, LIMITS)
        return super().produce_outcome(b, now_ms)

    def read_encoded(self, from_offset=0, *, committed=False, accepted=frozenset()):
        p = self.partition
        payloads, next_offset, _ = p.read(from_offset, p.last_stable_offset if committed else p.high_watermark, 1 << 30, 1 << 30,
                                          take_first=True, committed=committed, accepted=accepted, encoded=True)
        return payloads, next_offset

    def encoded_values(self, from_offset=0, **kwargs):
        """(offset, value, timestamp) of every record the encoded reads return, as a consumer computes them."""
        out = []
        for data in self.read_encoded(from_offset, **kwargs)[0]:
            header = batch_format.verified_header(data)
            for i, record in enumerate(batch_format.open_records(data, header, 1 << 30).records):
                out.append((header.base_offset + i, record.value.decode(), record.timestamp_ms or header.log_append_time_ms))
        return out


def run(coroutine):
    return asyncio.run(coroutine)


def test_an_encoded_batch_is_stored_as_sent_and_read_back_in_either_form(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"))
        assert await h.produce(encoded(["a", "b"], producer=(5, 0, 0), timestamps=[NOW - 9, 0]), now_ms=NOW) == (0, 1)
        sent = encoded(["c"], producer=(5, 0, 2))
        assert await h.produce(sent, now_ms=NOW + 1) == (2, 2)
        [first, second] = h.stored()
        assert first.is_encoded and (first.max_timestamp_ms, first.record_count) == (NOW, 2)  # a record took the append time
        value = h.store.batch(h.partition.pkey, 2)
        assert log_format.payload_of(value)[batch_format.CRC_END:] == sent[batch_format.CRC_END:]  # the producer's bytes
        assert h.values() == [(0, "a", NOW - 9), (1, "b", NOW), (2, "c", NOW + 1)]
        assert h.values(1) == [(1, "b", NOW), (2, "c", NOW + 1)]  # trimmed for a reader of messages
        assert h.encoded_values(1) == h.encoded_values() == h.values()  # whole for an encoded reader, which skips
        [data, _], _ = h.read_encoded()
        assert batch_format.verified_header(data).partition_leader_epoch == h.partition.epochs.epoch_at(0)
        again = h.produce_outcome(encoded(["c"], producer=(5, 0, 2)))  # a retry: its original offsets, nothing appended
        assert isinstance(again, Produced) and again.duplicate and (again.base_offset, again.last_offset) == (2, 2)
        gap = h.produce_outcome(encoded(["e"], producer=(5, 0, 9)))
        assert isinstance(gap, Reject) and gap.code == ErrorCode.Value("OUT_OF_ORDER_SEQUENCE")
        assert await h.produce(h_plain_batch(5, 0, 3, ["d"])) == (3, 3)  # the forms mix under one producer's sequences
        assert [v for _, v, _ in h.encoded_values()] == ["a", "b", "c", "d"]
    run(scenario())


def h_plain_batch(pid, epoch, seq, values):
    return common_pb2.RecordBatch(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  records=[common_pb2.Record(value=v.encode()) for v in values])


def test_a_topic_codec_recodes_an_encoded_batch_and_readers_get_it_as_they_accept(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"), {"compression.type": "zstd"})
        values = [f"record {i} " * 20 for i in range(30)]
        await h.produce(encoded(values))  # uncompressed as sent: the topic wants zstd
        await h.produce(encoded(values, codec=common_pb2.COMPRESSION_GZIP))
        assert [(s.compression, s.is_encoded) for s in h.stored()] == [(ZSTD, True), (ZSTD, True)]
        kept, _ = h.read_encoded(accepted=frozenset({ZSTD}))
        assert [batch_format.verified_header(d).compression for d in kept] == [ZSTD, ZSTD]
        opened, _ = h.read_encoded()
        assert [batch_format.verified_header(d).compression for d in opened] == [0, 0]
        assert [v for _, v, _ in h.encoded_values()] == [v for _, v, _ in h.values()] == values * 2
    run(scenario())


def test_a_record_over_max_record_bytes_is_refused_and_small_records_in_a_big_batch_are_not(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"), {"max.record.bytes": "100"})
        big = h.produce_outcome(encoded(["x" * 50, "y" * 150]))
        assert isinstance(big, Reject) and big.code == ErrorCode.Value("RECORD_TOO_LARGE") and "record 1" in big.message
        assert h.partition.next_offset == 0 and h.stored() == []
        assert await h.produce(encoded(["z" * 50] * 10)) == (0, 9)  # 500+ bytes of records, none over 100
    run(scenario())


def test_retention_timestamp_lookup_and_compaction_read_encoded_batches(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"), {"cleanup.policy": "compact"})
        await h.produce(encoded(["a", "b", "c"], timestamps=[1000, 1000, 1000], key="a"), now_ms=NOW)  # 0..2
        await h.produce(encoded(["x"]), now_ms=NOW + 20)  # 3: timestamp 0 -> append time
        assert h.partition.offset_for_timestamp(500) == (0, 1000)
        assert h.partition.offset_for_timestamp(NOW + 15) == (3, NOW + 20)
        assert h.partition.offset_for_timestamp(NOW + 21) == (-1, -1)
        assert await h.durable(h.partition.enforce_retention(NOW)) is None
        await h.produce(encoded(["a2"], key="a"), now_ms=NOW + 30)  # 4 supersedes every record of batch 0
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        assert [s.base_offset for s in h.stored()] == [3, 4]
    run(scenario())


def test_retention_by_time_reads_the_headers_timestamps(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"), {"retention.ms": "1000"})
        await h.produce(encoded(["old"], timestamps=[NOW - 5000]), now_ms=NOW)  # its own, old timestamp
        await h.produce(encoded(["untimed"]), now_ms=NOW - 5000)  # takes its (old) append time
        await h.produce(encoded(["new"], timestamps=[NOW]), now_ms=NOW)
        assert await h.durable(h.partition.enforce_retention(NOW)) == "written"
        assert [v for _, v, _ in h.encoded_values(h.partition.log_start_offset)] == ["new"]
    run(scenario())


def test_read_committed_hides_an_aborted_encoded_transaction(tmp_path):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"))
        await h.produce(encoded(["kept"], producer=(1, 0, 0), transactional=True))
        assert await h.marker(1, 1, committed=True) == "written"
        await h.produce(encoded(["gone"], producer=(1, 1, 0), transactional=True))
        assert h.encoded_values(committed=True) == h.values(committed=True)
        assert [v for _, v, _ in h.encoded_values(committed=True)] == ["kept"]
        assert await h.marker(1, 2, committed=False) == "written"
        assert [v for _, v, _ in h.encoded_values(committed=True)] == ["kept"]
        assert [v for _, v, _ in h.encoded_values()] == ["kept", "gone"]
    run(scenario())


@pytest.mark.parametrize("codec", [0, ZSTD])
def test_a_message_batch_reads_as_an_encoded_one(tmp_path, codec):
    async def scenario():
        h = EncodedHarness(str(tmp_path / "db"))
        message = h_plain_batch(-1, -1, -1, ["m1", "m2"])
        if codec:
            message.compression, message.compressed_records = codec, compression.compress_records(codec, message.records)
            del message.records[:]
        await h.produce(message, now_ms=NOW + 3)
        assert not h.stored()[0].is_encoded
        assert h.encoded_values() == h.values() == [(0, "m1", NOW + 3), (1, "m2", NOW + 3)]
        [data], _ = h.read_encoded(accepted=frozenset({ZSTD}))
        assert batch_format.verified_header(data).compression == codec
    run(scenario())
