"""The coordinator's transaction state machine: pure, no I/O, time passed in.

State Transitions
-----------------
Each state lists, in :data:`VALID_PREVIOUS_STATES`, the states it may be entered
from; :func:`prepare_transition` refuses any other move with IllegalStateError.

    EMPTY                 <- EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
        InitProducerId: a producer registered (new id, or epoch bumped).
    ONGOING               <- EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT, PREPARE_COMMIT, PREPARE_ABORT
        AddPartitionsToTxn / AddOffsetsToTxn: the transaction started or grew.
        From PREPARE_*: the next transaction's first add came while the
        decided one's markers were written; written once every marker is
        acknowledged, the record completes that one and opens this one.
    PREPARED              <- ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT, PREPARED
        PrepareTransaction: every record is written; the outcome waits for
        whoever holds the handle (from Empty/Complete*: a prepared transaction
        with nothing in it, so every participant has a handle to hand over).
        From PREPARED: a check-back answered without a decision (UNKNOWN, an
        error, no answer); the record counts it (check_back.py).
    PREPARE_COMMIT        <- ONGOING, PREPARED
        EndTxn(commit), CompleteTransaction(commit), or a group decision that
        names it: the outcome is decided; markers go out.
    PREPARE_ABORT         <- ONGOING, PREPARE_EPOCH_FENCE, PREPARED, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
        EndTxn(abort), CompleteTransaction(abort), the transaction (or its
        prepared) timeout, or a fence completes; from EMPTY/COMPLETE_* an
        EndTxn(abort) of a transaction with nothing in it, which still bumps
        the epoch (Transactions V2), so a late AddPartitions of that epoch is
        fenced instead of opening a phantom transaction.
    COMPLETE_COMMIT       <- PREPARE_COMMIT
        every partition acknowledged its COMMIT marker.
    COMPLETE_ABORT        <- PREPARE_ABORT
        every partition acknowledged its ABORT marker.
    DEAD                  <- EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
        the id was idle past its expiration; its record is removed.
    PREPARE_EPOCH_FENCE   <- ONGOING, PREPARED
        InitProducerId from a new incarnation while a transaction is open or
        prepared (as KIP-939's InitProducerId without keepPreparedTxn): the
        open transaction is aborted with a bumped epoch (pending-only: it is never
        written; the PREPARE_ABORT that follows is).

Transitions are two-phase: :func:`prepare_transition` checks the edge, sets
``pending_state`` and returns the immutable record to write to the transaction
log; once the record is durable, :func:`complete_transition` applies it; if the
write fails, :func:`abandon_transition` clears the pending state. While a
transition is pending, other requests for the id get CONCURRENT_TRANSACTIONS.

A group decision (:class:`GroupDecision`) is the one record that commits
several PREPARED ids of one transaction group at once: it is written before any
member moves to PREPARE_COMMIT, and a coordinator loading the log finishes
every member it names that is still PREPARED with the handle's epoch.

Epochs follow Kafka's Transactions V2: EndTxn (and every coordinator abort) bumps
the producer epoch, so nothing sent by transaction N can affect transaction N+1.
A fence bumps twice (PREPARE_EPOCH_FENCE, then the abort): the zombie's epoch is
then neither the current one nor the "last" one that recognises retries, so no
request of the zombie is ever answered as a retry.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace

from txlog.protocol import NO_PRODUCER_EPOCH as NO_EPOCH
from txlog.protocol import NO_PRODUCER_ID, PRODUCER_EPOCH_MAX, TransactionState
from txlog.protocol.names import TopicPartition


class IllegalStateError(RuntimeError):
    """A transition the state machine does not have: a bug, never a client error."""


S = TransactionState
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    # From Prepare*: the completion folded into the next transaction's first add, written only once every
    # marker of the decided transaction was acknowledged (transaction_core.decide_completion_into_next).
    S.ONGOING: frozenset({S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARE_COMMIT, S.PREPARE_ABORT}),
    S.PREPARED: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARED}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING, S.PREPARED}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.PREPARED, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING, S.PREPARED}),
}
# States with a transaction that has begun and is not decided: InitProducerId fences it.
UNDECIDED_STATES = frozenset({S.ONGOING, S.PREPARED})
PENDING_ONLY_STATES = frozenset({S.PREPARE_EPOCH_FENCE})

_STATE_OF_VALUE = {state.value: state for state in TransactionState}
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class TransactionRecord:
    """What the transaction log holds for an id: everything needed to resume it."""

    transactional_id: str
    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int  # the epoch before the last bump, to recognise a retried EndTxn
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_ms: int
    last_update_ms: int
    prepared_ms: int = -1  # when it became PREPARED
    prepared_timeout_ms: int = 0  # how long it may stay PREPARED
    prepare_metadata: bytes = b""  # the owner's, for the check-back
    checks_done: int = 0  # check-backs answered without a decision
    last_check_ms: int = -1  # when the last of those ended

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 2,
                "pid": self.producer_id,
                "prev_pid": self.previous_producer_id,
                "epoch": self.producer_epoch,
                "last_epoch": self.last_producer_epoch,
                "timeout_ms": self.txn_timeout_ms,
                "state": self.state.value,
                "partitions": sorted([t, p] for t, p in self.partitions),
                "start_ms": self.txn_start_ms,
                "update_ms": self.last_update_ms,
                "prepared_ms": self.prepared_ms,
                "prepared_timeout_ms": self.prepared_timeout_ms,
                **({"prepare_metadata": base64.b64encode(self.prepare_metadata).decode()} if self.prepare_metadata else {}),
                **({"checks": self.checks_done, "last_check_ms": self.last_check_ms} if self.checks_done else {}),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, transactional_id: str, data: bytes) -> TransactionRecord:
        return cls(**decoded_fields(transactional_id, data))


def decoded_fields(transactional_id: str, data: bytes) -> dict:
    """A stored record's fields by name, which TransactionRecord and
    TransactionMetadata share. A coordinator taking over decodes one record
    per id it loads: the shared decoder and a dict for the state keep this at
    about 3 us (json.loads and Enum() calls took twice that)."""
    raw = _JSON.decode(data.decode())
    metadata = raw.get("prepare_metadata")  # absent before the check-back
    return {
        "transactional_id": transactional_id,
        "producer_id": raw["pid"],
        "previous_producer_id": raw["prev_pid"],
        "producer_epoch": raw["epoch"],
        "last_producer_epoch": raw["last_epoch"],
        "txn_timeout_ms": raw["timeout_ms"],
        "state": _STATE_OF_VALUE[raw["state"]],
        "partitions": frozenset(map(tuple, raw["partitions"])),
        "txn_start_ms": raw["start_ms"],
        "last_update_ms": raw["update_ms"],
        "prepared_ms": raw.get("prepared_ms", -1),  # version 1 records had no prepared state
        "prepared_timeout_ms": raw.get("prepared_timeout_ms", 0),
        "prepare_metadata": base64.b64decode(metadata) if metadata else b"",
        "checks_done": raw.get("checks", 0),
        "last_check_ms": raw.get("last_check_ms", -1),
    }


@dataclass(frozen=True)
class Handle:
    """Names one prepared transaction: its id, producer id and the epoch it was prepared with."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class GroupDecision:
    """The commit of several prepared transactions of one group, decided at once."""

    decision_id: str
    group_id: str
    members: tuple[Handle, ...]
    decided_ms: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "group": self.group_id,
                "members": [[h.transactional_id, h.producer_id, h.producer_epoch] for h in self.members],
                "decided_ms": self.decided_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, decision_id: str, data: bytes) -> GroupDecision:
        raw = json.loads(data)
        return cls(decision_id, raw["group"], tuple(Handle(t, p, e) for t, p, e in raw["members"]), raw["decided_ms"])


@dataclass
class TransactionMetadata:
    """The coordinator's in-memory view of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState = S.EMPTY
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_EPOCH
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    txn_start_ms: int = -1
    last_update_ms: int = -1
    prepared_ms: int = -1
    prepared_timeout_ms: int = 0
    prepare_metadata: bytes = b""
    checks_done: int = 0
    last_check_ms: int = -1
    pending_state: TransactionState | None = None

    def record(self) -> TransactionRecord:
        return TransactionRecord(
            self.transactional_id,
            self.producer_id,
            self.previous_producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            self.state,
            self.partitions,
            self.txn_start_ms,
            self.last_update_ms,
            self.prepared_ms,
            self.prepared_timeout_ms,
            self.prepare_metadata,
            self.checks_done,
            self.last_check_ms,
        )

    @classmethod
    def decode(cls, transactional_id: str, data: bytes) -> TransactionMetadata:
        """An id as a coordinator loads it, straight from its stored record
        (without the frozen TransactionRecord between, which costs as much again)."""
        return cls(**decoded_fields(transactional_id, data))

    @classmethod
    def from_record(cls, record: TransactionRecord) -> TransactionMetadata:
        return cls(
            transactional_id=record.transactional_id,
            producer_id=record.producer_id,
            producer_epoch=record.producer_epoch,
            txn_timeout_ms=record.txn_timeout_ms,
            state=record.state,
            previous_producer_id=record.previous_producer_id,
            last_producer_epoch=record.last_producer_epoch,
            partitions=record.partitions,
            txn_start_ms=record.txn_start_ms,
            last_update_ms=record.last_update_ms,
            prepared_ms=record.prepared_ms,
            prepared_timeout_ms=record.prepared_timeout_ms,
            prepare_metadata=record.prepare_metadata,
            checks_done=record.checks_done,
            last_check_ms=record.last_check_ms,
        )


def check_transition(meta: TransactionMetadata, to_state: TransactionState) -> None:
    """Raises IllegalStateError unless ``to_state`` may follow the id's state now."""
    if meta.pending_state is not None:
        raise IllegalStateError(f"{meta.transactional_id}: {meta.pending_state.value} is pending already")
    if meta.state not in VALID_PREVIOUS_STATES[to_state]:
        raise IllegalStateError(f"{meta.transactional_id}: illegal transition {meta.state.value} -> {to_state.value}")


def prepare_transition(meta: TransactionMetadata, to_state: TransactionState, **changes) -> TransactionRecord:
    """Checks the edge, marks it pending and returns the record to write.
    ``changes`` are TransactionRecord fields that differ from the current ones."""
    check_transition(meta, to_state)
    meta.pending_state = to_state
    return replace(meta.record(), state=to_state, **changes)


def complete_transition(meta: TransactionMetadata, record: TransactionRecord) -> None:
    """Applies a prepared transition once its record is durable."""
    if meta.pending_state is not record.state:
        raise IllegalStateError(
            f"{meta.transactional_id}: completing {record.state.value} but {meta.pending_state} is pending"
        )
    meta.state = record.state
    meta.producer_id = record.producer_id
    meta.previous_producer_id = record.previous_producer_id
    meta.producer_epoch = record.producer_epoch
    meta.last_producer_epoch = record.last_producer_epoch
    meta.txn_timeout_ms = record.txn_timeout_ms
    meta.partitions = record.partitions
    meta.txn_start_ms = record.txn_start_ms
    meta.last_update_ms = record.last_update_ms
    meta.prepared_ms = record.prepared_ms
    meta.prepared_timeout_ms = record.prepared_timeout_ms
    meta.prepare_metadata = record.prepare_metadata
    meta.checks_done = record.checks_done
    meta.last_check_ms = record.last_check_ms
    meta.pending_state = None


def abandon_transition(meta: TransactionMetadata) -> None:
    """Clears a pending transition whose record could not be written."""
    meta.pending_state = None


def settled(meta: TransactionMetadata) -> bool:
    """True when the id's state says what was decided: no transition in flight,
    or only the Complete* record of a decided transaction (its outcome stands)."""
    return meta.pending_state in (None, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)


def bumped_epoch(producer_id: int, producer_epoch: int) -> tuple[int, int] | None:
    """The epoch after ``producer_epoch`` for the same producer id, or None when it
    is exhausted (the caller then takes a new producer id at epoch 0)."""
    if producer_epoch + 1 > PRODUCER_EPOCH_MAX - 1:  # keep MAX free, as Kafka does, for the last bump's markers
        return None
    return producer_id, producer_epoch + 1


def marker_producer(meta: TransactionMetadata) -> tuple[int, int]:
    """The producer id and epoch the markers of a decided transaction carry: its
    own, bumped; or, when the epoch was exhausted and the decision handed the
    producer a new id (at epoch 0), the old id at the last epoch."""
    if meta.previous_producer_id != NO_PRODUCER_ID and meta.producer_epoch == 0 and meta.last_producer_epoch >= PRODUCER_EPOCH_MAX - 1:
        return meta.previous_producer_id, PRODUCER_EPOCH_MAX
    return meta.producer_id, meta.producer_epoch


def fenced_epoch(producer_id: int, producer_epoch: int) -> tuple[int, int, int] | None:
    """(producer id, epoch, last epoch) after fencing ``producer_epoch``: bumped
    twice, the last epoch being the fence's; None when that passes the limit
    (the caller then takes a new producer id)."""
    if producer_epoch + 2 > PRODUCER_EPOCH_MAX - 1:
        return None
    return producer_id, producer_epoch + 2, producer_epoch + 1


def is_retried_init(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """True when a KIP-360 InitProducerId naming this id and epoch comes from a
    producer whose epoch was bumped to the current one while it did not hear
    the answer: a retry of an init (EMPTY), or an init after the EndTxn or the
    abort its own earlier init asked for (Complete*). It is answered the current
    epoch, with no second bump, as Kafka does. A fenced zombie's epoch is never
    the last one (fenced_epoch)."""
    settled_states = (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
    if meta.state not in settled_states or producer_epoch != meta.last_producer_epoch or producer_epoch < 0:
        return False
    if producer_id == meta.producer_id and producer_epoch + 1 == meta.producer_epoch:
        return True
    return producer_id == meta.previous_producer_id and meta.producer_epoch == 0


def is_retried_end(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """True when an EndTxn with this id and epoch is a retry of the one that
    decided the current (or last) transaction."""
    if producer_epoch != meta.last_producer_epoch:
        return False
    if producer_id == meta.producer_id and producer_epoch + 1 == meta.producer_epoch:
        return True
    return producer_id == meta.previous_producer_id and marker_producer(meta)[0] == producer_id


def is_prepared_as(meta: TransactionMetadata, handle: Handle) -> bool:
    """True when ``meta`` is the prepared transaction ``handle`` names."""
    return meta.state is S.PREPARED and meta.producer_id == handle.producer_id and meta.producer_epoch == handle.producer_epoch


def decided_as(meta: TransactionMetadata, handle: Handle) -> bool | None:
    """The outcome of the transaction ``handle`` names when it was decided and
    the id has not moved on since (True: commit); None otherwise."""
    if not is_retried_end(meta, handle.producer_id, handle.producer_epoch):
        return None
    if meta.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT):
        return True
    if meta.state in (S.PREPARE_ABORT, S.COMPLETE_ABORT):
        return False
    return None
