"""The encoded batch format: one batch of one producer as a single bytes value,
which the producer builds, the leader stores as it came and readers get back
as stored (Kafka's record batch v2 in spirit; docs/guides/batch-format.md is the
contract for other languages).

Layout, big-endian, HEADER_BYTES (53) then the records::

    0  int64   base_offset             the leader's; producers send 0
    8  int32   partition_leader_epoch  the leader's (set as it is read); producers send -1
   12  int64   log_append_time_ms      the leader's; producers send 0
   20  int8    magic                   2
   21  uint32  crc                     CRC32C (Castagnoli) of every byte from 25 on
   25  int16   attributes              bits 0-2: the records' compression codec
                                       (common.proto's Compression); bit 3: some
                                       record has timestamp 0 and takes
                                       log_append_time_ms; bit 4: transactional;
                                       every other bit 0
   27  int32   last_offset_delta       the record count - 1
   31  int64   max_timestamp_ms        the largest record timestamp (0: none set)
   39  int64   producer_id             -1: no producer (then epoch and sequence -1 too)
   47  int16   producer_epoch
   49  int32   base_sequence           record i has sequence base_sequence + i
   53  records                         a serialized RecordBatch holding only
                                       ``records``, compressed with the codec

Record i's offset is base_offset + i: records carry none (a batch is never
rewritten, compaction deletes whole batches, so the delta of record i is i).
A record's timestamp_ms 0 means the batch's log_append_time_ms.

The leader writes base_offset and log_append_time_ms, which the CRC does not
cover, so it stores the producer's bytes without computing anything over
them again; readers check the CRC before they trust the rest.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from txlog.protocol import compression
from txlog.v1 import common_pb2

MAGIC = 2
HEADER = struct.Struct(">qiqbIhiqqhi")
HEADER_BYTES = HEADER.size  # 53
LEADER_FIELDS = struct.Struct(">qiq")  # base_offset, partition_leader_epoch, log_append_time_ms
CRC_END = 25  # the CRC covers bytes[CRC_END:]
EPOCH_AT, EPOCH_END = 8, 12

CODEC_MASK = 0x07
UNTIMED_RECORDS = 0x08
TRANSACTIONAL = 0x10
KNOWN_ATTRIBUTES = CODEC_MASK | UNTIMED_RECORDS | TRANSACTIONAL


class BatchFormatError(ValueError):
    """Bytes that are not a well-formed encoded batch: says what is wrong."""


class BatchHeader(NamedTuple):
    base_offset: int
    partition_leader_epoch: int
    log_append_time_ms: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def record_count(self) -> int:
        return self.last_offset_delta + 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def has_untimed_records(self) -> bool:
        return bool(self.attributes & UNTIMED_RECORDS)


class BatchSummary(NamedTuple):
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


def summary_of(partition_batch) -> BatchSummary:
    """What a PartitionBatch carries, in either form (``encoded_batch`` or
    ``batch``): its producer fields and record count, for tools that watch
    requests go by (its CRC is not checked here)."""
    if partition_batch.encoded_batch:
        header = header_of(partition_batch.encoded_batch)
        return BatchSummary(header.producer_id, header.producer_epoch, header.base_sequence, header.record_count)
    batch = partition_batch.batch
    return BatchSummary(batch.producer_id, batch.producer_epoch, batch.base_sequence, len(batch.records))


def crc_of(data) -> int:
    return crc32c.crc32c(memoryview(data)[CRC_END:])


_COVERED = struct.Struct(">hiqqhi")  # the header's fields the CRC covers, attributes to base_sequence
_MAGIC_CRC = struct.Struct(">bI")


def header_bytes(records, record_count: int, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False, codec: int = 0, max_timestamp_ms: int = 0, untimed: bool = False,
                 base_offset: int = 0, log_append_time_ms: int = 0) -> bytes:
    """The header of a batch of ``records`` (a serialized RecordBatch of only
    records, already compressed with ``codec``), its CRC computed over it and
    ``records``: the batch is this then ``records``, which need not be joined
    to it here. ``untimed``: some record has timestamp 0."""
    attributes = codec | (UNTIMED_RECORDS if untimed else 0) | (TRANSACTIONAL if transactional else 0)
    covered = _COVERED.pack(attributes, record_count - 1, max_timestamp_ms, producer_id, producer_epoch, base_sequence)
    crc = crc32c.crc32c(records, crc32c.crc32c(covered))
    return LEADER_FIELDS.pack(base_offset, -1, log_append_time_ms) + _MAGIC_CRC.pack(MAGIC, crc) + covered


def encode(records: bytes, record_count: int, **fields) -> bytes:
    """A whole batch: header_bytes() then ``records``."""
    return header_bytes(records, record_count, **fields) + records


def header_of(data) -> BatchHeader:
    """The header of an encoded batch; BatchFormatError when it is too short or not this format."""
    if len(data) <= HEADER_BYTES:
        raise BatchFormatError(f"an encoded batch is a {HEADER_BYTES}-byte header then its records; got {len(data)} bytes")
    header = BatchHeader._make(HEADER.unpack_from(data))
    if header.magic != MAGIC:
        raise BatchFormatError(f"an encoded batch's magic byte (offset 20) is {MAGIC}, not {header.magic}")
    return header


def check_crc(data, header: BatchHeader) -> None:
    actual = crc_of(data)
    if actual != header.crc:
        raise BatchFormatError(f"the batch's CRC32C is {header.crc:#010x} but its bytes 25.. give {actual:#010x}: the batch "
                               "was damaged (or built without the CRC)")


def verified_header(data) -> BatchHeader:
    header = header_of(data)
    check_crc(data, header)
    return header


def records_section(data) -> memoryview:
    return memoryview(data)[HEADER_BYTES:]


def open_records(data, header: BatchHeader, bytes_max: int) -> common_pb2.RecordBatch:
    """The batch's records (a RecordBatch of only them, parsed), decompressed
    within ``bytes_max``; BatchFormatError unless they are exactly
    ``header.record_count`` records and nothing else."""
    section = records_section(data)
    if header.compression:
        try:
            section = compression.decompress(header.compression, bytes(section), bytes_max)
        except compression.CompressionError as exc:
            raise BatchFormatError(f"the batch's records section: {exc}") from None
    elif len(section) > bytes_max:
        raise BatchFormatError(f"the batch's records are {len(section)} bytes, more than the limit of {bytes_max}")
    inner = compression.records_only(section, BatchFormatError, "the batch's records")
    if len(inner.records) != header.record_count:
        raise BatchFormatError(f"the header says {header.record_count} records (last_offset_delta {header.last_offset_delta}) "
                               f"but the records section holds {len(inner.records)}")
    return inner


def stamped(data, base_offset: int, log_append_time_ms: int) -> list:
    """The pieces of ``data`` as the leader stores it: its base offset and
    append time written (the leader epoch is set as it is read, :func:`with_epoch`)."""
    return [LEADER_FIELDS.pack(base_offset, -1, log_append_time_ms), memoryview(data)[LEADER_FIELDS.size:]]


def with_epoch(data, leader_epoch: int) -> tuple:
    """``data`` with partition_leader_epoch set, as pieces to join (no copy here)."""
    view = memoryview(data)
    return view[:EPOCH_AT], leader_epoch.to_bytes(4, "big", signed=True), view[EPOCH_END:]


def from_message(batch: common_pb2.RecordBatch, record_count: int, max_timestamp_ms: int) -> bytes:
    """A stored RecordBatch (its records with their offsets and timestamps, or
    compressed ones taking log_append_time_ms for timestamp 0) in the encoded
    format, CRC computed; ``record_count`` and ``max_timestamp_ms`` as its
    stored header says. The records keep the offsets they carry: readers ignore them."""
    if batch.compression:
        records = batch.compressed_records
    else:
        records = common_pb2.RecordBatch(records=batch.records).SerializeToString()
    return encode(records, record_count, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                  base_sequence=batch.base_sequence, transactional=batch.is_transactional, codec=batch.compression,
                  max_timestamp_ms=max_timestamp_ms, untimed=bool(batch.compression), base_offset=batch.base_offset,
                  log_append_time_ms=batch.log_append_time_ms)


def uncompressed(data, header: BatchHeader, bytes_max: int = compression.READ_BYTES_MAX) -> bytes:
    """A compressed batch re-encoded with its records uncompressed, CRC computed."""
    records = open_records(data, header, bytes_max).SerializeToString()
    return encode(records, header.record_count, producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                  base_sequence=header.base_sequence, transactional=header.is_transactional,
                  max_timestamp_ms=header.max_timestamp_ms, untimed=header.has_untimed_records,
                  base_offset=header.base_offset, log_append_time_ms=header.log_append_time_ms)


def to_message(data, header: BatchHeader, *, from_offset: int = 0, keep_codecs: frozenset[int] = frozenset(),
               bytes_max: int = compression.READ_BYTES_MAX) -> common_pb2.RecordBatch:
    """The batch as a RecordBatch message, for a reader of that form: records
    with their offsets and timestamps, those below ``from_offset`` left out; or,
    stored with a codec in ``keep_codecs``, compressed and whole, as
    RecordBatch.compressed_records carries them."""
    batch = common_pb2.RecordBatch(base_offset=header.base_offset, producer_id=header.producer_id,
                                   producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                                   is_transactional=header.is_transactional)
    if header.compression and header.compression in keep_codecs:
        batch.compression = header.compression
        batch.compressed_records = bytes(records_section(data))
        batch.log_append_time_ms = header.log_append_time_ms
        return batch
    records = open_records(data, header, bytes_max).records
    skip = max(from_offset - header.base_offset, 0)
    if skip:
        del records[:skip]
    append_time_ms = header.log_append_time_ms
    for offset, record in enumerate(records, header.base_offset + skip):
        record.offset = offset
        if not record.timestamp_ms:
            record.timestamp_ms = append_time_ms
    batch.records.MergeFrom(records)
    return batch
