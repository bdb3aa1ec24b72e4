"""txlog's client SDK: Producer, Consumer and Admin, shaped like Kafka's.

Each client object is synchronous for its callers (Spark executors call it
from plain Python) and runs its network I/O on one asyncio event loop in a
background daemon thread of its own, over grpc.aio channels. Results of
asynchronous operations (``Producer.send``) are ``concurrent.futures.Future``.

    from txlog import Admin, Consumer, Producer

    with Admin("127.0.0.1:7001") as admin:
        admin.create_topics([("events", 6)])
    with Producer("127.0.0.1:7001") as producer:        # idempotent by default
        producer.send("events", b"hello", key=b"user-1").result()
    with Producer("127.0.0.1:7001", transactional_id="etl-0") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("events", b"all or nothing")
        producer.commit_transaction()
    with Consumer("127.0.0.1:7001", group_id="g") as consumer:
        consumer.assign([("events", p) for p in range(6)])
        records = consumer.poll(timeout_s=1.0)
        consumer.commit()

Modules: ``producer`` (facade), ``accumulator`` (batching), ``sender`` (I/O
loop), ``sequences`` (idempotence state machine), ``transactions`` (the
transactional producer's state machine), ``txn_requests`` (coordinator
requests), ``partitioner``,
``consumer`` / ``fetcher`` / ``group`` / ``membership`` (reading, committed
offsets, group membership), ``admin``, ``aio`` (the asyncio clients over the
synchronous ones), ``serde`` (serializers), ``shutdown`` (clients left open
are closed at exit), ``console`` (what the ``txlog`` command prints),
``metadata`` (cluster metadata cache), ``transport`` (gRPC channels, test-only
fault injection), ``requests`` (retry drivers), ``errors`` (exceptions and the
one error-sorting table), ``config``, ``structs`` (value types),
``two_phase`` (the exactly-once protocol of jobs whose tasks write in parallel and commit as one),
``checker`` (``TransactionChecker``: an application's answers to transaction check-back).
"""

from txlog.admin import Admin
from txlog.aio import AIOConsumer, AIOProducer
from txlog.checker import TransactionChecker
from txlog.consumer import Consumer
from txlog.errors import (
    AbortableError,
    BufferExhaustedError,
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    ConcurrentTransactionsError,
    DeliveryTimeoutError,
    FatalError,
    InvalidTxnStateError,
    IoThreadCallError,
    LogTruncationError,
    NoOffsetForPartitionError,
    ProducerFencedError,
    RecordTooLargeError,
    RetriableError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimedOutError,
)
from txlog.membership import GroupMetadata
from txlog.partitioner import DefaultPartitioner
from txlog.producer import Producer
from txlog.protocol.acls import AclBinding, AclFilter
from txlog.release import VERSION as __version__  # noqa: F401 - txlog.__version__, not in __all__ (a str)
from txlog.serde import RecordDeserializationError, SerializationError
from txlog.structs import (
    ClusterDescription,
    ConsumerRecord,
    HangingTransaction,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    ProducerDescription,
    RecordMetadata,
    RegisteredChecker,
    ServiceInstance,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionGroupConfig,
    TransactionHandle,
    TransactionListing,
)
from txlog.transactions import TxnState
from txlog.transport import FaultInjection

__all__ = [
    "AIOConsumer",
    "RecordDeserializationError",
    "SerializationError",
    "AIOProducer",
    "AclBinding",
    "AclFilter",
    "AbortableError",
    "Admin",
    "BufferExhaustedError",
    "ClientClosedError",
    "ClientError",
    "ClientTimeoutError",
    "ConcurrentTransactionsError",
    "Consumer",
    "ClusterDescription",
    "ConsumerRecord",
    "DefaultPartitioner",
    "DeliveryTimeoutError",
    "FatalError",
    "GroupMetadata",
    "FaultInjection",
    "HangingTransaction",
    "InvalidTxnStateError",
    "IoThreadCallError",
    "LogTruncationError",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "Producer",
    "ProducerDescription",
    "ProducerFencedError",
    "RecordMetadata",
    "RecordTooLargeError",
    "RegisteredChecker",
    "ServiceInstance",
    "RetriableError",
    "TopicDescription",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionChecker",
    "TransactionDescription",
    "TransactionGroupConfig",
    "TransactionHandle",
    "TransactionListing",
    "TransactionStateError",
    "TransactionTimedOutError",
    "TxnState",
]
