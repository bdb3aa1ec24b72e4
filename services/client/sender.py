"""The producer's I/O loop (Kafka's Sender): drains ready batches from the
accumulator, groups them by partition leader into Produce requests, handles
the answers, retries, and keeps the producer id.

Guarantees
----------
* One Produce request carries at most one batch per partition, only batches of
  partitions the addressed server leads (per the metadata cache), and at most
  ``max_request_size_bytes``; batches for the same leader share requests.
* Sequence numbers, the in-flight window (``max_in_flight`` per partition) and
  the order of re-sends are kept by :mod:`services.client.sequences`; with
  idempotence on, every record is appended exactly once and in order, or its
  future fails.
* Every future completes: with its RecordMetadata, or with a ClientError --
  the leader's error when it is not retriable, DeliveryTimeoutError when
  ``delivery_timeout_ms`` passes (or ``retries`` run out) first,
  ClientClosedError on a forced close.

Error Handling
--------------
Per batch, by :func:`services.client.errors.action_for` (the one table):
REFRESH_METADATA -> mark metadata stale, re-send after back-off; RETRY -> re-send
after back-off; ALREADY_APPENDED (DUPLICATE_SEQUENCE) -> the batch is in the
log: its futures complete with offset -1 (the leader no longer knows the
offsets); SEQUENCE_REJECTED -> ``PartitionSequences.on_rejected``; FAIL -> the
futures fail with the leader's error. A request-level failure (the call's
status, or a lost answer) applies to every batch of the request.

While a partition's sequence is broken (a sequenced batch failed, or a gap
was found), the sender stops assigning new sequences everywhere, lets every
partition become quiescent, takes a new producer id with InitProducerId, and
re-sequences the held batches (KIP-360's recovery: InitProducerId with the
current id and epoch answers the same id with the epoch bumped). An
InitProducerId failure that is not retriable is fatal for the producer: every
pending and later record fails with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.client.accumulator import BATCH_OVERHEAD_BYTES, BatchState, ProducerBatch, RecordAccumulator
from services.client.config import ProducerConfig
from services.client.errors import (
    Action,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    action_for,
    error_for,
    from_exception,
    from_proto,
)
from services.client.metadata import Metadata
from services.client.partitioner import Partitioner
from services.client.sequences import PartitionSequences
from services.client.structs import TopicPartition
from services.errors import ErrorCode
from services.retry import RetryPolicy
from services.stubs.txlog.v1 import coordinator_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
HOUSEKEEPING_INTERVAL_MS = 1000  # expiry checks while batches are outstanding
REQUEST_OVERHEAD_BYTES = 64
PARTITIONS_PER_REQUEST_MAX = 1000  # partition_svc refuses requests naming more than 10_000


@dataclass
class SenderStats:
    """Counters for tests and operators."""

    requests_sent: int = 0
    batches_sent: int = 0
    batches_resent: int = 0
    producer_id_inits: int = 0
    producer_id_resets: int = 0


class Sender:
    """Runs on the producer's loop; user threads only call :meth:`wakeup` via the loop."""

    def __init__(
        self,
        config: ProducerConfig,
        accumulator: RecordAccumulator,
        metadata: Metadata,
        transport,
        partitioner: Partitioner,
        *,
        clock_ms: Callable[[], float] | None = None,
        backoff: RetryPolicy | None = None,
    ):
        self._config = config
        self._accumulator = accumulator
        self._metadata = metadata
        self._transport = transport
        self._partitioner = partitioner
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._backoff = backoff or RetryPolicy(
            backoff_initial_ms=config.retry_backoff_ms, backoff_max_ms=config.retry_backoff_max_ms)
        self._idempotent = config.enable_idempotence
        self._partitions: dict[TopicPartition, PartitionSequences] = {}
        self.producer_id = -1
        self.producer_epoch = -1
        self._reset_pending = False
        self._init_task: asyncio.Task | None = None
        self._init_attempts = 0
        self._init_retry_at_ms = 0.0
        self._requests: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._closing = False
        self._forced = False
        self.fatal_error: ClientError | None = None
        self.stats = SenderStats()
        metadata.add_listener(self.wakeup)

    # --- control -------------------------------------------------------------------------

    def wakeup(self) -> None:
        self._wake.set()

    async def close(self, timeout_ms: float | None) -> None:
        """Sends what is queued (up to ``timeout_ms``), then stops; what is still
        unfinished then fails with ClientClosedError."""
        self._closing = True
        self._accumulator.close()
        self.wakeup()
        try:
            await asyncio.wait_for(self._stopped.wait(), None if timeout_ms is None else timeout_ms / 1000)
        except TimeoutError:
            self._force(ClientClosedError("the producer was closed before the record was acknowledged"))
            await self._stopped.wait()

    def _force(self, error: ClientError) -> None:
        self._forced = True
        for batch in self._accumulator.abort_all():
            self._fail(batch, error)
        for sequences in self._partitions.values():
            for batch in sequences.abort_all():
                self._fail(batch, error)
        for task in list(self._requests):
            task.cancel()
        if self._init_task is not None:
            self._init_task.cancel()
        self.wakeup()

    def _idle(self) -> bool:
        return (not self._accumulator.has_queued() and not self._requests
                and all(not s.unresolved for s in self._partitions.values()))

    # --- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                now_ms = self._clock_ms()
                self._expire(now_ms)
                if self._forced or (self._closing and self._idle()):
                    break
                if self.fatal_error is not None:
                    self._force(self.fatal_error)
                    continue
                self._maybe_init_producer_id(now_ms)
                if self._metadata.needs_refresh():
                    self._metadata.maybe_refresh()
                wait_ms = self._send_ready(now_ms)
                if wait_ms is None:
                    await self._wake.wait()
                elif wait_ms > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
                else:
                    await asyncio.sleep(0)
        finally:
            for task in list(self._requests):
                task.cancel()
            if self._requests:
                await asyncio.gather(*self._requests, return_exceptions=True)
            self._stopped.set()

    def _sequences(self, tp: TopicPartition) -> PartitionSequences:
        sequences = self._partitions.get(tp)
        if sequences is None:
            sequences = PartitionSequences(tp, idempotent=self._idempotent, max_in_flight=self._config.max_in_flight)
            self._partitions[tp] = sequences
        return sequences

    def _send_ready(self, now_ms: float) -> float | None:
        """Sends what may go now; returns how long to wait before looking again
        (None: until woken)."""
        ready, linger_wait_ms = self._accumulator.ready(now_ms)
        ready_set = set(ready)
        may_assign = not self._reset_pending and (not self._idempotent or self.producer_id >= 0)
        candidates = dict.fromkeys(tp for tp, s in self._partitions.items() if s.next_resend(now_ms) is not None)
        candidates.update(dict.fromkeys(ready))
        requests: dict[str, list[list[tuple[ProducerBatch, int]]]] = {}
        sizes: dict[str, int] = {}
        missing_leader = False
        sent = False
        for tp in candidates:
            sequences = self._sequences(tp)
            batch = sequences.next_resend(now_ms)
            if batch is None and not (tp in ready_set and may_assign and sequences.can_send_new()):
                continue
            leader = self._metadata.leader(tp)
            if leader is None:
                missing_leader = True
                continue
            size = (batch.size_bytes if batch is not None else self._accumulator.peek_size_bytes(tp)) \
                + BATCH_OVERHEAD_BYTES
            address = leader.leader_address
            groups = requests.setdefault(address, [[]])
            if groups[-1] and (sizes[address] + size > self._config.max_request_size_bytes
                               or len(groups[-1]) >= PARTITIONS_PER_REQUEST_MAX):
                groups.append([])
                sizes[address] = REQUEST_OVERHEAD_BYTES
            if batch is None:
                batch = self._accumulator.drain(tp)
                if batch is None:
                    continue
                self._partitioner.on_batch_sent(tp.topic, tp.partition, self._metadata.partition_count(tp.topic) or 0)
                sequences.assign(batch, self.producer_id, self.producer_epoch)
            else:
                sequences.mark_resent(batch)
                self.stats.batches_resent += 1
            groups[-1].append((batch, leader.leader_epoch))
            sizes[address] = sizes.get(address, REQUEST_OVERHEAD_BYTES) + size
            sent = True
        for address, groups in requests.items():
            for entries in groups:
                if entries:
                    task = asyncio.get_running_loop().create_task(self._send_request(address, entries))
                    self._requests.add(task)
                    task.add_done_callback(self._requests.discard)
        if missing_leader:
            self._metadata.request_update()
            self._metadata.maybe_refresh()
        if sent:
            return 0.0
        waits = [linger_wait_ms]
        waits += [s.next_retry_at_ms() - now_ms for s in self._partitions.values() if s.next_retry_at_ms() is not None]
        if missing_leader:
            waits.append(max(self._metadata.refresh_delay_ms(), 10.0))
        if (self._idempotent and self.producer_id < 0) or self._reset_pending:
            waits.append(max(self._init_retry_at_ms - now_ms, 10.0))
        if self._accumulator.incomplete_count() > 0:
            waits.append(HOUSEKEEPING_INTERVAL_MS)
        waits = [w for w in waits if w is not None]
        return max(0.0, min(waits)) if waits else None

    # --- Produce: request and answer ------------------------------------------------------------

    async def _send_request(self, address: str, entries: list[tuple[ProducerBatch, int]]) -> None:
        request = partition_pb2.ProduceRequest(
            acks=self._config.acks,
            timeout_ms=int(self._config.request_timeout_ms),
            batches=[
                partition_pb2.PartitionBatch(topic=b.tp.topic, partition=b.tp.partition, leader_epoch=epoch,
                                             batch=b.to_proto())
                for b, epoch in entries
            ],
        )
        self.stats.requests_sent += 1
        self.stats.batches_sent += len(entries)
        try:
            response = await self._transport.call(address, "Produce", request,
                                                   timeout_ms=self._config.request_timeout_ms)
        except Exception as exc:  # noqa: BLE001 -- every batch must end; unexpected failures are not retried
            error = from_exception(exc)
            now_ms = self._clock_ms()
            for batch, _ in entries:
                self._on_error(batch, error, now_ms)
        else:
            now_ms = self._clock_ms()
            results = {(r.topic, r.partition): r for r in response.results}
            for batch, _ in entries:
                result = results.get((batch.tp.topic, batch.tp.partition))
                if result is None:
                    self._on_error(batch, error_for(ErrorCode.Value("LEADER_NOT_AVAILABLE"),
                                                    f"{address} answered Produce without a result for {batch.tp}"),
                                   now_ms)
                elif result.error.code == NONE:
                    self._on_acked(batch, result.base_offset if self._config.acks != 0 else -1,
                                   result.log_append_time_ms)
                else:
                    self._on_error(batch, from_proto(result.error), now_ms)
        finally:
            self.wakeup()

    def _on_acked(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        if batch.state is not BatchState.IN_FLIGHT:
            return  # failed by a forced close meanwhile
        self._sequences(batch.tp).on_acked(batch)
        self._complete(batch, base_offset, log_append_time_ms)

    def _on_error(self, batch: ProducerBatch, error: ClientError, now_ms: float) -> None:
        if batch.state is not BatchState.IN_FLIGHT:
            return
        sequences = self._sequences(batch.tp)
        action = action_for(error.code)
        backoff_ms = self._backoff.delay_ms(batch.attempts)
        if self._idempotent and action is Action.ALREADY_APPENDED:
            sequences.on_acked(batch)
            self._complete(batch, -1, -1)
        elif self._idempotent and action is Action.SEQUENCE_REJECTED:
            sequences.on_rejected(batch, now_ms, backoff_ms)
        elif action.retries:
            if action is Action.REFRESH_METADATA:
                self._metadata.request_update()
            if batch.attempts > self._config.retries:
                sequences.on_failed(batch, maybe_appended=True)
                self._fail(batch, DeliveryTimeoutError(
                    f"{batch.tp}: gave up after {batch.attempts} attempts (retries={self._config.retries}); "
                    f"last error {error}; the records may or may not have been appended", maybe_appended=True))
            else:
                sequences.on_retriable(batch, now_ms, backoff_ms)
        else:
            sequences.on_failed(batch, maybe_appended=False)
            self._fail(batch, error)
        if sequences.broken:
            self._reset_pending = True

    def _complete(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        batch.complete(base_offset, log_append_time_ms)
        self._accumulator.release(batch)

    def _fail(self, batch: ProducerBatch, error: BaseException) -> None:
        batch.fail(error)
        self._accumulator.release(batch)

    def _expire(self, now_ms: float) -> None:
        timeout_ms = self._config.delivery_timeout_ms
        for batch in self._accumulator.expire(now_ms, timeout_ms):
            self._fail(batch, DeliveryTimeoutError(
                f"{batch.tp}: {batch.record_count} record(s) not sent within delivery_timeout_ms={timeout_ms:.0f} "
                "(no leader reachable, or no producer id); they were not appended", maybe_appended=False))
        for sequences in self._partitions.values():
            for batch, maybe_appended in sequences.expire(now_ms, timeout_ms):
                outcome = "they may or may not have been appended" if maybe_appended else "they were not appended"
                self._fail(batch, DeliveryTimeoutError(
                    f"{batch.tp}: {batch.record_count} record(s) not acknowledged within "
                    f"delivery_timeout_ms={timeout_ms:.0f}; {outcome}", maybe_appended=maybe_appended))
            if sequences.broken:
                self._reset_pending = True

    # --- producer id ---------------------------------------------------------------------------------

    def _maybe_init_producer_id(self, now_ms: float) -> None:
        if not self._idempotent or (self._init_task is not None and not self._init_task.done()):
            return
        if now_ms < self._init_retry_at_ms:
            return
        if self.producer_id >= 0 and not self._reset_pending:
            return
        if self._reset_pending and not all(s.quiescent() for s in self._partitions.values()):
            return
        self._init_task = asyncio.get_running_loop().create_task(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        # After a broken sequence, bump the epoch of the id we hold (KIP-360): every
        # partition then expects sequence 0 of the new epoch. The first time, or if
        # the epoch is used up, the server answers a new id with epoch 0.
        bump = self._reset_pending and self.producer_id >= 0
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id="",
            producer_id=self.producer_id if bump else -1,
            producer_epoch=self.producer_epoch if bump else -1,
        )
        try:
            response = await self._metadata.call_any("InitProducerId", request,
                                                     timeout_ms=self._config.request_timeout_ms)
        except Exception as exc:  # noqa: BLE001 -- sorted below; unexpected failures are fatal
            error = from_exception(exc)
            if error.retriable:
                self._init_attempts += 1
                self._init_retry_at_ms = self._clock_ms() + self._backoff.delay_ms(self._init_attempts)
            else:
                self.fatal_error = error
            self.wakeup()
            return
        self._init_attempts = 0
        self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
        self.stats.producer_id_inits += 1
        if self._reset_pending:
            if all(s.quiescent() for s in self._partitions.values()):
                for sequences in self._partitions.values():
                    sequences.reset(self.producer_id, self.producer_epoch)
                self._reset_pending = False
                self.stats.producer_id_resets += 1
            # else: something went out meanwhile; the next quiescent moment takes another id
        self.wakeup()
