"""Reads of one partition's stored batches: fetches, headers, the offset of a
timestamp, the transactional batches of a range. Functions of the store and
what the caller (partition.Partition) knows in memory; they change nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from partition_svc import log_core, log_format, wire
from partition_svc.log_format import StoredBatchHeader
from partition_svc.log_store import LogStore
from partition_svc.partition_core import DerivedState
from partition_svc.producer_state import ProducerStateEntry, ProducerStates
from txlog.protocol import batch_format
from txlog.protocol.leader_epochs import LeaderEpochCache


@dataclass(frozen=True)
class Recovered:
    """What a replica's store says of its partition when it opens."""

    log_start_offset: int
    next_offset: int
    size_bytes: int
    high_watermark: int  # what this replica last knew was replicated
    epochs: LeaderEpochCache
    derived: DerivedState


def recovered(store: LogStore, pkey: bytes) -> Recovered:
    """The partition as stored: its metadata, except that the log itself is the authority on where it ends."""
    meta = store.metadata(pkey) or {}
    next_offset = meta.get("next_offset", 0)
    last = store.batch_at_or_before(pkey, 2**63 - 1)
    if last is not None:
        next_offset = max(next_offset, log_format.decode_header(*last).last_offset + 1)
    producers = ProducerStates()
    for value in store.producers(pkey):
        entry = ProducerStateEntry.from_json(value)
        producers[entry.producer_id] = entry
    return Recovered(meta.get("log_start_offset", 0), next_offset, meta.get("size_bytes", 0),
                     min(meta.get("high_watermark", next_offset), next_offset), LeaderEpochCache(store.leader_epochs(pkey)),
                     DerivedState(producers, store.aborted_spans(pkey), store.pending_offsets(pkey)))


def read_encoded(store: LogStore, pkey: bytes, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *,
                 take_first: bool, is_aborted: Callable[[int, int], bool] | None, epoch_at: Callable[[int], int],
                 accepted: frozenset[int], encoded: bool = False, bytes_enough: int | None = None) -> tuple[list[wire.Encoded], int, int]:
    """The serialized RecordBatches from ``fetch_offset`` below ``upper_offset``,
    up to ``bytes_max`` bytes and ``records_max`` records, except that with
    ``take_first`` the first batch is taken whatever its size (so a consumer
    always makes progress); records before fetch_offset are trimmed from the
    first batch; with ``is_aborted`` (read_committed), batches of aborted
    transactions are skipped; each batch says the leader epoch it was written
    in (partition_leader_epoch, ``epoch_at``). A batch stored compressed goes
    out as stored, whole, when its codec is in ``accepted`` (the reader skips
    its records below fetch_offset, as Kafka's consumers do), else
    decompressed into plain records with offsets, trimmed as an uncompressed
    one. With ``encoded``, each batch comes whole in the encoded format
    (batch_format; one stored as a message converted), decompressed unless
    ``accepted`` lists its codec. Each batch is returned unjoined (wire.Encoded: the stored bytes, not
    copied, then the epoch field), for a response that copies them once.
    With ``bytes_enough``, the read stops once it has taken that many bytes
    (the last batch may take it past, within ``bytes_max``) rather than read
    the next batch to learn that it does not fit: a streamed fetch's chunk,
    which the next chunk continues, reads each batch once.
    Returns (batches, offset to fetch next, record count)."""
    batches: list[wire.Encoded] = []
    if fetch_offset >= upper_offset:
        return batches, fetch_offset, 0
    next_offset = fetch_offset
    taken_bytes = taken_records = 0
    for base_offset, value in store.batches_holding(pkey, fetch_offset, upper_offset):
        header = log_format.decode_header(base_offset, value)
        if header.last_offset < fetch_offset:
            continue
        if header.last_offset >= upper_offset:
            break  # a batch straddling the upper bound cannot happen; stop rather than expose it
        count = header.last_offset + 1 - max(base_offset, fetch_offset)
        over = taken_bytes + header.stored_bytes > bytes_max or taken_records + count > records_max
        if over and (taken_records or not take_first):
            break
        next_offset = header.last_offset + 1
        if header.is_control or (is_aborted is not None and header.is_transactional and is_aborted(header.producer_id, base_offset)):
            continue
        if encoded:
            batches.append(wire.encoded(*batch_format.with_epoch(log_core.encoded_of(header, value, accepted), epoch_at(base_offset))))
        else:
            batches.append(wire.record_batch(_message_payload(header, value, fetch_offset, accepted), epoch_at(base_offset)))
        taken_bytes += header.stored_bytes
        taken_records += count
        if taken_bytes >= min(bytes_max, bytes_enough or bytes_max) or taken_records >= records_max:
            break  # no next batch fits (each has bytes and a record), or enough: stop before the iterator reads one
    return batches, next_offset, taken_records


def _message_payload(header: StoredBatchHeader, value: bytes, fetch_offset: int, accepted: frozenset[int]):
    """A stored batch as a serialized RecordBatch for a reader of that form: the
    stored bytes themselves when they are one it takes as they are."""
    if not header.is_encoded and (header.compression in accepted if header.compression else header.base_offset >= fetch_offset):
        return log_format.payload_of(value)
    return log_core.message_of(value, fetch_offset, accepted).SerializeToString()


def headers(store: LogStore, pkey: bytes, from_offset: int) -> Iterator[StoredBatchHeader]:
    """The stored batches' headers from the one holding ``from_offset`` on."""
    for base_offset, value in store.batches_holding(pkey, from_offset):
        yield log_format.decode_header(base_offset, value)


def offset_for_timestamp(store: LogStore, pkey: bytes, timestamp_ms: int, log_start_offset: int,
                         high_watermark: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record at or after ``timestamp_ms`` in
    [log start, high watermark), or (-1, -1)."""
    for header in headers(store, pkey, log_start_offset):
        if header.base_offset >= high_watermark:
            break
        if header.max_timestamp_ms < timestamp_ms or header.is_control:
            continue
        for record in log_core.records_of(store.batch(pkey, header.base_offset)):
            if record.timestamp_ms >= timestamp_ms and record.offset >= log_start_offset:
                return record.offset, record.timestamp_ms
    return -1, -1


def transactional_batches(store: LogStore, pkey: bytes, from_offset: int, to_offset: int) -> list[tuple[int, int]]:
    """(producer id, base offset) of the transactional data batches holding offsets ``from_offset``..``to_offset`` - 1."""
    batches = []
    for base_offset, value in store.batches_holding(pkey, from_offset):
        if base_offset >= to_offset:
            break
        header = log_format.decode_header(base_offset, value)
        if header.last_offset >= from_offset and header.is_transactional and not header.is_control:
            batches.append((header.producer_id, base_offset))
    return batches
