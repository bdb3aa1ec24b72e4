"""The SDK's value types: what users pass in and get back (immutable), and
the conversions from user input (str/bytes keys, values, headers) to records.

Keys and values are bytes on the wire. ``str`` is accepted and encoded as
UTF-8 for convenience; ``None`` means null. Header values likewise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from txlog.protocol import names
from txlog.protocol.names import TopicPartition, as_tp  # noqa: F401  (the SDK's names for them)
from txlog.protocol.protowire import field_tag, varint
from txlog.v1 import common_pb2, transaction_check_pb2


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
    # when it was read), "none" outside any transaction; None when not asked (txlog/protocol/txn_outcomes.py).
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


class ServiceInstance(NamedTuple):
    """A live instance of one of the services (Admin.describe_cluster)."""

    kind: str  # "partition_svc", "coordinator_svc" or "producer_id_svc"
    node_id: int
    address: str
    version: str  # the txlog release it runs, "" if it registered none
    rack: str = ""
    metrics_address: str = ""  # host:port of its /metrics, "" without one


class ClusterDescription(NamedTuple):
    """Admin.describe_cluster: the controller (-1 while none is elected) and the live instances."""

    controller_id: int
    controller_epoch: int
    instances: tuple[ServiceInstance, ...]


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


# --- the producer's records on the wire ----------------------------------------------------------
# A protobuf message is the concatenation of its encoded fields, and a repeated message field is one
# length-delimited field per element (txlog/protocol/protowire.py; partition_svc/wire.py serves fetches so). The producer
# encodes each record so, once, in send(): building a Record message per record, copying it into the
# request and serializing that cost more than the rest of send() (bench/produce_fetch.py).

_RECORDS_TAG = field_tag(common_pb2.RecordBatch, "records")
_TIMESTAMP_TAG = field_tag(common_pb2.Record, "timestamp_ms")
_KEY_TAG = field_tag(common_pb2.Record, "key")
_VALUE_TAG = field_tag(common_pb2.Record, "value")
_HEADERS_TAG = field_tag(common_pb2.Record, "headers")
_HEADER_KEY_TAG = field_tag(common_pb2.Header, "key")
_HEADER_VALUE_TAG = field_tag(common_pb2.Header, "value")
_KEY_VALUE_TAGS_BYTES = len(_KEY_TAG) + len(_VALUE_TAG)


def encode_record(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, object]] | None, timestamp_ms: int | None
) -> tuple[bytes, int]:
    """One ``send()``'s record as an element of ``RecordBatch.records`` (its tag
    and length included: the bytes it takes in a request), and its payload bytes
    (what a topic's ``max.record.bytes`` counts: key, value and headers).
    ``key`` and ``value`` are bytes or None (``to_bytes`` first). The same bytes
    as protobuf's serialization of the Record with those fields, and a
    TypeError/ValueError on bad input."""
    if timestamp_ms is None and not headers and key is not None and value is not None:  # the usual record, at once
        key_length, value_length = len(key), len(value)
        key_varint, value_varint = varint(key_length), varint(value_length)
        size = _KEY_VALUE_TAGS_BYTES + len(key_varint) + key_length + len(value_varint) + value_length
        return b"".join((_RECORDS_TAG, varint(size), _KEY_TAG, key_varint, key, _VALUE_TAG, value_varint, value)), \
            key_length + value_length
    parts = [_RECORDS_TAG, b""]
    size = payload = 0
    if timestamp_ms is not None:
        if not isinstance(timestamp_ms, int) or timestamp_ms <= 0:
            raise ValueError(f"timestamp_ms must be a positive int (ms since the epoch), not {timestamp_ms!r}")
        encoded = varint(timestamp_ms)
        parts += (_TIMESTAMP_TAG, encoded)
        size += len(_TIMESTAMP_TAG) + len(encoded)
    for tag, data in ((_KEY_TAG, key), (_VALUE_TAG, value)):
        if data is not None:
            length = len(data)
            encoded = varint(length)
            parts += (tag, encoded, data)
            size += len(tag) + len(encoded) + length
            payload += length
    for header in headers or ():
        name, header_value = header
        if not isinstance(name, str):
            raise TypeError(f"a header name must be str, not {type(name).__name__}")
        header_bytes = to_bytes(header_value, f"header {name!r}")
        name_bytes = name.encode()
        fields = [_HEADER_KEY_TAG, varint(len(name_bytes)), name_bytes] if name_bytes else []
        if header_bytes is not None:
            fields += (_HEADER_VALUE_TAG, varint(len(header_bytes)), header_bytes)
        encoded = b"".join(fields)
        length_encoded = varint(len(encoded))
        parts += (_HEADERS_TAG, length_encoded, encoded)
        size += len(_HEADERS_TAG) + len(length_encoded) + len(encoded)
        payload += len(name_bytes) + (len(header_bytes) if header_bytes is not None else 0)
    parts[1] = varint(size)
    return b"".join(parts), payload


def consumer_record(topic: str, partition: int, record: common_pb2.Record, leader_epoch: int | None = None,
                    producer_id: int = -1, transaction_outcome: str | None = None, *, offset: int | None = None,
                    append_time_ms: int = 0) -> ConsumerRecord:
    """``offset``: the record's (an encoded batch's records carry none); ``append_time_ms``: its batch's log
    append time, the timestamp of a record that has none."""
    return ConsumerRecord(
        topic=topic,
        partition=partition,
        offset=record.offset if offset is None else offset,
        key=record.key if record.HasField("key") else None,
        value=record.value if record.HasField("value") else None,
        headers=[(h.key, h.value if h.HasField("value") else None) for h in record.headers],
        timestamp_ms=record.timestamp_ms or append_time_ms,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        transaction_outcome=transaction_outcome,
    )
