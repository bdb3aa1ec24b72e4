"""One partition this instance leads: its offsets, producer states and log.

Invariants:
- Offsets are assigned in order at append time; ``high_watermark`` only moves
  over appends that are durable, in order, so a reader never sees a record that
  a crash could take back, nor a gap.
- The last stable offset (LSO) is the first offset of the oldest open
  transaction, else the high watermark; no read_committed read goes past it,
  and retention never deletes past it.
- A batch is checked against its producer's state before it gets offsets; a
  rejected batch changes nothing.
- A COMMIT or ABORT marker closes its producer's open transaction, resets its
  sequences at the marker's (bumped) epoch, and records the coordinator epoch:
  a marker with an older coordinator epoch is refused. An aborted transaction
  enters the aborted index, and read_committed reads skip its batches.

Every change goes through one door per request kind (:meth:`Partition.produce`,
:meth:`~Partition.write_marker`, :meth:`~Partition.seal_prepared`,
:meth:`~Partition.commit_offsets`, :meth:`~Partition.commit_txn_offsets`,
:meth:`~Partition.enforce_retention`): each checks, applies the change in
memory and hands it to the writer in one synchronous call, with no await
inside, so the writer receives changes in the order the memory took them (an
earlier change can never overwrite a later one's producer state or metadata on
disk), and answers with a value: a :class:`Reject` (nothing changed) or a
future that completes once the change is durable (the high watermark has
moved over it by then).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from partition_svc import log_store, producer_state, validation
from partition_svc.log_store import LogStore, StoredBatchHeader
from partition_svc.producer_state import Append, Duplicate, ProducerStateEntry, Reject
from services.errors import ErrorCode, TxlogError
from services.stubs.txlog.v1 import common_pb2

Changes = list[tuple[bytes, bytes | None]]


class Writer(Protocol):
    """Where a partition's changes go: log_store.GroupCommitWriter, which
    completes the futures in submission order once the changes are durable."""

    def submit(self, changes: Changes) -> asyncio.Future: ...


@dataclass(frozen=True)
class Produced:
    """A batch taken: at ``base_offset``..``last_offset`` (appended now, or the
    original offsets of a duplicate), ``durable`` once it is (a duplicate: once
    its original is)."""

    base_offset: int
    last_offset: int
    durable: asyncio.Future
    duplicate: bool = False


class Partition:
    def __init__(self, topic: str, index: int, configs: dict[str, str], store: LogStore, writer: Writer):
        self.topic = topic
        self.index = index
        self.configs = configs
        self.store = store
        self.writer = writer
        self.pkey = log_store.partition_key(topic, index)
        self.log_start_offset = 0
        self.next_offset = 0
        self.high_watermark = 0
        self.size_bytes = 0
        self.producers: dict[int, ProducerStateEntry] = {}
        self._in_flight: deque[tuple[int, asyncio.Future]] = deque()  # (end offset, durable) in offset order
        self._data_arrived = asyncio.Event()
        self.aborted: dict[int, list[tuple[int, int]]] = {}  # producer id -> [(first, last offset)]
        self.pending_offsets: dict[int, dict[bytes, bytes]] = {}  # producer id -> {G key: value}
        # Offsets a marker decided, until the marker is durable: the G keys they become are not written yet,
        # so OffsetFetch(require_stable) must still call them unstable rather than answer the old offset.
        self.settling_offsets: dict[int, dict[bytes, bytes]] = {}  # id(the dict) -> the dict
        # First offsets of transactions whose marker is applied in memory but not durable yet: they hold the LSO.
        self.closing_transactions: dict[object, int] = {}
        self._recover()

    # --- recovery -----------------------------------------------------------------

    def _recover(self) -> None:
        meta = self.store.metadata(self.pkey)
        if meta is not None:
            self.log_start_offset = meta["log_start_offset"]
            self.next_offset = meta["next_offset"]
            self.size_bytes = meta["size_bytes"]
        last = self.store.batch_at_or_before(self.pkey, 2**63 - 1)
        if last is not None:  # the log itself is the authority on where it ends
            self.next_offset = max(self.next_offset, log_store.decode_header(*last).last_offset + 1)
        self.high_watermark = self.next_offset
        for value in self.store.producers(self.pkey):
            entry = ProducerStateEntry.from_json(value)
            self.producers[entry.producer_id] = entry
        self.aborted = self.store.aborted_spans(self.pkey)
        self.pending_offsets = self.store.pending_offsets(self.pkey)

    def metadata_change(self) -> tuple[bytes, bytes]:
        return log_store.meta_key(self.pkey), log_store.metadata_value(self.log_start_offset, self.next_offset, self.size_bytes)

    # --- offsets ------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        open_starts = [e.current_txn_first_offset for e in self.producers.values() if e.current_txn_first_offset >= 0]
        return min([self.high_watermark, *open_starts, *self.closing_transactions.values()])

    @property
    def record_bytes_max(self) -> int:
        return int(self.configs["max.record.bytes"])

    # --- the doors --------------------------------------------------------------------

    def produce(self, batch: common_pb2.RecordBatch, now_ms: int, limits: validation.BatchLimits) -> Produced | Reject:
        """One batch of a Produce, checked against its producer's state: a
        duplicate is answered its original offsets, a new batch is appended and
        submitted. A bad record is a Reject, with nothing changed."""
        outcome = self.check(batch)
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Duplicate):
            return Produced(outcome.base_offset, outcome.last_offset, asyncio.ensure_future(self.wait_durable(outcome.last_offset)),
                            duplicate=True)
        try:
            base, changes, durable = self._append(batch, now_ms, limits)
        except TxlogError as exc:
            return Reject(exc.code, exc.message)
        return Produced(base, base + len(batch.records) - 1, self._submit(changes, durable))

    def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool, now_ms: int
    ) -> Reject | asyncio.Future | None:
        """A COMMIT/ABORT marker (check_marker, then _apply_marker); None when
        there was nothing to change."""
        refused = self.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if refused is not None:
            return refused
        written = self._apply_marker(producer_id, producer_epoch, coordinator_epoch, committed, now_ms)
        return None if written is None else self._submit(*written)

    def seal_prepared(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, now_ms: int) -> Reject | asyncio.Future | None:
        """The seal of a prepared transaction (check_seal, then _apply_seal); None
        when it is sealed already."""
        refused = self.check_seal(producer_id, producer_epoch, coordinator_epoch)
        if refused is not None:
            return refused
        written = self._apply_seal(producer_id, producer_epoch, coordinator_epoch, now_ms)
        return None if written is None else self._submit(*written)

    def commit_offsets(self, offsets: list[tuple[bytes, bytes]], now_ms: int, limits: validation.BatchLimits) -> asyncio.Future:
        """Consumer offsets committed outside a transaction (this is a
        __consumer_offsets partition): a batch in the log, and the view
        OffsetFetch reads, in one write."""
        batch = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                       records=[common_pb2.Record(key=k, value=v) for k, v in offsets])
        _, changes, durable = self._append(batch, now_ms, limits)
        return self._submit(changes + offsets, durable)

    def commit_txn_offsets(
        self, producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]], now_ms: int
    ) -> Reject | asyncio.Future | None:
        """Consumer offsets committed in the producer's transaction; None when
        every one was older than an offset pending already."""
        written = self._apply_txn_offsets(producer_id, producer_epoch, offsets, now_ms)
        if isinstance(written, Reject) or written is None:
            return written
        return self._submit(*written)

    def enforce_retention(self, now_ms: int) -> asyncio.Future | None:
        """Deletes what retention.ms/bytes and compaction let go; None when nothing."""
        changes = self._retention_changes(now_ms) + self._compaction_changes()
        return self.writer.submit(changes) if changes else None

    def _submit(self, changes: Changes, on_durable: Callable[[], None]) -> asyncio.Future:
        written = self.writer.submit(changes)
        # Added before anyone awaits the future: the high watermark has moved by the time they resume.
        written.add_done_callback(lambda _: on_durable())
        return written

    # --- appending ----------------------------------------------------------------

    def check(self, batch: common_pb2.RecordBatch) -> Append | Duplicate | Reject:
        if batch.producer_id < 0:
            return producer_state.APPEND
        return producer_state.check_batch(
            self.producers.get(batch.producer_id),
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            len(batch.records),
            batch.is_transactional,
        )

    def _append(
        self, batch: common_pb2.RecordBatch, now_ms: int, limits: validation.BatchLimits
    ) -> tuple[int, list[tuple[bytes, bytes]], Callable[[], None]]:
        """Checks the batch's records while giving them offsets, then updates the
        in-memory state. Returns the base offset, the changes to persist, and the
        callback to run once they are durable. Only for a batch whose check()
        was Append; raises TxlogError, with nothing changed, for a bad record."""
        base = self.next_offset
        count = len(batch.records)
        batch.base_offset = base
        max_timestamp_ms = 0
        for i, record in enumerate(batch.records):
            record.offset = base + i
            timestamp_ms = record.timestamp_ms
            if timestamp_ms == 0:
                record.timestamp_ms = timestamp_ms = now_ms
            elif not 0 < timestamp_ms <= validation.TIMESTAMP_MS_MAX:
                validation.check_record(i, record)
            if len(record.headers) > validation.HEADERS_PER_RECORD_MAX:
                validation.check_record(i, record)
            if timestamp_ms > max_timestamp_ms:
                max_timestamp_ms = timestamp_ms
        payload = batch.SerializeToString()
        validation.check_sizes(batch, len(payload), limits, self.record_bytes_max)
        flags = log_store.FLAG_TRANSACTIONAL if batch.is_transactional else 0
        value = log_store.encode_batch(base + count - 1, max_timestamp_ms, batch.producer_id, batch.producer_epoch, flags, count, payload)
        self.next_offset = base + count
        self.size_bytes += len(value)
        changes = [(log_store.log_key(self.pkey, base), value)]
        if batch.producer_id >= 0:
            entry = producer_state.after_append(
                self.producers.get(batch.producer_id),
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                count,
                base,
                max_timestamp_ms,
                batch.is_transactional,
            )
            self.producers[batch.producer_id] = entry
            changes.append((log_store.producer_key(self.pkey, batch.producer_id), entry.to_json()))
        changes.append(self.metadata_change())
        return base, changes, self._durable_callback()

    def _durable_callback(self) -> Callable[[], None]:
        durable = asyncio.get_running_loop().create_future()
        self._in_flight.append((self.next_offset, durable))
        return lambda: self._mark_durable(durable)

    def _append_internal(self, batch: common_pb2.RecordBatch, flags: int, now_ms: int) -> tuple[int, bytes]:
        """Gives a batch the leader writes itself (markers, offsets) its offsets."""
        base = self.next_offset
        batch.base_offset = base
        for i, record in enumerate(batch.records):
            record.offset = base + i
            record.timestamp_ms = record.timestamp_ms or now_ms
        count = len(batch.records)
        value = log_store.encode_batch(base + count - 1, now_ms, batch.producer_id, batch.producer_epoch, flags, count, batch.SerializeToString())
        self.next_offset = base + count
        self.size_bytes += len(value)
        return base, value

    # --- transactions -----------------------------------------------------------------

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Reject | None:
        """Whether a COMMIT/ABORT marker may be applied. With Transactions V2 a
        marker carries the bumped epoch, so it ends only a transaction opened at a
        LOWER epoch: a marker whose epoch equals that of the transaction open here
        is a late copy of the previous transaction's marker and is refused (it
        must never end this one). With nothing open, a re-sent marker is a no-op
        (_apply_marker)."""
        entry = self.producers.get(producer_id)
        refused = self._check_sender("marker", producer_id, producer_epoch, coordinator_epoch)
        if refused is not None or entry is None:
            return refused
        if producer_epoch == entry.producer_epoch and self._has_open_transaction(producer_id, entry):
            # Not settled: the coordinator must not count it written (markers.py keeps retrying it).
            return Reject(
                ErrorCode.Value("INVALID_TXN_STATE"),
                f"marker for producer {producer_id} epoch {producer_epoch} cannot end the transaction open at that same "
                f"epoch on {self.topic}-{self.index}: a marker ends only a transaction of a lower epoch (a late marker "
                "of the previous transaction)",
            )
        return None

    def _has_open_transaction(self, producer_id: int, entry: ProducerStateEntry) -> bool:
        return entry.has_open_transaction or bool(self.pending_offsets.get(producer_id))

    def _apply_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool, now_ms: int
    ) -> tuple[list[tuple[bytes, bytes | None]], Callable[[], None]] | None:
        """Writes a COMMIT/ABORT control batch closing the producer's transaction.
        With nothing open and the producer at the marker's epoch already, the same
        marker was applied before (a coordinator retrying after a crash): nothing
        is written but a higher coordinator epoch, so the previous owner's late
        re-send is fenced; None when there is nothing at all to change. Only after
        check_marker passed."""
        entry = self.producers.get(producer_id)
        open_first = entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET
        pending = self.pending_offsets.get(producer_id)
        if entry is not None and open_first < 0 and not pending and entry.producer_epoch == producer_epoch:
            if coordinator_epoch <= entry.coordinator_epoch:
                return None
            entry = replace(entry, coordinator_epoch=coordinator_epoch)
            self.producers[producer_id] = entry
            return [(log_store.producer_key(self.pkey, producer_id), entry.to_json())], self._durable_callback()
        control = common_pb2.CONTROL_TYPE_COMMIT if committed else common_pb2.CONTROL_TYPE_ABORT
        marker = common_pb2.RecordBatch(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            is_transactional=True,
            control_type=control,
            coordinator_epoch=coordinator_epoch,
            records=[common_pb2.Record(timestamp_ms=now_ms)],
        )
        flags = log_store.FLAG_TRANSACTIONAL | log_store.FLAG_CONTROL | (log_store.FLAG_COMMIT if committed else 0)
        offset, value = self._append_internal(marker, flags, now_ms)
        changes: list[tuple[bytes, bytes | None]] = [(log_store.log_key(self.pkey, offset), value)]
        if not committed and open_first >= 0:
            self.aborted.setdefault(producer_id, []).append((open_first, offset))
            changes.append((log_store.aborted_key(self.pkey, producer_id, open_first), log_store.aborted_span_value(open_first, offset)))
        for group_key, offset_value in (pending or {}).items():
            changes.append((log_store.pending_offset_key(self.pkey, producer_id, group_key), None))
            if committed:
                changes.append((group_key, offset_value))
        settling = self.pending_offsets.pop(producer_id, None)
        if settling:
            self.settling_offsets[id(settling)] = settling
        previous = entry or ProducerStateEntry(producer_id, producer_epoch)
        entry = replace(
            previous,
            producer_epoch=producer_epoch,
            batches=(),
            last_timestamp_ms=now_ms,
            coordinator_epoch=coordinator_epoch,
            current_txn_first_offset=producer_state.NO_OFFSET,
            txn_prepared=False,
        )
        self.producers[producer_id] = entry
        changes.append((log_store.producer_key(self.pkey, producer_id), entry.to_json()))
        changes.append(self.metadata_change())
        # The transaction holds the LSO until its marker is durable: a crash before that takes the marker
        # back, and a read_committed reader must never see the LSO move backwards.
        closing_key = object()
        if open_first >= 0:
            self.closing_transactions[closing_key] = open_first
        durable = self._durable_callback()

        def settled() -> None:
            durable()
            self.closing_transactions.pop(closing_key, None)
            if settling:
                self.settling_offsets.pop(id(settling), None)

        return changes, settled

    def check_seal(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Reject | None:
        """Whether the seal of a prepared transaction (its own epoch, not bumped)
        may be applied: the coordinator epoch is not older than seen here, and no
        newer epoch of the producer wrote here (which would mean the transaction
        ended: settled, nothing can join it)."""
        return self._check_sender("seal", producer_id, producer_epoch, coordinator_epoch)

    def _check_sender(self, what: str, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Reject | None:
        """A marker's or seal's coordinator epoch must not be older than the one
        seen here (a deposed coordinator), nor its producer epoch older than the
        producer's here. The latter is settled, not an error: a newer epoch wrote
        here, which happens only after the transaction ended (an open transaction
        is always at the entry's epoch: producer_state rule 5)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if coordinator_epoch < entry.coordinator_epoch:
            return Reject(
                ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED"),
                f"{what} for producer {producer_id} carries coordinator epoch {coordinator_epoch}, older than "
                f"{entry.coordinator_epoch} seen on {self.topic}-{self.index}",
            )
        if producer_epoch < entry.producer_epoch:
            return Reject(
                ErrorCode.Value("INVALID_PRODUCER_EPOCH"),
                f"{what} for producer {producer_id} epoch {producer_epoch} is older than epoch {entry.producer_epoch}: "
                "that transaction is over here",
            )
        return None

    def _apply_seal(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, now_ms: int
    ) -> tuple[list[tuple[bytes, bytes | None]], Callable[[], None]] | None:
        """Records that the producer's transaction at ``producer_epoch`` is
        prepared: from now on no batch or offset of that epoch is taken here
        (a zombie of the preparing process cannot add to what the handle's holder
        commits). None when it is sealed already. Only after check_seal passed."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.producer_epoch == producer_epoch and entry.txn_prepared and coordinator_epoch <= entry.coordinator_epoch:
            return None
        if entry is None or entry.producer_epoch != producer_epoch:  # nothing of this transaction written here yet
            entry = replace(entry or ProducerStateEntry(producer_id, producer_epoch), producer_epoch=producer_epoch, batches=())
        entry = replace(entry, txn_prepared=True, coordinator_epoch=max(coordinator_epoch, entry.coordinator_epoch), last_timestamp_ms=now_ms)
        self.producers[producer_id] = entry
        return [(log_store.producer_key(self.pkey, producer_id), entry.to_json())], self._durable_callback()

    def _apply_txn_offsets(
        self, producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]], now_ms: int
    ) -> tuple[list[tuple[bytes, bytes | None]], Callable[[], None]] | Reject | None:
        """Appends consumer offsets committed in the producer's transaction (this
        is a __consumer_offsets partition); they take effect with its COMMIT marker."""
        entry = self.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.producer_epoch:
            return Reject(
                ErrorCode.Value("PRODUCER_FENCED"),
                f"producer {producer_id} epoch {producer_epoch} is older than epoch {entry.producer_epoch}",
            )
        if entry is not None and producer_epoch == entry.producer_epoch and entry.txn_prepared:
            return Reject(
                ErrorCode.Value("INVALID_TXN_STATE"),
                f"the transaction of producer {producer_id} epoch {producer_epoch} is prepared: it takes no more offsets",
            )
        if entry is not None and producer_epoch > entry.producer_epoch and self._has_open_transaction(producer_id, entry):
            return Reject(
                ErrorCode.Value("INVALID_TXN_STATE"),
                f"producer {producer_id}: the transaction of epoch {entry.producer_epoch} is still open on this partition; "
                f"offsets of epoch {producer_epoch} cannot start before it ends",
            )
        # Within one transaction a partition's pending offset only moves forward: TxnOffsetCommit has no
        # sequence, so an earlier request delivered late must not take back a later one's offset.
        pending = self.pending_offsets.get(producer_id, {}) if entry is not None and producer_epoch == entry.producer_epoch else {}
        offsets = [(key, value) for key, value in offsets if key not in pending or log_store.offset_of(value) >= log_store.offset_of(pending[key])]
        if not offsets:
            return None
        batch = common_pb2.RecordBatch(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            is_transactional=True,
            records=[common_pb2.Record(key=key, value=value) for key, value in offsets],
        )
        base, value = self._append_internal(batch, log_store.FLAG_TRANSACTIONAL, now_ms)
        previous = entry or ProducerStateEntry(producer_id, producer_epoch)
        if previous.producer_epoch != producer_epoch:
            previous = replace(previous, producer_epoch=producer_epoch, batches=(), txn_prepared=False)
        first = previous.current_txn_first_offset if previous.current_txn_first_offset >= 0 else base
        entry = replace(previous, last_timestamp_ms=now_ms, current_txn_first_offset=first)
        self.producers[producer_id] = entry
        self.pending_offsets.setdefault(producer_id, {}).update(offsets)
        changes: list[tuple[bytes, bytes | None]] = [(log_store.log_key(self.pkey, base), value)]
        changes += [(log_store.pending_offset_key(self.pkey, producer_id, key), v) for key, v in offsets]
        changes.append((log_store.producer_key(self.pkey, producer_id), entry.to_json()))
        changes.append(self.metadata_change())
        return changes, self._durable_callback()

    def has_pending_offsets(self, group_key_prefix: bytes, keys: list[bytes] | None = None) -> bool:
        """Whether offsets of the group are pending in a transaction (or settling): of the
        partitions ``keys`` names (as Kafka's require_stable), or of any partition."""
        pending = (*self.pending_offsets.values(), *self.settling_offsets.values())
        if keys is not None:
            return any(key in offsets for offsets in pending for key in keys)
        return any(key.startswith(group_key_prefix) for offsets in pending for key in offsets)

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        """Binary search: a producer's aborted spans never overlap and are kept in
        offset order (appended at each ABORT marker, reloaded in key order), and
        read_committed asks once per transactional batch it reads."""
        spans = self.aborted.get(producer_id)
        if not spans:
            return False
        index = bisect.bisect_right(spans, (offset, 2**63)) - 1
        return index >= 0 and spans[index][0] <= offset <= spans[index][1]

    def _mark_durable(self, durable: asyncio.Future) -> None:
        durable.set_result(None)
        advanced = False
        while self._in_flight and self._in_flight[0][1].done():
            self.high_watermark = self._in_flight.popleft()[0]
            advanced = True
        if advanced:
            self._data_arrived.set()
            self._data_arrived = asyncio.Event()

    async def wait_durable(self, offset: int) -> None:
        """Returns once ``offset`` is below the high watermark."""
        while self.high_watermark <= offset:
            await self._data_arrived.wait()

    def data_arrived(self) -> asyncio.Event:
        return self._data_arrived

    # --- reading ------------------------------------------------------------------

    def read(
        self, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *, take_first: bool, committed: bool = False
    ) -> tuple[list[bytes], int, int]:
        """The serialized RecordBatches from ``fetch_offset`` below ``upper_offset``,
        up to ``bytes_max`` bytes and ``records_max`` records, except that with
        ``take_first`` the first batch is taken whatever its size (so a consumer
        always makes progress); records before fetch_offset are trimmed from the
        first batch; with ``committed``, batches of aborted transactions are
        skipped. Returns (payloads, offset to fetch next, record count)."""
        payloads: list[bytes] = []
        if fetch_offset >= upper_offset:
            return payloads, fetch_offset, 0
        start = self.store.batch_at_or_before(self.pkey, fetch_offset)
        start_offset = start[0] if start is not None and start[0] >= self.log_start_offset else fetch_offset
        next_offset = fetch_offset
        taken_bytes = taken_records = 0
        for base_offset, value in self.store.batches(self.pkey, start_offset):
            if base_offset >= upper_offset:
                break
            header = log_store.decode_header(base_offset, value)
            if header.last_offset < fetch_offset:
                continue
            if header.last_offset >= upper_offset:
                break  # a batch straddling the upper bound cannot happen; stop rather than expose it
            count = header.last_offset + 1 - max(base_offset, fetch_offset)
            over = taken_bytes + header.stored_bytes > bytes_max or taken_records + count > records_max
            if over and (taken_records or not take_first):
                break
            next_offset = header.last_offset + 1
            if header.is_control or (committed and header.is_transactional and self.is_aborted(header.producer_id, base_offset)):
                continue
            payload = log_store.payload_of(value)
            if base_offset < fetch_offset:
                batch = common_pb2.RecordBatch.FromString(payload)
                del batch.records[: fetch_offset - base_offset]
                payload = batch.SerializeToString()
            payloads.append(payload)
            taken_bytes += header.stored_bytes
            taken_records += count
        return payloads, next_offset, taken_records

    def headers(self, from_offset: int = 0):
        for base_offset, value in self.store.batches(self.pkey, max(from_offset, self.log_start_offset)):
            yield log_store.decode_header(base_offset, value)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record at or after ``timestamp_ms``, or (-1, -1)."""
        for header in self.headers():
            if header.base_offset >= self.high_watermark:
                break
            if header.max_timestamp_ms < timestamp_ms or header.is_control:
                continue
            batch = common_pb2.RecordBatch.FromString(log_store.payload_of(self.store.batch(self.pkey, header.base_offset)))
            for record in batch.records:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset, record.timestamp_ms
        return -1, -1

    # --- retention ----------------------------------------------------------------

    def _retention_changes(self, now_ms: int) -> list[tuple[bytes, bytes | None]]:
        """Deletes whole batches from the log start while they are older than
        retention.ms or the log is larger than retention.bytes, never at or past
        the LSO; applies the new log start in memory and returns the changes."""
        retention_ms = int(self.configs["retention.ms"])
        retention_bytes = int(self.configs["retention.bytes"])
        if retention_ms < 0 and retention_bytes < 0:
            return []
        lso = self.last_stable_offset
        doomed: list[StoredBatchHeader] = []
        size = self.size_bytes
        for header in self.headers():
            expired = retention_ms >= 0 and header.max_timestamp_ms < now_ms - retention_ms
            oversized = retention_bytes >= 0 and size > retention_bytes
            if header.last_offset >= lso or not (expired or oversized):
                break
            doomed.append(header)
            size -= header.stored_bytes
        if not doomed:
            return []
        self.log_start_offset = doomed[-1].last_offset + 1
        self.size_bytes = size
        changes: list[tuple[bytes, bytes | None]] = [(log_store.log_key(self.pkey, h.base_offset), None) for h in doomed]
        changes += self._forget_aborted_below(self.log_start_offset)
        changes.append(self.metadata_change())
        return changes

    def _forget_aborted_below(self, offset: int) -> list[tuple[bytes, None]]:
        changes = []
        for producer_id, spans in list(self.aborted.items()):
            kept = [(first, last) for first, last in spans if last >= offset]
            changes += [(log_store.aborted_key(self.pkey, producer_id, first), None) for first, last in spans if last < offset]
            if kept:
                self.aborted[producer_id] = kept
            else:
                del self.aborted[producer_id]
        return changes


    def _compaction_changes(self) -> list[tuple[bytes, bytes | None]]:
        """For cleanup.policy=compact: deletes every batch below the LSO all of
        whose records have a newer record with the same key (the newest record
        of every key stays), and the batches of aborted transactions; applies it
        in memory and returns the changes. Only records read_committed readers
        see count as newer: an aborted record never hides a committed one, and
        markers (all keyed b"") never hide each other; markers are kept."""
        if self.configs.get("cleanup.policy") != "compact":
            return []
        lso = self.last_stable_offset
        latest: dict[bytes, int] = {}
        batches: list[tuple[StoredBatchHeader, list[tuple[bytes, int]]]] = []
        aborted: list[StoredBatchHeader] = []
        scanned: list[StoredBatchHeader] = []  # every batch in offset order, markers included
        for base_offset, value in self.store.batches(self.pkey, self.log_start_offset):
            header = log_store.decode_header(base_offset, value)
            if header.last_offset >= lso:
                break
            scanned.append(header)
            if header.is_control:
                continue
            if header.is_transactional and self.is_aborted(header.producer_id, header.base_offset):
                aborted.append(header)
                continue
            records = [(r.key, r.offset) for r in common_pb2.RecordBatch.FromString(log_store.payload_of(value)).records]
            batches.append((header, records))
            for key, offset in records:
                latest[key] = offset
        doomed = aborted + [h for h, records in batches if all(latest[key] > offset for key, offset in records)]
        if not doomed:
            return []
        gone = {h.base_offset for h in doomed}
        self.size_bytes -= sum(h.stored_bytes for h in doomed)
        for header in scanned:  # the log starts at the first batch kept
            if header.base_offset not in gone:
                break
            self.log_start_offset = header.last_offset + 1
        changes: list[tuple[bytes, bytes | None]] = [(log_store.log_key(self.pkey, h.base_offset), None) for h in doomed]
        changes.append(self.metadata_change())
        return changes


def now_ms() -> int:
    return int(time.time() * 1000)
