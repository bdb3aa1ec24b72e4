"""The producer's I/O loop (Kafka's Sender): drains ready batches from the
accumulator, groups them by partition leader into Produce requests, handles
the answers, retries, and keeps the producer id.

Guarantees
----------
* One Produce request carries at most one batch per partition, only batches of
  partitions the addressed server leads (per the metadata cache), and at most
  ``max_request_size_bytes``; batches for the same leader share requests.
* Sequence numbers, the in-flight window (``max_in_flight`` per partition) and
  the order of re-sends are kept by :mod:`txlog.sequences`; with
  idempotence on, every record is appended exactly once and in order, or its
  future fails.
* Every future completes: with its RecordMetadata, or with a ClientError --
  the leader's error when it is not retriable, DeliveryTimeoutError when
  ``delivery_timeout_ms`` passes (or ``retries`` run out) first,
  ClientClosedError on a forced close.

Error Handling
--------------
Per batch, by :func:`txlog.errors.action_for` (the one table):
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

Transactions
------------
With a :class:`~txlog.transactions.TransactionManager` the sender is
transactional: it takes no producer id of its own (``init_transactions()`` does,
through :meth:`Sender.reset_producer`); a partition's batches are sent only once
the coordinator has the partition in the transaction (the sender adds new
partitions with AddPartitionsToTxn, one request at a time); Produce requests
carry the transactional id and ``is_transactional``. Any batch that fails makes
the transaction abortable (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH make the
producer fatal instead); there is no KIP-360 bump inside a transaction -- a
broken sequence is an abortable error, and the epoch bump of the abort's EndTxn
starts every partition at sequence 0 again. While the transaction is failed or
aborting, nothing more is sent or retried: unsent batches fail with
TransactionAbortedError (or the fatal error) and in-flight ones just finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from txlog.accumulator import BATCH_OVERHEAD_BYTES, BatchState, ProducerBatch, RecordAccumulator
from txlog.config import ProducerConfig
from txlog.errors import (
    Action,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
    action_for,
    error_for,
    from_exception,
    from_proto,
)
from txlog.metadata import Metadata
from txlog.partitioner import Partitioner
from txlog.protocol.errors import ErrorCode
from txlog.protocol.names import TRANSACTIONAL_ID_CHARS_MAX
from txlog.protocol.protowire import field_tag, varint
from txlog.protocol.retry import RetryPolicy
from txlog.sequences import PartitionSequences
from txlog.structs import TopicPartition
from txlog.transactions import DROPPING_STATES, SENDING_STATES, TransactionManager, TxnState
from txlog.transport import sends_encoded
from txlog.txn_requests import (
    PARTITIONS_PER_ADD_MAX,
    AddPartitionsHandler,
    CoordinatorClient,
    StopRetrying,
    fenced_error,
)
from txlog.v1 import coordinator_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
FENCED_CODES = frozenset({ErrorCode.Value("PRODUCER_FENCED"), ErrorCode.Value("INVALID_PRODUCER_EPOCH")})
HOUSEKEEPING_INTERVAL_MS = 1000  # expiry checks while batches are outstanding
REQUEST_OVERHEAD_BYTES = 64 + TRANSACTIONAL_ID_CHARS_MAX  # a ProduceRequest's own fields, its transactional id at most
PARTITIONS_PER_REQUEST_MAX = 1000  # partition_svc refuses requests naming more than 10_000
_BATCHES_TAG = field_tag(partition_pb2.ProduceRequest, "batches")


@dataclass
class SenderStats:
    """Counters for tests and operators."""

    requests_sent: int = 0
    request_errors: int = 0  # requests that failed whole (no answer, a refused call)
    request_latency_ms_total: float = 0.0
    request_latency_ms_max: float = 0.0
    batches_sent: int = 0
    batches_resent: int = 0
    records_sent: int = 0  # acknowledged
    record_errors: int = 0  # failed for good (their futures raised)
    bytes_sent: int = 0  # of acknowledged batches
    producer_id_inits: int = 0
    producer_id_resets: int = 0
    throttled_requests: int = 0  # answered late because this client is over a quota
    throttle_time_ms_total: float = 0.0
    throttle_time_ms_max: float = 0.0

    def snapshot(self) -> dict[str, float]:
        answered = self.requests_sent - self.request_errors
        return {
            "requests_sent": self.requests_sent, "request_errors": self.request_errors,
            "request_latency_avg_ms": round(self.request_latency_ms_total / answered, 3) if answered else 0.0,
            "request_latency_max_ms": round(self.request_latency_ms_max, 3),
            "batches_sent": self.batches_sent, "batches_retried": self.batches_resent,
            "records_sent": self.records_sent, "record_errors": self.record_errors, "bytes_sent": self.bytes_sent,
            "batch_size_avg_bytes": round(self.bytes_sent / self.batches_sent, 1) if self.batches_sent else 0.0,
            "records_per_request_avg": round(self.records_sent / answered, 1) if answered else 0.0,
            "producer_id_inits": self.producer_id_inits, "producer_id_resets": self.producer_id_resets,
            "throttled_requests": self.throttled_requests,
            "produce_throttle_time_avg_ms": round(self.throttle_time_ms_total / answered, 3) if answered else 0.0,
            "produce_throttle_time_max_ms": self.throttle_time_ms_max,
        }


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
        txn: TransactionManager | None = None,
        coordinator: CoordinatorClient | None = None,
    ):
        self._config = config
        self._compression = config.compression  # read once: _send_request is hot
        self._sends_encoded = sends_encoded(transport)
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
        if (txn is None) != (coordinator is None):
            raise ValueError("a transactional sender needs both a TransactionManager and a CoordinatorClient")
        self._txn = txn
        self._coordinator = coordinator
        self._add_task: asyncio.Task | None = None
        self._request_head = partition_pb2.ProduceRequest(  # every Produce request's fixed fields, encoded
            transactional_id=txn.transactional_id if txn is not None else "", acks=config.acks,
            timeout_ms=int(config.request_timeout_ms),
            add_to_transaction=txn is not None and txn.implicit_partition_adds).SerializeToString()
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
        if self._add_task is not None:
            self._add_task.cancel()
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
                if self.fatal_error is not None:
                    self._force(self.fatal_error)
                if self._txn is not None and self._txn.state in DROPPING_STATES:
                    self.drop_unsent()
                # after dropping: a close() waiting for a failed transaction's queued batches must see them gone,
                # or this loop would sleep until a wake-up that never comes
                if self._forced or (self._closing and self._idle()):
                    break
                self._maybe_init_producer_id(now_ms)
                if self._metadata.needs_refresh():
                    self._metadata.maybe_refresh()
                wait_ms = self._send_ready(now_ms)
                self._maybe_add_partitions()
                if wait_ms is None:
                    await self._wake.wait()
                elif wait_ms > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
                else:
                    await asyncio.sleep(0)
        finally:
            if self._add_task is not None:
                self._add_task.cancel()
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
        txn = self._txn
        if txn is not None and txn.state not in SENDING_STATES:
            may_assign = False
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
            if batch is None and txn is not None and not txn.may_send(tp):
                txn.maybe_add_partition(tp)  # sent once the coordinator has it in the transaction
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
        if self._txn is None and ((self._idempotent and self.producer_id < 0) or self._reset_pending):
            waits.append(max(self._init_retry_at_ms - now_ms, 10.0))
        if self._accumulator.incomplete_count() > 0:
            waits.append(HOUSEKEEPING_INTERVAL_MS)
        waits = [w for w in waits if w is not None]
        return max(0.0, min(waits)) if waits else None

    # --- Produce: request and answer ------------------------------------------------------------

    def _encode_request(self, entries: list[tuple[ProducerBatch, int]]) -> bytes:
        """The Produce request of ``entries`` (batch, leader epoch), encoded: its
        fixed fields, then one ``batches`` field per batch, each batch's records
        as they were encoded in send() (see structs.encode_record)."""
        transactional = self._txn is not None
        codec = self._compression
        parts = [self._request_head]
        for batch, leader_epoch in entries:
            pieces = batch.encode(leader_epoch, is_transactional=transactional, compression=codec)
            parts += (_BATCHES_TAG, varint(sum(len(piece) for piece in pieces)), *pieces)
        return b"".join(parts)

    async def _send_request(self, address: str, entries: list[tuple[ProducerBatch, int]]) -> None:
        request = self._encode_request(entries)
        self.stats.requests_sent += 1
        self.stats.batches_sent += len(entries)
        started_ms = self._clock_ms()
        try:
            if self._sends_encoded:
                response = await self._transport.call_encoded(address, "Produce", request,
                                                              timeout_ms=self._config.request_timeout_ms)
            else:
                response = await self._transport.call(address, "Produce", partition_pb2.ProduceRequest.FromString(request),
                                                      timeout_ms=self._config.request_timeout_ms)
        except Exception as exc:  # noqa: BLE001 -- every batch must end; unexpected failures are not retried
            self.stats.request_errors += 1
            error = from_exception(exc)
            now_ms = self._clock_ms()
            for batch, _ in entries:
                self._on_error(batch, error, now_ms)
        else:
            now_ms = self._clock_ms()
            self.stats.request_latency_ms_total += now_ms - started_ms
            self.stats.request_latency_ms_max = max(self.stats.request_latency_ms_max, now_ms - started_ms)
            if response.throttle_time_ms:  # the leader held the answer that long: this client is over a quota
                self.stats.throttled_requests += 1
                self.stats.throttle_time_ms_total += response.throttle_time_ms
                self.stats.throttle_time_ms_max = max(self.stats.throttle_time_ms_max, response.throttle_time_ms)
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
        if self._txn is not None:
            if error.code in FENCED_CODES:
                sequences.on_failed(batch, maybe_appended=False)
                self._fail(batch, fenced_error(self._txn.transactional_id, batch.producer_epoch, error))
                return
            if self._txn.state not in SENDING_STATES:  # failed or aborting: nothing is retried any more
                sequences.on_failed(batch, maybe_appended=True)
                self._fail(batch, self._dropped_error())
                return
        action = action_for(error.code)
        backoff_ms = self._backoff.delay_after(batch.attempts, error)
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
                batch.last_error = str(error)
                sequences.on_retriable(batch, now_ms, backoff_ms)
        else:
            sequences.on_failed(batch, maybe_appended=False)
            self._fail(batch, error)
        if sequences.broken:
            self._on_broken(error)

    def _on_broken(self, error: ClientError) -> None:
        """A partition's sequence has a gap: idempotent, recover with a new epoch
        (KIP-360); transactional, the transaction can only abort (its EndTxn bumps
        the epoch)."""
        if self._txn is not None:
            self._txn.on_abortable_error(error)
        else:
            self._reset_pending = True

    def _complete(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        batch.complete(base_offset, log_append_time_ms)
        self.stats.records_sent += batch.record_count
        self.stats.bytes_sent += batch.size_bytes
        self._accumulator.release(batch)

    def _fail(self, batch: ProducerBatch, error: BaseException) -> None:
        batch.fail(error)
        self.stats.record_errors += batch.record_count
        self._accumulator.release(batch)
        if self._txn is not None and isinstance(error, ClientError) \
                and not isinstance(error, (TransactionAbortedError, ClientClosedError)):
            if isinstance(error, ProducerFencedError):
                self._txn.on_fatal_error(error)
            else:  # any failed batch of a transaction makes it abortable (as in Kafka)
                self._txn.on_abortable_error(error)

    def _expire(self, now_ms: float) -> None:
        timeout_ms = self._config.delivery_timeout_ms
        for batch in self._accumulator.expire(now_ms, timeout_ms):
            self._fail(batch, DeliveryTimeoutError(
                f"{batch.tp}: {batch.record_count} record(s) not sent within delivery_timeout_ms={timeout_ms:.0f} "
                "(no leader reachable, or no producer id); they were not appended", maybe_appended=False))
        for sequences in self._partitions.values():
            for batch, maybe_appended in sequences.expire(now_ms, timeout_ms):
                outcome = "they may or may not have been appended" if maybe_appended else "they were not appended"
                waited = f" (the last attempt: {batch.last_error})" if batch.last_error else ""
                self._fail(batch, DeliveryTimeoutError(
                    f"{batch.tp}: {batch.record_count} record(s) not acknowledged within "
                    f"delivery_timeout_ms={timeout_ms:.0f}{waited}; {outcome}", maybe_appended=maybe_appended))
            if sequences.broken:
                self._on_broken(error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                          f"{sequences.tp}: a batch expired (delivery_timeout_ms={timeout_ms:.0f})"))

    # --- producer id ---------------------------------------------------------------------------------

    def _maybe_init_producer_id(self, now_ms: float) -> None:
        if self._txn is not None or not self._idempotent or (self._init_task is not None and not self._init_task.done()):
            return
        if now_ms < self._init_retry_at_ms:
            return
        if self.producer_id >= 0 and not self._reset_pending:
            return
        if self._reset_pending and not all(s.quiescent() for s in self._partitions.values()):
            return
        self._init_task = asyncio.get_running_loop().create_task(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        # After a broken sequence (KIP-360) the producer asks again, naming the id it
        # holds; partition_svc answers a new id at epoch 0, so every partition then
        # expects sequence 0 of a producer it has not seen.
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

    # --- transactions -----------------------------------------------------------------------------

    def _dropped_error(self) -> ClientError:
        txn = self._txn
        assert txn is not None
        if txn.state is TxnState.FATAL_ERROR and txn.fatal_error is not None:
            return txn.fatal_error
        cause = f" after {txn.abortable_error}" if txn.abortable_error is not None else ""
        return TransactionAbortedError(
            f"the transaction of {txn.transactional_id!r} was aborted{cause} before this record was acknowledged: "
            "it is not in the log (or is there as aborted); send it again in a new transaction")

    def drop_unsent(self) -> None:
        """Fails every batch of the transaction not in flight now (queued, waiting
        for a retry, held): the transaction is failed or aborting."""
        error = self._dropped_error()
        for batch in self._accumulator.abort_all():
            self._fail(batch, error)
        for sequences in self._partitions.values():
            for batch in sequences.abort_unsent():
                self._fail(batch, error)

    async def wait_in_flight(self) -> None:
        """Returns once no batch is in flight and no AddPartitionsToTxn either (it is cancelled)."""
        if self._add_task is not None and not self._add_task.done():
            self._add_task.cancel()
            await asyncio.gather(self._add_task, return_exceptions=True)
        while True:
            done = [b.done for s in self._partitions.values() for b in s.unresolved if b.state is BatchState.IN_FLIGHT]
            if not done:
                return
            await asyncio.wait([asyncio.wrap_future(f) for f in done])

    def reset_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id or epoch (init_transactions, or a transaction ended):
        every partition starts at sequence 0 again. Nothing of the last
        transaction may be unresolved (the caller flushed or dropped it)."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        for sequences in self._partitions.values():
            for batch in sequences.abort_all():  # none expected; never leave a future pending
                self._fail(batch, TransactionAbortedError(f"{batch.tp}: the transaction ended before the batch did"))
        self._partitions.clear()
        self.wakeup()

    def _maybe_add_partitions(self) -> None:
        txn = self._txn
        if txn is None or (self._add_task is not None and not self._add_task.done()):
            return
        if not txn.has_pending_partitions():
            return
        tps = txn.take_pending_partitions()
        if tps:
            self._add_task = asyncio.get_running_loop().create_task(self._add_partitions(tps))

    async def _add_partitions(self, tps: list[TopicPartition]) -> None:
        txn, coordinator = self._txn, self._coordinator
        assert txn is not None and coordinator is not None
        producer_id, producer_epoch = self.producer_id, self.producer_epoch
        try:
            for start in range(0, len(tps), PARTITIONS_PER_ADD_MAX):
                chunk = tps[start:start + PARTITIONS_PER_ADD_MAX]
                await coordinator.send(
                    AddPartitionsHandler(txn.transactional_id, producer_id, producer_epoch, chunk),
                    producer_epoch=producer_epoch, keep_going=lambda: txn.state in SENDING_STATES)
                txn.partitions_added(chunk)
        except StopRetrying:
            txn.partitions_not_added(tps)
        except ClientError as exc:
            txn.partitions_not_added(tps)
            txn.on_coordinator_error(exc)
        except BaseException:
            txn.partitions_not_added(tps)
            raise
        finally:
            self.wakeup()
