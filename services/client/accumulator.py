"""Per-partition batching of produced records (Kafka's RecordAccumulator).

Guarantees
----------
* Records of one partition are batched in ``send()`` order, and batches are
  drained in the order they were created: the order of ``send()`` calls on a
  partition is the order of its records in the batches.
* A batch is *ready* (may be drained by the sender) when it holds at least
  ``batch_size_bytes`` or ``batch_records_max`` records, when another batch of its partition was started behind
  it (it cannot grow any more), when it is ``linger_ms`` old, or while a flush
  or close is in progress. A record larger than ``batch_size_bytes`` gets a
  batch of its own.
* Memory is bounded: the records of unfinished batches take at most
  ``buffer_memory_bytes``; ``append`` waits up to ``max_block_ms`` for room and
  then fails with BufferExhaustedError. Memory is given back when the sender
  finishes a batch (:meth:`RecordAccumulator.release`).
* No clock is read here: callers pass ``now_ms``. All methods are thread-safe
  (user threads append, the sender's loop thread drains).
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services import compression as compression_codecs
from services.client.errors import BufferExhaustedError, ClientClosedError
from services.client.structs import RecordMetadata, TopicPartition, record_payload_bytes
from services.stubs.txlog.v1 import common_pb2

RECORD_FRAMING_BYTES = 6  # a Record's field tag and length prefix inside its RecordBatch
BATCH_OVERHEAD_BYTES = 64  # a PartitionBatch's fixed fields and framing inside a ProduceRequest
# At most, besides the key's and value's bytes: a timestamp (tag and a 10-byte varint), the key's and
# the value's tags and length prefixes (1 + 5 each), and the record's own framing.
RECORD_FIELDS_BYTES_MAX = 11 + 12 + RECORD_FRAMING_BYTES
HEADER_FIELDS_BYTES_MAX = 18  # a header's framing, and its name's and value's tags and length prefixes


def record_size_bytes(record: common_pb2.Record, payload_bytes: int | None = None) -> int:
    """What the record takes in a request, at most (never less than its
    serialized size and framing), counted from its fields' lengths (protobuf's
    ByteSize walked the record and was a sixth of send()'s time):
    ``payload_bytes`` (record_payload_bytes, counted here when not given) and
    the fields' overhead."""
    if payload_bytes is None:
        payload_bytes = record_payload_bytes(record)
    return payload_bytes + RECORD_FIELDS_BYTES_MAX + HEADER_FIELDS_BYTES_MAX * len(record.headers)


class BatchState(enum.Enum):
    """Where a batch is; see ``sequences.py`` for the transitions after QUEUED."""

    QUEUED = "queued"  # in the accumulator, may still grow
    IN_FLIGHT = "in_flight"  # in a Produce request that has not been answered
    AWAITING_RETRY = "awaiting_retry"  # failed retriably; will be sent again in sequence order
    HELD = "held"  # rejected and known not appended; waits for a new producer id
    DONE = "done"  # its futures are resolved


@dataclass(eq=False)
class ProducerBatch:
    """Records of one partition sent (and retried) together as one RecordBatch."""

    tp: TopicPartition
    created_ms: float
    records: list[common_pb2.Record] = field(default_factory=list)
    futures: list[concurrent.futures.Future] = field(default_factory=list)
    size_bytes: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attempts: int = 0
    last_error: str = ""  # the retriable error of its last attempt: what an expiry says it was waiting for
    retry_at_ms: float = 0.0
    order: int = -1  # position among the partition's sequenced batches (set by sequences.py)
    state: BatchState = BatchState.QUEUED
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    compressed_records: bytes | None = None  # made on the first fill() with a codec; every retry sends these bytes

    @property
    def record_count(self) -> int:
        return len(self.records)

    def fill(self, target: common_pb2.RecordBatch, *, is_transactional: bool = False, compression: int = 0) -> None:
        """Writes the batch into ``target`` (a request's own RecordBatch: one copy of the records, not two).
        With a ``compression`` codec, its records are compressed the first time (a batch is drained
        whole: it no longer grows) and the same bytes go into every retry (same sequence, same bytes)."""
        target.producer_id = self.producer_id
        target.producer_epoch = self.producer_epoch
        target.base_sequence = self.base_sequence
        target.is_transactional = is_transactional
        if not compression:
            target.records.extend(self.records)
            return
        if self.compressed_records is None:
            self.compressed_records = compression_codecs.compress_records(compression, self.records)
        target.compression = compression
        target.compressed_records = self.compressed_records

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Resolves every record's future; ``base_offset`` -1 means unknown."""
        self.state = BatchState.DONE
        topic, partition = self.tp.topic, self.tp.partition
        append_time_ms = log_append_time_ms if log_append_time_ms > 0 else -1
        results = [RecordMetadata(topic, partition, base_offset + index if base_offset >= 0 else -1,
                                  record.timestamp_ms or append_time_ms) for index, record in enumerate(self.records)]
        _settle(self.futures, results, None)
        _resolve(self.done, result=None)

    def fail(self, error: BaseException) -> None:
        self.state = BatchState.DONE
        _settle(self.futures, None, error)
        _resolve(self.done, result=None)


class RecordFuture(concurrent.futures.Future):
    """A record's future: a real concurrent.futures.Future (``wait``,
    ``as_completed`` and ``asyncio.wrap_future`` take it) that shares one
    condition with the other records of its producer and is born running
    (a record's fate is not the caller's to cancel). A Future of its own made
    a Condition and an RLock per record: a quarter of ``send()``'s time."""

    def __init__(self, condition: threading.Condition):  # no super().__init__(): it would make a condition of its own
        self._condition = condition
        self._state = _RUNNING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []


# concurrent.futures' own states (CPython's _base module): RecordFuture and
# _settle set them as Future.set_result / set_exception do.
_RUNNING, _FINISHED = concurrent.futures._base.RUNNING, concurrent.futures._base.FINISHED
_SETTLED = (concurrent.futures._base.CANCELLED, concurrent.futures._base.CANCELLED_AND_NOTIFIED, _FINISHED)


def _settle(futures: list, results: list | None, error: BaseException | None) -> None:
    """Resolves a batch's futures: RecordFutures of one condition under one
    acquisition of it and one notify_all, the callbacks run after it (as
    Future.set_result does, one future at a time); any other future alone."""
    condition = futures[0]._condition if futures and type(futures[0]) is RecordFuture else None
    if condition is None or any(type(f) is not RecordFuture or f._condition is not condition for f in futures):
        for index, future in enumerate(futures):
            _resolve(future, result=None if results is None else results[index], error=error)
        return
    called = []
    with condition:
        for index, future in enumerate(futures):
            if future._state in _SETTLED:
                continue
            if error is not None:
                future._exception = error
            else:
                future._result = results[index]
            future._state = _FINISHED
            for waiter in future._waiters:
                if error is not None:
                    waiter.add_exception(future)
                else:
                    waiter.add_result(future)
            if future._done_callbacks:
                called.append(future)
        condition.notify_all()
    for future in called:
        future._invoke_callbacks()


def _resolve(future: concurrent.futures.Future, *, result=None, error: BaseException | None = None) -> None:
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # resolved concurrently (cancelled by its owner)
        pass


class RecordAccumulator:
    """Open and queued batches, per partition, bounded in memory."""

    def __init__(
        self,
        *,
        batch_size_bytes: int,
        linger_ms: float,
        buffer_memory_bytes: int,
        batch_records_max: int = 10_000,
        clock_ms: Callable[[], float] | None = None,
    ):
        self.batch_size_bytes = batch_size_bytes
        self.batch_records_max = batch_records_max
        self.linger_ms = linger_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._buffered_bytes = 0
        self._flushes_in_progress = 0
        self._closed = False
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)

    # --- user threads ----------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        record: common_pb2.Record,
        size_bytes: int,
        future: concurrent.futures.Future,
        now_ms: float,
        *,
        max_block_ms: float = 0.0,
    ) -> bool:
        """Adds a record to the partition's open batch (or a new one).

        Returns True when the sender should wake up: a batch was started (its
        linger timer starts) or became full. Waits up to ``max_block_ms`` for
        buffer memory, then raises BufferExhaustedError."""
        if size_bytes > self.buffer_memory_bytes:
            raise BufferExhaustedError(
                f"a record of {size_bytes} bytes can never fit buffer_memory_bytes={self.buffer_memory_bytes}")
        with self._room:
            if self._buffered_bytes + size_bytes > self.buffer_memory_bytes and max_block_ms > 0:
                deadline_ms = self._clock_ms() + max_block_ms
                while self._buffered_bytes + size_bytes > self.buffer_memory_bytes and not self._closed:
                    remaining_ms = deadline_ms - self._clock_ms()
                    if remaining_ms <= 0:
                        break
                    self._room.wait(remaining_ms / 1000)
            if self._closed:
                raise ClientClosedError("the producer is closed")
            if self._buffered_bytes + size_bytes > self.buffer_memory_bytes:
                raise BufferExhaustedError(
                    f"buffer_memory_bytes={self.buffer_memory_bytes} stayed full for max_block_ms={max_block_ms:.0f}; "
                    "the cluster is slower than send(), or unreachable")
            queue = self._queues.setdefault(tp, deque())
            last = queue[-1] if queue else None
            wake = False
            if last is None or len(last.records) >= self.batch_records_max \
                    or (last.records and last.size_bytes + size_bytes > self.batch_size_bytes):
                last = ProducerBatch(tp, now_ms)
                queue.append(last)
                self._incomplete.add(last)
                wake = True
            last.records.append(record)
            last.futures.append(future)
            last.size_bytes += size_bytes
            self._buffered_bytes += size_bytes
            return wake or self._full(last)

    def _full(self, batch: ProducerBatch) -> bool:
        return batch.size_bytes >= self.batch_size_bytes or len(batch.records) >= self.batch_records_max

    def begin_flush(self) -> list[concurrent.futures.Future]:
        """Makes every batch ready until :meth:`end_flush`; returns the done-futures
        of the batches unfinished now (a flush waits for exactly these)."""
        with self._lock:
            self._flushes_in_progress += 1
            return [batch.done for batch in self._incomplete]

    def end_flush(self) -> None:
        with self._lock:
            self._flushes_in_progress -= 1

    def close(self) -> None:
        """No more appends; every queued batch is ready from now on."""
        with self._room:
            self._closed = True
            self._room.notify_all()

    # --- the sender's loop thread ------------------------------------------------

    def ready(self, now_ms: float) -> tuple[list[TopicPartition], float | None]:
        """Partitions whose first batch may be drained, and how long until the next
        one becomes ready by lingering (None: no batch is waiting)."""
        ready, next_ms = [], None
        with self._lock:
            hurry = self._flushes_in_progress > 0 or self._closed
            for tp, queue in self._queues.items():
                if not queue:
                    continue
                first = queue[0]
                waited_ms = now_ms - first.created_ms
                if hurry or len(queue) > 1 or self._full(first) or waited_ms >= self.linger_ms:
                    ready.append(tp)
                else:
                    wait_ms = self.linger_ms - waited_ms
                    next_ms = wait_ms if next_ms is None else min(next_ms, wait_ms)
        return ready, next_ms

    def peek_size_bytes(self, tp: TopicPartition) -> int:
        with self._lock:
            queue = self._queues.get(tp)
            return queue[0].size_bytes if queue else 0

    def drain(self, tp: TopicPartition) -> ProducerBatch | None:
        """Removes and returns the partition's first batch (it grows no more)."""
        with self._lock:
            queue = self._queues.get(tp)
            if not queue:
                return None
            batch = queue.popleft()
            if not queue:
                del self._queues[tp]
            return batch

    def expire(self, now_ms: float, delivery_timeout_ms: float) -> list[ProducerBatch]:
        """Removes and returns the queued batches older than ``delivery_timeout_ms``."""
        expired = []
        with self._lock:
            for tp in list(self._queues):
                queue = self._queues[tp]
                while queue and now_ms - queue[0].created_ms >= delivery_timeout_ms:
                    expired.append(queue.popleft())
                if not queue:
                    del self._queues[tp]
        return expired

    def abort_all(self) -> list[ProducerBatch]:
        """Removes and returns every queued batch (forced close)."""
        with self._lock:
            batches = [batch for queue in self._queues.values() for batch in queue]
            self._queues.clear()
        return batches

    def release(self, batch: ProducerBatch) -> None:
        """The batch is finished: its memory is free again."""
        with self._room:
            if batch in self._incomplete:
                self._incomplete.discard(batch)
                self._buffered_bytes -= batch.size_bytes
                self._room.notify_all()

    # --- observation ---------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        with self._lock:
            return self._buffered_bytes

    def has_queued(self) -> bool:
        with self._lock:
            return any(self._queues.values())

    def incomplete_count(self) -> int:
        with self._lock:
            return len(self._incomplete)
