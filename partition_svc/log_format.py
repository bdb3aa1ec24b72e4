"""How a partition's data is laid out as RocksDB keys and values: pure
encodings, no store (log_store.py holds the store and its writer).

Key layout (``pkey`` = topic UTF-8, NUL, partition as 4-byte big-endian):

    L pkey offset(8B BE)       a record batch, keyed by its base offset: a fixed
                               header (BATCH_HEADER) then the batch, encoded
                               (FLAG_ENCODED: batch_format, as produced) or a
                               RecordBatch protobuf
    M pkey                     partition metadata, JSON: log_start_offset, next_offset, size_bytes,
                               high_watermark (what this replica last knew was replicated)
    E pkey epoch(4B BE)        the leader-epoch cache: the first offset written in that epoch
    P pkey producer_id(8B BE)  the producer's state (producer_state.ProducerStateEntry)
    A pkey producer_id(8B) first_offset(8B)
                               an aborted transaction: JSON {"first", "last"} (the
                               aborted-transaction index read_committed filters with)
    X pkey producer_id(8B) G-key
                               a consumer offset committed in the producer's open
                               transaction, waiting for its marker (TxnOffsetCommit)
    G group NUL topic NUL partition(4B BE)
                               a consumer group's committed offset, JSON (the
                               compacted view of __consumer_offsets)
    S                          when this storage was made: JSON {"zxid"}, a ZooKeeper
                               transaction id no earlier than its creation (0 for
                               storage made before this key existed)
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from txlog.protocol import batch_format

# last_offset, max_timestamp_ms, producer_id, producer_epoch, flags, record_count
BATCH_HEADER = struct.Struct(">qqqhBI")
FLAG_TRANSACTIONAL = 1
FLAG_CONTROL = 2
FLAG_COMMIT = 4
# Bits 3 and 4: the batch's RecordBatch.compression (0: none), so that reads
# know which batches to decompress without parsing any.
COMPRESSION_SHIFT = 3
COMPRESSION_MASK = 3
# The payload is a batch in the encoded format (txlog.protocol.batch_format), as its producer sent it
# with the base offset and append time written; without it, a RecordBatch message.
FLAG_ENCODED = 32
# A marker whose transaction has no batch left on this replica: its max_timestamp_ms is then the time
# compaction found it so (its delete horizon starts there; the marker's own time is in its record).
FLAG_EMPTIED = 64


STORAGE_KEY = b"S"


def metadata_value(log_start_offset: int, next_offset: int, size_bytes: int, high_watermark: int) -> bytes:
    return json.dumps({"log_start_offset": log_start_offset, "next_offset": next_offset, "size_bytes": size_bytes,
                       "high_watermark": high_watermark}).encode()


def offset_value(offset: int) -> bytes:
    return offset.to_bytes(8, "big")


def aborted_span_value(first_offset: int, last_offset: int) -> bytes:
    return json.dumps({"first": first_offset, "last": last_offset}).encode()


def group_offset_value(offset: int, metadata: str, commit_ms: int) -> bytes:
    return json.dumps({"offset": offset, "metadata": metadata, "commit_ms": commit_ms}).encode()


def offset_of(group_offset_value: bytes) -> int:
    return json.loads(group_offset_value)["offset"]


def offset_and_metadata(raw: bytes) -> tuple[int, str]:
    committed = json.loads(raw)
    return committed["offset"], committed["metadata"]


def partition_key(topic: str, partition: int) -> bytes:
    return topic.encode() + b"\x00" + partition.to_bytes(4, "big")


def log_key(pkey: bytes, offset: int) -> bytes:
    return b"L" + pkey + offset.to_bytes(8, "big")


def offset_of_key(key: bytes) -> int:
    """The base offset of a batch's key (log_key)."""
    return int.from_bytes(key[-8:], "big")


def meta_key(pkey: bytes) -> bytes:
    return b"M" + pkey


def epoch_key(pkey: bytes, epoch: int) -> bytes:
    return b"E" + pkey + epoch.to_bytes(4, "big")


def producer_key(pkey: bytes, producer_id: int) -> bytes:
    return b"P" + pkey + producer_id.to_bytes(8, "big")


def aborted_key(pkey: bytes, producer_id: int, first_offset: int) -> bytes:
    return b"A" + pkey + producer_id.to_bytes(8, "big") + first_offset.to_bytes(8, "big")


def pending_offset_key(pkey: bytes, producer_id: int, group_key: bytes) -> bytes:
    return b"X" + pkey + producer_id.to_bytes(8, "big") + group_key


def group_offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return b"G" + group_id.encode() + b"\x00" + topic.encode() + b"\x00" + partition.to_bytes(4, "big")


def group_prefix(group_id: str) -> bytes:
    return b"G" + group_id.encode() + b"\x00"


def membership_key(group_id: str, member_id: str) -> bytes:
    """A consumer group's membership record (consumer_group.records(); member id "": the group's own)."""
    return membership_prefix(group_id) + member_id.encode()


def membership_prefix(group_id: str) -> bytes:
    return b"C" + group_id.encode() + b"\x00"


@dataclass(frozen=True)
class StoredBatchHeader:
    base_offset: int
    last_offset: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    flags: int
    record_count: int
    stored_bytes: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.flags & FLAG_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)

    @property
    def is_encoded(self) -> bool:
        return bool(self.flags & FLAG_ENCODED)

    @property
    def is_emptied(self) -> bool:
        return bool(self.flags & FLAG_EMPTIED)

    @property
    def compression(self) -> int:
        """The RecordBatch.compression the batch is stored with (0: uncompressed)."""
        return self.flags >> COMPRESSION_SHIFT & COMPRESSION_MASK


def compression_flags(compression: int) -> int:
    return compression << COMPRESSION_SHIFT


def encode_batch(last_offset, max_timestamp_ms, producer_id, producer_epoch, flags, record_count, payload: bytes) -> bytes:
    return BATCH_HEADER.pack(last_offset, max_timestamp_ms, producer_id, producer_epoch, flags, record_count) + payload


def encode_batch_parts(last_offset, max_timestamp_ms, producer_id, producer_epoch, flags, record_count, parts) -> bytes:
    """encode_batch() of a payload given as pieces, joined once."""
    return b"".join([BATCH_HEADER.pack(last_offset, max_timestamp_ms, producer_id, producer_epoch, flags, record_count), *parts])


def decode_header(base_offset: int, value: bytes) -> StoredBatchHeader:
    return StoredBatchHeader(base_offset, *BATCH_HEADER.unpack_from(value), len(value))


class DamagedBatch(ValueError):
    """A stored batch whose bytes do not hold together: says what disagrees."""


def prove_encoded(stored: StoredBatchHeader, value) -> None:
    """A stored batch in the encoded format (``stored``: its decoded stored
    header) proves itself: its CRC32C holds (over everything but the leader's
    fields, as the producer computed it) and its stored header agrees with
    the batch's own header, base offset included (the key's). What reads it
    from RocksDB without RocksDB's checksums relies on this; DamagedBatch
    otherwise. (validation.check_encoded is the produce-side check of a batch
    a producer sends.)"""
    base_offset = stored.base_offset
    try:
        header = batch_format.verified_header(payload_of(value))
    except batch_format.BatchFormatError as exc:
        raise DamagedBatch(f"the batch stored at offset {base_offset} is damaged: {exc}") from None
    said = (base_offset, stored.last_offset, stored.producer_id, stored.producer_epoch, stored.record_count, stored.is_transactional,
            stored.compression)
    holds = (header.base_offset, header.last_offset, header.producer_id, header.producer_epoch, header.record_count,
             header.is_transactional, header.compression)
    if said != holds:
        raise DamagedBatch(f"the batch stored at offset {base_offset} is damaged: its stored header says (base offset, last "
                           f"offset, producer, epoch, records, transactional, codec) {said}, the batch {holds}")


def emptied_marker(value: bytes, emptied_ms: int) -> bytes:
    """A stored marker's value, marked FLAG_EMPTIED since ``emptied_ms``."""
    last_offset, _, producer_id, producer_epoch, flags, record_count = BATCH_HEADER.unpack_from(value)
    return encode_batch(last_offset, emptied_ms, producer_id, producer_epoch, flags | FLAG_EMPTIED, record_count,
                        bytes(payload_of(value)))


def payload_of(value: bytes) -> memoryview:
    """The batch bytes of a stored value (encoded or a RecordBatch, as its flags say), without copying them."""
    return memoryview(value)[BATCH_HEADER.size:]
