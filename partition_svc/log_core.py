"""The rules of a partition's log itself, pure: the offsets, timestamps and
stored form of an append; which batches retention, compaction and
DeleteRecords let go, and where the log start moves. No I/O, no clock, no
asyncio: the shell (partition.py) passes the time, the batches it read from
the store and the sizes it keeps; partition_core.py holds the transactional
rules.

Invariants kept here:
- Offsets are given in order from the log end; a batch's stored value is its
  header (log_format) then the RecordBatch, compressed as the topic's
  compression.type says.
- The log start only moves forward. Whole batches below it are deleted; a
  batch it falls inside stays (reads trim its records below the log start).
- Nothing at or past the last stable offset is deleted, by retention,
  compaction or DeleteRecords: not a record of an open transaction, nor the
  marker still to come for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from partition_svc import log_format, validation
from partition_svc.log_format import StoredBatchHeader
from partition_svc.partition_core import UNCHANGED, Unchanged
from partition_svc.producer_state import Reject
from txlog.protocol import batch_format, compression
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2


@dataclass(frozen=True)
class Encoded:
    """A batch given its offsets: its stored value, its record count and newest timestamp."""

    value: bytes
    record_count: int
    max_timestamp_ms: int


@dataclass(frozen=True)
class MoveLogStart:
    """Move the log start forward to ``offset``."""

    offset: int


def encode_append(batch: common_pb2.RecordBatch, base: int, now_ms: int, topic: str, configs: dict[str, str],
                  limits: validation.BatchLimits) -> Encoded:
    """Checks a producer's batch's records while giving them offsets from
    ``base``; raises TxlogError for a bad record (nothing is changed but the
    message ``batch``). A batch validation.check_batch opened (compressed: its
    records decompressed into ``records``) is checked as a plain one, then
    stored as the topic's compression.type says: compressed (the producer's
    bytes as they came when the codec is the same, else re-encoded), its
    records without offsets and timestamps 0 left for log_append_time_ms; or
    plain, each record with its offset and a timestamp (``now_ms`` for 0)."""
    count = len(batch.records)
    batch.base_offset = base
    batch.ClearField("partition_leader_epoch")  # a fetch says it
    codec = validation.stored_compression(topic, configs, batch.compression)
    record_bytes_max = int(configs["max.record.bytes"])
    max_timestamp_ms = 0
    for i, record in enumerate(batch.records):
        timestamp_ms = record.timestamp_ms
        if not codec:  # a compressed batch's records are stored as the producer sent them
            record.offset = base + i
            if timestamp_ms == 0:
                record.timestamp_ms = now_ms
        if timestamp_ms == 0:
            timestamp_ms = now_ms
        elif not 0 < timestamp_ms <= validation.TIMESTAMP_MS_MAX:
            validation.check_record(i, record)
        if len(record.headers) > validation.HEADERS_PER_RECORD_MAX:
            validation.check_record(i, record)
        if timestamp_ms > max_timestamp_ms:
            max_timestamp_ms = timestamp_ms
    if codec:
        # the records' plain size: the message holds them and, when it came compressed, their compressed bytes
        validation.check_sizes(batch, batch.ByteSize() - len(batch.compressed_records), limits, record_bytes_max)
        if codec != batch.compression:
            batch.compressed_records = compression.compress_records(codec, batch.records)
            batch.compression = codec
        batch.ClearField("records")
        batch.log_append_time_ms = now_ms
        payload = batch.SerializeToString()
    else:
        for name in ("compression", "compressed_records", "log_append_time_ms"):
            batch.ClearField(name)
        payload = batch.SerializeToString()
        validation.check_sizes(batch, len(payload), limits, record_bytes_max)
    flags = (log_format.FLAG_TRANSACTIONAL if batch.is_transactional else 0) | log_format.compression_flags(codec)
    value = log_format.encode_batch(base + count - 1, max_timestamp_ms, batch.producer_id, batch.producer_epoch, flags, count,
                                    payload)
    return Encoded(value, count, max_timestamp_ms)


def encode_encoded(batch: validation.EncodedBatch, base: int, now_ms: int, topic: str, configs: dict[str, str],
                   limits: validation.BatchLimits) -> Encoded:
    """An encoded batch (validation.check_encoded) given its offsets from
    ``base``: stored as the producer sent it, with its base offset and append
    time written (outside the CRC), unless the topic's compression.type asks
    for another codec (then re-encoded, CRC computed here). Raises TxlogError
    for a record larger than max.record.bytes, nothing changed."""
    header = batch.header
    count = header.record_count
    validation.check_sizes(batch.parsed, batch.plain_bytes, limits, int(configs["max.record.bytes"]))
    max_timestamp_ms = header.max_timestamp_ms
    if header.has_untimed_records or not max_timestamp_ms:
        max_timestamp_ms = max(max_timestamp_ms, now_ms)
    codec = validation.stored_compression(topic, configs, header.compression)
    if codec == header.compression:
        parts = batch_format.stamped(batch.data, base, now_ms)
    else:
        records = batch.parsed.SerializeToString()
        parts = [batch_format.encode(compression.compress(codec, records) if codec else records, count,
                                     producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                                     base_sequence=header.base_sequence, transactional=header.is_transactional, codec=codec,
                                     max_timestamp_ms=header.max_timestamp_ms, untimed=header.has_untimed_records,
                                     base_offset=base, log_append_time_ms=now_ms)]
    flags = (log_format.FLAG_TRANSACTIONAL if header.is_transactional else 0) | log_format.compression_flags(codec) \
        | log_format.FLAG_ENCODED
    value = log_format.encode_batch_parts(base + count - 1, max_timestamp_ms, header.producer_id, header.producer_epoch, flags,
                                          count, parts)
    return Encoded(value, count, max_timestamp_ms)


def encode_internal(batch: common_pb2.RecordBatch, base: int, flags: int, now_ms: int) -> Encoded:
    """A batch the leader writes itself (markers, offsets), given its offsets from ``base``."""
    batch.base_offset = base
    for i, record in enumerate(batch.records):
        record.offset = base + i
        record.timestamp_ms = record.timestamp_ms or now_ms
    count = len(batch.records)
    return Encoded(log_format.encode_batch(base + count - 1, now_ms, batch.producer_id, batch.producer_epoch, flags, count,
                                           batch.SerializeToString()), count, now_ms)


def control_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, control_type: int,
                  now_ms: int) -> tuple[common_pb2.RecordBatch, int]:
    """A control batch (COMMIT, ABORT, PREPARED) of one record, and its stored flags."""
    marker = common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                                    is_transactional=True, control_type=control_type, coordinator_epoch=coordinator_epoch,
                                    records=[common_pb2.Record(timestamp_ms=now_ms)])
    flags = log_format.FLAG_TRANSACTIONAL | log_format.FLAG_CONTROL
    if control_type == common_pb2.CONTROL_TYPE_COMMIT:
        flags |= log_format.FLAG_COMMIT
    return marker, flags


def offsets_batch(offsets: list[tuple[bytes, bytes | None]]) -> common_pb2.RecordBatch:
    """Consumer offsets committed outside a transaction, as a batch of no producer: a value of
    None deletes the offset (a tombstone record)."""
    return common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  records=[common_pb2.Record(key=k) if v is None else common_pb2.Record(key=k, value=v)
                                           for k, v in offsets])


def txn_offsets_batch(producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]]) -> common_pb2.RecordBatch:
    return common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1, is_transactional=True,
                                  records=[common_pb2.Record(key=key, value=value) for key, value in offsets])


def records_of(value: bytes):
    """A stored batch's records, with their offsets and timestamps, decompressed if it is compressed."""
    return message_of(value).records


def message_of(value: bytes, from_offset: int = 0, keep_codecs: frozenset[int] = frozenset()) -> common_pb2.RecordBatch:
    """A stored batch (either form) as a RecordBatch message: its records with
    their offsets and timestamps, those below ``from_offset`` left out; or,
    stored with a codec in ``keep_codecs``, compressed and whole."""
    payload = log_format.payload_of(value)
    if log_format.decode_header(0, value).is_encoded:
        return batch_format.to_message(payload, batch_format.header_of(payload), from_offset=from_offset, keep_codecs=keep_codecs)
    batch = common_pb2.RecordBatch.FromString(payload)
    if batch.compression and batch.compression not in keep_codecs:
        compression.expand(batch, compression.READ_BYTES_MAX, from_offset)
    elif not batch.compression and from_offset > batch.base_offset:
        del batch.records[: from_offset - batch.base_offset]
    return batch


def encoded_of(header: StoredBatchHeader, value: bytes, keep_codecs: frozenset[int]) -> memoryview | bytes:
    """A stored batch (either form) in the encoded format, whole, its leader
    epoch still to set; stored with a codec not in ``keep_codecs``, decompressed."""
    payload = log_format.payload_of(value)
    if header.is_encoded:
        if header.compression and header.compression not in keep_codecs:
            return batch_format.uncompressed(payload, batch_format.header_of(payload))
        return payload
    batch = common_pb2.RecordBatch.FromString(payload)
    if batch.compression not in keep_codecs:
        compression.expand(batch, compression.READ_BYTES_MAX)
    return batch_format.from_message(batch, header.record_count, header.max_timestamp_ms)


def decide_delete_records(where: str, offset: int, lso: int, log_start_offset: int) -> Reject | Unchanged | MoveLogStart:
    """DeleteRecords (Kafka's): the log start moves to ``offset``, at most the LSO
    (-1 names the LSO itself); an offset at or below the log start changes nothing."""
    target = lso if offset == -1 else offset
    if not 0 <= target <= lso:
        return Reject(ErrorCode.Value("OFFSET_OUT_OF_RANGE"),
                      f"offset {offset} is outside [0, {lso}] of {where}: the log start moves at most to the "
                      "last stable offset (-1 names it); nothing was deleted")
    if target <= log_start_offset:
        return UNCHANGED
    return MoveLogStart(target)


def follower_log_start(leader_log_start: int, high_watermark: int, log_start_offset: int) -> int | None:
    """A follower takes its leader's log start within what it holds as replicated:
    min(the leader's, its own high watermark), as Kafka's followers do; None when it does not move."""
    target = min(leader_log_start, high_watermark)
    return target if target > log_start_offset else None


def batches_below(headers: Iterable[StoredBatchHeader], offset: int) -> list[StoredBatchHeader]:
    """The whole batches a log start at ``offset`` deletes (from the log start, in offset order)."""
    doomed = []
    for header in headers:
        if header.last_offset >= offset:
            break
        doomed.append(header)
    return doomed


def retention_end(headers: Iterable[StoredBatchHeader], now_ms: int, retention_ms: int, retention_bytes: int,
                  size_bytes: int, lso: int) -> int | None:
    """Where retention moves the log start: past the whole batches, from the log
    start, while they are older than ``retention_ms`` or the log is larger than
    ``retention_bytes`` (negative: no limit), never at or past the LSO. None: nowhere."""
    if retention_ms < 0 and retention_bytes < 0:
        return None
    end = None
    for header in headers:
        expired = retention_ms >= 0 and header.max_timestamp_ms < now_ms - retention_ms
        oversized = retention_bytes >= 0 and size_bytes > retention_bytes
        if header.last_offset >= lso or not (expired or oversized):
            break
        end = header.last_offset + 1
        size_bytes -= header.stored_bytes
    return end


@dataclass(frozen=True)
class CompactionPlan:
    """What one compaction pass does: the batches it removes, the new log start
    (None when it does not move), and the markers it marks FLAG_EMPTIED now
    (log_format.emptied_marker), with their stored values."""

    doomed: list[StoredBatchHeader]
    log_start: int | None
    emptied: list[tuple[StoredBatchHeader, bytes]]


def compaction_plan(batches: Iterable[tuple[StoredBatchHeader, bytes]], lso: int,
                    is_aborted: Callable[[int, int], bool], now_ms: int = 0, delete_retention_ms: int = -1,
                    marker_end: int = 0) -> CompactionPlan:
    """cleanup.policy=compact over the stored batches (from the log start, in offset
    order): every batch below the LSO all of whose records have a newer record with
    the same key (the newest record of every key stays), and the batches of aborted
    transactions. Only records read_committed readers see count as newer: an aborted
    record never hides a committed one, and markers (all keyed b"") never hide each
    other.

    A transaction's markers (its COMMIT or ABORT, and a PREPARED before it) stay
    while a batch of the transaction is left: they are what ends it for whoever
    reads the log. The pass that finds none left marks the completing marker
    emptied, since now (``delete_retention_ms`` -1: markers are kept, unmarked);
    a later pass removes the markers once that is ``delete_retention_ms`` ago
    (Kafka's delete.retention.ms, counted as its delete horizon is, KIP-534) and
    the marker is below ``marker_end`` (every replica holds the log below it:
    Partition.marker_end; a replica that copied the transaction's batches but
    not its marker would hold the transaction open for good). Counting from
    when this replica found the transaction empty, not from the marker's write,
    leaves a replica that is slower to compact a day to hand the marker on
    with the batches it still has."""
    latest: dict[bytes, int] = {}
    kept_records: list[tuple[StoredBatchHeader, list[tuple[bytes, int]]]] = []
    aborted: list[StoredBatchHeader] = []
    # every batch in offset order; a marker with its control type and value (kept for markers only: they are small)
    scanned: list[tuple[StoredBatchHeader, int | None, bytes | None]] = []
    for header, value in batches:
        if header.last_offset >= lso:
            break
        if header.is_control:
            scanned.append((header, message_of(value).control_type, value) if delete_retention_ms >= 0 else (header, None, None))
            continue
        scanned.append((header, None, None))
        if header.is_transactional and is_aborted(header.producer_id, header.base_offset):
            aborted.append(header)
            continue
        records = [(r.key, r.offset) for r in records_of(value)]
        kept_records.append((header, records))
        for key, offset in records:
            latest[key] = offset
    doomed = aborted + [h for h, records in kept_records if all(latest[key] > offset for key, offset in records)]
    emptied: list[tuple[StoredBatchHeader, bytes]] = []
    if delete_retention_ms >= 0:
        gone = {h.base_offset for h in doomed}
        for members, marker, value in _transactions_without_batches(scanned, gone):
            if not marker.is_emptied:
                emptied.append((marker, value))
            elif marker.max_timestamp_ms + delete_retention_ms <= now_ms and marker.last_offset < marker_end:
                doomed += [h for h in members if h.is_control] + [marker]
    gone = {h.base_offset for h in doomed}
    log_start = None
    for header, _, _ in scanned:  # the log starts at the first batch kept
        if header.base_offset not in gone:
            break
        log_start = header.last_offset + 1
    return CompactionPlan(doomed, log_start, emptied)


def _transactions_without_batches(scanned: list[tuple[StoredBatchHeader, int | None, bytes | None]], gone: set[int]):
    """The completed transactions in ``scanned`` (offset order) none of whose batches is
    left (all ``gone``), each as (its batches and PREPARED markers, its completing marker,
    that marker's stored value): a producer's transaction is its transactional batches
    since its last completing marker (one transaction at a time, producer_state)."""
    open_txns: dict[int, list[StoredBatchHeader]] = {}  # producer id -> its transaction's batches and PREPARED marker so far
    for header, control_type, value in scanned:
        if not header.is_control:
            if header.is_transactional:
                open_txns.setdefault(header.producer_id, []).append(header)
            continue
        members = open_txns.setdefault(header.producer_id, [])
        if control_type == common_pb2.CONTROL_TYPE_PREPARED:
            members.append(header)
            continue
        del open_txns[header.producer_id]
        if not any(not h.is_control and h.base_offset not in gone for h in members):
            yield members, header, value
