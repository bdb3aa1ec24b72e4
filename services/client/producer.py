"""The Producer: Kafka's producer API, synchronous for its callers.

``send()`` returns at once with a ``concurrent.futures.Future`` that resolves
to a :class:`RecordMetadata` when the partition leader has the record (or fails
with a :class:`~services.client.errors.ClientError`). Records are batched per
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
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence

from services.client._loop import LoopThread
from services.client.accumulator import RecordAccumulator, record_size_bytes
from services.client.config import ProducerConfig
from services.client.errors import (
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    IoThreadCallError,
    RecordTooLargeError,
    error_for,
)
from services.client.metadata import Metadata
from services.client.partitioner import DefaultPartitioner, Partitioner
from services.client.sender import REQUEST_OVERHEAD_BYTES, Sender, SenderStats
from services.client.structs import TopicPartition, build_record, record_payload_bytes
from services.client.transport import FaultInjection, Transport
from services.errors import ErrorCode


class Producer:
    """Sends records to txlog topics. Thread-safe; use one per process and share
    it, and close it (or use it as a context manager): it owns a thread.

    ``bootstrap``: comma-separated partition_svc addresses (or a list).
    ``acks``: "all" (default; -1), 1 or 0 (offsets then come back as -1).
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
        partitioner: Partitioner | None = None,
        fault_injection: FaultInjection | None = None,
        transport=None,
        tracer_provider=None,
    ):
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
        )
        self._partitioner = partitioner or DefaultPartitioner()
        self._transport = transport or Transport(
            request_timeout_ms=int(request_timeout_ms), fault_injection=fault_injection,
            tracer_provider=tracer_provider)
        self._metadata = Metadata(self._transport, bootstrap, refresh_backoff_ms=retry_backoff_ms,
                                  max_age_ms=metadata_max_age_ms)
        self._accumulator = RecordAccumulator(
            batch_size_bytes=batch_size_bytes, linger_ms=linger_ms, buffer_memory_bytes=buffer_memory_bytes,
            batch_records_max=batch_records_max)
        self._closed = False
        self._loop = LoopThread("txlog-producer")
        self._sender = self._loop.run(self._make_sender(), timeout_s=10, what="starting the producer")
        self._sender_done = self._loop.submit(self._sender.run())

    async def _make_sender(self) -> Sender:
        return Sender(self.config, self._accumulator, self._metadata, self._transport, self._partitioner)

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
        ClientClosedError. Everything else (unknown topic after ``max_block_ms``,
        an oversized record, a full buffer, delivery failures) fails the future."""
        if self._closed:
            raise ClientClosedError("send() on a closed producer")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
            raise ValueError(f"partition must be an int >= 0 or None, not {partition!r}")
        record = build_record(key, value, headers, timestamp_ms)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # a record's fate is not the caller's to cancel
        try:
            self._append(topic, record, partition, future)
        except ClientError as exc:
            future.set_exception(exc)
        return future

    def _append(self, topic: str, record, partition: int | None, future) -> None:
        if self._sender.fatal_error is not None:
            raise self._sender.fatal_error
        size_bytes = record_size_bytes(record)
        limit_bytes = self.config.max_request_size_bytes - REQUEST_OVERHEAD_BYTES - 64
        if size_bytes > limit_bytes:
            raise RecordTooLargeError(
                f"the record takes {size_bytes} bytes, more than max_request_size_bytes allows ({limit_bytes})")
        partition_count = self._partition_count(topic)
        self._check_record_size(topic, record)
        if partition is None:
            key = record.key if record.HasField("key") else None
            partition = self._partitioner.partition(topic, key, partition_count)
        elif partition >= partition_count:
            raise error_for(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                            f"topic {topic!r} has {partition_count} partitions; there is no partition {partition}")
        on_loop = self._loop.in_loop_thread()
        wake = self._accumulator.append(TopicPartition(topic, partition), record, size_bytes, future,
                                        time.monotonic() * 1000,
                                        max_block_ms=0 if on_loop else self.config.max_block_ms)
        if wake:
            self._loop.call_soon(self._sender.wakeup)

    def _partition_count(self, topic: str) -> int:
        count = self._metadata.partition_count(topic)
        if count is not None:
            return count
        info = self._loop.run(self._metadata.wait_for_topic(topic, self.config.max_block_ms),
                              timeout_s=self.config.max_block_ms / 1000 + 5, what=f"waiting for topic {topic!r}")
        return len(info.partitions)

    def _check_record_size(self, topic: str, record) -> None:
        """Fails early a record the topic's ``max.record.bytes`` refuses (the
        leader would reject its whole batch)."""
        info = self._metadata.topic(topic)
        limit = info.configs.get("max.record.bytes") if info is not None else None
        if limit is None or not limit.isdigit():
            return
        payload_bytes = record_payload_bytes(record)
        if payload_bytes > int(limit):
            raise RecordTooLargeError(
                f"the record's key, value and headers take {payload_bytes} bytes, more than max.record.bytes={limit} "
                f"of topic {topic!r}")

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partitions (waiting up to ``max_block_ms`` for its metadata)."""
        return list(range(self._partition_count(topic)))

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
        self._closed = True
        timeout_ms = None if timeout_s is None else timeout_s * 1000
        try:
            self._loop.run(self._sender.close(timeout_ms), what="closing the producer")
            self._loop.run(self._transport.close(), timeout_s=5, what="closing connections")
        finally:
            self._loop.stop()

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
    def stats(self) -> SenderStats:
        return self._sender.stats
