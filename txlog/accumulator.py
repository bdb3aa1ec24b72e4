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

from txlog.errors import BufferExhaustedError, ClientClosedError
from txlog.protocol import batch_format
from txlog.protocol import compression as compression_codecs
from txlog.protocol.names import TOPIC_NAME_CHARS_MAX
from txlog.protocol.protowire import field_tag, varint
from txlog.structs import RecordMetadata, TopicPartition
from txlog.v1 import partition_pb2

# A PartitionBatch's fields and framing inside a ProduceRequest, at most: the topic's name (now that records
# are counted exactly, a long name is no longer hidden in a per-record margin), then fixed fields and lengths:
# the topic's tag and length (3), partition (6), leader_epoch (11), encoded_batch's tag and length (6) and the
# encoded batch's header (53), rounded up.
BATCH_OVERHEAD_BYTES = 96 + TOPIC_NAME_CHARS_MAX
_ENCODED_BATCH_TAG = field_tag(partition_pb2.PartitionBatch, "encoded_batch")


class BatchState(enum.Enum):
    """Where a batch is; see ``sequences.py`` for the transitions after QUEUED."""

    QUEUED = "queued"  # in the accumulator, may still grow
    IN_FLIGHT = "in_flight"  # in a Produce request that has not been answered
    AWAITING_RETRY = "awaiting_retry"  # failed retriably; will be sent again in sequence order
    HELD = "held"  # rejected and known not appended; waits for a new producer id
    DONE = "done"  # its futures are resolved


@dataclass(eq=False)
class ProducerBatch:
    """Records of one partition sent (and retried) together as one RecordBatch.

    ``records`` are encoded (``structs.encode_record``: each an element of
    ``RecordBatch.records``); :meth:`add` appends one and returns its future.
    The first :meth:`encode` joins them into ``sent_records`` and lets the list
    go (a drained batch no longer grows): an in-flight batch holds its bytes once."""

    tp: TopicPartition
    created_ms: float
    records: list[bytes] = field(default_factory=list)
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
    # the condition of its records' futures: a producer's batches share one (RecordFuture)
    condition: threading.Condition = field(default_factory=threading.Condition, repr=False)
    sent_records: bytes | None = None  # made on the first encode(); every retry sends these bytes
    record_count: int = 0

    def __post_init__(self):
        self.outcome = BatchOutcome(self.tp, self.condition)

    def add(self, record: bytes, timestamp_ms: int = 0) -> RecordFuture:
        """Appends an encoded record (``timestamp_ms`` 0: none, the leader's append
        time stands for it) and returns its future."""
        index = self.record_count
        self.records.append(record)
        self.record_count += 1
        self.size_bytes += len(record)
        if timestamp_ms:
            self.outcome.timestamps_ms[index] = timestamp_ms
        return RecordFuture(self.outcome, index)

    def encode(self, leader_epoch: int, *, is_transactional: bool = False, compression: int = 0) -> list[bytes]:
        """The batch as a ProduceRequest's PartitionBatch, its ``encoded_batch``
        in the encoded batch format (txlog.protocol.batch_format): pieces whose
        concatenation is the encoded message. Its records are joined -- and with
        a ``compression`` codec compressed -- the first time (a batch is drained
        whole: it no longer grows); every retry sends the same records (a new
        producer id or sequence changes only the header, whose CRC covers them)."""
        records = self.sent_records
        if records is None:
            records = b"".join(self.records)  # a RecordBatch of only these records, encoded
            if compression:
                records = compression_codecs.compress(compression, records)
            self.sent_records = records
            self.records = []
        stamped = self.outcome.timestamps_ms
        header = batch_format.header_bytes(records, self.record_count, producer_id=self.producer_id,
                                           producer_epoch=self.producer_epoch, base_sequence=self.base_sequence,
                                           transactional=is_transactional, codec=compression,
                                           max_timestamp_ms=max(stamped.values(), default=0),
                                           untimed=len(stamped) < self.record_count)
        partition_batch = partition_pb2.PartitionBatch(topic=self.tp.topic, partition=self.tp.partition,
                                                       leader_epoch=leader_epoch)
        return [partition_batch.SerializeToString(), _ENCODED_BATCH_TAG, varint(len(header) + len(records)), header, records]

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Resolves every record's future; ``base_offset`` -1 means unknown."""
        self.state = BatchState.DONE
        self.outcome.settle(base_offset, log_append_time_ms if log_append_time_ms > 0 else -1, None)
        _resolve(self.done, result=None)

    def fail(self, error: BaseException) -> None:
        self.state = BatchState.DONE
        self.outcome.settle(-1, -1, error)
        _resolve(self.done, result=None)


# concurrent.futures' own states (CPython's _base module): RecordFuture and
# BatchOutcome set them as Future.set_result / set_exception do.
_RUNNING, _FINISHED = concurrent.futures._base.RUNNING, concurrent.futures._base.FINISHED
_SETTLED = (_FINISHED, concurrent.futures._base.CANCELLED, concurrent.futures._base.CANCELLED_AND_NOTIFIED)


class BatchOutcome:
    """How a batch ended, shared by its records' futures: settling a batch sets
    it once and wakes only the futures somebody waits on (or gave a callback),
    instead of resolving a future per record. Small on purpose: a future the
    application keeps holds this, not the batch's records."""

    __slots__ = ("tp", "condition", "timestamps_ms", "state", "base_offset", "append_time_ms", "error", "watched")

    def __init__(self, tp: TopicPartition, condition: threading.Condition):
        self.tp = tp
        self.condition = condition
        self.timestamps_ms: dict[int, int] = {}  # by record index, the records sent with a timestamp
        self.state = _RUNNING
        self.base_offset = -1
        self.append_time_ms = -1
        self.error: BaseException | None = None
        self.watched: list[RecordFuture] = []  # futures with waiters or callbacks (RecordFuture._hooks)

    def result(self, index: int) -> RecordMetadata | None:
        """The RecordMetadata of record ``index``; None until the batch is appended (or when it failed)."""
        if self.state != _FINISHED or self.error is not None:
            return None
        base_offset = self.base_offset
        return RecordMetadata(self.tp.topic, self.tp.partition, base_offset + index if base_offset >= 0 else -1,
                              self.timestamps_ms.get(index) or self.append_time_ms)

    def settle(self, base_offset: int, append_time_ms: int, error: BaseException | None) -> None:
        """Resolves every future of the batch: under one acquisition of the
        condition and one notify_all, the callbacks run after it (as
        Future.set_result does, one future at a time). The first outcome stays."""
        with self.condition:
            if self.state != _RUNNING:
                return
            self.base_offset, self.append_time_ms, self.error = base_offset, append_time_ms, error
            self.state = _FINISHED
            watched = [future for future in self.watched if future._own is None]
            for future in watched:
                for waiter in future._waiters:
                    if error is not None:
                        waiter.add_exception(future)
                    else:
                        waiter.add_result(future)
            self.condition.notify_all()
        for future in watched:
            if future._done_callbacks:
                future._invoke_callbacks()


def _future_attribute(index: int, from_outcome: Callable[[RecordFuture], object]) -> property:
    """One of Future's ``_state``, ``_result``, ``_exception``: read from the
    batch's outcome, or from the future's own (``_own[index]``) once it was
    resolved on its own; setting it (Future.set_result, ...) detaches it."""

    def get(future: RecordFuture):
        own = future._own
        return from_outcome(future) if own is None else own[index]

    def set_(future: RecordFuture, value) -> None:
        future._detached()[index] = value

    return property(get, set_)


class RecordFuture(concurrent.futures.Future):
    """A record's future: a real concurrent.futures.Future (``wait``,
    ``as_completed`` and ``asyncio.wrap_future`` take it), born running (a
    record's fate is not the caller's to cancel), that reads its state, result
    and exception from its batch's :class:`BatchOutcome` and its index there:
    making it sets three attributes, settling a batch costs nothing per record
    nobody waits on, and its RecordMetadata is made when asked for. (A Future
    of its own made a Condition and an RLock per record, and resolving one per
    record was a third of a batch's answer handling.) Resolved on its own
    (``set_result``/``set_exception``), it keeps its own outcome from then on."""

    def __init__(self, outcome: BatchOutcome, index: int):  # no super().__init__(): it would make a condition
        self._condition = outcome.condition
        self._outcome = outcome
        self._index = index
        self._own: list | None = None  # [state, result, exception] once resolved on its own
        self._hooks: tuple[list, list] | None = None  # (waiters, done callbacks), made when first asked for

    def _detached(self) -> list:
        if self._own is None:
            self._own = [self._state, self._result, self._exception]
        return self._own

    _state = _future_attribute(0, lambda future: future._outcome.state)
    _result = _future_attribute(1, lambda future: future._outcome.result(future._index))
    _exception = _future_attribute(2, lambda future: future._outcome.error)

    def _watched(self) -> tuple[list, list]:
        hooks = self._hooks
        if hooks is None:  # Future reads these under the condition: the outcome's settle sees the registration
            hooks = self._hooks = ([], [])
            self._outcome.watched.append(self)
        return hooks

    # Future.result and .exception wait on the condition once and then time out
    # if not finished: with a condition shared by every batch of the producer,
    # any other batch settling would end their wait early. These wait until
    # this future is settled or the timeout (counted from the call) is up, then
    # let Future answer at once: its result, its exception, CancelledError or
    # TimeoutError. (concurrent.futures.wait and as_completed wait on their own
    # waiter's event, set only for the futures they wait on: nothing to do.)
    def result(self, timeout=None):
        self._wait_settled(timeout)
        return super().result(0)

    def exception(self, timeout=None):
        self._wait_settled(timeout)
        return super().exception(0)

    def _wait_settled(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._state not in _SETTLED:
                if deadline is None:
                    self._condition.wait()
                else:
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return
                    self._condition.wait(remaining_s)

    @property
    def _waiters(self) -> list:
        return self._watched()[0]

    @property
    def _done_callbacks(self) -> list:
        return self._watched()[1]


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
        self._futures_condition = threading.Condition()  # shared by the futures of every record (RecordFuture)

    # --- user threads ----------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        record: bytes,
        timestamp_ms: int,
        now_ms: float,
        *,
        max_block_ms: float = 0.0,
    ) -> tuple[RecordFuture, bool]:
        """Adds an encoded record (``structs.encode_record``; it takes
        ``len(record)`` bytes of the buffer and of its batch) to the partition's
        open batch (or a new one); ``timestamp_ms`` 0: none.

        Returns the record's future, and True when the sender should wake up: a
        batch was started (its linger timer starts) or became full. Waits up to
        ``max_block_ms`` for buffer memory, then raises BufferExhaustedError."""
        size_bytes = len(record)
        if size_bytes > self.buffer_memory_bytes:
            raise BufferExhaustedError(
                f"a record of {size_bytes} bytes can never fit buffer_memory_bytes={self.buffer_memory_bytes}")
        with self._lock:
            if self._buffered_bytes + size_bytes > self.buffer_memory_bytes:
                self._wait_for_room(size_bytes, max_block_ms)
            if self._closed:
                raise ClientClosedError("the producer is closed")
            queue = self._queues.get(tp)
            if queue is None:
                queue = self._queues[tp] = deque()
            last = queue[-1] if queue else None
            wake = False
            if last is None or last.record_count >= self.batch_records_max \
                    or (last.size_bytes + size_bytes > self.batch_size_bytes and last.record_count):
                last = ProducerBatch(tp, now_ms, condition=self._futures_condition)
                queue.append(last)
                self._incomplete.add(last)
                wake = True
            future = last.add(record, timestamp_ms)
            self._buffered_bytes += size_bytes
            return future, wake or self._full(last)

    def _wait_for_room(self, size_bytes: int, max_block_ms: float) -> None:
        """Holding the lock: waits up to ``max_block_ms`` until ``size_bytes`` more fit the buffer."""
        if max_block_ms > 0:
            deadline_ms = self._clock_ms() + max_block_ms
            while self._buffered_bytes + size_bytes > self.buffer_memory_bytes and not self._closed:
                remaining_ms = deadline_ms - self._clock_ms()
                if remaining_ms <= 0:
                    break
                self._room.wait(remaining_ms / 1000)
        if self._buffered_bytes + size_bytes > self.buffer_memory_bytes and not self._closed:
            raise BufferExhaustedError(
                f"buffer_memory_bytes={self.buffer_memory_bytes} stayed full for max_block_ms={max_block_ms:.0f}; "
                "the cluster is slower than send(), or unreachable")

    def _full(self, batch: ProducerBatch) -> bool:
        return batch.size_bytes >= self.batch_size_bytes or batch.record_count >= self.batch_records_max

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
