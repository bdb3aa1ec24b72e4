"""One partition replica on this instance, leader or follower: its offsets,
producer states and log.

Invariants:
- Offsets are assigned in order at append time (by the leader; a follower
  stores the leader's batches at the leader's offsets). ``durable_end`` moves
  over appends that are durable here, in order; ``written_end`` (never behind
  it) over appends that are readable here, written but maybe not synced yet:
  followers fetch up to it, so their write and sync overlap the leader's own
  sync. The ``high_watermark`` is the
  smallest durable end among the in-sync replicas (isr.ReplicaSet), so a
  reader never sees a record that a crash, or a failover, could take back,
  nor a gap; it never moves backwards while this replica leads.
- Everything a replica knows besides the log (producer states, the aborted
  index, pending and committed group offsets, seals) is a function of the log:
  every batch kind has one effect function (``_effect_*``), which the leader
  applies when it appends, a follower when it stores the leader's batch, and a
  rebuild after truncation when it replays the log.
- The last stable offset (LSO) is the first offset of the oldest open
  transaction, else the high watermark; no read_committed read goes past it,
  and neither retention nor DeleteRecords deletes past it.
- The log start offset only moves forward (retention, compaction,
  DeleteRecords on the leader, a follower following its leader's). Whole
  batches below it are deleted; a batch it falls inside stays, and reads trim
  its records below the log start. The leader's low watermark is the lowest
  log start among its in-sync replicas.
- A batch is checked against its producer's state before it gets offsets; a
  rejected batch changes nothing.
- A COMMIT or ABORT marker closes its producer's open transaction, resets its
  sequences at the marker's (bumped) epoch, and records the coordinator epoch:
  a marker with an older coordinator epoch is refused. An aborted transaction
  enters the aborted index, and read_committed reads skip its batches.

Every change goes through one door per request kind (:meth:`Partition.produce`,
:meth:`~Partition.write_marker`, :meth:`~Partition.seal_prepared`,
:meth:`~Partition.commit_offsets`, :meth:`~Partition.commit_txn_offsets`,
:meth:`~Partition.enforce_retention`, :meth:`~Partition.delete_records`): each checks, applies the change in
memory and hands it to the writer in one synchronous call, with no await
inside, so the writer receives changes in the order the memory took them (an
earlier change can never overwrite a later one's producer state or metadata on
disk), and answers with a value: a :class:`Reject` (nothing changed) or a
future that completes once the change is replicated (below the high
watermark), with True, or False when this replica stopped leading first (its
fate is then the new leader's to decide).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from partition_svc import log_format, producer_state, validation, wire
from partition_svc.isr import FollowerProgress, ReplicaSet
from partition_svc.log_format import StoredBatchHeader
from partition_svc.log_store import LogStore
from partition_svc.producer_state import Append, Duplicate, ProducerStateEntry, ProducerStates, Reject
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, INTERNAL_TOPIC_PREFIX, compression, txn_outcomes
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.leader_epochs import LeaderEpochCache
from txlog.v1 import common_pb2

Changes = list[tuple[bytes, bytes | None]]


class Writer(Protocol):
    """Where a partition's changes go: log_store.GroupCommitWriter, which
    completes the futures in submission order once the changes are durable
    (and, with submit_readable, first once they are readable)."""

    def submit(self, changes: Changes) -> asyncio.Future: ...

    def submit_readable(self, changes: Changes) -> tuple[asyncio.Future, asyncio.Future]: ...


@dataclass(frozen=True)
class Produced:
    """A batch taken: at ``base_offset``..``last_offset`` (appended now, or the
    original offsets of a duplicate); ``durable`` completes once it is durable
    here (acks=1), ``replicated`` once it is below the high watermark (acks=all:
    True, or False when this replica stopped leading first)."""

    base_offset: int
    last_offset: int
    durable: asyncio.Future
    replicated: asyncio.Future
    duplicate: bool = False


@dataclass(frozen=True)
class RecordsDeleted:
    """DeleteRecords taken on the leader: the log start is ``log_start_offset``
    now; ``written`` completes once that is durable here (None: it was there
    already, nothing changed)."""

    log_start_offset: int
    written: asyncio.Future | None


class Partition:
    def __init__(self, topic: str, index: int, configs: dict[str, str], store: LogStore, writer: Writer, *, node_id: int = 0,
                 partition_count: int = 1, sole_replica: bool = True):
        self.topic = topic
        self.index = index
        self.partition_count = partition_count
        self.replicas: tuple[int, ...] = (node_id,)  # every replica, as the topic's assignment says
        self.configs = configs
        self.store = store
        self.writer = writer
        self.node_id = node_id
        self.pkey = log_format.partition_key(topic, index)
        self.log_start_offset = 0
        self.next_offset = 0
        self.durable_end = 0
        self.written_end = 0
        self.high_watermark = 0
        self.size_bytes = 0
        self.producers = ProducerStates()
        self.epochs = LeaderEpochCache()
        # A sole replica leads at epoch 0 from the start; a replicated one follows until the controller says.
        self.leader_epoch = 0 if sole_replica else -1
        self.replica_set: ReplicaSet | None = ReplicaSet(node_id, frozenset({node_id})) if sole_replica else None
        self.leader_high_watermark = 0  # a follower's: the leader's, as its last fetch answered
        self._in_flight: deque[tuple[int, asyncio.Future]] = deque()  # (end offset, durable) in offset order
        self._unreadable: deque[tuple[int, asyncio.Future]] = deque()  # (end offset, readable) in offset order
        # (end offset, future, callback) of the leader's appends, completed once the high watermark passes them.
        self._replicating: deque[tuple[int, asyncio.Future, Callable[[], None] | None]] = deque()
        self._data_arrived = asyncio.Event()  # the high watermark moved
        self._log_end_moved = asyncio.Event()  # durable_end moved
        self._written_end_moved = asyncio.Event()  # written_end moved: what followers wait on
        self._log_start_moved = asyncio.Event()  # the leader's log start moved (its followers are told at once)
        self._low_watermark_moved = asyncio.Event()  # the lowest log start of the ISR moved
        self.aborted: dict[int, list[tuple[int, int]]] = {}  # producer id -> [(first, last offset)]
        self.pending_offsets: dict[int, dict[bytes, bytes]] = {}  # producer id -> {G key: value}
        # Offsets a marker decided, until the marker is replicated: the G keys they become are not there yet,
        # so OffsetFetch(require_stable) must still call them unstable rather than answer the old offset.
        self.settling_offsets: dict[int, dict[bytes, bytes]] = {}  # id(the dict) -> the dict
        # First offsets of transactions whose marker is applied in memory but not replicated yet: they hold the LSO.
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
            self.next_offset = max(self.next_offset, log_format.decode_header(*last).last_offset + 1)
        self.durable_end = self.written_end = self.next_offset
        # What this replica last knew was replicated; a sole replica moves it to its log end when it leads.
        self.high_watermark = min(meta.get("high_watermark", self.next_offset), self.next_offset) if meta else self.next_offset
        self.leader_high_watermark = self.high_watermark
        self.epochs = LeaderEpochCache(self.store.leader_epochs(self.pkey))
        self._load_derived_state()
        if self.replica_set is not None:
            self.replica_set.high_watermark = self.high_watermark
            self._advance_high_watermark()

    def _load_derived_state(self) -> None:
        self.producers = ProducerStates()
        for value in self.store.producers(self.pkey):
            entry = ProducerStateEntry.from_json(value)
            self.producers[entry.producer_id] = entry
        self.aborted = self.store.aborted_spans(self.pkey)
        self.pending_offsets = self.store.pending_offsets(self.pkey)

    def metadata_change(self) -> tuple[bytes, bytes]:
        return log_format.meta_key(self.pkey), log_format.metadata_value(
            self.log_start_offset, self.next_offset, self.size_bytes, self.high_watermark)

    # --- offsets ------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        first_open = self.producers.first_open_offset()
        return min([self.high_watermark, *([] if first_open is None else [first_open]), *self.closing_transactions.values()])

    @property
    def record_bytes_max(self) -> int:
        return int(self.configs["max.record.bytes"])

    @property
    def min_insync_replicas(self) -> int:
        return int(self.configs.get("min.insync.replicas", "1"))

    # --- roles --------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.replica_set is not None

    @property
    def epoch_start_offset(self) -> int:
        """Where this replica's current leader epoch started in its log."""
        return self.epochs.entries[-1][1] if self.epochs.entries and self.epochs.latest_epoch == self.leader_epoch else 0

    def become_leader(self, leader_epoch: int, isr: frozenset[int], now_ms: int) -> None:
        """Leads from now at ``leader_epoch``, with ``isr`` as the controller or
        the last ISR change wrote it. Records where the epoch starts (the log
        end), so followers can find where their logs diverge. Every follower
        in the ISR counts as caught up now: each gets the lag time to fetch
        before it can be dropped (as in Kafka)."""
        if self.is_leader and leader_epoch == self.leader_epoch:
            self.isr_changed(isr)
            return
        self.leader_epoch = leader_epoch
        if self.epochs.assign(leader_epoch, self.next_offset):
            self.writer.submit([(log_format.epoch_key(self.pkey, leader_epoch), log_format.offset_value(self.next_offset))])
        self.replica_set = ReplicaSet(self.node_id, isr, high_watermark=self.high_watermark,
                                      followers={n: FollowerProgress(0, now_ms) for n in isr if n != self.node_id})
        self._advance_high_watermark()

    def become_follower(self, leader_epoch: int) -> None:
        """Stops leading (if it did): whoever waits for replication is told
        False, and what only a leader holds in memory is dropped."""
        self.leader_epoch = leader_epoch
        if self.replica_set is None:
            return
        self.replica_set = None
        self.leader_high_watermark = self.high_watermark
        waiting, self._replicating = self._replicating, deque()
        for _, future, _ in waiting:
            if not future.done():
                future.set_result(False)
        self.closing_transactions.clear()
        self.settling_offsets.clear()
        self._wake("_data_arrived")
        self._wake("_low_watermark_moved")

    def isr_changed(self, isr: frozenset[int]) -> None:
        """The ISR as written to ZooKeeper (by this leader or the controller)."""
        if self.replica_set is not None:
            self.replica_set.set_isr(isr)
            self._advance_high_watermark()
            self._wake("_low_watermark_moved")

    def not_leading(self) -> Reject | None:
        """Only a leader appends: a request that found this replica leading
        and awaited something before its change may find it a follower now,
        whose log is the leader's alone to write."""
        if self.replica_set is None:
            return Reject(ErrorCode.Value("NOT_LEADER"), f"{self.topic}-{self.index} is no longer led here; refresh metadata")
        return None

    def check_enough_replicas(self) -> Reject | None:
        """acks=all is refused before anything is appended while the ISR is
        smaller than min.insync.replicas."""
        isr = len(self.replica_set.isr) if self.replica_set is not None else 0
        if isr < self.min_insync_replicas:
            return Reject(ErrorCode.Value("NOT_ENOUGH_REPLICAS"),
                          f"{self.topic}-{self.index} has {isr} in-sync replicas, fewer than its min.insync.replicas "
                          f"{self.min_insync_replicas}: nothing was appended")
        return None

    # --- the doors --------------------------------------------------------------------

    def produce(self, batch: common_pb2.RecordBatch, now_ms: int, limits: validation.BatchLimits) -> Produced | Reject:
        """One batch of a Produce, checked against its producer's state: a
        duplicate is answered its original offsets, a new batch is appended and
        submitted. A bad record is a Reject, with nothing changed."""
        outcome = self.not_leading() or self.check(batch)
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Duplicate):
            return Produced(outcome.base_offset, outcome.last_offset, asyncio.ensure_future(self.wait_durable(outcome.last_offset)),
                            asyncio.ensure_future(self.wait_replicated(outcome.last_offset)), duplicate=True)
        count = len(batch.records)
        try:
            base, changes = self._append(batch, now_ms, limits)
        except TxlogError as exc:
            return Reject(exc.code, exc.message)
        written, replicated = self._submit(changes)
        return Produced(base, base + count - 1, written, replicated)

    def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool, now_ms: int
    ) -> Reject | asyncio.Future | None:
        """A COMMIT/ABORT marker (check_marker, then the marker batch); None
        when there was nothing to change. A marker whose transaction is closed
        here already is written again only to record a higher coordinator
        epoch (so the previous owner's late re-send is fenced on every replica)."""
        refused = self.not_leading() or self.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if refused is not None:
            return refused
        entry = self.producers.get(producer_id)
        if (entry is not None and entry.producer_epoch == producer_epoch and not self._has_open_transaction(producer_id, entry)
                and coordinator_epoch <= entry.coordinator_epoch):
            return None
        control = common_pb2.CONTROL_TYPE_COMMIT if committed else common_pb2.CONTROL_TYPE_ABORT
        return self._append_control(producer_id, producer_epoch, coordinator_epoch, control, now_ms)

    def seal_prepared(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, now_ms: int) -> Reject | asyncio.Future | None:
        """The seal of a prepared transaction (check_seal, then a PREPARED
        control batch): from now on no batch or offset of that epoch is taken
        here (a zombie of the preparing process cannot add to what the
        handle's holder commits). None when it is sealed already."""
        refused = self.not_leading() or self.check_seal(producer_id, producer_epoch, coordinator_epoch)
        if refused is not None:
            return refused
        entry = self.producers.get(producer_id)
        if entry is not None and entry.producer_epoch == producer_epoch and entry.txn_prepared and coordinator_epoch <= entry.coordinator_epoch:
            return None
        return self._append_control(producer_id, producer_epoch, coordinator_epoch, common_pb2.CONTROL_TYPE_PREPARED, now_ms)

    def commit_offsets(self, offsets: list[tuple[bytes, bytes | None]], now_ms: int, limits: validation.BatchLimits) -> asyncio.Future | Reject:
        """Consumer offsets committed outside a transaction (this is a
        __consumer_offsets partition): a batch in the log, and the view
        OffsetFetch reads, in one write. A value of None deletes the offset
        (a tombstone record)."""
        refused = self.not_leading()
        if refused is not None:
            return refused
        batch = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                       records=[common_pb2.Record(key=k) if v is None else common_pb2.Record(key=k, value=v)
                                                for k, v in offsets])
        _, changes = self._append(batch, now_ms, limits)
        return self._submit(changes)[1]

    def commit_txn_offsets(
        self, producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]], now_ms: int
    ) -> Reject | asyncio.Future | None:
        """Consumer offsets committed in the producer's transaction (this is a
        __consumer_offsets partition); they take effect with its COMMIT marker.
        None when every one was older than an offset pending already."""
        entry = self.producers.get(producer_id)
        refused = self.not_leading() or self._check_txn_offsets(producer_id, producer_epoch, entry)
        if refused is not None:
            return refused
        # Within one transaction a partition's pending offset only moves forward: TxnOffsetCommit has no
        # sequence, so an earlier request delivered late must not take back a later one's offset.
        pending = self.pending_offsets.get(producer_id, {}) if entry is not None and producer_epoch == entry.producer_epoch else {}
        offsets = [(key, value) for key, value in offsets if key not in pending or log_format.offset_of(value) >= log_format.offset_of(pending[key])]
        if not offsets:
            return None
        batch = common_pb2.RecordBatch(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            is_transactional=True,
            records=[common_pb2.Record(key=key, value=value) for key, value in offsets],
        )
        base, value = self._append_internal(batch, log_format.FLAG_TRANSACTIONAL, now_ms)
        changes = [(log_format.log_key(self.pkey, base), value), *self._effect_txn_offsets(producer_id, producer_epoch, offsets, base, now_ms)]
        changes.append(self.metadata_change())
        return self._submit(changes)[1]

    def enforce_retention(self, now_ms: int) -> asyncio.Future | None:
        """Deletes what retention.ms/bytes and compaction let go; None when nothing."""
        changes = self._retention_changes(now_ms) + self._compaction_changes()
        return self.writer.submit(changes) if changes else None

    def expire_producers(self, now_ms: int, expiration_ms: int) -> asyncio.Future | None:
        """Forgets the producers ``ProducerStateEntry.expired`` says may go (their
        next batch must then start at sequence 0, as a new producer's); None
        when none. Internal topics keep theirs: their writers (the coordinators'
        log writers) live as long as their process, and a sequence gap there is
        read as fencing."""
        if self.topic.startswith(INTERNAL_TOPIC_PREFIX):
            return None
        gone = [producer_id for producer_id, entry in self.producers.items()
                if entry.expired(now_ms, expiration_ms) and not self._has_open_transaction(producer_id, entry)]
        for producer_id in gone:
            del self.producers[producer_id]
        return self.writer.submit([(log_format.producer_key(self.pkey, producer_id), None) for producer_id in gone]) if gone else None

    def delete_records(self, offset: int) -> RecordsDeleted | Reject:
        """DeleteRecords (Kafka's): moves the log start to ``offset``, at most
        the LSO (-1: the LSO itself), so no record of an open transaction, nor
        the marker still to come for it, is deleted. An offset at or below the
        log start changes nothing. A Reject (OFFSET_OUT_OF_RANGE, NOT_LEADER)
        changes nothing. Producer states stay (as with retention: only open
        transactions need their first offset, and those are never deleted);
        the leader-epoch cache keeps its history (its answers stay true, and a
        follower behind the log start restarts at it)."""
        refused = self.not_leading()
        if refused is not None:
            return refused
        lso = self.last_stable_offset
        target = lso if offset == -1 else offset
        if not 0 <= target <= lso:
            return Reject(ErrorCode.Value("OFFSET_OUT_OF_RANGE"),
                          f"offset {offset} is outside [0, {lso}] of {self.topic}-{self.index}: the log start moves at most to the "
                          "last stable offset (-1 names it); nothing was deleted")
        if target <= self.log_start_offset:
            return RecordsDeleted(self.log_start_offset, None)
        written = self.writer.submit(self._log_start_changes(target))
        self._wake("_log_start_moved")
        self._wake("_low_watermark_moved")
        return RecordsDeleted(target, written)

    def follow_log_start(self, leader_log_start: int) -> asyncio.Future | None:
        """A follower takes its leader's log start (a ReplicaFetch answer),
        within what it holds as replicated: min(the leader's, its own high
        watermark), as Kafka's followers do. None when it does not move."""
        target = min(leader_log_start, self.high_watermark)
        if self.is_leader or target <= self.log_start_offset:
            return None
        return self.writer.submit(self._log_start_changes(target))

    def _submit(self, changes: Changes, on_replicated: Callable[[], None] | None = None) -> tuple[asyncio.Future, asyncio.Future]:
        """Hands an append's changes to the writer: (written: durable here,
        replicated: below the high watermark, True; False if leadership went
        first). ``on_replicated`` runs when the high watermark passes."""
        end = self.next_offset
        readable, written = self.writer.submit_readable(changes)
        self._unreadable.append((end, readable))
        self._in_flight.append((end, written))
        # Added before anyone awaits the futures: written_end and durable_end have moved by the time they resume.
        readable.add_done_callback(lambda _: self._on_readable())
        written.add_done_callback(lambda _: self._on_written())
        replicated = asyncio.get_running_loop().create_future()
        self._replicating.append((end, replicated, on_replicated))
        self._advance_high_watermark()
        return written, replicated

    def check_leader_epoch(self, seen: int) -> None:
        """A request naming the leader epoch it saw (a client's metadata, a
        follower's LeaderAndIsr) must name this leader's."""
        if seen < self.leader_epoch:
            raise TxlogError(ErrorCode.Value("FENCED_LEADER_EPOCH"),
                             f"leader epoch {seen} of {self.topic}-{self.index} is older than {self.leader_epoch}; refresh metadata")
        if seen > self.leader_epoch:
            raise TxlogError(ErrorCode.Value("UNKNOWN_LEADER_EPOCH"),
                             f"leader epoch {seen} of {self.topic}-{self.index} is newer than {self.leader_epoch} known here; "
                             "refresh metadata")

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

    def _append(self, batch: common_pb2.RecordBatch, now_ms: int, limits: validation.BatchLimits) -> tuple[int, Changes]:
        """Checks the batch's records while giving them offsets, then updates the
        in-memory state. Returns the base offset and the changes to persist.
        Only for a batch whose check() was Append; raises TxlogError, with
        nothing changed, for a bad record.

        A batch validation.check_batch opened (compressed: its records
        decompressed into ``records``) is checked as a plain one, then stored
        as the topic's compression.type says: compressed (the producer's bytes
        as they came when the codec is the same, else re-encoded), its records
        without offsets and timestamps 0 left for log_append_time_ms; or plain,
        as today."""
        base = self.next_offset
        count = len(batch.records)
        batch.base_offset = base
        batch.ClearField("partition_leader_epoch")  # a fetch says it
        codec = validation.stored_compression(self.topic, self.configs, batch.compression)
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
            validation.check_sizes(batch, batch.ByteSize() - len(batch.compressed_records), limits, self.record_bytes_max)
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
            validation.check_sizes(batch, len(payload), limits, self.record_bytes_max)
        flags = (log_format.FLAG_TRANSACTIONAL if batch.is_transactional else 0) | log_format.compression_flags(codec)
        value = log_format.encode_batch(base + count - 1, max_timestamp_ms, batch.producer_id, batch.producer_epoch, flags, count, payload)
        self.next_offset = base + count
        self.size_bytes += len(value)
        changes = [(log_format.log_key(self.pkey, base), value)]
        if batch.producer_id >= 0:
            changes += self._effect_data(batch.producer_id, batch.producer_epoch, batch.base_sequence, count, base,
                                         max_timestamp_ms, batch.is_transactional)
        elif self.topic == CONSUMER_OFFSETS_TOPIC:
            changes += offset_changes(batch)
        changes.append(self.metadata_change())
        return base, changes

    def _append_internal(self, batch: common_pb2.RecordBatch, flags: int, now_ms: int) -> tuple[int, bytes]:
        """Gives a batch the leader writes itself (markers, offsets) its offsets."""
        base = self.next_offset
        batch.base_offset = base
        for i, record in enumerate(batch.records):
            record.offset = base + i
            record.timestamp_ms = record.timestamp_ms or now_ms
        count = len(batch.records)
        value = log_format.encode_batch(base + count - 1, now_ms, batch.producer_id, batch.producer_epoch, flags, count, batch.SerializeToString())
        self.next_offset = base + count
        self.size_bytes += len(value)
        return base, value

    def _append_control(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, control: int,
                        now_ms: int) -> asyncio.Future:
        """Appends a control batch (COMMIT, ABORT, PREPARED) and applies its
        effect. A transaction closed by a marker holds the LSO until the marker
        is replicated: a failover before that can take the marker back, and a
        read_committed reader must never see the LSO move backwards."""
        marker = common_pb2.RecordBatch(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            is_transactional=True,
            control_type=control,
            coordinator_epoch=coordinator_epoch,
            records=[common_pb2.Record(timestamp_ms=now_ms)],
        )
        flags = log_format.FLAG_TRANSACTIONAL | log_format.FLAG_CONTROL | (log_format.FLAG_COMMIT if control == common_pb2.CONTROL_TYPE_COMMIT else 0)
        entry = self.producers.get(producer_id)
        open_first = entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET
        settling = self.pending_offsets.get(producer_id) if control != common_pb2.CONTROL_TYPE_PREPARED else None
        offset, value = self._append_internal(marker, flags, now_ms)
        changes = [(log_format.log_key(self.pkey, offset), value), *self._effect_control(marker, offset, now_ms)]
        changes.append(self.metadata_change())
        closing_key = object()
        if control != common_pb2.CONTROL_TYPE_PREPARED and open_first >= 0:
            self.closing_transactions[closing_key] = open_first
        if settling:
            self.settling_offsets[id(settling)] = settling

        def settled() -> None:
            self.closing_transactions.pop(closing_key, None)
            if settling:
                self.settling_offsets.pop(id(settling), None)

        return self._submit(changes, settled)[1]

    # --- what each stored batch does (the leader's appends, a follower's, a rebuild's replay) ----

    def _effect_data(self, producer_id: int, producer_epoch: int, base_sequence: int, count: int, base: int,
                     max_timestamp_ms: int, is_transactional: bool) -> Changes:
        entry = producer_state.after_append(self.producers.get(producer_id), producer_id, producer_epoch, base_sequence,
                                            count, base, max_timestamp_ms, is_transactional, appended_ms=now_ms())
        self.producers[producer_id] = entry
        return [(log_format.producer_key(self.pkey, producer_id), entry.to_json())]

    def _effect_control(self, marker: common_pb2.RecordBatch, offset: int, timestamp_ms: int) -> Changes:
        if marker.control_type == common_pb2.CONTROL_TYPE_PREPARED:
            return self._effect_seal(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, timestamp_ms)
        return self._effect_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                   marker.control_type == common_pb2.CONTROL_TYPE_COMMIT, offset, timestamp_ms)

    def _effect_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool, offset: int,
                       timestamp_ms: int) -> Changes:
        """A COMMIT/ABORT marker at ``offset`` closes the producer's open
        transaction (an ABORT enters the aborted index; a COMMIT makes its
        pending offsets the group's), resets its sequences at the marker's
        epoch and records the coordinator epoch. With nothing open it only
        records a higher coordinator epoch (a repeated marker)."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.producer_epoch == producer_epoch and not self._has_open_transaction(producer_id, entry):
            entry = replace(entry, coordinator_epoch=max(coordinator_epoch, entry.coordinator_epoch))
            self.producers[producer_id] = entry
            return [(log_format.producer_key(self.pkey, producer_id), entry.to_json())]
        open_first = entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET
        changes: Changes = []
        if not committed and open_first >= 0:
            self.aborted.setdefault(producer_id, []).append((open_first, offset))
            changes.append((log_format.aborted_key(self.pkey, producer_id, open_first), log_format.aborted_span_value(open_first, offset)))
        for group_key, offset_value in self.pending_offsets.pop(producer_id, {}).items():
            changes.append((log_format.pending_offset_key(self.pkey, producer_id, group_key), None))
            if committed:
                changes.append((group_key, offset_value))
        entry = replace(
            entry or ProducerStateEntry(producer_id, producer_epoch),
            producer_epoch=producer_epoch,
            batches=(),
            last_timestamp_ms=timestamp_ms,
            coordinator_epoch=coordinator_epoch,
            current_txn_first_offset=producer_state.NO_OFFSET,
            txn_prepared=False,
        )
        self.producers[producer_id] = entry
        changes.append((log_format.producer_key(self.pkey, producer_id), entry.to_json()))
        return changes

    def _effect_seal(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, timestamp_ms: int) -> Changes:
        entry = self.producers.get(producer_id)
        if entry is None or entry.producer_epoch != producer_epoch:  # nothing of this transaction written here yet
            entry = replace(entry or ProducerStateEntry(producer_id, producer_epoch), producer_epoch=producer_epoch, batches=())
        entry = replace(entry, txn_prepared=True, coordinator_epoch=max(coordinator_epoch, entry.coordinator_epoch),
                        last_timestamp_ms=timestamp_ms)
        self.producers[producer_id] = entry
        return [(log_format.producer_key(self.pkey, producer_id), entry.to_json())]

    def _effect_txn_offsets(self, producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]], base: int,
                            timestamp_ms: int) -> Changes:
        previous = self.producers.get(producer_id) or ProducerStateEntry(producer_id, producer_epoch)
        if previous.producer_epoch != producer_epoch:
            previous = replace(previous, producer_epoch=producer_epoch, batches=(), txn_prepared=False)
        first = previous.current_txn_first_offset if previous.current_txn_first_offset >= 0 else base
        entry = replace(previous, last_timestamp_ms=timestamp_ms, current_txn_first_offset=first)
        self.producers[producer_id] = entry
        self.pending_offsets.setdefault(producer_id, {}).update(offsets)
        changes: Changes = [(log_format.pending_offset_key(self.pkey, producer_id, key), v) for key, v in offsets]
        changes.append((log_format.producer_key(self.pkey, producer_id), entry.to_json()))
        return changes

    def _effect_stored(self, base_offset: int, value: bytes) -> Changes:
        """The effect of one stored batch, whichever kind, as its leader applied it."""
        header = log_format.decode_header(base_offset, value)
        if header.producer_id < 0 and self.topic != CONSUMER_OFFSETS_TOPIC:
            return []
        batch = common_pb2.RecordBatch.FromString(log_format.payload_of(value))
        if header.is_control:
            return self._effect_control(batch, base_offset, header.max_timestamp_ms)
        if self.topic == CONSUMER_OFFSETS_TOPIC:
            if not header.is_transactional:
                return offset_changes(batch)
            offsets = [(r.key, r.value) for r in batch.records]
            return self._effect_txn_offsets(header.producer_id, header.producer_epoch, offsets, base_offset, header.max_timestamp_ms)
        return self._effect_data(header.producer_id, header.producer_epoch, batch.base_sequence, header.record_count,
                                 base_offset, header.max_timestamp_ms, header.is_transactional)

    # --- a follower's log ------------------------------------------------------------

    def append_replicated(self, batches: list[tuple[int, int, bytes]], leader_high_watermark: int) -> asyncio.Future | None:
        """Stores the leader's batches ((base offset, leader epoch, stored
        value), in offset order from this replica's log end) at the leader's
        offsets, with their effects; the future completes once they are
        durable. None when there was nothing to store. A batch may start past
        the log end: compaction on the leader removed the batches between
        (offsets are never reused, so the gap stays a gap)."""
        self.leader_high_watermark = max(self.leader_high_watermark, leader_high_watermark)
        changes: Changes = []
        for base_offset, epoch, value in batches:
            if base_offset < self.next_offset and not self._restarts_inside(base_offset, value):
                raise ValueError(f"{self.topic}-{self.index}: the leader sent offset {base_offset}, below the log end {self.next_offset}")
            if self.epochs.assign(epoch, base_offset):
                changes.append((log_format.epoch_key(self.pkey, epoch), log_format.offset_value(base_offset)))
            changes.append((log_format.log_key(self.pkey, base_offset), value))
            changes += self._effect_stored(base_offset, value)
            self.next_offset = log_format.decode_header(base_offset, value).last_offset + 1
            self.size_bytes += len(value)
        if not changes:
            self._advance_high_watermark()
            return None
        changes.append(self.metadata_change())
        return self._submit(changes)[0]

    def _restarts_inside(self, base_offset: int, value: bytes) -> bool:
        """Whether the leader's batch is the one its log start falls inside,
        sent whole to this replica, whose log restarted empty at that log start
        (restart_log_at)."""
        empty = self.next_offset == self.log_start_offset and self.store.batch_at_or_before(self.pkey, 2**63 - 1) is None
        return empty and base_offset < self.log_start_offset <= log_format.decode_header(base_offset, value).last_offset

    def truncate_to(self, offset: int) -> asyncio.Future | None:
        """Removes the log from ``offset`` on (where it diverges from the
        leader's) and rebuilds every state derived from the log by replaying
        what is left; None when the log ends there already. Only once this
        replica's appends are written (settle_writes)."""
        self._check_settled("truncate")
        if offset >= self.next_offset:
            # An epoch this replica started at its log end and never wrote in (a leader that took no write)
            # is not in the leader's log either: forgotten, or every fetch would be told the logs diverge.
            gone = [e for e, start in self.epochs.entries if start >= offset]
            self.epochs.truncate_from_end(offset)
            return self.writer.submit([(log_format.epoch_key(self.pkey, e), None) for e in gone]) if gone else None
        changes: Changes = [(key, None) for key, _ in self.store.items(b"L" + self.pkey, log_format.log_key(self.pkey, offset))]
        changes += [(key, None) for key in self.store.derived_keys(self.pkey, self._owns_group())]
        self.epochs.truncate_from_end(offset)
        changes += [(key, None) for key, _ in self.store.items(b"E" + self.pkey)]
        changes += [(log_format.epoch_key(self.pkey, e), log_format.offset_value(start)) for e, start in self.epochs.entries]
        self.producers, self.aborted, self.pending_offsets = ProducerStates(), {}, {}
        self.next_offset = max(offset, self.log_start_offset)
        self.durable_end = min(self.durable_end, self.next_offset)
        self.written_end = min(self.written_end, self.next_offset)
        self.high_watermark = min(self.high_watermark, self.next_offset)
        self.size_bytes = 0
        for base_offset, value in self.store.batches_holding(self.pkey, self.log_start_offset):
            if base_offset >= offset:
                break
            self.size_bytes += len(value)
            changes += self._effect_stored(base_offset, value)
        changes.append(self.metadata_change())
        return self.writer.submit(changes)

    def restart_log_at(self, offset: int) -> asyncio.Future:
        """Drops the whole log and starts it empty at ``offset`` (the leader's
        log start, when retention there deleted what this replica lacks).
        Only once this replica's appends are written (settle_writes)."""
        self._check_settled("start over")
        changes = self._wipe_changes()
        self.producers, self.aborted, self.pending_offsets = ProducerStates(), {}, {}
        self.log_start_offset = self.next_offset = self.durable_end = self.written_end = offset
        self.high_watermark = min(self.high_watermark, offset)
        self.size_bytes = 0
        self.epochs = LeaderEpochCache()
        changes.append(self.metadata_change())  # after the wipe's delete of the same key
        return self.writer.submit(changes)

    async def delete(self) -> None:
        """Deletes this replica's copy of the partition (a reassignment moved it away)."""
        await self.settle_writes()
        await self.writer.submit(self._wipe_changes())

    async def settle_writes(self) -> None:
        """Returns once every change submitted before the call is written: what
        truncate_to, restart_log_at and delete read from the store to delete
        then includes a leader's last appends, still queued when it stopped
        leading (read before, they were written after the deletions and
        survived them: an unreplicated batch and its producer's state, back at
        the next restart)."""
        await self.writer.submit([])

    def _check_settled(self, what: str) -> None:
        """What to delete is read from the store: an append not written yet would outlive the deletions."""
        if self._in_flight or self._unreadable:
            raise RuntimeError(f"{self.topic}-{self.index}: cannot {what} with appends not written yet; settle_writes first")

    def _wipe_changes(self) -> Changes:
        return wipe_changes(self.store, self.pkey, self._owns_group())

    def _owns_group(self) -> Callable[[str], bool] | None:
        """For a __consumer_offsets partition, which groups' committed offsets it holds."""
        if self.topic != CONSUMER_OFFSETS_TOPIC:
            return None
        return lambda group: partition_for_id(group, self.partition_count) == self.index

    # --- transactions -----------------------------------------------------------------

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Reject | None:
        """Whether a COMMIT/ABORT marker may be applied. With Transactions V2 a
        marker carries the bumped epoch, so it ends only a transaction opened at a
        LOWER epoch: a marker whose epoch equals that of the transaction open here
        is a late copy of the previous transaction's marker and is refused (it
        must never end this one). With nothing open, a re-sent marker is a no-op
        (write_marker)."""
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

    def _check_txn_offsets(self, producer_id: int, producer_epoch: int, entry: ProducerStateEntry | None) -> Reject | None:
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
        return None

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

    def aborted_span(self, producer_id: int, offset: int) -> tuple[int, int] | None:
        """The aborted span (first, last offset) of the producer holding ``offset``, if one does."""
        if not self.is_aborted(producer_id, offset):
            return None
        spans = self.aborted[producer_id]
        return spans[bisect.bisect_right(spans, (offset, 2**63)) - 1]

    def transaction_outcomes(self, from_offset: int, to_offset: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The aborted ((producer id, first, last)) and open ((producer id,
        first)) transactions that the transactional batches holding offsets
        ``from_offset``..``to_offset`` - 1 belong to (txn_outcomes.leader_answer):
        what a READ_UNCOMMITTED read of that range asked for. A second pass
        over the batches read, only when asked, so a read that does not ask
        pays nothing; no await between the read and this, so both see one state."""
        batches = []
        for base_offset, value in self.store.batches_holding(self.pkey, from_offset):
            if base_offset >= to_offset:
                break
            header = log_format.decode_header(base_offset, value)
            if header.last_offset >= from_offset and header.is_transactional and not header.is_control:
                batches.append((header.producer_id, base_offset))

        def open_first_offset(producer_id: int) -> int:
            entry = self.producers.get(producer_id)
            return entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET

        return txn_outcomes.leader_answer(batches, self.aborted_span, open_first_offset)

    # --- durability and the high watermark ---------------------------------------------

    def _on_readable(self) -> None:
        end = _settled_end(self._unreadable)
        if end is not None:
            self.written_end = end
            self._wake("_written_end_moved")

    def _on_written(self) -> None:
        end = _settled_end(self._in_flight)
        if end is not None:
            self.durable_end = end
            self._wake("_log_end_moved")
            self._advance_high_watermark()

    def _advance_high_watermark(self) -> None:
        """Moves the high watermark as far as the replicas allow (a leader: the
        ISR's smallest durable end; a follower: its leader's, within its own
        log) and completes the appends it passed."""
        if self.replica_set is not None:
            self.replica_set.advance_high_watermark(self.durable_end)
            candidate = self.replica_set.high_watermark
        else:
            candidate = min(self.leader_high_watermark, self.durable_end)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            self._wake("_data_arrived")
        while self._replicating and self._replicating[0][0] <= self.high_watermark:
            _, future, on_replicated = self._replicating.popleft()
            if on_replicated is not None:
                on_replicated()
            if not future.done():
                future.set_result(True)

    def follower_fetched(self, follower: int, log_end_offset: int, now_ms: int, log_start_offset: int = 0) -> None:
        """A follower fetched from ``log_end_offset``: it holds everything below,
        from ``log_start_offset`` (as it said; 0 when it did not) on."""
        if self.replica_set is not None:
            if self.replica_set.on_fetch(follower, log_end_offset, self.durable_end, now_ms, log_start_offset):
                self._wake("_low_watermark_moved")
            self._advance_high_watermark()

    @property
    def low_watermark(self) -> int:
        """The lowest log start offset among the in-sync replicas (as far as
        this leader knows its followers'); a follower's own log start."""
        if self.replica_set is None:
            return self.log_start_offset
        return self.replica_set.low_watermark(self.log_start_offset)

    async def wait_log_start_followed(self, deleted: RecordsDeleted) -> bool:
        """True once DeleteRecords' new log start is durable here and every
        in-sync replica has moved its own to it (the low watermark reached
        it); False if this replica stops leading first."""
        if deleted.written is not None:
            await asyncio.shield(deleted.written)  # the write goes on if the caller stops waiting
        while self.low_watermark < deleted.log_start_offset:
            if not self.is_leader:
                return False
            await self._low_watermark_moved.wait()
        return self.is_leader

    def _wake(self, name: str) -> None:
        # A new event each time: whoever took the old one before the move and waits on it after returns at once.
        getattr(self, name).set()
        setattr(self, name, asyncio.Event())

    async def wait_durable(self, offset: int) -> None:
        """Returns once ``offset`` is durable here."""
        while self.durable_end <= offset:
            await self._log_end_moved.wait()

    async def wait_replicated(self, offset: int) -> bool:
        """True once ``offset`` is below the high watermark; False if this
        replica stops leading first."""
        while self.high_watermark <= offset:
            if not self.is_leader:
                return False
            await self._data_arrived.wait()
        return True

    def data_arrived(self) -> asyncio.Event:
        """Set once the high watermark moves (a new event is made then)."""
        return self._data_arrived

    def written_end_moved(self) -> asyncio.Event:
        """Set once written_end moves (a new event is made then)."""
        return self._written_end_moved

    def log_start_moved(self) -> asyncio.Event:
        """Set once DeleteRecords moves the leader's log start (a new event is made then)."""
        return self._log_start_moved

    # --- reading ------------------------------------------------------------------

    def read(
        self, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *, take_first: bool, committed: bool = False,
        accepted: frozenset[int] = frozenset(),
    ) -> tuple[list[bytes], int, int]:
        """read_encoded()'s batches, each joined into its serialized RecordBatch."""
        batches, next_offset, records = self.read_encoded(fetch_offset, upper_offset, bytes_max, records_max,
                                                          take_first=take_first, committed=committed, accepted=accepted)
        return [b"".join(batch.parts) for batch in batches], next_offset, records

    def read_encoded(
        self, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *, take_first: bool, committed: bool = False,
        accepted: frozenset[int] = frozenset(),
    ) -> tuple[list[wire.Encoded], int, int]:
        """The serialized RecordBatches from ``fetch_offset`` below ``upper_offset``,
        up to ``bytes_max`` bytes and ``records_max`` records, except that with
        ``take_first`` the first batch is taken whatever its size (so a consumer
        always makes progress); records before fetch_offset are trimmed from the
        first batch; with ``committed``, batches of aborted transactions are
        skipped; each batch says the leader epoch it was written in
        (partition_leader_epoch). A batch stored compressed goes out as
        stored, whole, when its codec is in ``accepted`` (the reader skips its
        records below fetch_offset, as Kafka's consumers do), else
        decompressed into plain records with offsets, trimmed as an
        uncompressed one. Each batch is returned unjoined (wire.Encoded: the
        stored bytes, not copied, then the epoch field), for a response that
        copies them once. Returns (batches, offset to fetch next, record
        count)."""
        batches: list[wire.Encoded] = []
        if fetch_offset >= upper_offset:
            return batches, fetch_offset, 0
        next_offset = fetch_offset
        taken_bytes = taken_records = 0
        for base_offset, value in self.store.batches_holding(self.pkey, fetch_offset, upper_offset):
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
            if header.is_control or (committed and header.is_transactional and self.is_aborted(header.producer_id, base_offset)):
                continue
            payload = log_format.payload_of(value)
            if header.compression and header.compression not in accepted:
                batch = common_pb2.RecordBatch.FromString(payload)
                compression.expand(batch, compression.READ_BYTES_MAX, fetch_offset)
                payload = batch.SerializeToString()
            elif base_offset < fetch_offset and not header.compression:
                batch = common_pb2.RecordBatch.FromString(payload)
                del batch.records[: fetch_offset - base_offset]
                payload = batch.SerializeToString()
            batches.append(wire.record_batch(payload, self.epochs.epoch_at(base_offset)))
            taken_bytes += header.stored_bytes
            taken_records += count
            if taken_bytes >= bytes_max or taken_records >= records_max:
                break  # no next batch fits (each has bytes and a record): stop before the iterator reads one
        return batches, next_offset, taken_records

    def headers(self, from_offset: int = 0):
        """The stored batches' headers from ``from_offset`` or the log start (the first may start before it)."""
        for base_offset, value in self.store.batches_holding(self.pkey, max(from_offset, self.log_start_offset)):
            yield log_format.decode_header(base_offset, value)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record at or after ``timestamp_ms``, or (-1, -1)."""
        for header in self.headers():
            if header.base_offset >= self.high_watermark:
                break
            if header.max_timestamp_ms < timestamp_ms or header.is_control:
                continue
            for record in self.records_of(self.store.batch(self.pkey, header.base_offset)):
                if record.timestamp_ms >= timestamp_ms and record.offset >= self.log_start_offset:
                    return record.offset, record.timestamp_ms
        return -1, -1

    @staticmethod
    def records_of(value: bytes):
        """A stored batch's records, with their offsets and timestamps, decompressed if it is compressed."""
        batch = common_pb2.RecordBatch.FromString(log_format.payload_of(value))
        compression.expand(batch, compression.READ_BYTES_MAX)
        return batch.records

    # --- retention ----------------------------------------------------------------

    def _retention_changes(self, now_ms: int) -> list[tuple[bytes, bytes | None]]:
        """Deletes whole batches from the log start while they are older than
        retention.ms or the log is larger than retention.bytes, never at or past
        the LSO: moves the log start past them (_log_start_changes)."""
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
        return self._log_start_changes(doomed[-1].last_offset + 1)

    def _log_start_changes(self, offset: int) -> Changes:
        """Moves the log start forward to ``offset``: deletes the whole batches
        below it, keeps the one it falls inside (reads trim its records below
        the log start), forgets the aborted spans ending below it; applies it
        in memory and returns the changes, one write (retention's and
        DeleteRecords' alike, on the leader and on its followers)."""
        if offset < self.log_start_offset:
            raise ValueError(f"{self.topic}-{self.index}: the log start never moves back, from {self.log_start_offset} to {offset}")
        doomed = list(itertools.takewhile(lambda header: header.last_offset < offset, self.headers()))
        self.log_start_offset = offset
        self.size_bytes -= sum(h.stored_bytes for h in doomed)
        changes: Changes = [(log_format.log_key(self.pkey, h.base_offset), None) for h in doomed]
        changes += self._forget_aborted_below(offset)
        changes.append(self.metadata_change())
        return changes

    def _forget_aborted_below(self, offset: int) -> list[tuple[bytes, None]]:
        changes = []
        for producer_id, spans in list(self.aborted.items()):
            kept = [(first, last) for first, last in spans if last >= offset]
            changes += [(log_format.aborted_key(self.pkey, producer_id, first), None) for first, last in spans if last < offset]
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
        for base_offset, value in self.store.batches_holding(self.pkey, self.log_start_offset):
            header = log_format.decode_header(base_offset, value)
            if header.last_offset >= lso:
                break
            scanned.append(header)
            if header.is_control:
                continue
            if header.is_transactional and self.is_aborted(header.producer_id, header.base_offset):
                aborted.append(header)
                continue
            records = [(r.key, r.offset) for r in self.records_of(value)]
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
        changes: list[tuple[bytes, bytes | None]] = [(log_format.log_key(self.pkey, h.base_offset), None) for h in doomed]
        changes.append(self.metadata_change())
        return changes


def wipe_changes(store: LogStore, pkey: bytes, owns_group: Callable[[str], bool] | None = None) -> Changes:
    """Deletes of every key of a partition: log, epochs, metadata and what
    derives from the log (also of one not loaded: a deleted topic's, found on disk)."""
    changes: Changes = [(key, None) for kind in (b"L", b"E", b"M") for key, _ in store.items(kind + pkey)]
    return changes + [(key, None) for key in store.derived_keys(pkey, owns_group)]


def now_ms() -> int:
    return int(time.time() * 1000)


def offset_changes(batch: common_pb2.RecordBatch) -> Changes:
    """A __consumer_offsets batch as changes of the offsets view: a record
    without a value is a tombstone (a deleted group's offset)."""
    return [(r.key, r.value if r.HasField("value") else None) for r in batch.records]


def _settled_end(writes: deque[tuple[int, asyncio.Future]]) -> int | None:
    """Takes the leading writes whose future is done off ``writes`` (end offset,
    future; in offset order): the end of the last one taken, None if none was."""
    end = None
    while writes and writes[0][1].done():
        end = writes.popleft()[0]
    return end
