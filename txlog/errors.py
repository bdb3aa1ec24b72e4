"""Client exceptions, and the one place where the SDK sorts errors.

Every failure a client object raises, or fails a future with, is a
:class:`ClientError`: a :class:`txlog.protocol.errors.TxlogError` with the txlog code
(``.code``, ``.name``), its class (``.error_class``: retriable, abortable,
fatal) and a message saying what went wrong and what to do. Like aiokafka's
``KafkaError`` tree, the class of an error is also its Python type:
:class:`RetriableError`, :class:`AbortableError`, :class:`FatalError`, with a few
named subclasses for what the SDK itself detects (timeouts, a closed client, a
full buffer, an oversized record).

Error Handling
--------------
:func:`action_for` is the only table the request handlers consult:

* ``REFRESH_METADATA`` -- the leader moved, is unknown or unreachable
  (NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE -- which is also
  what an unreachable server reads as --, FENCED_LEADER_EPOCH,
  UNKNOWN_LEADER_EPOCH): refresh metadata, back off, retry.
* ``FIND_COORDINATOR`` -- NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: look the
  group's coordinator up again, back off, retry.
* ``RETRY`` -- any other retriable code, and codes this build does not know
  (a newer server): back off and retry the same request.
* ``ALREADY_APPENDED`` -- DUPLICATE_SEQUENCE: the batch is in the log already
  (appended by an earlier attempt, longer ago than the leader's duplicate cache
  remembers offsets for).
* ``SEQUENCE_REJECTED`` -- OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER_ID: the leader
  did not append the batch because an earlier sequence is missing; the
  producer's sender decides between re-sending in order and resetting its
  producer id (see ``sequences.py``).
* ``FAIL`` -- abortable and fatal codes: raise / fail the futures.

Calls to a transaction coordinator (and TxnOffsetCommit) are sorted by
:func:`txn_action_for` instead, a second table for the transactional protocol:

* ``FIND_COORDINATOR`` -- NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
  COORDINATOR_LOAD_IN_PROGRESS, SHUTTING_DOWN and LEADER_NOT_AVAILABLE (what an
  unreachable server reads as): look the coordinator up again, back off, retry.
* ``RETRY`` -- CONCURRENT_TRANSACTIONS (the coordinator is completing or fencing
  a transaction of this id) and every other retriable code: back off, retry.
* ``FENCED`` -- PRODUCER_FENCED, INVALID_PRODUCER_EPOCH: a newer producer with
  the same transactional id exists; this one is a zombie (ProducerFencedError).
* ``ABORTABLE`` -- abortable codes: the transaction can only abort.
* ``FATAL`` -- fatal codes: the producer must be closed.

Transactional exceptions have types of their own (aiokafka's registry by code,
:data:`_TYPE_BY_CODE`): ProducerFencedError, InvalidTxnStateError,
TransactionTimedOutError, TransactionAbortableError, ConcurrentTransactionsError;
TransactionStateError is a method called in a state that does not allow it.
"""

from __future__ import annotations

import asyncio
import enum

import grpc

from txlog.protocol import errors as txlog_errors
from txlog.protocol.errors import ErrorClass, ErrorCode, TxlogError


def _code(name: str) -> int:
    return ErrorCode.Value(name)


class ConfigError(ValueError):
    """Settings that parse but cannot work (a missing file, a certificate
    without its key): the process stops before it serves, naming the setting."""


class LocalSetupError(RuntimeError):
    """A local cluster or its certificates could not be set up or found (the
    ``txlog cluster`` and ``txlog tls`` commands)."""


class ClientError(TxlogError):
    """Base of every error the client SDK raises; ``str()`` is ``CODE: message``."""


class RetriableError(ClientError):
    """Transient: the SDK retries these itself until its limits run out."""


class AbortableError(ClientError):
    """The request failed; the client object lives on (in a transaction: abort it)."""


class FatalError(ClientError):
    """Retrying cannot help: the request is wrong, or the client must be recreated."""


class ClientTimeoutError(RetriableError):
    """A blocking call of the SDK (flush, close, a metadata wait, a poll step)
    ran past its timeout."""

    def __init__(self, message: str):
        super().__init__(_code("REQUEST_TIMED_OUT"), message)


class DeliveryTimeoutError(RetriableError):
    """A record was not acknowledged within ``delivery_timeout_ms``.

    ``maybe_appended`` is True when a request carrying it had been sent, so the
    leader may have appended it even though no answer arrived; False when it was
    never sent or was rejected by every attempt."""

    def __init__(self, message: str, *, maybe_appended: bool):
        self.maybe_appended = maybe_appended
        super().__init__(_code("REQUEST_TIMED_OUT"), message)


class BufferExhaustedError(RetriableError):
    """The producer's ``buffer_memory_bytes`` stayed full for ``max_block_ms``."""

    def __init__(self, message: str):
        super().__init__(_code("LIMIT_EXCEEDED"), message)


class RecordTooLargeError(AbortableError):
    """A record is larger than the producer's ``max_request_size_bytes`` (checked
    before sending) or than the topic's limit (answered by the leader)."""

    def __init__(self, message: str):
        super().__init__(_code("RECORD_TOO_LARGE"), message)


class ClientClosedError(FatalError):
    """The client object is closed, or was closed before the operation finished."""

    def __init__(self, message: str):
        super().__init__(_code("INVALID_REQUEST"), message)


class IoThreadCallError(FatalError):
    """A blocking client method was called from the client's own I/O thread (from
    a future callback): it would wait for itself forever, so it is refused."""

    def __init__(self, message: str):
        super().__init__(_code("INVALID_REQUEST"), message)


class NoOffsetForPartitionError(FatalError):
    """A consumer has no position for a partition and ``auto_offset_reset`` is
    ``"none"`` (no committed offset, or the committed one is out of range)."""

    def __init__(self, message: str):
        super().__init__(_code("OFFSET_OUT_OF_RANGE"), message)


class LogTruncationError(FatalError):
    """The log a consumer read from was truncated below its position (an
    unclean leader election lost records it had returned; KIP-320), and
    ``auto_offset_reset`` is ``"none"``. ``divergent_offset`` is the first
    offset the logs may disagree at (-1: unknown): seek() to go on."""

    def __init__(self, topic: str, partition: int, position: int, divergent_offset: int):
        where = f"at offset {divergent_offset}" if divergent_offset >= 0 else "before every epoch it still has"
        super().__init__(_code("OFFSET_OUT_OF_RANGE"),
                         f"{topic}-{partition} was truncated below the position {position}: the leader's log diverges from "
                         f"what this consumer read {where}; seek() to go on")
        self.position = position
        self.divergent_offset = divergent_offset


class ConcurrentTransactionsError(RetriableError):
    """CONCURRENT_TRANSACTIONS: the coordinator is completing, or fencing, a
    transaction of this transactional id. The producer retries by itself."""


class ProducerFencedError(FatalError):
    """Another producer with the same transactional id has called
    ``init_transactions()`` (or the coordinator aborted this producer's
    transaction with an epoch bump): this producer is a zombie. Every later call
    raises this error; close the producer (a new one may take over the id)."""


class TransactionAbortableError(AbortableError):
    """The open transaction cannot commit any more (a record failed, the
    coordinator refused a request, ...): call ``abort_transaction()``, then
    begin a new transaction with the same producer. ``__cause__`` is the error
    that made the transaction abortable."""


class InvalidTxnStateError(TransactionAbortableError):
    """INVALID_TXN_STATE: the coordinator or a partition leader refused a request
    in the transaction's current state (a write to a partition the coordinator
    does not have in the transaction, ...): abort the transaction."""


class TransactionTimedOutError(TransactionAbortableError):
    """TRANSACTION_TIMED_OUT: the transaction ran past ``transaction_timeout_ms``
    and the coordinator aborted it: abort it here too, then begin again (with a
    larger ``transaction_timeout_ms`` if transactions are that long)."""


class TransactionAbortedError(AbortableError):
    """A record's future fails with this when its transaction was aborted before
    the record was sent (``abort_transaction()``, or an earlier error of the
    transaction): the record is not in the log, or is in it as aborted."""

    def __init__(self, message: str):
        super().__init__(_code("TRANSACTION_ABORTABLE"), message)


class TransactionStateError(ClientError):
    """A transactional method was called in a state that does not allow it
    (``commit_transaction()`` without ``begin_transaction()``, ``send()`` before
    ``init_transactions()``, ...). A mistake of the calling code: nothing was
    changed and nothing is retried; the message names the state and what to
    call first."""

    def __init__(self, message: str):
        super().__init__(_code("INVALID_REQUEST"), message)


_TYPE_BY_CODE: dict[int, type[ClientError]] = {
    _code("CONCURRENT_TRANSACTIONS"): ConcurrentTransactionsError,
    _code("PRODUCER_FENCED"): ProducerFencedError,
    _code("INVALID_TXN_STATE"): InvalidTxnStateError,
    _code("TRANSACTION_TIMED_OUT"): TransactionTimedOutError,
    _code("TRANSACTION_ABORTABLE"): TransactionAbortableError,
}

_TYPE_BY_CLASS: dict[ErrorClass, type[ClientError]] = {
    ErrorClass.RETRIABLE: RetriableError,
    ErrorClass.ABORTABLE: AbortableError,
    ErrorClass.FATAL: FatalError,
    ErrorClass.NONE: FatalError,  # NONE is never an error; reaching here is a bug in the caller
}


def error_for(code: int, message: str, *, retry_delay_ms: int | None = None) -> ClientError:
    """The client exception for a txlog code: its own type for the transactional
    codes of :data:`_TYPE_BY_CODE`, else the type of the code's class."""
    error_type = _TYPE_BY_CODE.get(code) or _TYPE_BY_CLASS[txlog_errors.spec_of(code).error_class]
    return error_type(code, message, retry_delay_ms=retry_delay_ms)


def from_proto(error) -> ClientError:
    """The client exception of a per-item ``txlog.v1.Error`` (code must not be NONE)."""
    return error_for(error.code, error.message or txlog_errors.spec_of(error.code).name)


def from_exception(exc: BaseException) -> ClientError:
    """Any failure of a call, as a ClientError: our codes from a gRPC status's
    details; plain gRPC failures (unreachable server, deadline) by status code."""
    if isinstance(exc, ClientError):
        return exc
    if isinstance(exc, TxlogError):
        return error_for(exc.code, exc.message, retry_delay_ms=exc.retry_delay_ms)
    if isinstance(exc, grpc.RpcError):
        decoded = txlog_errors.from_rpc_error(exc)
        return error_for(decoded.code, decoded.message, retry_delay_ms=decoded.retry_delay_ms)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return error_for(_code("REQUEST_TIMED_OUT"), f"the call timed out: {exc}")
    if isinstance(exc, OSError):
        return error_for(_code("LEADER_NOT_AVAILABLE"), f"connection failed: {exc}")
    return error_for(_code("UNKNOWN_SERVER_ERROR"), f"{type(exc).__name__}: {exc}")


class Action(enum.Enum):
    """What a request handler does about an error (see the module docstring)."""

    RETRY = "retry"
    REFRESH_METADATA = "refresh_metadata"
    FIND_COORDINATOR = "find_coordinator"
    ALREADY_APPENDED = "already_appended"
    SEQUENCE_REJECTED = "sequence_rejected"
    FAIL = "fail"

    @property
    def retries(self) -> bool:
        """True for the actions that end in sending the request again."""
        return self in (Action.RETRY, Action.REFRESH_METADATA, Action.FIND_COORDINATOR)


_ACTION_BY_CODE: dict[int, Action] = {
    **{_code(name): Action.REFRESH_METADATA for name in (
        "NOT_LEADER", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    )},
    **{_code(name): Action.FIND_COORDINATOR for name in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE")},
    _code("DUPLICATE_SEQUENCE"): Action.ALREADY_APPENDED,
    _code("OUT_OF_ORDER_SEQUENCE"): Action.SEQUENCE_REJECTED,
    _code("UNKNOWN_PRODUCER_ID"): Action.SEQUENCE_REJECTED,
}


def action_for(code: int) -> Action:
    """What to do about ``code``: the SDK's one error-sorting table."""
    action = _ACTION_BY_CODE.get(code)
    if action is not None:
        return action
    if txlog_errors.spec_of(code).error_class is ErrorClass.RETRIABLE:
        return Action.RETRY
    return Action.FAIL


class TxnAction(enum.Enum):
    """What a transactional request handler does about an error (module docstring)."""

    RETRY = "retry"
    FIND_COORDINATOR = "find_coordinator"
    FENCED = "fenced"
    ABORTABLE = "abortable"
    FATAL = "fatal"

    @property
    def retries(self) -> bool:
        return self in (TxnAction.RETRY, TxnAction.FIND_COORDINATOR)


_TXN_ACTION_BY_CODE: dict[int, TxnAction] = {
    **{_code(name): TxnAction.FIND_COORDINATOR for name in (
        "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "SHUTTING_DOWN",
        "LEADER_NOT_AVAILABLE",
    )},
    _code("PRODUCER_FENCED"): TxnAction.FENCED,
    _code("INVALID_PRODUCER_EPOCH"): TxnAction.FENCED,
}


def txn_action_for(code: int) -> TxnAction:
    """What to do about ``code`` answered by a transaction coordinator (or by a
    group coordinator to TxnOffsetCommit): the transactional error table."""
    action = _TXN_ACTION_BY_CODE.get(code)
    if action is not None:
        return action
    error_class = txlog_errors.spec_of(code).error_class
    if error_class is ErrorClass.RETRIABLE:
        return TxnAction.RETRY
    if error_class is ErrorClass.ABORTABLE:
        return TxnAction.ABORTABLE
    return TxnAction.FATAL
