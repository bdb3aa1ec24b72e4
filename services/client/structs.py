"""The SDK's value types: what users pass in and get back (immutable), and
the conversions from user input (str/bytes keys, values, headers) to records.

Keys and values are bytes on the wire. ``str`` is accepted and encoded as
UTF-8 for convenience; ``None`` means null. Header values likewise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from services import names
from services.stubs.txlog.v1 import common_pb2, transaction_check_pb2


class TopicPartition(NamedTuple):
    """One partition of one topic; a plain ``(topic, partition)`` tuple works too."""

    topic: str
    partition: int

    def __str__(self) -> str:  # in messages, as Kafka writes it: orders-3
        return f"{self.topic}-{self.partition}"


def as_tp(value) -> TopicPartition:
    """A TopicPartition from a TopicPartition or a ``(topic, partition)`` pair."""
    if isinstance(value, TopicPartition):
        return value
    topic, partition = value
    if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
        raise TypeError(f"a topic partition is (topic: str, partition: int), not {value!r}")
    return TopicPartition(topic, partition)


class RecordMetadata(NamedTuple):
    """Where a produced record landed.

    ``offset`` is -1 when the producer cannot know it: with ``acks=0``, and when
    the leader answered DUPLICATE_SEQUENCE (the record was appended by an earlier
    attempt, longer ago than the leader's duplicate cache keeps offsets for).
    ``timestamp_ms`` is the record's own timestamp, or the leader's append time
    when the record was sent without one (-1 when unknown)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int
    leader_epoch: int | None = None  # the leader epoch the record was written in, when the server said
    producer_id: int = -1  # the producer that wrote it (-1: one neither idempotent nor transactional)
    # With include_transaction_outcomes: "committed", "aborted" or "open" (its transaction's, as the leader knew
    # when it was read), "none" outside any transaction; None when not asked (services/txn_outcomes.py).
    transaction_outcome: str | None = None


class OffsetAndTimestamp(NamedTuple):
    """An offset answered by ListOffsets; ``offset`` -1 for a timestamp after
    every record; ``timestamp_ms`` -1 unless looked up by timestamp."""

    offset: int
    timestamp_ms: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to consume) with the free-form
    text committed beside it (at most 4 KiB)."""

    offset: int
    metadata: str = ""


class PartitionReassignment(NamedTuple):
    """A reassignment under way: the replicas now (the target's new ones
    included while they catch up) and the target."""

    replicas: tuple[int, ...]
    target_replicas: tuple[int, ...]


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader_id: int
    leader_address: str
    leader_epoch: int
    error: str = "NONE"
    replicas: tuple[int, ...] = ()  # node ids, the preferred leader first
    isr: tuple[int, ...] = ()  # node ids of the in-sync replicas


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionDescription, ...]
    is_internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)


class ProducerDescription(NamedTuple):
    """One producer a partition leader knows (DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int


class GroupListing(NamedTuple):
    """A consumer group (ListGroups): ``state`` Empty (committed offsets, no
    live member), Stable or Reconciling."""

    group_id: str
    state: str
    members: int


class GroupMemberDescription(NamedTuple):
    member_id: str
    instance_id: str | None
    member_epoch: int
    state: str
    subscribed_topics: tuple[str, ...]
    assigned: frozenset[TopicPartition]
    revoking: frozenset[TopicPartition]


class GroupDescription(NamedTuple):
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[GroupMemberDescription, ...]

    def owner(self, tp: TopicPartition) -> str | None:
        return next((m.member_id for m in self.members if tp in m.assigned or tp in m.revoking), None)


class TransactionListing(NamedTuple):
    """One transaction a coordinator knows (ListTransactions); ``state`` is the
    coordinator's state name: Empty, Ongoing, Prepared, PrepareCommit,
    PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence."""

    transactional_id: str
    producer_id: int
    state: str
    producer_epoch: int = -1

    @property
    def handle(self) -> TransactionHandle:
        """The handle of this transaction (meaningful when it is Prepared)."""
        return TransactionHandle(self.transactional_id, self.producer_id, self.producer_epoch)


class TransactionHandle(NamedTuple):
    """Names one prepared transaction (Producer.prepare_transaction); any process
    holding it can complete it (Admin.complete_transaction) or commit it with
    others of its group (Admin.commit_transaction_group). Picklable: Spark
    hands it from tasks to the driver."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    @property
    def group(self) -> str:
        """The transaction group of its id (the part before the first "/")."""
        return names.transaction_group(self.transactional_id)


class TransactionDescription(NamedTuple):
    """A transactional id in detail (DescribeTransactions);
    ``transaction_start_time_ms`` is -1 when no transaction is open."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[TopicPartition, ...]
    prepared_time_ms: int = -1  # when it was prepared (ms since epoch), -1 unless Prepared
    prepared_timeout_ms: int = 0  # how long it may stay Prepared, 0 unless Prepared
    # Check-back (unset unless Prepared): what prepare_transaction(metadata=) was given,
    prepare_metadata: bytes = b""
    checks_done: int = 0  # checks answered without a decision so far,
    last_check_answer: str = ""  # the last of those answers ("UNKNOWN"; "": none yet),
    next_check_time_ms: int = -1  # when the next is due (ms since epoch); -1: none will be made


# The answers of a TransactionCheckService: "COMMIT", "ABORT", "UNKNOWN" <-> the
# proto's enum numbers (UNSPECIFIED, which counts as UNKNOWN, has no name here).
_CHECK_ANSWER_PREFIX = "TRANSACTION_CHECK_ANSWER_"
CHECK_ANSWERS: dict[str, int] = {
    name.removeprefix(_CHECK_ANSWER_PREFIX): number
    for name, number in transaction_check_pb2.TransactionCheckAnswer.items()
    if number != transaction_check_pb2.TRANSACTION_CHECK_ANSWER_UNSPECIFIED}
_CHECK_ANSWER_NAMES = {number: name for name, number in CHECK_ANSWERS.items()}


def check_answer_name(number: int) -> str:
    """A TransactionCheckAnswer as the SDK shows it: "COMMIT", "ABORT",
    "UNKNOWN", or "" for UNSPECIFIED (no answer yet)."""
    if number == transaction_check_pb2.TRANSACTION_CHECK_ANSWER_UNSPECIFIED:
        return ""
    return _CHECK_ANSWER_NAMES.get(number, f"Unknown({number})")


class RegisteredChecker(NamedTuple):
    """A checker registered for a transaction group, with what is left of its lease."""

    address: str
    lease_remaining_ms: int


class TransactionGroupConfig(NamedTuple):
    """A transaction group's check-back settings (DescribeTransactionGroupConfig):
    every key with its value (defaults included), the keys set explicitly, and
    the checkers registered now."""

    group_id: str
    configs: dict[str, str]
    overridden: tuple[str, ...]
    checkers: tuple[RegisteredChecker, ...]


class HangingTransaction(NamedTuple):
    """An open transaction on a partition that no coordinator will end: it holds
    the partition's last stable offset back (read_committed readers stop there)
    until ``Admin.abort_transaction`` writes its ABORT marker with these fields."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp_ms: int
    reason: str


def to_bytes(value, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, str or None, not {type(value).__name__}")


def build_record(
    key, value, headers: Iterable[tuple[str, object]] | None, timestamp_ms: int | None
) -> common_pb2.Record:
    """The wire record for one ``send()``; raises TypeError/ValueError on bad input."""
    record = common_pb2.Record()
    key_bytes = to_bytes(key, "key")
    value_bytes = to_bytes(value, "value")
    if key_bytes is not None:
        record.key = key_bytes
    if value_bytes is not None:
        record.value = value_bytes
    if timestamp_ms is not None:
        if not isinstance(timestamp_ms, int) or timestamp_ms <= 0:
            raise ValueError(f"timestamp_ms must be a positive int (ms since the epoch), not {timestamp_ms!r}")
        record.timestamp_ms = timestamp_ms
    for header in headers or ():
        name, header_value = header
        if not isinstance(name, str):
            raise TypeError(f"a header name must be str, not {type(name).__name__}")
        entry = record.headers.add(key=name)
        header_bytes = to_bytes(header_value, f"header {name!r}")
        if header_bytes is not None:
            entry.value = header_bytes
    return record


def record_payload_bytes(record: common_pb2.Record) -> int:
    """What a topic's ``max.record.bytes`` counts: key, value and headers."""
    headers = record.headers
    return len(record.key) + len(record.value) + (sum(len(h.key.encode()) + len(h.value) for h in headers) if headers else 0)


def consumer_record(topic: str, partition: int, record: common_pb2.Record, leader_epoch: int | None = None,
                    producer_id: int = -1, transaction_outcome: str | None = None) -> ConsumerRecord:
    return ConsumerRecord(
        topic=topic,
        partition=partition,
        offset=record.offset,
        key=record.key if record.HasField("key") else None,
        value=record.value if record.HasField("value") else None,
        headers=[(h.key, h.value if h.HasField("value") else None) for h in record.headers],
        timestamp_ms=record.timestamp_ms,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        transaction_outcome=transaction_outcome,
    )
