"""The protocol's shared numbers, names and arithmetic: one definition for the
services, the SDK and the test fake (docs/design.md "Idempotent produce",
"Transactions"). Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum

from txlog.v1 import coordinator_pb2

# Producer ids are int64 and epochs int16 on the log. An epoch at the maximum
# is never bumped again: the coordinator moves the transactional id to a new
# producer id instead (KIP-360).
PRODUCER_EPOCH_MAX = 32767
PRODUCER_EPOCHS = PRODUCER_EPOCH_MAX + 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# Sequences are int32 and wrap to 0 after 2^31 - 1.
SEQUENCE_MODULUS = 2**31
SEQUENCE_MAX = SEQUENCE_MODULUS - 1
NO_SEQUENCE = -1

INTERNAL_TOPIC_PREFIX = "__"  # names the services keep for their own topics
TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"


def last_sequence_of(base_sequence: int, record_count: int) -> int:
    """The sequence of a batch's last record."""
    return (base_sequence + record_count - 1) % SEQUENCE_MODULUS


def next_sequence(sequence: int, count: int = 1) -> int:
    """The sequence ``count`` records after ``sequence``."""
    return (sequence + count) % SEQUENCE_MODULUS


def is_behind(sequence: int, expected: int) -> bool:
    """True when ``sequence`` lies before ``expected`` in the wrapping int32 space."""
    return (sequence - expected) % SEQUENCE_MODULUS >= SEQUENCE_MODULUS // 2


class TransactionState(enum.Enum):
    """A transactional id's state at its coordinator, by Kafka's names (which
    the CLI and the SDK show). Which state may follow which is the coordinator's
    rule: ``coordinator_svc.transaction_state.VALID_PREVIOUS_STATES``."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    PREPARED = "Prepared"

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @property
    def is_preparing(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_open(self) -> bool:
        """A transaction is open: begun, and its markers not all written."""
        return self in OPEN_TRANSACTION_STATES

    def to_proto(self) -> int:
        return _STATE_TO_PROTO[self]

    @classmethod
    def from_proto(cls, number: int) -> TransactionState:
        """The state of a proto value; KeyError for one this build does not know."""
        return _STATE_FROM_PROTO[number]


OPEN_TRANSACTION_STATES = frozenset({
    TransactionState.ONGOING, TransactionState.PREPARED, TransactionState.PREPARE_COMMIT,
    TransactionState.PREPARE_ABORT, TransactionState.PREPARE_EPOCH_FENCE,
})
_STATE_TO_PROTO = {state: coordinator_pb2.TransactionState.Value("TRANSACTION_STATE_" + state.name) for state in TransactionState}
_STATE_FROM_PROTO = {number: state for state, number in _STATE_TO_PROTO.items()}
