"""The Producer: Kafka's producer API, synchronous for its callers.

``send()`` returns at once with a ``concurrent.futures.Future`` that resolves
to a :class:`RecordMetadata` when the partition leader has the record (or fails
with a :class:`~txlog.errors.ClientError`). Records are batched per
partition (``linger_ms``, ``batch_size_bytes``) and sent by a background event
loop thread, one per Producer.

Guarantees
----------
* With ``enable_idempotence=True`` (the default; needs ``acks="all"``): every
  record whose future succeeds is in its partition exactly once, and the
  records of one partition are in ``send()`` order, across retries, lost
  answers and leader changes (see ``sequences.py``). A future that fails with
  a retriable error after ``delivery_timeout_ms`` may or may not have been
  appended (``DeliveryTimeoutError.maybe_appended``).
* A future resolved after a DUPLICATE_SEQUENCE answer has offset -1: the
  record was appended by an earlier attempt whose answer was lost, longer ago
  than the leader's 5-batch duplicate cache remembers offsets for.
* ``flush()`` returns when every record sent before it has completed;
  ``close()`` flushes, then stops the loop thread; records still unfinished at
  its timeout fail with ClientClosedError.
* Future callbacks run on the producer's I/O thread: keep them short, and do
  not call ``flush()``/``close()`` from them (that raises rather than deadlock).

Without idempotence (``enable_idempotence=False``) batches carry producer id -1
and retries may duplicate or reorder records (at-least-once), as in Kafka.

Transactions
------------
With ``transactional_id`` the producer is transactional (and idempotent), as
Kafka's: ::

    producer = Producer(bootstrap, transactional_id="orders-etl-0")
    producer.init_transactions()          # fences older producers with this id
    producer.begin_transaction()
    producer.send("out", b"...")
    producer.send_offsets_to_transaction({("in", 0): 42}, "orders-etl")
    producer.commit_transaction()         # or abort_transaction()

* The records sent, and the offsets given, between ``begin_transaction()`` and
  a successful ``commit_transaction()`` become visible to ``read_committed``
  readers together, on every partition, or -- aborted -- never.
* ``commit_transaction()`` first waits for every record of the transaction; if
  any failed, it raises TransactionAbortableError and the transaction can only
  be aborted. After ``abort_transaction()`` (or after a successful commit) the
  same producer begins the next transaction.
* Once another producer with the same transactional id has called
  ``init_transactions()``, this one is fenced: its next call (or record)
  fails with ProducerFencedError, and so does every later one; close it.
* ``init_transactions``, ``commit_transaction`` and ``abort_transaction`` wait
  up to ``timeout_s`` (default ``max_block_ms``); on ClientTimeoutError the
  operation goes on in the background, and calling the same method again waits
  for it (Kafka's behaviour). ``close()`` aborts an open transaction, never a
  prepared one (``prepare_transaction()``: its handle's holder decides it).
* Which call is legal in which state is the table in ``transactions.py``; an
  illegal call raises TransactionStateError and changes nothing. ``send()`` in
  a state that does not take records raises at once (not through the future).
* ``send()`` racing ``commit_transaction()``/``abort_transaction()`` from another
  thread is decided by the state check: a record whose ``send()`` passed it is
  part of the transaction being ended; a later one is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from txlog import serde, shutdown
from txlog._loop import LoopThread
from txlog.accumulator import BATCH_OVERHEAD_BYTES, RecordAccumulator, RecordFuture
from txlog.config import ProducerConfig, checked_prepare_metadata
from txlog.errors import (
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    FatalError,
    IoThreadCallError,
    ProducerFencedError,
    RecordTooLargeError,
    TransactionStateError,
    error_for,
)
from txlog.membership import GroupMetadata
from txlog.metadata import Metadata, TopicInfo
from txlog.partitioner import DefaultPartitioner, Partitioner
from txlog.protocol import names
from txlog.protocol.errors import ErrorCode
from txlog.protocol.names import GROUP_ID_CHARS_MAX
from txlog.protocol.retry import RetryPolicy
from txlog.sender import REQUEST_OVERHEAD_BYTES, Sender, SenderStats
from txlog.structs import TopicPartition, TransactionHandle, as_tp, encode_record, to_bytes
from txlog.transactions import SENDING_STATES, Call, TransactionManager, TxnState, Verdict
from txlog.transport import FaultInjection, Transport, tls_files
from txlog.txn_requests import (
    AddOffsetsHandler,
    CoordinatorClient,
    EndTxnHandler,
    InitProducerIdHandler,
    PrepareTransactionHandler,
    StopRetrying,
    TxnOffsetCommitHandler,
)

ROUTES_MAX = 10_000  # topics whose routes a producer keeps (more: forgotten, read again from the metadata)


class _Route(NamedTuple):
    """What send() needs of a topic's metadata, read once per version of it."""

    info: TopicInfo  # the metadata it was read from: a refresh that changes the topic replaces it
    tps: tuple[TopicPartition, ...]  # one per partition
    record_bytes_max: int | None  # the topic's max.record.bytes, if set


def _failed_future(error: ClientError) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()  # born running, as a queued record's future
    future.set_exception(error)
    return future


class Producer:
    """Sends records to txlog topics. Thread-safe; use one per process and share
    it, and close it (or use it as a context manager): it owns a thread.

    ``bootstrap``: comma-separated partition_svc addresses (or a list).
    ``acks``: "all" (default; -1), 1 or 0 (offsets then come back as -1).
    ``transactional_id``: makes the producer transactional (module docstring);
    ``transaction_timeout_ms``: how long a transaction may stay open before the
    coordinator aborts it (at most the coordinator's maximum, 15 min by default).
    ``compression_type``: "none" (the default), "gzip", "zstd" or "lz4" (Kafka's
    names): each batch's records are compressed once, when it is first sent, and
    a retry re-sends the same bytes; the topic's compression.type may store it
    otherwise (the leader re-encodes it).
    ``implicit_partition_adds``: True (the default): a transaction's partitions
    are added at the coordinator by their leaders, with the first batch there
    (Transactions V2, KIP-890 part 2), saving a round trip per transaction;
    False: AddPartitionsToTxn first, for clusters older than this release.
    ``client_id``: names this client to the servers (Kafka's client.id), what
    client quotas are set on; a client over its quota gets its answers late
    (``throttle_time_ms``), never an error.
    ``fault_injection``: test-only (see ``transport.FaultInjection``); ``transport``:
    a test seam replacing the gRPC transport."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        enable_idempotence: bool = True,
        acks: str | int = "all",
        linger_ms: float = 5,
        batch_size_bytes: int = 1_048_576,
        batch_records_max: int = 10_000,
        max_in_flight: int = 5,
        retries: int = 2**31 - 1,
        retry_backoff_ms: float = 100,
        retry_backoff_max_ms: float = 1000,
        delivery_timeout_ms: float = 120_000,
        request_timeout_ms: float = 30_000,
        max_request_size_bytes: int = 4 * 1024 * 1024,
        buffer_memory_bytes: int = 32 * 1024 * 1024,
        max_block_ms: float = 60_000,
        metadata_max_age_ms: float = 300_000,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        compression_type: str = "none",
        partitioner: Partitioner | None = None,
        fault_injection: FaultInjection | None = None,
        transport=None,
        tracer_provider=None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token_file: str | None = None,
        key_serializer: str | serde.Serializer | None = None,
        value_serializer: str | serde.Serializer | None = None,
        implicit_partition_adds: bool = True,
        client_id: str = "",
    ):
        self._key_serializer = serde.serializer(key_serializer, "key_serializer")
        self._value_serializer = serde.serializer(value_serializer, "value_serializer")
        self.config = ProducerConfig(
            enable_idempotence=enable_idempotence,
            acks=ProducerConfig.parse_acks(acks),
            linger_ms=linger_ms,
            batch_size_bytes=batch_size_bytes,
            batch_records_max=batch_records_max,
            max_in_flight=max_in_flight,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            max_request_size_bytes=max_request_size_bytes,
            buffer_memory_bytes=buffer_memory_bytes,
            max_block_ms=max_block_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            compression_type=compression_type,
            implicit_partition_adds=implicit_partition_adds,
        )
        self._partitioner = partitioner or DefaultPartitioner()
        self._transport = transport or Transport(
            request_timeout_ms=int(request_timeout_ms), fault_injection=fault_injection,
            tracer_provider=tracer_provider, tls_files=tls_files(tls_ca, tls_cert, tls_key, token_file), client_id=client_id)
        self._metadata = Metadata(self._transport, bootstrap, refresh_backoff_ms=retry_backoff_ms,
                                  max_age_ms=metadata_max_age_ms)
        self._accumulator = RecordAccumulator(
            batch_size_bytes=batch_size_bytes, linger_ms=linger_ms, buffer_memory_bytes=buffer_memory_bytes,
            batch_records_max=batch_records_max)
        self._closed = False
        # a record may take what a request holds besides its own fields and one batch's
        self._record_bytes_max = max_request_size_bytes - REQUEST_OVERHEAD_BYTES - BATCH_OVERHEAD_BYTES
        self._routes: dict[str, _Route] = {}  # by topic (send() is hot: a topic's metadata is read once)
        self._txn = TransactionManager(transactional_id, transaction_timeout_ms, implicit_partition_adds) if transactional_id else None
        self._coordinator: CoordinatorClient | None = None
        self._offsets_tasks: set[asyncio.Task] = set()  # send_offsets_to_transaction operations (loop thread)
        self._loop = LoopThread("txlog-producer")
        self._sender = self._loop.run(self._make_sender(), timeout_s=10, what="starting the producer")
        self._sender_done = self._loop.submit(self._sender.run())
        shutdown.close_at_exit(self)  # left open, it is closed at interpreter exit

    async def _make_sender(self) -> Sender:
        self._loop_thread_id = threading.get_ident()  # send() from it must not block (max_block_ms 0)
        if self._txn is not None:
            self._coordinator = CoordinatorClient(
                self._metadata, self._transport, self._txn.transactional_id,
                request_timeout_ms=self.config.request_timeout_ms,
                backoff=RetryPolicy(backoff_initial_ms=self.config.retry_backoff_ms,
                                    backoff_max_ms=self.config.retry_backoff_max_ms))
        return Sender(self.config, self._accumulator, self._metadata, self._transport, self._partitioner,
                      txn=self._txn, coordinator=self._coordinator)

    # --- sending -----------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value=None,
        key=None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future:
        """Queues one record; the future resolves to its RecordMetadata.

        Bad arguments raise TypeError/ValueError; a closed producer raises
        ClientClosedError; a transactional producer raises at once when its
        state takes no records (TransactionStateError outside a transaction,
        TransactionAbortableError after a failure, ProducerFencedError once
        fenced). Everything else (unknown topic after ``max_block_ms``, an
        oversized record, a full buffer, delivery failures) fails the future."""
        if self._closed:
            raise ClientClosedError("send() on a closed producer")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
            raise ValueError(f"partition must be an int >= 0 or None, not {partition!r}")
        if self._key_serializer is not None:
            key = serde.serialized(self._key_serializer, key, "key")
        if self._value_serializer is not None:
            value = serde.serialized(self._value_serializer, value, "value")
        if key is not None and key.__class__ is not bytes:
            key = to_bytes(key, "key")
        if value is not None and value.__class__ is not bytes:
            value = to_bytes(value, "value")
        record, payload_bytes = encode_record(key, value, headers, timestamp_ms)
        txn = self._txn
        if txn is None:
            try:
                return self._append(topic, key, record, payload_bytes, timestamp_ms or 0, partition)
            except ClientError as exc:
                return _failed_future(exc)
        txn.enter_send()
        try:
            try:
                return self._append(topic, key, record, payload_bytes, timestamp_ms or 0, partition)
            except ClientError as exc:  # a transaction missing a record must not commit (as in Kafka)
                if isinstance(exc, ProducerFencedError):
                    txn.on_fatal_error(exc)
                else:
                    txn.on_abortable_error(exc)
                return _failed_future(exc)
        finally:
            txn.exit_send()

    def _append(self, topic: str, key: bytes | None, record: bytes, payload_bytes: int, timestamp_ms: int,
                partition: int | None) -> RecordFuture:
        if self._sender.fatal_error is not None:
            raise self._sender.fatal_error
        size_bytes = len(record)
        if size_bytes > self._record_bytes_max:
            raise RecordTooLargeError(f"the record takes {size_bytes} bytes, more than max_request_size_bytes "
                                      f"allows ({self._record_bytes_max})")
        route = self._routes.get(topic)
        if route is None or route.info is not self._metadata.topic(topic):
            route = self._route(topic)
        if route.record_bytes_max is not None and payload_bytes > route.record_bytes_max:
            raise RecordTooLargeError(
                f"the record's key, value and headers take {payload_bytes} bytes, more than "
                f"max.record.bytes={route.record_bytes_max} of topic {topic!r}")
        tps = route.tps
        if partition is None:
            partition = self._partitioner.partition(topic, key, len(tps))
        elif partition >= len(tps):
            raise error_for(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                            f"topic {topic!r} has {len(tps)} partitions; there is no partition {partition}")
        tp = tps[partition] if 0 <= partition < len(tps) else TopicPartition(topic, partition)
        new_partition = self._txn is not None and self._txn.maybe_add_partition(tp)
        on_loop = threading.get_ident() == self._loop_thread_id
        future, wake = self._accumulator.append(tp, record, timestamp_ms, time.monotonic() * 1000,
                                                max_block_ms=0 if on_loop else self.config.max_block_ms)
        if wake or new_partition:
            self._loop.call_soon(self._sender.wakeup)
        return future

    def _route(self, topic: str) -> _Route:
        """Where the records of ``topic`` may go, from its metadata (waiting up to
        ``max_block_ms`` for it); kept until the metadata of the topic changes."""
        info = self._metadata.topic(topic)
        if info is None or not info.exists:
            info = self._loop.run(self._metadata.wait_for_topic(topic, self.config.max_block_ms),
                                  timeout_s=self.config.max_block_ms / 1000 + 5, what=f"waiting for topic {topic!r}")
        limit = info.configs.get("max.record.bytes")
        route = _Route(info, tuple(TopicPartition(topic, p) for p in range(len(info.partitions))),
                       int(limit) if limit is not None and limit.isdigit() else None)
        if len(self._routes) >= ROUTES_MAX:
            self._routes.clear()
        self._routes[topic] = route
        return route

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partitions (waiting up to ``max_block_ms`` for its metadata)."""
        return list(range(len(self._route(topic).tps)))

    # --- flushing and closing ---------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> None:
        """Sends everything queued now and waits until those records complete
        (successfully or not); ClientTimeoutError after ``timeout_s``."""
        if self._loop.in_loop_thread():
            raise IoThreadCallError("flush() cannot block on the producer's own I/O thread (from a callback?)")
        pending = self._accumulator.begin_flush()
        try:
            self._loop.call_soon(self._sender.wakeup)
            _, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
            if not_done:
                raise ClientTimeoutError(f"flush: {len(not_done)} batch(es) still unfinished after {timeout_s} s")
        finally:
            self._accumulator.end_flush()

    def close(self, timeout_s: float | None = None) -> None:
        """Flushes (up to ``timeout_s``; None: until the delivery timeouts decide),
        then releases the loop thread and connections. Idempotent."""
        if self._closed:
            return
        if self._loop.in_loop_thread():
            raise IoThreadCallError("close() cannot block on the producer's own I/O thread (from a callback?)")
        if self._txn is not None:
            self._end_transaction_for_close(timeout_s)
        self._closed = True
        timeout_ms = None if timeout_s is None else timeout_s * 1000
        try:
            self._loop.run(self._sender.close(timeout_ms), what="closing the producer")
            self._loop.run(self._transport.close(), timeout_s=5, what="closing connections")
        finally:
            self._loop.stop()
            shutdown.closed(self)

    def metrics(self) -> dict[str, float]:
        """This producer's figures since it started (Kafka's producer metrics):
        requests sent and failed, their latency (average and max, ms), batches
        sent and retried, records acknowledged and failed, bytes acknowledged,
        the average batch size and records per request, the buffer's total and
        available bytes, producer id inits and resets."""
        figures = self._sender.stats.snapshot()
        figures["buffer_total_bytes"] = self._accumulator.buffer_memory_bytes
        figures["buffer_available_bytes"] = self._accumulator.buffer_memory_bytes - self._accumulator.buffered_bytes
        return figures

    def close_at_exit(self, timeout_s: float) -> None:
        self.close(timeout_s)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- observation -------------------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        """The producer id in use (-1 before the first InitProducerId, or without idempotence)."""
        return self._sender.producer_id

    @property
    def producer_epoch(self) -> int:
        """The producer epoch in use (-1 before the first InitProducerId); a
        transactional producer's grows at every commit or abort."""
        return self._sender.producer_epoch

    @property
    def transaction_state(self) -> TxnState | None:
        """The transactional producer's state (None without ``transactional_id``)."""
        return None if self._txn is None else self._txn.state

    @property
    def stats(self) -> SenderStats:
        return self._sender.stats

    # --- transactions ----------------------------------------------------------------------------

    def _transactional(self, call: Call) -> TransactionManager:
        if self._txn is None:
            raise TransactionStateError(
                f"{call.value} needs a transactional producer: create it with Producer(..., transactional_id=...)")
        if self._closed:
            raise ClientClosedError(f"{call.value} on a closed producer")
        if self._loop.in_loop_thread():
            raise IoThreadCallError(f"{call.value} cannot block on the producer's own I/O thread (from a callback?)")
        return self._txn

    def init_transactions(self, timeout_s: float | None = None) -> None:
        """Registers the transactional id with its coordinator and takes a
        producer id and epoch: every older producer with this id is fenced, and
        a transaction it left open is aborted. Call it once, first. A fatal
        answer (an invalid id or timeout) raises and makes the producer fatal."""
        txn = self._transactional(Call.INIT)
        if txn.start(Call.INIT) is Verdict.STARTED:
            self._run_operation(txn, self._init_operation())
        self._wait_operation(txn, Call.INIT, timeout_s)

    def begin_transaction(self) -> None:
        """Opens a transaction (locally: the coordinator hears of it with its first
        partition or offsets)."""
        self._transactional(Call.BEGIN).start(Call.BEGIN)

    def send_offsets_to_transaction(self, offsets: Mapping, group_id: str | GroupMetadata, timeout_s: float | None = None) -> None:
        """Commits ``offsets`` ({(topic, partition): next offset to consume}) for
        consumer group ``group_id`` as part of the open transaction: they become
        the group's committed offsets when, and only if, the transaction commits.
        Pass a subscribed consumer's ``group_metadata()`` instead of the group id
        and the coordinator refuses the commit if that member was fenced
        meanwhile (KIP-447: STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID).
        Failures make the transaction abortable (TransactionAbortableError)."""
        member = group_id if isinstance(group_id, GroupMetadata) else GroupMetadata(group_id)
        group_id = member.group_id
        txn = self._transactional(Call.SEND_OFFSETS)
        if not names.is_group_id(group_id):
            raise ValueError(f"group_id must be 1 to {GROUP_ID_CHARS_MAX} characters of [a-zA-Z0-9._-] "
                             f"(INVALID_GROUP_ID), not {group_id!r}")
        checked: dict[TopicPartition, int] = {}
        for key, offset in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"the offset of {key!r} must be an int >= 0 (the next offset to consume), "
                                 f"not {offset!r}")
            checked[as_tp(key)] = offset
        if not checked:
            return
        txn.check(Call.SEND_OFFSETS)
        future = self._loop.submit(self._send_offsets_operation(checked, member))
        timeout = self._operation_timeout_s(timeout_s)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ClientTimeoutError(
                f"send_offsets_to_transaction() did not finish within {timeout:.3f} s; it goes on in the "
                "background and commit_transaction() waits for it") from None

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Sends every record of the transaction, waits for them, then commits
        (EndTxn): on return the transaction is committed for good; its records
        and offsets become visible to read_committed readers once the coordinator
        has written its markers, a moment later (as in Kafka). If a record or
        request of the transaction failed, raises TransactionAbortableError:
        call abort_transaction()."""
        txn = self._transactional(Call.COMMIT)
        if txn.start(Call.COMMIT) is Verdict.STARTED:
            txn.wait_sends_done()
            self._run_operation(txn, self._commit_operation())
        self._wait_operation(txn, Call.COMMIT, timeout_s)

    def prepare_transaction(self, prepared_timeout_ms: int = 0, timeout_s: float | None = None, *,
                            metadata: bytes = b"") -> TransactionHandle:
        """Sends every record of the transaction, waits for them, then moves the
        transaction to Prepared (two-phase participation) and returns its handle.
        The outcome is decided later, by whoever holds the handle:
        ``Admin.complete_transaction(handle, commit)``, or
        ``Admin.commit_transaction_group(group, handles)`` for several at once.
        A prepared transaction survives the transaction timeout and this
        producer's close(); the coordinator aborts it only after
        ``prepared_timeout_ms`` (0: its ``prepared_transaction_timeout_ms``,
        default 24 h), or when a new producer with this transactional id calls
        init_transactions(). Until then it holds the last stable offset of its
        partitions. This producer can still commit_transaction() or
        abort_transaction() it itself; it takes no new transaction.

        ``metadata`` (bytes, at most ``PREPARE_METADATA_BYTES_MAX`` = 4096) is
        kept durably with the Prepared state and handed to the transaction
        group's checker if the coordinator checks the transaction back (see
        :class:`~txlog.checker.TransactionChecker`): say what lets
        the application find its own outcome, such as its database transaction
        id. Every attempt of this prepare sends the same bytes; calling
        prepare_transaction() again to wait for it (after ClientTimeoutError)
        with other metadata raises ValueError."""
        if not isinstance(prepared_timeout_ms, int) or isinstance(prepared_timeout_ms, bool) or prepared_timeout_ms < 0:
            raise ValueError(f"prepared_timeout_ms must be an int >= 0 (0: the coordinator's default), "
                             f"not {prepared_timeout_ms!r}")
        metadata = checked_prepare_metadata(metadata)
        txn = self._transactional(Call.PREPARE)
        if txn.start(Call.PREPARE, metadata) is Verdict.STARTED:
            txn.wait_sends_done()
            self._run_operation(txn, self._prepare_operation(prepared_timeout_ms, metadata))
        self._wait_operation(txn, Call.PREPARE, timeout_s)
        assert txn.handle is not None
        return txn.handle

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Aborts the open (or failed) transaction: records not sent yet fail
        with TransactionAbortedError, records in flight finish, then EndTxn
        marks the transaction aborted everywhere. The producer goes on."""
        txn = self._transactional(Call.ABORT)
        if txn.start(Call.ABORT) is Verdict.STARTED:
            txn.wait_sends_done()
            self._run_operation(txn, self._abort_operation())
        self._wait_operation(txn, Call.ABORT, timeout_s)

    def _operation_timeout_s(self, timeout_s: float | None) -> float:
        return self.config.max_block_ms / 1000 if timeout_s is None else timeout_s

    def _run_operation(self, txn: TransactionManager, coro) -> None:
        """Runs an init/commit/abort on the loop; its outcome goes to ``txn.operation``."""
        operation = txn.operation
        assert operation is not None

        def settle(done: concurrent.futures.Future) -> None:
            if done.cancelled():
                operation.set_exception(ClientClosedError("the producer was closed during the operation"))
            elif done.exception() is not None:
                operation.set_exception(done.exception())
            else:
                operation.set_result(None)

        try:
            self._loop.submit(coro).add_done_callback(settle)
        except ClientClosedError as exc:
            operation.set_exception(exc)

    def _wait_operation(self, txn: TransactionManager, call: Call, timeout_s: float | None) -> None:
        operation = txn.operation
        assert operation is not None
        timeout = self._operation_timeout_s(timeout_s)
        try:
            operation.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ClientTimeoutError(
                f"{call.value} did not finish within {timeout:.3f} s; it goes on in the background: "
                f"call {call.value} again to wait for it") from None

    async def _init_operation(self) -> None:
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        try:
            producer_id, producer_epoch = await coordinator.send(
                InitProducerIdHandler(txn.transactional_id, txn.transaction_timeout_ms), producer_epoch=-1)
        except ClientError as exc:
            fatal = exc if isinstance(exc, FatalError) else FatalError(
                exc.code, f"init_transactions() failed: {exc.message}; close the producer")
            txn.on_fatal_error(fatal)
            raise fatal  # noqa: B904 -- the context is exc
        self._sender.reset_producer(producer_id, producer_epoch)
        txn.initialized(producer_id, producer_epoch)

    async def _send_offsets_operation(self, offsets: dict[TopicPartition, int], member: GroupMetadata) -> None:
        group_id = member.group_id
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        task = asyncio.current_task()
        self._offsets_tasks.add(task)
        try:
            txn.check(Call.SEND_OFFSETS)
            producer_id, producer_epoch = txn.producer_id, txn.producer_epoch
            keep_going = lambda: txn.state in SENDING_STATES  # noqa: E731
            try:
                txn.note_offsets_added()
                await coordinator.send(AddOffsetsHandler(txn.transactional_id, producer_id, producer_epoch, group_id),
                                       producer_epoch=producer_epoch, keep_going=keep_going)
                await coordinator.send(
                    TxnOffsetCommitHandler(txn.transactional_id, producer_id, producer_epoch, group_id, offsets, member),
                    producer_epoch=producer_epoch, keep_going=keep_going)
            except StopRetrying:
                raise txn.error_unless(TxnState.IN_TRANSACTION) or TransactionStateError(
                    f"send_offsets_to_transaction() in state {txn.state.name}: the transaction ended meanwhile") \
                    from None
            except ClientError as exc:
                txn.on_coordinator_error(exc)
                raise txn.error_unless(TxnState.IN_TRANSACTION) or exc  # noqa: B904 -- the context is exc
        finally:
            self._offsets_tasks.discard(task)

    async def _flush_transaction(self) -> None:
        pending = self._accumulator.begin_flush()
        try:
            self._sender.wakeup()
            if pending:
                await asyncio.wait([asyncio.wrap_future(f) for f in pending])
        finally:
            self._accumulator.end_flush()

    async def _commit_operation(self) -> None:
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        if self._offsets_tasks:
            await asyncio.gather(*list(self._offsets_tasks), return_exceptions=True)
        await self._flush_transaction()
        error = txn.error_unless(TxnState.COMMITTING)
        if error is not None:
            raise error
        producer_id, producer_epoch = txn.producer_id, txn.producer_epoch
        if txn.coordinator_touched:
            try:
                producer_id, producer_epoch = await coordinator.send(
                    EndTxnHandler(txn.transactional_id, producer_id, producer_epoch, committed=True),
                    producer_epoch=producer_epoch)
            except ClientError as exc:
                txn.on_coordinator_error(exc)
                raise txn.error_unless(TxnState.COMMITTING) or exc  # noqa: B904 -- the context is exc
        self._sender.reset_producer(producer_id, producer_epoch)
        if not txn.completed(producer_id, producer_epoch):
            raise txn.error_unless(TxnState.READY)

    async def _prepare_operation(self, prepared_timeout_ms: int, metadata: bytes) -> None:
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        if self._offsets_tasks:
            await asyncio.gather(*list(self._offsets_tasks), return_exceptions=True)
        await self._flush_transaction()
        error = txn.error_unless(TxnState.PREPARING)
        if error is not None:
            raise error
        try:
            txn.note_offsets_added()  # the coordinator has the transaction now, even an empty one
            handle = await coordinator.send(
                PrepareTransactionHandler(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                          prepared_timeout_ms, metadata), producer_epoch=txn.producer_epoch)
        except ClientError as exc:
            txn.on_coordinator_error(exc)
            raise txn.error_unless(TxnState.PREPARING) or exc  # noqa: B904 -- the context is exc
        if not txn.prepared(handle):
            raise txn.error_unless(TxnState.PREPARED)

    async def _abort_operation(self) -> None:
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        for task in list(self._offsets_tasks):
            task.cancel()
        if self._offsets_tasks:
            await asyncio.gather(*list(self._offsets_tasks), return_exceptions=True)
        self._sender.drop_unsent()
        await self._sender.wait_in_flight()
        self._sender.drop_unsent()
        producer_id, producer_epoch = txn.producer_id, txn.producer_epoch
        if txn.coordinator_touched:
            try:
                producer_id, producer_epoch = await coordinator.send(
                    EndTxnHandler(txn.transactional_id, producer_id, producer_epoch, committed=False),
                    producer_epoch=producer_epoch)
            except ProducerFencedError as exc:
                txn.on_fatal_error(exc)
                raise
            except ClientError as exc:
                if isinstance(exc, FatalError):
                    txn.on_fatal_error(exc)
                    raise
                # The coordinator has no transaction to abort at this epoch (it timed
                # out, ...): bump the epoch with the id we hold instead (KIP-360).
                producer_id, producer_epoch = await self._bump_epoch(txn, coordinator, exc)
        self._sender.reset_producer(producer_id, producer_epoch)
        if not txn.completed(producer_id, producer_epoch):
            raise txn.error_unless(TxnState.READY)

    async def _bump_epoch(self, txn: TransactionManager, coordinator: CoordinatorClient,
                          cause: ClientError) -> tuple[int, int]:
        try:
            return await coordinator.send(
                InitProducerIdHandler(txn.transactional_id, txn.transaction_timeout_ms, txn.producer_id,
                                      txn.producer_epoch), producer_epoch=txn.producer_epoch)
        except ClientError as exc:
            fatal = exc if isinstance(exc, FatalError) else FatalError(
                exc.code, f"abort_transaction() could not end the transaction ({cause}) nor bump the producer "
                          f"epoch ({exc.message}); close the producer")
            txn.on_fatal_error(fatal)
            raise fatal  # noqa: B904 -- the context is exc

    def _end_transaction_for_close(self, timeout_s: float | None) -> None:
        """close(): an open or failed transaction is aborted (as Kafka's producer
        does on a graceful close); an operation in progress is waited for."""
        txn = self._txn
        assert txn is not None
        try:
            if txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
                self.abort_transaction(timeout_s)
            elif txn.state in (TxnState.INITIALIZING, TxnState.COMMITTING, TxnState.ABORTING, TxnState.PREPARING):
                assert txn.operation is not None
                txn.operation.result(self._operation_timeout_s(timeout_s))
        except (ClientError, concurrent.futures.TimeoutError):
            pass  # closing anyway; the coordinator aborts what is left open at its timeout
