"""A partition's transactional rules, pure: what a replica knows besides its
log's bytes (:class:`DerivedState`), the checks of each request against it,
and the effect of each kind of stored batch on it. No I/O, no clock, no
asyncio: the shell (partition.py) reads the time and the store, asks here,
and submits what comes back to its writer; log_core.py holds the rules of
the log itself (offsets and encoding of an append, retention, compaction,
the log start).

Checks answer with values: a :class:`~partition_svc.producer_state.Reject`
(the error; nothing changes), :data:`UNCHANGED` (the change is here already:
a re-sent marker or seal, offsets older than those pending), or what to
write (:class:`WriteControl`, :class:`WriteTxnOffsets`; a produce check is
``Append`` or ``Duplicate``, producer_state.py's rules).

Effects (``effect_*``) are the one place each batch kind changes the derived
state: the leader applies one when it appends, a follower when it stores the
leader's batch, a rebuild when it replays the log after truncation. Each
changes the given state in memory and returns the same change as store
writes; the caller submits those in the same synchronous step (no await
between), so the writer receives changes in the order memory took them.

Invariants kept here:
- An open transaction is always at its producer entry's epoch
  (producer_state rule 5), so a marker compares its epoch with the entry's.
- A COMMIT or ABORT marker closes its producer's open transaction, resets
  its sequences at the marker's (bumped) epoch and records the coordinator
  epoch; one with an older coordinator epoch is refused. An aborted
  transaction enters the aborted index, whose spans per producer never
  overlap and stay in offset order; a committed one makes its pending
  offsets the group's.
- The last stable offset is the first offset of the oldest open
  transaction, or of one whose marker is not replicated yet, else the high
  watermark.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

from partition_svc import log_format, producer_state
from partition_svc.producer_state import APPEND, Append, Duplicate, ProducerStateEntry, ProducerStates, Reject
from txlog.protocol import batch_format
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2

Changes = list[tuple[bytes, bytes | None]]
Span = tuple[int, int]  # an aborted transaction's (first, last) offset: last is its ABORT marker's


@dataclass(frozen=True)
class Unchanged:
    """Nothing to write: the request's change is here already."""


UNCHANGED = Unchanged()


@dataclass(frozen=True)
class WriteControl:
    """Append a control batch of this type (COMMIT, ABORT, PREPARED)."""

    control_type: int


@dataclass(frozen=True)
class WriteTxnOffsets:
    """Append these offsets to the producer's transaction (the rest were older than those pending)."""

    offsets: list[tuple[bytes, bytes]]


@dataclass
class DerivedState:
    """What a replica knows besides its log's bytes; every field is a function
    of the log (the effects below), so truncation rebuilds it by replay."""

    producers: ProducerStates = field(default_factory=ProducerStates)
    aborted: dict[int, list[Span]] = field(default_factory=dict)  # producer id -> spans, in offset order
    pending_offsets: dict[int, dict[bytes, bytes]] = field(default_factory=dict)  # producer id -> {G key: value}

    def has_open_transaction(self, producer_id: int, entry: ProducerStateEntry) -> bool:
        """Records or offsets of the producer's transaction are here and its marker is not."""
        return entry.has_open_transaction or bool(self.pending_offsets.get(producer_id))

    def open_first_offset(self, producer_id: int) -> int:
        entry = self.producers.get(producer_id)
        return entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET

    def aborted_span(self, producer_id: int, offset: int) -> Span | None:
        """The aborted span of the producer holding ``offset``, if one does (a binary search:
        read_committed asks once per transactional batch it reads)."""
        spans = self.aborted.get(producer_id)
        if not spans:
            return None
        index = bisect.bisect_right(spans, (offset, 2**63)) - 1
        if index >= 0 and spans[index][0] <= offset <= spans[index][1]:
            return spans[index]
        return None

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return self.aborted_span(producer_id, offset) is not None


def last_stable_offset(high_watermark: int, first_open: int | None, closing: list[int]) -> int:
    """The first offset of the oldest open transaction (``first_open``) or of one
    whose marker is not replicated yet (``closing``), else the high watermark."""
    return min([high_watermark, *([] if first_open is None else [first_open]), *closing])


# --- checks ----------------------------------------------------------------------------------


def check_produce(state: DerivedState, batch: common_pb2.RecordBatch) -> Append | Duplicate | Reject:
    """A data batch against its producer's state (producer_state.py's rules); a batch
    of no producer (id -1) is always appended."""
    if batch.producer_id < 0:
        return APPEND
    return producer_state.check_batch(state.producers.get(batch.producer_id), batch.producer_id, batch.producer_epoch,
                                      batch.base_sequence, len(batch.records), batch.is_transactional)


def decide_marker(state: DerivedState, where: str, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                  committed: bool) -> Reject | Unchanged | WriteControl:
    """A COMMIT/ABORT marker. With Transactions V2 a marker carries the bumped
    epoch, so it ends only a transaction opened at a LOWER epoch: one whose
    epoch equals that of the transaction open here is a late copy of the
    previous transaction's marker, refused (it must never end this one, and
    the coordinator must not count it written: it keeps retrying). A marker
    whose transaction is closed here already is written again only to record
    a higher coordinator epoch (so the previous owner's late re-send is fenced
    on every replica)."""
    refused = _check_sender(state, where, "marker", producer_id, producer_epoch, coordinator_epoch)
    if refused is not None:
        return refused
    entry = state.producers.get(producer_id)
    if entry is not None and producer_epoch == entry.producer_epoch:
        if state.has_open_transaction(producer_id, entry):
            return Reject(
                ErrorCode.Value("INVALID_TXN_STATE"),
                f"marker for producer {producer_id} epoch {producer_epoch} cannot end the transaction open at that same "
                f"epoch on {where}: a marker ends only a transaction of a lower epoch (a late marker of the previous "
                "transaction)",
            )
        if coordinator_epoch <= entry.coordinator_epoch:
            return UNCHANGED
    return WriteControl(common_pb2.CONTROL_TYPE_COMMIT if committed else common_pb2.CONTROL_TYPE_ABORT)


def decide_seal(state: DerivedState, where: str, producer_id: int, producer_epoch: int,
                coordinator_epoch: int) -> Reject | Unchanged | WriteControl:
    """The seal of a prepared transaction (its own epoch, not bumped): from then
    on nothing of that epoch is taken here. Refused like a marker from a deposed
    coordinator or for an epoch that is over here; unchanged when sealed already."""
    refused = _check_sender(state, where, "seal", producer_id, producer_epoch, coordinator_epoch)
    if refused is not None:
        return refused
    entry = state.producers.get(producer_id)
    if entry is not None and entry.producer_epoch == producer_epoch and entry.txn_prepared and coordinator_epoch <= entry.coordinator_epoch:
        return UNCHANGED
    return WriteControl(common_pb2.CONTROL_TYPE_PREPARED)


def _check_sender(state: DerivedState, where: str, what: str, producer_id: int, producer_epoch: int,
                  coordinator_epoch: int) -> Reject | None:
    """A marker's or seal's coordinator epoch must not be older than the one
    seen here (a deposed coordinator), nor its producer epoch older than the
    producer's here. The latter is settled, not an error: a newer epoch wrote
    here, which happens only after the transaction ended."""
    entry = state.producers.get(producer_id)
    if entry is None:
        return None
    if coordinator_epoch < entry.coordinator_epoch:
        return Reject(
            ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED"),
            f"{what} for producer {producer_id} carries coordinator epoch {coordinator_epoch}, older than "
            f"{entry.coordinator_epoch} seen on {where}",
        )
    if producer_epoch < entry.producer_epoch:
        return Reject(
            ErrorCode.Value("INVALID_PRODUCER_EPOCH"),
            f"{what} for producer {producer_id} epoch {producer_epoch} is older than epoch {entry.producer_epoch}: "
            "that transaction is over here",
        )
    return None


def decide_txn_offsets(state: DerivedState, producer_id: int, producer_epoch: int,
                       offsets: list[tuple[bytes, bytes]]) -> Reject | Unchanged | WriteTxnOffsets:
    """Consumer offsets committed in the producer's transaction (a
    __consumer_offsets partition). Within one transaction a partition's pending
    offset only moves forward: TxnOffsetCommit has no sequence, so an earlier
    request delivered late must not take back a later one's offset."""
    entry = state.producers.get(producer_id)
    if entry is not None and producer_epoch < entry.producer_epoch:
        return Reject(ErrorCode.Value("PRODUCER_FENCED"),
                      f"producer {producer_id} epoch {producer_epoch} is older than epoch {entry.producer_epoch}")
    if entry is not None and producer_epoch == entry.producer_epoch and entry.txn_prepared:
        return Reject(ErrorCode.Value("INVALID_TXN_STATE"),
                      f"the transaction of producer {producer_id} epoch {producer_epoch} is prepared: it takes no more offsets")
    if entry is not None and producer_epoch > entry.producer_epoch and state.has_open_transaction(producer_id, entry):
        return Reject(
            ErrorCode.Value("INVALID_TXN_STATE"),
            f"producer {producer_id}: the transaction of epoch {entry.producer_epoch} is still open on this partition; "
            f"offsets of epoch {producer_epoch} cannot start before it ends",
        )
    pending = state.pending_offsets.get(producer_id, {}) if entry is not None and producer_epoch == entry.producer_epoch else {}
    newer = [(key, value) for key, value in offsets
             if key not in pending or log_format.offset_of(value) >= log_format.offset_of(pending[key])]
    return WriteTxnOffsets(newer) if newer else UNCHANGED


def expired_producers(state: DerivedState, now_ms: int, expiration_ms: int) -> list[int]:
    """The producers ``ProducerStateEntry.expired`` says may go, none with a transaction open here."""
    return [producer_id for producer_id, entry in state.producers.items()
            if entry.expired(now_ms, expiration_ms) and not state.has_open_transaction(producer_id, entry)]


# --- effects: what each stored batch does to the derived state -----------------------------------


def effect_data(state: DerivedState, pkey: bytes, producer_id: int, producer_epoch: int, base_sequence: int, count: int,
                base: int, max_timestamp_ms: int, is_transactional: bool, appended_ms: int) -> Changes:
    """A producer's data batch at ``base``, appended by this replica at ``appended_ms`` (its clock)."""
    entry = producer_state.after_append(state.producers.get(producer_id), producer_id, producer_epoch, base_sequence,
                                        count, base, max_timestamp_ms, is_transactional, appended_ms=appended_ms)
    return _put_producer(state, pkey, entry)


def effect_control(state: DerivedState, pkey: bytes, marker: common_pb2.RecordBatch, offset: int, timestamp_ms: int) -> Changes:
    if marker.control_type == common_pb2.CONTROL_TYPE_PREPARED:
        return effect_seal(state, pkey, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, timestamp_ms)
    return effect_marker(state, pkey, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                         marker.control_type == common_pb2.CONTROL_TYPE_COMMIT, offset, timestamp_ms)


def effect_marker(state: DerivedState, pkey: bytes, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                  committed: bool, offset: int, timestamp_ms: int) -> Changes:
    """A COMMIT/ABORT marker at ``offset`` closes the producer's open
    transaction (an ABORT enters the aborted index; a COMMIT makes its pending
    offsets the group's), resets its sequences at the marker's epoch and
    records the coordinator epoch. With nothing open it only records a higher
    coordinator epoch (a repeated marker)."""
    entry = state.producers.get(producer_id)
    if entry is not None and entry.producer_epoch == producer_epoch and not state.has_open_transaction(producer_id, entry):
        return _put_producer(state, pkey, replace(entry, coordinator_epoch=max(coordinator_epoch, entry.coordinator_epoch)))
    open_first = entry.current_txn_first_offset if entry is not None else producer_state.NO_OFFSET
    changes: Changes = []
    if not committed and open_first >= 0:
        state.aborted.setdefault(producer_id, []).append((open_first, offset))
        changes.append((log_format.aborted_key(pkey, producer_id, open_first), log_format.aborted_span_value(open_first, offset)))
    for group_key, offset_value in state.pending_offsets.pop(producer_id, {}).items():
        changes.append((log_format.pending_offset_key(pkey, producer_id, group_key), None))
        if committed:
            changes.append((group_key, offset_value))
    closed = replace(entry or ProducerStateEntry(producer_id, producer_epoch), producer_epoch=producer_epoch, batches=(),
                     last_timestamp_ms=timestamp_ms, coordinator_epoch=coordinator_epoch,
                     current_txn_first_offset=producer_state.NO_OFFSET, txn_prepared=False)
    return changes + _put_producer(state, pkey, closed)


def effect_seal(state: DerivedState, pkey: bytes, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                timestamp_ms: int) -> Changes:
    entry = state.producers.get(producer_id)
    if entry is None or entry.producer_epoch != producer_epoch:  # nothing of this transaction written here yet
        entry = replace(entry or ProducerStateEntry(producer_id, producer_epoch), producer_epoch=producer_epoch, batches=())
    return _put_producer(state, pkey, replace(entry, txn_prepared=True, last_timestamp_ms=timestamp_ms,
                                              coordinator_epoch=max(coordinator_epoch, entry.coordinator_epoch)))


def effect_txn_offsets(state: DerivedState, pkey: bytes, producer_id: int, producer_epoch: int,
                       offsets: list[tuple[bytes, bytes]], base: int, timestamp_ms: int) -> Changes:
    """Offsets of the producer's transaction at ``base``: pending until its marker; they open the
    transaction here if nothing did (so they hold the LSO as records would)."""
    previous = state.producers.get(producer_id) or ProducerStateEntry(producer_id, producer_epoch)
    if previous.producer_epoch != producer_epoch:
        previous = replace(previous, producer_epoch=producer_epoch, batches=(), txn_prepared=False)
    first = previous.current_txn_first_offset if previous.current_txn_first_offset >= 0 else base
    state.pending_offsets.setdefault(producer_id, {}).update(offsets)
    changes: Changes = [(log_format.pending_offset_key(pkey, producer_id, key), value) for key, value in offsets]
    return changes + _put_producer(state, pkey, replace(previous, last_timestamp_ms=timestamp_ms, current_txn_first_offset=first))


def offset_changes(batch: common_pb2.RecordBatch) -> Changes:
    """A plain __consumer_offsets batch as changes of the offsets view: a record
    without a value is a tombstone (a deleted group's offset)."""
    return [(r.key, r.value if r.HasField("value") else None) for r in batch.records]


def effect_stored(state: DerivedState, pkey: bytes, holds_offsets: bool, base_offset: int, value: bytes,
                  appended_ms: int) -> Changes:
    """The effect of one stored batch (its key's offset, its stored value), whichever kind, as
    its leader applied it (``holds_offsets``: this is a __consumer_offsets partition)."""
    header = log_format.decode_header(base_offset, value)
    if header.producer_id < 0 and not holds_offsets:
        return []
    payload = log_format.payload_of(value)
    if header.is_encoded:  # a producer's data batch (never a marker, nor in an internal topic): its header says it all
        base_sequence = batch_format.header_of(payload).base_sequence
    else:
        batch = common_pb2.RecordBatch.FromString(payload)
        if header.is_control:
            return effect_control(state, pkey, batch, header.base_offset, header.max_timestamp_ms)
        if holds_offsets:
            if not header.is_transactional:
                return offset_changes(batch)
            return effect_txn_offsets(state, pkey, header.producer_id, header.producer_epoch,
                                      [(r.key, r.value) for r in batch.records], header.base_offset, header.max_timestamp_ms)
        base_sequence = batch.base_sequence
    return effect_data(state, pkey, header.producer_id, header.producer_epoch, base_sequence, header.record_count,
                       header.base_offset, header.max_timestamp_ms, header.is_transactional, appended_ms)


def forget_aborted_below(state: DerivedState, pkey: bytes, offset: int) -> Changes:
    """The aborted spans ending below ``offset`` are forgotten: the new log start
    (no read reaches them), or the LSO a compaction ran to (it removed every
    aborted batch below it)."""
    changes: Changes = []
    for producer_id, spans in list(state.aborted.items()):
        kept = [(first, last) for first, last in spans if last >= offset]
        changes += [(log_format.aborted_key(pkey, producer_id, first), None) for first, last in spans if last < offset]
        if kept:
            state.aborted[producer_id] = kept
        else:
            del state.aborted[producer_id]
    return changes


def _put_producer(state: DerivedState, pkey: bytes, entry: ProducerStateEntry) -> Changes:
    state.producers[entry.producer_id] = entry
    return [(log_format.producer_key(pkey, entry.producer_id), entry.to_json())]


# --- leadership ----------------------------------------------------------------------------------


def not_leading(where: str) -> Reject:
    """Only a leader appends: a request that found this replica leading and awaited
    something before its change may find it a follower now, whose log is the leader's
    alone to write."""
    return Reject(ErrorCode.Value("NOT_LEADER"), f"{where} is no longer led here; refresh metadata")


def check_enough_replicas(where: str, isr_size: int, min_insync_replicas: int) -> Reject | None:
    """acks=all is refused before anything is appended while the ISR is smaller than min.insync.replicas."""
    if isr_size < min_insync_replicas:
        return Reject(ErrorCode.Value("NOT_ENOUGH_REPLICAS"), f"{where} has {isr_size} in-sync replicas, fewer than its "
                                                              f"min.insync.replicas {min_insync_replicas}: nothing was appended")
    return None


def check_leader_epoch(where: str, seen: int, leader_epoch: int) -> TxlogError | None:
    """A request naming the leader epoch it saw (a client's metadata, a follower's
    LeaderAndIsr) must name this leader's."""
    if seen < leader_epoch:
        return TxlogError(ErrorCode.Value("FENCED_LEADER_EPOCH"),
                          f"leader epoch {seen} of {where} is older than {leader_epoch}; refresh metadata")
    if seen > leader_epoch:
        return TxlogError(ErrorCode.Value("UNKNOWN_LEADER_EPOCH"),
                          f"leader epoch {seen} of {where} is newer than {leader_epoch} known here; refresh metadata")
    return None
