"""The coordinator's request rules, pure: each ``decide_*`` is a function of the
id's metadata, the request and the time, and answers with what to do as a
value. No I/O, no clock, no awaits: the coordinator (coordinator.py) gathers
what a decision needs first (the metadata, which partitions exist, fresh
producer ids), decides, and carries the outcome out with no await between the
decision and the transition it names, so a concurrent request of the same id
sees that transition pending (CONCURRENT_TRANSACTIONS).

Outcomes
--------
- :class:`Refuse`: answer the error; nothing changes.
- :class:`Reply`: answer at once; nothing changes (a retry whose first attempt
  was applied, a repeat of a decision).
- :class:`Transit`: write the transition's record (``prepare_transition``, the
  log, ``complete_transition``: every change of state takes that path), then
  ``then`` (nothing, complete the decided transaction in the background, or
  seal its partitions before answering), then answer ``reply``, or raise it
  when it is an error (an init that aborts the open transaction first answers
  CONCURRENT_TRANSACTIONS once the abort is decided).
- :class:`NeedProducerIds`: the decision hands out new producer ids (a new
  transactional id, an exhausted epoch); the coordinator fetches ``count`` and
  decides again with them.

Epoch rules are Kafka's Transactions V2 (docs/design.md "Transactions"); the state
table and the epoch arithmetic are transaction_state.py's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from coordinator_svc import transaction_state as ts
from coordinator_svc.transaction_state import Handle, TransactionMetadata, TransactionState
from txlog.protocol import names
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.names import TopicPartition

S = TransactionState
# A Complete* record's resets.
COMPLETED = {"partitions": frozenset(), "txn_start_ms": -1, "prepared_ms": -1, "prepared_timeout_ms": 0,
             "prepare_metadata": b"", "checks_done": 0, "last_check_ms": -1}


def error(code: str, message: str) -> TxlogError:
    return TxlogError(ErrorCode.Value(code), message)


class Then(enum.Enum):
    NOTHING = "nothing"
    COMPLETE = "complete"  # a decided transaction: markers to every partition, then Complete*
    SEAL = "seal"  # a prepared transaction: every partition told, before the answer


class Answer(enum.Enum):
    PRODUCER = "the id's producer id and epoch, as they are once the outcome is carried out"


@dataclass(frozen=True)
class Refuse:
    error: TxlogError


@dataclass(frozen=True)
class Reply:
    value: object = None  # or Answer.PRODUCER
    then: Then = Then.NOTHING  # SEAL: a retried PrepareTransaction seals again before it answers


@dataclass(frozen=True)
class Transit:
    to_state: TransactionState
    changes: dict = field(default_factory=dict)
    then: Then = Then.NOTHING
    reply: object = None  # a value or Answer.PRODUCER to answer, or a TxlogError to raise once the transition is written
    fence: bool = False  # the abort of a fenced producer's transaction (passes through PREPARE_EPOCH_FENCE)


@dataclass(frozen=True)
class NeedProducerIds:
    count: int


Outcome = Refuse | Reply | Transit | NeedProducerIds


def concurrent(meta: TransactionMetadata) -> Refuse:
    return Refuse(error("CONCURRENT_TRANSACTIONS", f"a {meta.pending_state.value} of {meta.transactional_id!r} is in flight; retry"))


def check_existing(meta: TransactionMetadata | None, transactional_id: str, producer_id: int) -> Refuse | None:
    """The id must be known, at this producer id, with nothing in flight."""
    if meta is None or meta.state is S.DEAD:
        return Refuse(error("INVALID_PRODUCER_ID_MAPPING", f"transactional id {transactional_id!r} is unknown: call InitProducerId first"))
    if producer_id != meta.producer_id:
        return Refuse(error(
            "INVALID_PRODUCER_ID_MAPPING",
            f"producer id {producer_id} is not the one of transactional id {transactional_id!r} ({meta.producer_id})",
        ))
    if meta.pending_state is not None:
        return concurrent(meta)
    return None


def check_epoch(meta: TransactionMetadata, producer_epoch: int) -> Refuse | None:
    if producer_epoch < meta.producer_epoch:
        return Refuse(error(
            "PRODUCER_FENCED",
            f"producer epoch {producer_epoch} of {meta.transactional_id!r} was fenced by epoch {meta.producer_epoch}: "
            "a newer producer with this transactional id exists, or the transaction was aborted; close this producer",
        ))
    if producer_epoch > meta.producer_epoch:
        return Refuse(error("INVALID_PRODUCER_EPOCH", f"producer epoch {producer_epoch} is newer than {meta.producer_epoch}, which the coordinator knows"))
    return None


def check_producer(meta: TransactionMetadata | None, transactional_id: str, producer_id: int, producer_epoch: int) -> Refuse | None:
    return check_existing(meta, transactional_id, producer_id) or check_epoch(meta, producer_epoch)


def completing(meta: TransactionMetadata) -> Refuse | None:
    if meta.state.is_preparing:
        return Refuse(error("CONCURRENT_TRANSACTIONS", f"the last transaction of {meta.transactional_id!r} is completing; retry"))
    return None


def epoch_bump(meta: TransactionMetadata, spare_ids: list[int]) -> dict | NeedProducerIds:
    """The record changes of deciding ``meta``'s transaction: the epoch bumped;
    when it is exhausted, a new producer id at epoch 0 (the markers carry the
    old one, ts.marker_producer), taken from ``spare_ids``."""
    bumped = ts.bumped_epoch(meta.producer_id, meta.producer_epoch)
    if bumped is not None:
        return {"producer_epoch": bumped[1], "last_producer_epoch": meta.producer_epoch}
    if not spare_ids:
        return NeedProducerIds(1)
    return {"producer_id": spare_ids[0], "producer_epoch": 0, "previous_producer_id": meta.producer_id,
            "last_producer_epoch": meta.producer_epoch}


def decide(meta: TransactionMetadata, committed: bool, spare_ids: list[int], reply: object = None, then: Then = Then.COMPLETE) -> Transit | NeedProducerIds:
    """Deciding the transaction: PrepareCommit/PrepareAbort with the epoch bumped."""
    changes = epoch_bump(meta, spare_ids)
    if isinstance(changes, NeedProducerIds):
        return changes
    return Transit(S.PREPARE_COMMIT if committed else S.PREPARE_ABORT, changes, then, reply)


# --- InitProducerId ---------------------------------------------------------------------


def decide_init(meta: TransactionMetadata | None, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                spare_ids: list[int]) -> Outcome:
    """InitProducerId of a transactional id (producer_id -1: a new incarnation;
    else KIP-360: the producer bumps its own epoch)."""
    if meta is None or meta.state is S.DEAD:  # a new id: its first record, EMPTY at epoch 0
        if not spare_ids:
            return NeedProducerIds(1)
        return registered(spare_ids[0], 0, ts.NO_PRODUCER_ID, ts.NO_EPOCH, timeout_ms)
    if meta.pending_state is not None:
        return concurrent(meta)
    kip360 = producer_id >= 0
    if kip360 and ts.is_retried_init(meta, producer_id, producer_epoch):
        return Reply((meta.producer_id, meta.producer_epoch))  # its first attempt bumped the epoch; the answer was lost
    if kip360 and (producer_id != meta.producer_id or producer_epoch != meta.producer_epoch):
        return Refuse(error(
            "PRODUCER_FENCED",
            f"producer {producer_id} epoch {producer_epoch} is not the current one of {transactional_id!r}; close this producer",
        ))
    if meta.state in ts.UNDECIDED_STATES:
        abort_first = error("CONCURRENT_TRANSACTIONS", f"aborting the open transaction of {transactional_id!r} first; retry")
        if kip360:  # the current producer's own transaction: aborted as its EndTxn(abort) would
            return decide(meta, False, spare_ids, reply=abort_first)
        return fence(meta, spare_ids, abort_first)  # a new incarnation: the previous one is a zombie
    refused = completing(meta)
    if refused is not None:
        return refused
    bumped = ts.bumped_epoch(meta.producer_id, meta.producer_epoch)
    if bumped is None:
        if not spare_ids:
            return NeedProducerIds(1)
        new_id, new_epoch, previous = spare_ids[0], 0, meta.producer_id
    else:
        (new_id, new_epoch), previous = bumped, meta.previous_producer_id
    # The last epoch recognises a retry of this init: only the requester's own epoch (a new
    # incarnation names none, and the epoch it replaces must not be taken for a retry).
    return registered(new_id, new_epoch, previous, producer_epoch if kip360 else ts.NO_EPOCH, timeout_ms)


def registered(producer_id: int, producer_epoch: int, previous_producer_id: int, last_producer_epoch: int,
               timeout_ms: int) -> Transit:
    """EMPTY with a producer (re)registered, answered its id and epoch."""
    return Transit(S.EMPTY, {"producer_id": producer_id, "producer_epoch": producer_epoch,
                             "previous_producer_id": previous_producer_id, "last_producer_epoch": last_producer_epoch,
                             "txn_timeout_ms": timeout_ms, "partitions": frozenset(), "txn_start_ms": -1},
                   reply=Answer.PRODUCER)


def fence(meta: TransactionMetadata, spare_ids: list[int], reply: object) -> Transit | NeedProducerIds:
    """The abort of an Ongoing or Prepared transaction whose producer is replaced
    by a new incarnation: the epoch is bumped twice (the fence, then the abort),
    so the zombie's epoch is neither the current nor the last one."""
    fenced = ts.fenced_epoch(meta.producer_id, meta.producer_epoch)
    if fenced is not None:
        changes = {"producer_epoch": fenced[1], "last_producer_epoch": fenced[2]}
    elif not spare_ids:
        return NeedProducerIds(1)
    else:  # exhausted: a new id; the markers carry the old one at the last epoch, which no zombie holds
        changes = {"producer_id": spare_ids[0], "producer_epoch": 0, "previous_producer_id": meta.producer_id,
                   "last_producer_epoch": ts.PRODUCER_EPOCH_MAX}
    return Transit(S.PREPARE_ABORT, changes, Then.COMPLETE, reply, fence=True)


# --- AddPartitionsToTxn, AddOffsetsToTxn ----------------------------------------------------


def verify_partitions(meta: TransactionMetadata | None, producer_id: int, producer_epoch: int,
                      partitions: list[TopicPartition]) -> Refuse | dict[TopicPartition, TxlogError | None]:
    """AddPartitionsToTxn(verify_only), a partition leader asking (KIP-890):
    which partitions are in the producer's open transaction. A zombie is fenced."""
    if meta is not None and meta.producer_id == producer_id:
        refused = check_epoch(meta, producer_epoch)
        if refused is not None:
            return refused
    ok = meta is not None and meta.producer_id == producer_id and meta.producer_epoch == producer_epoch and meta.state is S.ONGOING
    return {
        tp: None if ok and tp in meta.partitions else error(
            "INVALID_TXN_STATE", f"{tp[0]}-{tp[1]} is not in an open transaction of producer {producer_id} epoch {producer_epoch}")
        for tp in partitions
    }


def decide_add_partitions(meta: TransactionMetadata | None, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[TopicPartition], unknown: dict[TopicPartition, TxlogError], now_ms: int) -> Outcome:
    """Partitions (or a group's offsets partition) join the transaction; those
    that do not exist are answered UNKNOWN_TOPIC_OR_PARTITION."""
    refused = check_producer(meta, transactional_id, producer_id, producer_epoch) or completing(meta)
    if refused is not None:
        return refused
    if meta.state is S.PREPARED:
        return Refuse(error("INVALID_TXN_STATE", f"the transaction of {transactional_id!r} is prepared: it takes nothing more; complete it first"))
    answer = {tp: unknown.get(tp) for tp in partitions}
    wanted = frozenset(tp for tp in partitions if tp not in unknown)
    if not wanted or (meta.state is S.ONGOING and wanted <= meta.partitions):
        return Reply(answer)
    start = meta.txn_start_ms if meta.state is S.ONGOING else now_ms
    return Transit(S.ONGOING, {"partitions": meta.partitions | wanted, "txn_start_ms": start}, reply=answer)



@dataclass(frozen=True)
class NextAdd:
    """An AddPartitionsToTxn of an id's next transaction that arrived while the
    markers of its last one were being written."""
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    unknown: dict[TopicPartition, TxlogError]


def decide_completion_into_next(meta: TransactionMetadata, adds: list[NextAdd], now_ms: int) -> tuple[dict | None, list[Outcome]]:
    """A decided transaction whose markers are all written, and the adds of the
    next transaction that waited for them, decided in arrival order on the
    completed state. Returns the changes of one Ongoing record that both
    completes the transaction and opens the next (None when no add opened it:
    Complete* is written as usual) and each add's outcome (Refuse, Reply, or
    Transit whose reply is answered once that record is durable).

    Folding is safe because the record is written only after every marker was
    acknowledged: what it says of the last transaction (finished on every
    partition) is what Complete* would say, and a coordinator loading it finds
    the next transaction open, to be ended or timed out like any other."""
    completed = replace(meta, state=S.COMPLETE_COMMIT if meta.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT,
                        pending_state=None, last_update_ms=now_ms, **COMPLETED)
    outcomes: list[Outcome] = []
    for add in adds:
        outcome = decide_add_partitions(completed, meta.transactional_id, add.producer_id, add.producer_epoch,
                                        list(add.partitions), add.unknown, now_ms)
        if isinstance(outcome, Transit):
            completed = replace(completed, state=S.ONGOING, **outcome.changes)
        outcomes.append(outcome)
    if completed.state is not S.ONGOING:
        return None, outcomes
    return {**COMPLETED, "partitions": completed.partitions, "txn_start_ms": completed.txn_start_ms}, outcomes


# --- EndTxn -------------------------------------------------------------------------------


def decide_end_txn(meta: TransactionMetadata | None, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
                   spare_ids: list[int]) -> Outcome:
    retry = meta is not None and ts.settled(meta) and ts.is_retried_end(meta, producer_id, producer_epoch)
    if retry and meta.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_ABORT):
        # A retried EndTxn whose first attempt was applied (Transactions V2 table).
        if (meta.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)) == committed:
            return Reply(Answer.PRODUCER)
        if committed:  # the coordinator aborted it (timeout): the commit never happened
            return Refuse(error("PRODUCER_FENCED", f"the transaction of {transactional_id!r} was aborted by the coordinator (timeout or fence); close this producer"))
        return Refuse(error("INVALID_TXN_STATE", f"the transaction of {transactional_id!r} committed already; it cannot be aborted"))
    refused = check_producer(meta, transactional_id, producer_id, producer_epoch) or completing(meta)
    if refused is not None:
        return refused
    if meta.state not in ts.UNDECIDED_STATES and committed:
        return Refuse(error("INVALID_TXN_STATE", f"{transactional_id!r} has no open transaction to commit (nothing was added to it)"))
    # Aborting a transaction with nothing in it bumps the epoch too (Transactions V2): a late
    # AddPartitions of the old epoch is then fenced instead of opening a phantom transaction.
    return decide(meta, committed, spare_ids, reply=Answer.PRODUCER)


# --- two-phase: PrepareTransaction, CompleteTransaction --------------------------------------


def decide_prepare(meta: TransactionMetadata | None, handle: Handle, timeout_ms: int, now_ms: int, metadata: bytes = b"") -> Outcome:
    if meta is not None and meta.pending_state is None and ts.is_prepared_as(meta, handle):
        if metadata != meta.prepare_metadata:  # not a retry: a retry sends the same request
            return Refuse(error("INVALID_TXN_STATE", f"the transaction of {handle.transactional_id!r} is prepared already, "
                                                     "with other prepare_metadata"))
        return Reply(handle, Then.SEAL)  # a retry whose first attempt was applied: it may not have sealed
    refused = check_producer(meta, handle.transactional_id, handle.producer_id, handle.producer_epoch) or completing(meta)
    if refused is not None:
        return refused
    start = meta.txn_start_ms if meta.state is S.ONGOING else now_ms
    return Transit(S.PREPARED, {"prepared_ms": now_ms, "prepared_timeout_ms": timeout_ms, "txn_start_ms": start,
                                "prepare_metadata": metadata, "checks_done": 0, "last_check_ms": -1}, Then.SEAL, handle)


def check_handle(meta: TransactionMetadata | None, handle: Handle) -> Refuse | None:
    """The prepared transaction ``handle`` names must be Prepared at that epoch
    (refused as a producer's request with that id and epoch would be)."""
    refused = check_producer(meta, handle.transactional_id, handle.producer_id, handle.producer_epoch)
    if refused is not None:
        return refused
    if meta.state is not S.PREPARED:
        return Refuse(error("INVALID_TXN_STATE", f"the transaction of {handle.transactional_id!r} is {meta.state.value}, "
                                                 "not Prepared: call PrepareTransaction first"))
    return None


def repeated_outcome(meta: TransactionMetadata | None, handle: Handle, committed: bool) -> Refuse | bool:
    """True when the transaction ``handle`` names was decided as asked already (a
    repeat); Refuse when it was decided the other way; False otherwise."""
    if meta is None or not ts.settled(meta):
        return False
    decided = ts.decided_as(meta, handle)
    if decided is None:
        return False
    if decided == committed:
        return True
    if committed:
        return Refuse(error(
            "PRODUCER_FENCED",
            f"the transaction of {handle.transactional_id!r} was aborted (CompleteTransaction(abort), its prepared timeout, "
            "or a new producer with its id): it cannot commit",
        ))
    return Refuse(error("INVALID_TXN_STATE", f"the transaction of {handle.transactional_id!r} was committed already: it cannot be aborted"))


def decide_complete(meta: TransactionMetadata | None, handle: Handle, committed: bool, spare_ids: list[int]) -> Outcome:
    repeat = repeated_outcome(meta, handle, committed)
    if isinstance(repeat, Refuse):
        return repeat
    if repeat:
        return Reply(Answer.PRODUCER)
    refused = check_handle(meta, handle)
    if refused is not None:
        return refused
    return decide(meta, committed, spare_ids, reply=Answer.PRODUCER)


# --- CommitTransactionGroup ---------------------------------------------------------------


GROUP_HANDLES_MAX = 10_000


def check_group_request(group_id: str, handles: list[Handle]) -> Refuse | None:
    """A group commit names 1..GROUP_HANDLES_MAX ids of its own group, each once."""
    if not handles:
        return Refuse(error("INVALID_REQUEST", "the request names no transaction handle"))
    if len(handles) > GROUP_HANDLES_MAX:
        return Refuse(error("INVALID_REQUEST", f"at most {GROUP_HANDLES_MAX} handles per group commit, got {len(handles)}"))
    seen = set()
    for handle in handles:
        member_group = names.transaction_group(handle.transactional_id)
        if member_group != group_id:
            return Refuse(error(
                "INVALID_REQUEST",
                f"transactional id {handle.transactional_id!r} belongs to group {names.quoted(member_group)}, not "
                f"{names.quoted(group_id)}: a group commit takes only its own ids (<group>/<member>)",
            ))
        if handle.transactional_id in seen:
            return Refuse(error("INVALID_REQUEST", f"transactional id {handle.transactional_id!r} is named twice"))
        seen.add(handle.transactional_id)
    return None


@dataclass(frozen=True)
class GroupCommit:
    """The members to move to PREPARE_COMMIT together, each with its record changes."""

    members: tuple[TransactionMetadata, ...]
    changes: tuple[dict, ...]


def decide_group_commit(metas: list[TransactionMetadata | None], handles: list[Handle],
                        spare_ids: list[int]) -> Refuse | Reply | GroupCommit | NeedProducerIds:
    """All members PREPARED as their handles say are committed as one; a repeat
    of a group already committed is answered; anything else changes nothing."""
    done = []
    for meta, handle in zip(metas, handles, strict=True):
        repeat = repeated_outcome(meta, handle, True)
        if isinstance(repeat, Refuse):
            return repeat
        done.append(repeat)
    if all(done):
        return Reply()
    if any(done):
        example = next(h.transactional_id for h, d in zip(handles, done, strict=True) if d)
        return Refuse(error("INVALID_TXN_STATE", f"{sum(done)} of the {len(handles)} transactions were committed already (e.g. "
                                                 f"{example!r}) and the others not: a group commits once, whole"))
    for meta, handle in zip(metas, handles, strict=True):
        refused = check_handle(meta, handle)
        if refused is not None:
            return refused
    exhausted = sum(1 for m in metas if ts.bumped_epoch(m.producer_id, m.producer_epoch) is None)
    if exhausted > len(spare_ids):
        return NeedProducerIds(exhausted - len(spare_ids))
    changes, spare = [], list(spare_ids)
    for meta in metas:
        bump = epoch_bump(meta, spare)
        if "previous_producer_id" in bump:  # an exhausted epoch took a spare id
            spare.pop(0)
        changes.append(bump)
    return GroupCommit(tuple(metas), tuple(changes))


# --- timers ------------------------------------------------------------------------------


def timed_out(meta: TransactionMetadata, now_ms: int) -> bool:
    """An open transaction past its timeout, or a prepared one past its prepared timeout."""
    if meta.pending_state is not None:
        return False
    return (meta.state is S.ONGOING and meta.txn_start_ms + meta.txn_timeout_ms < now_ms) or (
        meta.state is S.PREPARED and meta.prepared_ms + meta.prepared_timeout_ms < now_ms)


def expired(meta: TransactionMetadata, now_ms: int, expiration_ms: int) -> bool:
    """An id idle in a settled state past its expiration: its record is removed (DEAD)."""
    return meta.pending_state is None and meta.state.is_complete and meta.last_update_ms + expiration_ms < now_ms


def decide_timeout(meta: TransactionMetadata | None, now_ms: int, spare_ids: list[int]) -> Transit | NeedProducerIds | None:
    """The abort of a timed-out transaction; None when there is nothing to do."""
    return decide(meta, False, spare_ids) if meta is not None and timed_out(meta, now_ms) else None
