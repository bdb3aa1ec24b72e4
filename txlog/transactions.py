"""The transactional producer's state machine: pure (no I/O, no clock) and
thread-safe, shared by the Producer facade (user threads) and its sender
(the loop thread).

Guarantees
----------
* Every state change goes through :meth:`TransactionManager.transition_to`,
  which checks it against :data:`VALID_PREVIOUS_STATES` (the one table of
  transitions) and raises :class:`IllegalStateError` -- a bug in the SDK, never
  a user mistake -- on any other move.
* Whether a user call is legal is decided by :data:`CALLS` (the one table of
  calls): per state, each call either starts a transition, resumes the
  operation in progress, is allowed without a transition, raises the error
  that put the producer in an error state, or is refused with a
  :class:`~txlog.errors.TransactionStateError` naming the state and
  what to call instead. A refused call changes nothing.
* A partition takes records of a transaction only after the coordinator has
  it in the transaction (:meth:`TransactionManager.may_send`).
* ``commit``/``abort`` wait until every ``send()`` that passed its state check
  has put its record in the accumulator (:meth:`TransactionManager.wait_sends_done`),
  so a record is never half in a finished transaction.

State Transitions
-----------------
::

    UNINITIALIZED   -> INITIALIZING     init_transactions()
    INITIALIZING    -> READY            InitProducerId answered (producer id, epoch)
    READY           -> IN_TRANSACTION   begin_transaction()
    IN_TRANSACTION  -> COMMITTING       commit_transaction()
    IN_TRANSACTION  -> ABORTING         abort_transaction()
    IN_TRANSACTION  -> PREPARING        prepare_transaction()
    PREPARING       -> PREPARED         every batch acknowledged, PrepareTransaction answered the handle
    PREPARED        -> COMMITTING       commit_transaction() (EndTxn; whoever holds the handle may
    PREPARED        -> ABORTING         abort_transaction()   complete it instead, and close() leaves it)
    COMMITTING      -> READY            every batch acknowledged, EndTxn(commit) answered a new epoch
    ABORTING        -> READY            unsent batches dropped, in-flight ones finished, EndTxn(abort)
                                        (or KIP-360's InitProducerId bump) answered a new epoch
    IN_TRANSACTION  -> ABORTABLE_ERROR  a batch failed; the coordinator answered an abortable error
    COMMITTING      -> ABORTABLE_ERROR  the same while committing (the commit raises it)
    PREPARING       -> ABORTABLE_ERROR  the same while preparing (the prepare raises it)
    ABORTABLE_ERROR -> ABORTING         abort_transaction()
    any but UNINITIALIZED -> FATAL_ERROR   PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, or a fatal
                                        coordinator error: every later call raises it; close()

Error Handling
--------------
:meth:`TransactionManager.on_abortable_error` keeps the first error of the
transaction (later ones add nothing); :meth:`TransactionManager.on_fatal_error`
keeps the first fatal one. In ABORTABLE_ERROR, ``send``, ``send_offsets`` and
``commit`` raise :class:`TransactionAbortableError` caused by the first error;
in FATAL_ERROR every call raises the fatal error itself.
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
from collections.abc import Iterable

from txlog.errors import ClientError, FatalError, TransactionAbortableError, TransactionStateError
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition


class IllegalStateError(RuntimeError):
    """A transition the table does not have: a bug in the SDK, never an outcome."""


class TxnState(enum.Enum):
    """The client's view of its transaction (see the module docstring)."""

    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"
    PREPARING = "preparing"
    PREPARED = "prepared"

    @property
    def valid_previous_states(self) -> frozenset[TxnState]:
        return VALID_PREVIOUS_STATES[self]


S = TxnState
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.UNINITIALIZED: frozenset(),
    S.INITIALIZING: frozenset({S.UNINITIALIZED}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING, S.ABORTING}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING: frozenset({S.IN_TRANSACTION, S.PREPARED}),
    S.ABORTING: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING, S.PREPARING}),
    S.PREPARING: frozenset({S.IN_TRANSACTION}),
    S.PREPARED: frozenset({S.PREPARING}),
    S.FATAL_ERROR: frozenset(set(TxnState) - {S.UNINITIALIZED, S.FATAL_ERROR}),
}


class Call(enum.Enum):
    """The user calls the transaction state decides about."""

    INIT = "init_transactions()"
    BEGIN = "begin_transaction()"
    SEND = "send()"
    SEND_OFFSETS = "send_offsets_to_transaction()"
    COMMIT = "commit_transaction()"
    ABORT = "abort_transaction()"
    PREPARE = "prepare_transaction()"


class Verdict(enum.Enum):
    """What a legal call does (returned by :meth:`TransactionManager.start`)."""

    PROCEED = "proceed"  # legal here, no transition (send, send_offsets)
    STARTED = "started"  # the call moved the state; its operation is new
    RESUME = "resume"  # the same call's operation is in progress: wait for it again
    RAISE = "raise"  # (table only) the producer is in an error state: raise its error


# What each call does in each state: a state to go to, PROCEED, RESUME, RAISE,
# or (str) why it is refused and what to call instead. The one table of calls.
_NOT_INITIALIZED = "init_transactions() has not been called: call it once after creating the producer"
_INITIALIZING = "init_transactions() has not finished: call init_transactions() again to wait for it"
_NO_TRANSACTION = "no transaction is open: call begin_transaction() first"
_OPEN = "a transaction is open: commit_transaction() or abort_transaction() it first"
_COMMITTING = "the transaction is being committed: call commit_transaction() again to wait for the outcome"
_ABORTING = "the transaction is being aborted: call abort_transaction() again to wait for it"
_PREPARING = "the transaction is being prepared: call prepare_transaction() again to wait for its handle"
_PREPARED = ("the transaction is prepared: whoever holds its handle completes it (or call commit_transaction() or "
             "abort_transaction() here)")

CALLS: dict[TxnState, dict[Call, TxnState | Verdict | str]] = {
    S.UNINITIALIZED: {
        Call.INIT: S.INITIALIZING, Call.BEGIN: _NOT_INITIALIZED, Call.SEND: _NOT_INITIALIZED,
        Call.SEND_OFFSETS: _NOT_INITIALIZED, Call.COMMIT: _NOT_INITIALIZED, Call.ABORT: _NOT_INITIALIZED,
        Call.PREPARE: _NOT_INITIALIZED,
    },
    S.INITIALIZING: {
        Call.INIT: Verdict.RESUME, Call.BEGIN: _INITIALIZING, Call.SEND: _INITIALIZING,
        Call.SEND_OFFSETS: _INITIALIZING, Call.COMMIT: _INITIALIZING, Call.ABORT: _INITIALIZING,
        Call.PREPARE: _INITIALIZING,
    },
    S.READY: {
        Call.INIT: "init_transactions() has completed already: call begin_transaction()",
        Call.BEGIN: S.IN_TRANSACTION, Call.SEND: _NO_TRANSACTION, Call.SEND_OFFSETS: _NO_TRANSACTION,
        Call.COMMIT: _NO_TRANSACTION, Call.ABORT: _NO_TRANSACTION, Call.PREPARE: _NO_TRANSACTION,
    },
    S.IN_TRANSACTION: {
        Call.INIT: _OPEN, Call.BEGIN: "a transaction is open already: commit_transaction() or abort_transaction() "
                                      "it before beginning the next one",
        Call.SEND: Verdict.PROCEED, Call.SEND_OFFSETS: Verdict.PROCEED,
        Call.COMMIT: S.COMMITTING, Call.ABORT: S.ABORTING, Call.PREPARE: S.PREPARING,
    },
    S.COMMITTING: {
        Call.INIT: _COMMITTING, Call.BEGIN: _COMMITTING, Call.SEND: _COMMITTING, Call.SEND_OFFSETS: _COMMITTING,
        Call.COMMIT: Verdict.RESUME, Call.ABORT: _COMMITTING, Call.PREPARE: _COMMITTING,
    },
    S.ABORTING: {
        Call.INIT: _ABORTING, Call.BEGIN: _ABORTING, Call.SEND: _ABORTING, Call.SEND_OFFSETS: _ABORTING,
        Call.COMMIT: _ABORTING, Call.ABORT: Verdict.RESUME, Call.PREPARE: _ABORTING,
    },
    S.ABORTABLE_ERROR: {
        Call.INIT: Verdict.RAISE, Call.BEGIN: Verdict.RAISE, Call.SEND: Verdict.RAISE,
        Call.SEND_OFFSETS: Verdict.RAISE, Call.COMMIT: Verdict.RAISE, Call.ABORT: S.ABORTING,
        Call.PREPARE: Verdict.RAISE,
    },
    S.PREPARING: {
        Call.INIT: _PREPARING, Call.BEGIN: _PREPARING, Call.SEND: _PREPARING, Call.SEND_OFFSETS: _PREPARING,
        Call.COMMIT: _PREPARING, Call.ABORT: _PREPARING, Call.PREPARE: Verdict.RESUME,
    },
    S.PREPARED: {
        Call.INIT: _PREPARED, Call.BEGIN: _PREPARED, Call.SEND: _PREPARED, Call.SEND_OFFSETS: _PREPARED,
        Call.COMMIT: S.COMMITTING, Call.ABORT: S.ABORTING, Call.PREPARE: Verdict.RESUME,
    },
    S.FATAL_ERROR: dict.fromkeys(Call, Verdict.RAISE),
}

# The states in which the sender may send a transaction's batches and add its partitions.
SENDING_STATES = frozenset({S.IN_TRANSACTION, S.COMMITTING, S.PREPARING})
# The states in which unsent batches are dropped instead of sent.
DROPPING_STATES = frozenset({S.ABORTABLE_ERROR, S.ABORTING, S.FATAL_ERROR})


class TransactionManager:
    """The state of one transactional producer. Methods are thread-safe."""

    def __init__(self, transactional_id: str, transaction_timeout_ms: int, implicit_partition_adds: bool = True):
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        # Transactions V2 (KIP-890 part 2): the partition leaders add the partitions
        # the producer writes to (ProduceRequest.add_to_transaction); no AddPartitionsToTxn.
        self.implicit_partition_adds = implicit_partition_adds
        self._state = S.UNINITIALIZED
        self._lock = threading.Lock()
        self._sends_done = threading.Condition(self._lock)
        self._sends_in_progress = 0
        self.producer_id = -1
        self.producer_epoch = -1
        self.abortable_error: ClientError | None = None
        self.fatal_error: ClientError | None = None
        # The operation (init, commit or abort) the current state waits for.
        self.operation: concurrent.futures.Future | None = None
        # Partitions of the open transaction: added at the coordinator, being
        # added (a request in flight), waiting to be added.
        self._added: set[TopicPartition] = set()
        self._adding: set[TopicPartition] = set()
        self._pending: set[TopicPartition] = set()
        # True once an AddPartitionsToTxn/AddOffsetsToTxn was sent in this
        # transaction: the coordinator may have it open, so it must be ended.
        self.coordinator_touched = False
        self.transactions_completed = 0
        self.handle = None  # the TransactionHandle of the prepared transaction
        self.prepare_metadata = b""  # what its prepare was given (every attempt sends it)

    # --- state -----------------------------------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self._state

    def transition_to(self, to_state: TxnState) -> None:
        with self._lock:
            self._transition_locked(to_state)

    def _transition_locked(self, to_state: TxnState) -> None:
        if self._state not in VALID_PREVIOUS_STATES[to_state]:
            raise IllegalStateError(
                f"transactional id {self.transactional_id!r}: illegal transition {self._state.name} -> {to_state.name}")
        self._state = to_state
        if to_state in (S.READY, S.ABORTING, S.ABORTABLE_ERROR, S.FATAL_ERROR):
            self._pending.clear()
        if to_state is S.READY:
            self._added.clear()
            self._adding.clear()
            self.coordinator_touched = False
            self.abortable_error = None

    # --- user calls ---------------------------------------------------------------------------

    def _verdict(self, call: Call) -> TxnState | Verdict:
        """The table's answer for ``call`` now; raises when it is not legal (lock held)."""
        outcome = CALLS[self._state][call]
        if isinstance(outcome, str):
            raise TransactionStateError(f"{call.value} in state {self._state.name}: {outcome}")
        if outcome is Verdict.RAISE:
            raise self._error_to_raise(call)
        return outcome

    def _error_to_raise(self, call: Call) -> ClientError:
        if self._state is S.FATAL_ERROR:
            assert self.fatal_error is not None
            return self.fatal_error
        cause = self.abortable_error
        error = TransactionAbortableError(
            ErrorCode.Value("TRANSACTION_ABORTABLE"),
            f"{call.value}: the transaction of {self.transactional_id!r} cannot commit any more ({cause}); "
            "call abort_transaction(), then begin a new transaction")
        error.__cause__ = cause
        return error

    def check(self, call: Call) -> None:
        """Raises unless ``call`` is legal now."""
        with self._lock:
            self._verdict(call)

    def start(self, call: Call, prepare_metadata: bytes = b"") -> Verdict:
        """Decides ``call``: makes its transition (STARTED, with a new
        :attr:`operation` future for the operation to complete), or answers
        RESUME (wait for :attr:`operation` again) or PROCEED; raises when the
        call is not legal now. A prepare keeps ``prepare_metadata``; resuming
        it with other bytes raises ValueError (a prepared transaction keeps
        the metadata it was first given)."""
        with self._lock:
            outcome = self._verdict(call)
            if call is Call.PREPARE and outcome is Verdict.RESUME and prepare_metadata != self.prepare_metadata:
                raise ValueError("prepare_transaction() is resumed with other metadata than the prepare under way "
                                 f"({len(self.prepare_metadata)} bytes): pass the same bytes")
            if isinstance(outcome, Verdict):
                return outcome
            if call is Call.PREPARE:
                self.prepare_metadata = prepare_metadata
            self._transition_locked(outcome)
            if outcome in (S.INITIALIZING, S.COMMITTING, S.ABORTING, S.PREPARING):
                self.operation = concurrent.futures.Future()
                self.operation.set_running_or_notify_cancel()
            return Verdict.STARTED

    # --- sends ---------------------------------------------------------------------------------

    def enter_send(self) -> None:
        """A ``send()`` begins: raises unless records may be sent now."""
        with self._lock:
            self._verdict(Call.SEND)
            self._sends_in_progress += 1

    def exit_send(self) -> None:
        with self._lock:
            self._sends_in_progress -= 1
            if self._sends_in_progress == 0:
                self._sends_done.notify_all()

    def wait_sends_done(self, timeout_s: float | None = None) -> bool:
        """Waits until no ``send()`` is between its state check and its append."""
        with self._lock:
            return self._sends_done.wait_for(lambda: self._sends_in_progress == 0, timeout_s)

    # --- partitions ------------------------------------------------------------------------------

    def maybe_add_partition(self, tp: TopicPartition) -> bool:
        """Notes that the transaction writes to ``tp``; True when it is new and
        the sender must add it at the coordinator (False with implicit adds:
        its leader adds it with its first batch, which may go at once)."""
        with self._lock:
            if tp in self._added or tp in self._adding or tp in self._pending:
                return False
            if self.implicit_partition_adds:
                if self._state in SENDING_STATES:
                    self._added.add(tp)
                    self.coordinator_touched = True  # its first batch may open the transaction at the coordinator
                return False
            self._pending.add(tp)
            return True

    def has_pending_partitions(self) -> bool:
        with self._lock:
            return bool(self._pending) and self._state in SENDING_STATES

    def take_pending_partitions(self) -> list[TopicPartition]:
        """The partitions to add now (they become "being added")."""
        with self._lock:
            if self._state not in SENDING_STATES:
                return []
            taken = sorted(self._pending)
            self._pending.clear()
            self._adding.update(taken)
            if taken:
                self.coordinator_touched = True
            return taken

    def partitions_added(self, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                if tp in self._adding:
                    self._adding.discard(tp)
                    self._added.add(tp)

    def partitions_not_added(self, tps: Iterable[TopicPartition]) -> None:
        """The add request ended without adding ``tps`` (cancelled, or failed)."""
        with self._lock:
            self._adding.difference_update(tps)

    def may_send(self, tp: TopicPartition) -> bool:
        """True when a new batch of ``tp`` may be sent (its partition is in the transaction)."""
        with self._lock:
            return self._state in SENDING_STATES and tp in self._added

    def note_offsets_added(self) -> None:
        """AddOffsetsToTxn is about to be sent: the coordinator may open the transaction."""
        with self._lock:
            self.coordinator_touched = True

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(self._added)

    # --- outcomes --------------------------------------------------------------------------------

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        with self._lock:
            self.producer_id, self.producer_epoch = producer_id, producer_epoch
            self._transition_locked(S.READY)

    def completed(self, producer_id: int, producer_epoch: int) -> bool:
        """The transaction ended (committed or aborted); the next one uses this
        epoch. False (nothing changes) when the producer went fatal meanwhile."""
        with self._lock:
            if self._state is S.FATAL_ERROR:
                return False
            self.producer_id, self.producer_epoch = producer_id, producer_epoch
            self._transition_locked(S.READY)
            self.transactions_completed += 1
            return True

    def prepared(self, handle) -> bool:
        """PrepareTransaction answered ``handle``. False (nothing changes) when
        the producer went fatal meanwhile."""
        with self._lock:
            if self._state is S.FATAL_ERROR:
                return False
            self.handle = handle
            self._transition_locked(S.PREPARED)
            return True

    def on_abortable_error(self, error: ClientError) -> None:
        """The transaction can only abort now. Ignored while aborting (the
        outcome is decided), once in an error state (the first error counts),
        and outside a transaction."""
        with self._lock:
            if self._state in (S.IN_TRANSACTION, S.COMMITTING, S.PREPARING):
                self.abortable_error = error
                self._transition_locked(S.ABORTABLE_ERROR)

    def on_fatal_error(self, error: ClientError) -> None:
        """The producer is dead (fenced, or a fatal coordinator error): every later call raises ``error``."""
        with self._lock:
            if self._state is S.FATAL_ERROR:
                return
            self.fatal_error = error
            self._transition_locked(S.FATAL_ERROR)

    def on_coordinator_error(self, error: ClientError) -> None:
        """A coordinator request failed for good: a fatal error (fenced included)
        makes the producer fatal; any other makes the transaction abortable."""
        if isinstance(error, FatalError):
            self.on_fatal_error(error)
        else:
            self.on_abortable_error(error)

    def error_unless(self, state: TxnState) -> ClientError | None:
        """None while the state is ``state``; else the error the operation that
        expects it must raise (the fatal error, or the transaction's abortable one)."""
        with self._lock:
            if self._state is state:
                return None
            if self._state is S.FATAL_ERROR:
                return self.fatal_error
            return self._error_to_raise(Call.COMMIT)
