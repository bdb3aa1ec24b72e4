"""One partition replica on this instance, leader or follower: the shell
around the pure rules of partition_core.py (transactions: checks, effects,
the LSO) and log_core.py (the log: offsets and encoding, retention,
compaction, the log start). It holds the replica's state, reads the store
and the clock, and hands changes to the writer (write_queue.py).

Invariants:
- Offsets are assigned in order at append time (by the leader; a follower
  stores the leader's batches at the leader's offsets). ``durable_end`` moves
  over appends durable here, in order; ``written_end`` (never behind it) over
  appends readable here, written but maybe not synced: followers fetch up to
  it, so their write and sync overlap the leader's own sync. The
  ``high_watermark`` is the smallest durable end among the in-sync replicas
  (isr.ReplicaSet), so a reader never sees a record that a crash, or a
  failover, could take back, nor a gap; it never moves backwards while this
  replica leads. The low watermark is the lowest log start in the ISR.
- What a replica knows besides the log (partition_core.DerivedState) is a
  function of the log: one effect per batch kind, applied by the leader when
  it appends, by a follower when it stores the leader's batch, and by a
  rebuild after truncation when it replays the log.

Every change goes through one door per request kind (:meth:`Partition.produce`,
:meth:`~Partition.write_marker`, :meth:`~Partition.seal_prepared`,
:meth:`~Partition.commit_offsets`, :meth:`~Partition.commit_txn_offsets`,
:meth:`~Partition.enforce_retention`, :meth:`~Partition.delete_records`), which
answers with a value: a :class:`Reject` (nothing changed) or a future that
completes once the change is replicated (True), or False when this replica
stopped leading first (its fate is then the new leader's to decide).

The one rule for ordering memory and the writer queue: a door asks the core,
applies the change in memory and submits it (:meth:`Partition._take`) in one
synchronous call, with no await inside, so the writer receives changes in
the order memory took them (an earlier change never overwrites a later one's
producer state or metadata on disk); and what reads the store to delete
(truncation, a restart of the log, deleting the replica) first lets every
earlier submission be written (:meth:`Partition.settle_writes`), or a queued
append would be written after the deletions and survive them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from partition_svc import log_core, log_format, log_reads, partition_core, validation, wire
from partition_svc.isr import FollowerProgress, ReplicaSet
from partition_svc.log_store import LogStore
from partition_svc.partition_core import Changes, DerivedState, Unchanged, WriteControl
from partition_svc.producer_state import Duplicate, ProducerStates, Reject
from partition_svc.write_queue import Signal, WriteQueue, Writer
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, INTERNAL_TOPIC_PREFIX, txn_outcomes
from txlog.protocol.errors import TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.leader_epochs import LeaderEpochCache
from txlog.v1 import common_pb2


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
                 partition_count: int = 1, sole_replica: bool = True, clock: Callable[[], int] | None = None):
        self.topic = topic
        self.index = index
        self.partition_count = partition_count
        self.replicas: tuple[int, ...] = (node_id,)  # every replica, as the topic's assignment says
        self.configs = configs
        self.store = store
        self.queue = WriteQueue(writer, self._readable_to, self._durable_to)
        self.node_id = node_id
        self.pkey = log_format.partition_key(topic, index)
        self.where = f"{topic}-{index}"
        self.clock = clock or now_ms  # this replica's clock, ms: when it appended each producer's batches
        self.log_start_offset = 0
        self.next_offset = 0
        self.durable_end = 0
        self.written_end = 0
        self.high_watermark = 0
        self.size_bytes = 0
        self.derived = DerivedState()
        self.epochs = LeaderEpochCache()
        # A sole replica leads at epoch 0 from the start; a replicated one follows until the controller says.
        self.leader_epoch = 0 if sole_replica else -1
        self.replica_set: ReplicaSet | None = ReplicaSet(node_id, frozenset({node_id})) if sole_replica else None
        self.leader_high_watermark = 0  # a follower's: the leader's, as its last fetch answered
        self.leader_replicated_end = 0  # a follower's: the leader's replicated end (marker_end), as its last fetch answered
        self._data_arrived = Signal()  # the high watermark moved
        self._log_end_moved = Signal()  # durable_end moved
        self._written_end_moved = Signal()  # written_end moved: what followers wait on
        self._log_start_moved = Signal()  # the leader's log start moved (its followers are told at once)
        self._low_watermark_moved = Signal()  # the lowest log start of the ISR moved
        # Offsets a marker decided, until the marker is replicated: the G keys they become are not there yet,
        # so OffsetFetch(require_stable) must still call them unstable rather than answer the old offset.
        self.settling_offsets: dict[int, dict[bytes, bytes]] = {}  # id(the dict) -> the dict
        # First offsets of transactions whose marker is applied in memory but not replicated yet: they hold the LSO.
        self.closing_transactions: dict[object, int] = {}
        self._recover()

    # --- recovery -----------------------------------------------------------------

    def _recover(self) -> None:
        found = log_reads.recovered(self.store, self.pkey)
        self.log_start_offset, self.next_offset, self.size_bytes = found.log_start_offset, found.next_offset, found.size_bytes
        self.durable_end = self.written_end = self.next_offset
        self.high_watermark = self.leader_high_watermark = found.high_watermark
        self.epochs, self.derived = found.epochs, found.derived
        if self.replica_set is not None:  # a sole replica moves it to its log end when it leads
            self.replica_set.high_watermark = self.high_watermark
            self._advance_high_watermark()

    @property
    def producers(self) -> ProducerStates:
        return self.derived.producers

    @property
    def aborted(self) -> dict[int, list[tuple[int, int]]]:
        """producer id -> its aborted transactions' (first, last offset), in offset order."""
        return self.derived.aborted

    @property
    def pending_offsets(self) -> dict[int, dict[bytes, bytes]]:
        """producer id -> {G key: offset value} committed in its open transaction."""
        return self.derived.pending_offsets

    def metadata_change(self) -> tuple[bytes, bytes]:
        return log_format.meta_key(self.pkey), log_format.metadata_value(
            self.log_start_offset, self.next_offset, self.size_bytes, self.high_watermark)

    # --- offsets ------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        return partition_core.last_stable_offset(self.high_watermark, self.producers.first_open_offset(),
                                                 list(self.closing_transactions.values()))

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
            self.queue.submit([(log_format.epoch_key(self.pkey, leader_epoch), log_format.offset_value(self.next_offset))])
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
        self.queue.abandon_replication()
        self.closing_transactions.clear()
        self.settling_offsets.clear()
        self._data_arrived.fire()
        self._low_watermark_moved.fire()

    def isr_changed(self, isr: frozenset[int]) -> None:
        """The ISR as written to ZooKeeper (by this leader or the controller)."""
        if self.replica_set is not None:
            self.replica_set.set_isr(isr)
            self._advance_high_watermark()
            self._low_watermark_moved.fire()

    def not_leading(self) -> Reject | None:
        return partition_core.not_leading(self.where) if self.replica_set is None else None

    def check_enough_replicas(self) -> Reject | None:
        isr_size = len(self.replica_set.isr) if self.replica_set is not None else 0
        return partition_core.check_enough_replicas(self.where, isr_size, self.min_insync_replicas)

    # --- the doors --------------------------------------------------------------------

    def produce(self, batch: common_pb2.RecordBatch | validation.EncodedBatch, now_ms: int,
                limits: validation.BatchLimits) -> Produced | Reject:
        """One batch of a Produce, checked against its producer's state: a
        duplicate is answered its original offsets, a new batch is appended and
        submitted. A bad record is a Reject, with nothing changed."""
        outcome = self.not_leading() or partition_core.check_produce(self.derived, batch)
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Duplicate):
            return Produced(outcome.base_offset, outcome.last_offset, asyncio.ensure_future(self.wait_durable(outcome.last_offset)),
                            asyncio.ensure_future(self.wait_replicated(outcome.last_offset)), duplicate=True)
        try:
            if isinstance(batch, validation.EncodedBatch):
                encoded = log_core.encode_encoded(batch, self.next_offset, now_ms, self.topic, self.configs, limits)
            else:
                encoded = log_core.encode_append(batch, self.next_offset, now_ms, self.topic, self.configs, limits)
        except TxlogError as exc:
            return Reject(exc.code, exc.message)
        base = self.next_offset
        written, replicated = self._take(self._appended(encoded, self._data_effect(batch, base, encoded)))
        return Produced(base, base + encoded.record_count - 1, written, replicated)

    def _data_effect(self, batch: common_pb2.RecordBatch | validation.EncodedBatch, base: int, encoded: log_core.Encoded) -> Changes:
        if batch.producer_id >= 0:
            return partition_core.effect_data(self.derived, self.pkey, batch.producer_id, batch.producer_epoch,
                                              batch.base_sequence, encoded.record_count, base, encoded.max_timestamp_ms,
                                              batch.is_transactional, appended_ms=self.clock())
        if self.topic == CONSUMER_OFFSETS_TOPIC:
            return partition_core.offset_changes(batch)
        return []

    def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool, now_ms: int
    ) -> Reject | asyncio.Future | None:
        """A COMMIT/ABORT marker (partition_core.decide_marker, then the marker
        batch); None when there was nothing to change."""
        outcome = self.not_leading() or partition_core.decide_marker(self.derived, self.where, producer_id, producer_epoch,
                                                                     coordinator_epoch, committed)
        return self._control(outcome, producer_id, producer_epoch, coordinator_epoch, now_ms)

    def seal_prepared(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, now_ms: int) -> Reject | asyncio.Future | None:
        """The seal of a prepared transaction (partition_core.decide_seal, then a
        PREPARED control batch): from now on no batch or offset of that epoch is
        taken here (a zombie of the preparing process cannot add to what the
        handle's holder commits). None when it is sealed already."""
        outcome = self.not_leading() or partition_core.decide_seal(self.derived, self.where, producer_id, producer_epoch,
                                                                   coordinator_epoch)
        return self._control(outcome, producer_id, producer_epoch, coordinator_epoch, now_ms)

    def _control(self, outcome: Reject | Unchanged | WriteControl, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                 now_ms: int) -> Reject | asyncio.Future | None:
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Unchanged):
            return None
        return self._append_control(producer_id, producer_epoch, coordinator_epoch, outcome.control_type, now_ms)

    def commit_offsets(self, offsets: list[tuple[bytes, bytes | None]], now_ms: int, limits: validation.BatchLimits) -> asyncio.Future | Reject:
        """Consumer offsets committed outside a transaction (this is a
        __consumer_offsets partition): a batch in the log, and the view
        OffsetFetch reads, in one write. A value of None deletes the offset
        (a tombstone record)."""
        refused = self.not_leading()
        if refused is not None:
            return refused
        batch = log_core.offsets_batch(offsets)
        base = self.next_offset
        encoded = log_core.encode_append(batch, base, now_ms, self.topic, self.configs, limits)
        return self._take(self._appended(encoded, self._data_effect(batch, base, encoded)))[1]

    def commit_txn_offsets(
        self, producer_id: int, producer_epoch: int, offsets: list[tuple[bytes, bytes]], now_ms: int
    ) -> Reject | asyncio.Future | None:
        """Consumer offsets committed in the producer's transaction (this is a
        __consumer_offsets partition); they take effect with its COMMIT marker.
        None when every one was older than an offset pending already."""
        outcome = self.not_leading() or partition_core.decide_txn_offsets(self.derived, producer_id, producer_epoch, offsets)
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Unchanged):
            return None
        base = self.next_offset
        batch = log_core.txn_offsets_batch(producer_id, producer_epoch, outcome.offsets)
        encoded = log_core.encode_internal(batch, base, log_format.FLAG_TRANSACTIONAL, now_ms)
        effect = partition_core.effect_txn_offsets(self.derived, self.pkey, producer_id, producer_epoch, outcome.offsets, base, now_ms)
        return self._take(self._appended(encoded, effect))[1]

    def enforce_retention(self, now_ms: int, delete_retention_ms: int = validation.DELETE_RETENTION_MS_DEFAULT
                          ) -> asyncio.Future | None:
        """Deletes what retention.ms/bytes and compaction let go; None when nothing.
        ``delete_retention_ms``: the instance's default for a topic without delete.retention.ms."""
        changes = self._retention_changes(now_ms) + self._compaction_changes(now_ms, delete_retention_ms)
        return self.queue.submit(changes) if changes else None

    def expire_producers(self, now_ms: int, expiration_ms: int) -> asyncio.Future | None:
        """Forgets the producers ``ProducerStateEntry.expired`` says may go (their
        next batch must then start at sequence 0, as a new producer's); None
        when none. Internal topics keep theirs: their writers (the coordinators'
        log writers) live as long as their process, and a sequence gap there is
        read as fencing."""
        if self.topic.startswith(INTERNAL_TOPIC_PREFIX):
            return None
        gone = partition_core.expired_producers(self.derived, now_ms, expiration_ms)
        for producer_id in gone:
            del self.producers[producer_id]
        return self.queue.submit([(log_format.producer_key(self.pkey, producer_id), None) for producer_id in gone]) if gone else None

    def delete_records(self, offset: int) -> RecordsDeleted | Reject:
        """DeleteRecords (log_core.decide_delete_records). Producer states stay
        (as with retention: only open transactions need their first offset, and
        those are never deleted); the leader-epoch cache keeps its history (its
        answers stay true, and a follower behind the log start restarts at it)."""
        outcome = self.not_leading() or log_core.decide_delete_records(self.where, offset, self.last_stable_offset,
                                                                       self.log_start_offset)
        if isinstance(outcome, Reject):
            return outcome
        if isinstance(outcome, Unchanged):
            return RecordsDeleted(self.log_start_offset, None)
        written = self.queue.submit(self._log_start_changes(outcome.offset))
        self._log_start_moved.fire()
        self._low_watermark_moved.fire()
        return RecordsDeleted(outcome.offset, written)

    def follow_log_start(self, leader_log_start: int) -> asyncio.Future | None:
        """A follower takes its leader's log start (a ReplicaFetch answer), as
        log_core.follower_log_start says. None when it does not move."""
        target = log_core.follower_log_start(leader_log_start, self.high_watermark, self.log_start_offset)
        if self.is_leader or target is None:
            return None
        return self.queue.submit(self._log_start_changes(target))

    def _take(self, changes: Changes, on_replicated: Callable[[], None] | None = None) -> tuple[asyncio.Future, asyncio.Future]:
        """Hands an append's changes, applied in memory by the caller in the same
        synchronous step, to the writer: (written: durable here, replicated:
        below the high watermark, True; False if leadership went first).
        ``on_replicated`` runs when the high watermark passes."""
        taken = self.queue.submit_append(changes, self.next_offset, on_replicated)
        self._advance_high_watermark()
        return taken

    def _appended(self, encoded: log_core.Encoded, effect: Changes) -> Changes:
        """A batch at the log end with its effect: the log end and size move; the changes of one append."""
        base = self.next_offset
        self.next_offset = base + encoded.record_count
        self.size_bytes += len(encoded.value)
        return [(log_format.log_key(self.pkey, base), encoded.value), *effect, self.metadata_change()]

    def check_leader_epoch(self, seen: int) -> None:
        refused = partition_core.check_leader_epoch(self.where, seen, self.leader_epoch)
        if refused is not None:
            raise refused

    # --- appending ----------------------------------------------------------------

    def _append_control(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, control: int,
                        now_ms: int) -> asyncio.Future:
        """Appends a control batch (COMMIT, ABORT, PREPARED) and applies its
        effect. A transaction closed by a marker holds the LSO until the marker
        is replicated: a failover before that can take the marker back, and a
        read_committed reader must never see the LSO move backwards."""
        marker, flags = log_core.control_batch(producer_id, producer_epoch, coordinator_epoch, control, now_ms)
        open_first = self.derived.open_first_offset(producer_id)
        settling = self.pending_offsets.get(producer_id) if control != common_pb2.CONTROL_TYPE_PREPARED else None
        base = self.next_offset
        encoded = log_core.encode_internal(marker, base, flags, now_ms)
        changes = self._appended(encoded, partition_core.effect_control(self.derived, self.pkey, marker, base, now_ms))
        closing_key = object()
        if control != common_pb2.CONTROL_TYPE_PREPARED and open_first >= 0:
            self.closing_transactions[closing_key] = open_first
        if settling:
            self.settling_offsets[id(settling)] = settling

        def settled() -> None:
            self.closing_transactions.pop(closing_key, None)
            if settling:
                self.settling_offsets.pop(id(settling), None)

        return self._take(changes, settled)[1]

    # --- what each stored batch does (the leader's appends, a follower's, a rebuild's replay) ----

    def _effect_stored(self, base_offset: int, value: bytes) -> Changes:
        return partition_core.effect_stored(self.derived, self.pkey, self.topic == CONSUMER_OFFSETS_TOPIC, base_offset, value,
                                            appended_ms=self.clock())

    # --- a follower's log ------------------------------------------------------------

    def append_replicated(self, batches: list[tuple[int, int, bytes]], leader_high_watermark: int,
                          leader_replicated_end: int = 0) -> asyncio.Future | None:
        """Stores the leader's batches ((base offset, leader epoch, stored
        value), in offset order from this replica's log end) at the leader's
        offsets, with their effects; the future completes once they are
        durable. None when there was nothing to store. A batch may start past
        the log end: compaction on the leader removed the batches between
        (offsets are never reused, so the gap stays a gap)."""
        self.leader_high_watermark = max(self.leader_high_watermark, leader_high_watermark)
        self.leader_replicated_end = leader_replicated_end  # not max: it falls when a replica holds less (a wiped disk)
        changes: Changes = []
        for base_offset, _, value in batches:  # all proven before any is taken: a damaged one leaves the log end where it was
            stored = log_format.decode_header(base_offset, value)
            if stored.is_encoded:  # the leader read it without RocksDB's checksums, and it crossed the network
                log_format.prove_encoded(stored, value)  # DamagedBatch, a ValueError: nothing stored, fetched again
        for base_offset, epoch, value in batches:
            if base_offset < self.next_offset and not self._restarts_inside(base_offset, value):
                raise ValueError(f"{self.where}: the leader sent offset {base_offset}, below the log end {self.next_offset}")
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
        return self._take(changes)[0]

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
        self.queue.check_settled(self.where, "truncate")
        if offset >= self.next_offset:
            # An epoch this replica started at its log end and never wrote in (a leader that took no write)
            # is not in the leader's log either: forgotten, or every fetch would be told the logs diverge.
            gone = [e for e, start in self.epochs.entries if start >= offset]
            self.epochs.truncate_from_end(offset)
            return self.queue.submit([(log_format.epoch_key(self.pkey, e), None) for e in gone]) if gone else None
        changes: Changes = [(key, None) for key, _ in self.store.items(b"L" + self.pkey, log_format.log_key(self.pkey, offset))]
        changes += [(key, None) for key in self.store.derived_keys(self.pkey, self._owns_group())]
        self.epochs.truncate_from_end(offset)
        changes += [(key, None) for key, _ in self.store.items(b"E" + self.pkey)]
        changes += [(log_format.epoch_key(self.pkey, e), log_format.offset_value(start)) for e, start in self.epochs.entries]
        self.derived = DerivedState()
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
        return self.queue.submit(changes)

    def restart_log_at(self, offset: int) -> asyncio.Future:
        """Drops the whole log and starts it empty at ``offset`` (the leader's
        log start, when retention there deleted what this replica lacks).
        Only once this replica's appends are written (settle_writes)."""
        self.queue.check_settled(self.where, "start over")
        changes = self._wipe_changes()
        self.derived = DerivedState()
        self.log_start_offset = self.next_offset = self.durable_end = self.written_end = offset
        self.high_watermark = min(self.high_watermark, offset)
        self.size_bytes = 0
        self.epochs = LeaderEpochCache()
        changes.append(self.metadata_change())  # after the wipe's delete of the same key
        return self.queue.submit(changes)

    async def truncate(self, offset: int) -> None:
        """truncate_to once every change submitted before is written; returns once the truncation is durable."""
        await self.settle_writes()
        written = self.truncate_to(offset)
        if written is not None:
            await written

    async def start_over_at(self, offset: int, still_following: Callable[[], bool]) -> None:
        """restart_log_at once every change submitted before is written, if ``still_following()`` then."""
        await self.settle_writes()
        if still_following():
            await self.restart_log_at(offset)

    async def delete(self) -> None:
        """Deletes this replica's copy of the partition (a reassignment moved it away)."""
        await self.settle_writes()
        await self.queue.submit(self._wipe_changes())

    async def settle_writes(self) -> None:
        """Returns once every change submitted before the call is written: what
        truncate, start_over_at and delete read from the store to delete then
        includes a leader's last appends, still queued when it stopped leading
        (read before, they were written after the deletions and survived them:
        an unreplicated batch and its producer's state, back at the next restart)."""
        await self.queue.settle()

    def _wipe_changes(self) -> Changes:
        return self.store.wipe_changes(self.pkey, self._owns_group())

    def _owns_group(self) -> Callable[[str], bool] | None:
        """For a __consumer_offsets partition, which groups' committed offsets it holds."""
        if self.topic != CONSUMER_OFFSETS_TOPIC:
            return None
        return lambda group: partition_for_id(group, self.partition_count) == self.index

    # --- transactions -----------------------------------------------------------------

    def check_seal(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Reject | None:
        """Whether the seal of a prepared transaction may be applied (partition_core.decide_seal)."""
        outcome = partition_core.decide_seal(self.derived, self.where, producer_id, producer_epoch, coordinator_epoch)
        return outcome if isinstance(outcome, Reject) else None

    def has_pending_offsets(self, group_key_prefix: bytes, keys: list[bytes] | None = None) -> bool:
        """Whether offsets of the group are pending in a transaction (or settling): of the
        partitions ``keys`` names (as Kafka's require_stable), or of any partition."""
        pending = (*self.pending_offsets.values(), *self.settling_offsets.values())
        if keys is not None:
            return any(key in offsets for offsets in pending for key in keys)
        return any(key.startswith(group_key_prefix) for offsets in pending for key in offsets)

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return self.derived.is_aborted(producer_id, offset)

    def aborted_span(self, producer_id: int, offset: int) -> tuple[int, int] | None:
        """The aborted span (first, last offset) of the producer holding ``offset``, if one does."""
        return self.derived.aborted_span(producer_id, offset)

    def transaction_outcomes(self, from_offset: int, to_offset: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The aborted ((producer id, first, last)) and open ((producer id,
        first)) transactions that the transactional batches holding offsets
        ``from_offset``..``to_offset`` - 1 belong to (txn_outcomes.leader_answer):
        what a READ_UNCOMMITTED read of that range asked for. A second pass
        over the batches read, only when asked, so a read that does not ask
        pays nothing; no await between the read and this, so both see one state."""
        batches = log_reads.transactional_batches(self.store, self.pkey, from_offset, to_offset)
        return txn_outcomes.leader_answer(batches, self.aborted_span, self.derived.open_first_offset)

    # --- durability and the high watermark ---------------------------------------------

    def _readable_to(self, end: int) -> None:
        self.written_end = end
        self._written_end_moved.fire()

    def _durable_to(self, end: int) -> None:
        self.durable_end = end
        self._log_end_moved.fire()
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
            self._data_arrived.fire()
        self.queue.replicated_to(self.high_watermark)

    def follower_fetched(self, follower: int, log_end_offset: int, now_ms: int, log_start_offset: int = 0,
                         storage_zxid: int | None = None) -> None:
        """A follower fetched from ``log_end_offset``: it holds everything below,
        from ``log_start_offset`` (as it said; 0 when it did not) on, on the
        storage marked ``storage_zxid`` (None: it did not say)."""
        if self.replica_set is not None:
            if self.replica_set.on_fetch(follower, log_end_offset, self.durable_end, now_ms, log_start_offset, storage_zxid):
                self._low_watermark_moved.fire()
            self._advance_high_watermark()

    @property
    def marker_end(self) -> int:
        """Below it every replica holds the log, as far as is known here (the leader's
        ReplicaSet.replicated_end; a follower's, as the leader last said it): compaction
        removes a transaction's markers only below it."""
        if self.replica_set is not None:
            return self.replica_set.replicated_end(self.replicas)
        return min(self.leader_replicated_end, self.high_watermark)

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
        return self._data_arrived.event

    def written_end_moved(self) -> asyncio.Event:
        """Set once written_end moves (a new event is made then)."""
        return self._written_end_moved.event

    def log_start_moved(self) -> asyncio.Event:
        """Set once DeleteRecords moves the leader's log start (a new event is made then)."""
        return self._log_start_moved.event

    # --- reading ------------------------------------------------------------------

    def read(
        self, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *, take_first: bool, committed: bool = False,
        accepted: frozenset[int] = frozenset(), encoded: bool = False,
    ) -> tuple[list[bytes], int, int]:
        """read_encoded()'s batches, each joined: a serialized RecordBatch (or with ``encoded``, an encoded batch)."""
        batches, next_offset, records = self.read_encoded(fetch_offset, upper_offset, bytes_max, records_max, take_first=take_first,
                                                          committed=committed, accepted=accepted, encoded=encoded)
        return [b"".join(batch.parts) for batch in batches], next_offset, records

    def read_encoded(
        self, fetch_offset: int, upper_offset: int, bytes_max: int, records_max: int, *, take_first: bool, committed: bool = False,
        accepted: frozenset[int] = frozenset(), encoded: bool = False, bytes_enough: int | None = None,
    ) -> tuple[list[wire.Encoded], int, int]:
        """log_reads.read_encoded of this replica's log; ``committed`` skips aborted transactions' batches."""
        return log_reads.read_encoded(self.store, self.pkey, fetch_offset, upper_offset, bytes_max, records_max,
                                      take_first=take_first, is_aborted=self.derived.is_aborted if committed else None,
                                      epoch_at=self.epochs.epoch_at, accepted=accepted, encoded=encoded, bytes_enough=bytes_enough)

    def headers(self, from_offset: int = 0):
        """The stored batches' headers from ``from_offset`` or the log start (the first may start before it)."""
        return log_reads.headers(self.store, self.pkey, max(from_offset, self.log_start_offset))

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record at or after ``timestamp_ms``, or (-1, -1)."""
        return log_reads.offset_for_timestamp(self.store, self.pkey, timestamp_ms, self.log_start_offset, self.high_watermark)

    # --- retention ----------------------------------------------------------------

    def _retention_changes(self, now_ms: int) -> Changes:
        """The log start moved past what retention.ms and retention.bytes let go (log_core.retention_end)."""
        end = log_core.retention_end(self.headers(), now_ms, int(self.configs["retention.ms"]), int(self.configs["retention.bytes"]),
                                     self.size_bytes, self.last_stable_offset)
        return [] if end is None else self._log_start_changes(end)

    def _log_start_changes(self, offset: int) -> Changes:
        """Moves the log start forward to ``offset``: deletes the whole batches
        below it, keeps the one it falls inside, forgets the aborted spans
        ending below it; applies it in memory and returns the changes, one
        write (retention's and DeleteRecords' alike, on the leader and on its
        followers)."""
        if offset < self.log_start_offset:
            raise ValueError(f"{self.where}: the log start never moves back, from {self.log_start_offset} to {offset}")
        doomed = log_core.batches_below(self.headers(), offset)
        self.log_start_offset = offset
        self.size_bytes -= sum(h.stored_bytes for h in doomed)
        changes: Changes = [(log_format.log_key(self.pkey, h.base_offset), None) for h in doomed]
        changes += partition_core.forget_aborted_below(self.derived, self.pkey, offset)
        changes.append(self.metadata_change())
        return changes

    def _compaction_changes(self, now_ms: int, delete_retention_ms: int) -> Changes:
        """For cleanup.policy=compact, what log_core.compaction_plan lets go; applied in memory.
        The plan removes every aborted transaction's batches below the LSO, so the
        spans of those transactions go too (they were kept, and loaded at every
        start, for ever while markers were: the log start of a compacted log stayed
        at its first marker). A marker is marked emptied by the pass that finds its
        transaction's batches gone, and goes delete.retention.ms later, below
        marker_end (every replica holds it)."""
        if self.configs.get("cleanup.policy") != "compact":
            return []
        lso = self.last_stable_offset
        stored = ((log_format.decode_header(base_offset, value), value)
                  for base_offset, value in self.store.batches_holding(self.pkey, self.log_start_offset))
        plan = log_core.compaction_plan(stored, lso, self.derived.is_aborted, now_ms,
                                        int(self.configs.get("delete.retention.ms", delete_retention_ms)), self.marker_end)
        changes: Changes = partition_core.forget_aborted_below(self.derived, self.pkey, lso)
        if not plan.doomed and not plan.emptied and not changes:
            return []
        self.size_bytes -= sum(h.stored_bytes for h in plan.doomed)
        if plan.log_start is not None:
            self.log_start_offset = plan.log_start
        changes += [(log_format.log_key(self.pkey, h.base_offset), None) for h in plan.doomed]
        changes += [(log_format.log_key(self.pkey, h.base_offset), log_format.emptied_marker(value, now_ms))
                    for h, value in plan.emptied]
        changes.append(self.metadata_change())
        return changes


def now_ms() -> int:
    return int(time.time() * 1000)


