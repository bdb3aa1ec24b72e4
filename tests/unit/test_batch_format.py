"""The encoded batch format, pure: what the producer builds is what a reader
verifies and decodes; the CRC covers everything but the leader's own fields;
every way a batch can be malformed is caught by the check that owns it."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txlog.protocol import batch_format, compression
from txlog.protocol.batch_format import BatchFormatError
from txlog.v1 import common_pb2, partition_pb2

NOW = 1_700_000_000_000


def section(records: list[common_pb2.Record], codec: int = 0) -> bytes:
    raw = common_pb2.RecordBatch(records=records).SerializeToString()
    return compression.compress(codec, raw) if codec else raw


records_strategy = st.lists(st.builds(
    common_pb2.Record,
    timestamp_ms=st.sampled_from([0, NOW, NOW + 7]),
    key=st.one_of(st.none(), st.binary(max_size=8)),
    value=st.one_of(st.none(), st.binary(max_size=64)),
    headers=st.lists(st.builds(common_pb2.Header, key=st.text(max_size=4), value=st.binary(max_size=4)), max_size=2),
), min_size=1, max_size=20)


@given(records=records_strategy, codec=st.sampled_from([0, *sorted(compression.CODECS)]),
       producer=st.sampled_from([(-1, -1, -1, False), (7, 3, 100, False), (7, 3, 2**31 - 1, True)]),
       base_offset=st.integers(0, 2**40), append_time=st.sampled_from([0, NOW + 1000]))
def test_a_batch_decodes_to_the_records_it_was_built_from_with_offsets_and_timestamps(records, codec, producer, base_offset,
                                                                                       append_time):
    producer_id, epoch, sequence, transactional = producer
    data = batch_format.encode(section(records, codec), len(records), producer_id=producer_id, producer_epoch=epoch,
                               base_sequence=sequence, transactional=transactional, codec=codec,
                               max_timestamp_ms=max(r.timestamp_ms for r in records),
                               untimed=any(r.timestamp_ms == 0 for r in records))
    stored = b"".join(batch_format.stamped(data, base_offset, append_time))
    read = b"".join(batch_format.with_epoch(stored, 9))
    header = batch_format.verified_header(read)  # the leader's fields lie outside the CRC
    assert (header.base_offset, header.partition_leader_epoch, header.log_append_time_ms) == (base_offset, 9, append_time)
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.is_transactional) == producer
    assert (header.record_count, header.last_offset, header.compression) == (len(records), base_offset + len(records) - 1, codec)
    message = batch_format.to_message(read, header)
    assert [r.offset for r in message.records] == list(range(base_offset, base_offset + len(records)))
    assert [r.timestamp_ms for r in message.records] == [r.timestamp_ms or append_time for r in records]
    assert [(r.key, r.value, list(r.headers)) for r in message.records] == [(r.key, r.value, list(r.headers)) for r in records]
    # and back: the message form of a stored batch encodes to a batch with the same records
    again = batch_format.from_message(message, len(records), header.max_timestamp_ms)
    again_header = batch_format.verified_header(again)
    assert batch_format.to_message(again, again_header) == message


def test_a_reader_of_messages_gets_a_compressed_batch_whole_when_it_takes_the_codec():
    records = [common_pb2.Record(value=b"a"), common_pb2.Record(value=b"b", timestamp_ms=NOW)]
    data = b"".join(batch_format.stamped(batch_format.encode(section(records, common_pb2.COMPRESSION_GZIP), 2,
                                                             codec=common_pb2.COMPRESSION_GZIP, untimed=True), 40, NOW + 5))
    header = batch_format.verified_header(data)
    whole = batch_format.to_message(data, header, from_offset=41, keep_codecs=frozenset({common_pb2.COMPRESSION_GZIP}))
    assert (whole.base_offset, whole.compression, whole.log_append_time_ms) == (40, common_pb2.COMPRESSION_GZIP, NOW + 5)
    compression.expand(whole, 1 << 20, 41)
    assert [(r.offset, r.value, r.timestamp_ms) for r in whole.records] == [(41, b"b", NOW)]
    trimmed = batch_format.to_message(data, header, from_offset=41)
    assert [(r.offset, r.timestamp_ms) for r in trimmed.records] == [(41, NOW)]
    plain = batch_format.uncompressed(data, header)
    plain_header = batch_format.verified_header(plain)
    assert plain_header.compression == 0 and batch_format.to_message(plain, plain_header) == batch_format.to_message(data, header)


def test_every_byte_the_crc_covers_is_checked_and_the_leader_fields_are_not():
    data = batch_format.encode(section([common_pb2.Record(value=b"value")]), 1, producer_id=1, producer_epoch=0,
                               base_sequence=0, max_timestamp_ms=NOW)
    for index in range(batch_format.CRC_END, len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x40
        with pytest.raises(BatchFormatError, match="CRC32C"):
            batch_format.check_crc(bytes(damaged), batch_format.header_of(bytes(damaged)))
    for index in range(0, 20):  # base offset, leader epoch, append time: the leader's
        changed = bytearray(data)
        changed[index] ^= 0x40
        batch_format.verified_header(bytes(changed))


def test_the_header_sits_where_the_contract_says():
    data = batch_format.encode(section([common_pb2.Record(value=b"v")] * 3), 3, producer_id=0x0102030405060708,
                               producer_epoch=0x0a0b, base_sequence=0x0c0d0e0f, transactional=True, codec=0,
                               max_timestamp_ms=NOW, base_offset=5, log_append_time_ms=6)
    assert batch_format.HEADER_BYTES == 53
    assert struct.unpack_from(">qiqb", data) == (5, -1, 6, 2)
    assert struct.unpack_from(">hiqqhi", data, 25) == (0x10, 2, NOW, 0x0102030405060708, 0x0a0b, 0x0c0d0e0f)
    assert common_pb2.RecordBatch.FromString(data[53:]).records[2].value == b"v"


@pytest.mark.parametrize(("data", "message"), [
    (b"", "53-byte header"),
    (b"\x00" * 53, "53-byte header"),
    (b"\x00" * 20 + b"\x01" + b"\x00" * 40, "magic"),
])
def test_bytes_that_are_not_an_encoded_batch_say_why(data, message):
    with pytest.raises(BatchFormatError, match=message):
        batch_format.header_of(data)


@pytest.mark.parametrize(("records", "count", "message"), [
    (section([common_pb2.Record(value=b"v")] * 3), 2, "says 2 records"),
    (section([common_pb2.Record(value=b"v")]), 2, "holds 1"),
    (b"\xff" * 10, 1, "not a serialized RecordBatch"),
    (common_pb2.RecordBatch(base_offset=4, records=[common_pb2.Record()]).SerializeToString(), 1, "only records"),
])
def test_a_records_section_must_hold_exactly_the_records_the_header_counts(records, count, message):
    data = batch_format.encode(records, count)
    with pytest.raises(BatchFormatError, match=message):
        batch_format.open_records(data, batch_format.verified_header(data), 1 << 20)


def test_decompression_is_bounded_and_plain_records_too():
    bomb = batch_format.encode(compression.compress(common_pb2.COMPRESSION_ZSTD, bytes(1 << 20)), 1,
                               codec=common_pb2.COMPRESSION_ZSTD)
    with pytest.raises(BatchFormatError, match="limit"):
        batch_format.open_records(bomb, batch_format.verified_header(bomb), 1 << 16)
    plain = batch_format.encode(section([common_pb2.Record(value=bytes(1000))]), 1)
    with pytest.raises(BatchFormatError, match="limit"):
        batch_format.open_records(plain, batch_format.verified_header(plain), 500)


def test_a_summary_reads_either_form_of_a_produced_batch():
    encoded = partition_pb2.PartitionBatch(encoded_batch=batch_format.encode(
        section([common_pb2.Record()] * 4), 4, producer_id=9, producer_epoch=2, base_sequence=10))
    message = partition_pb2.PartitionBatch(batch=common_pb2.RecordBatch(producer_id=9, producer_epoch=2, base_sequence=10,
                                                                         records=[common_pb2.Record()] * 4))
    assert batch_format.summary_of(encoded) == batch_format.summary_of(message) == (9, 2, 10, 4)
