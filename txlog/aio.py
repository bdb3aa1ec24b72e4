"""asyncio clients: :class:`AIOProducer` and :class:`AIOConsumer`, shaped like
aiokafka's ``AIOKafkaProducer`` / ``AIOKafkaConsumer``, for services written
with asyncio. ::

    async with AIOProducer("127.0.0.1:7001") as producer:
        metadata = await producer.send_and_wait("events", b"hello", key=b"user-1")
    async with AIOProducer("127.0.0.1:7001", transactional_id="etl-0") as producer:
        async with producer.transaction():          # commits, or aborts on an exception
            await producer.send("events", b"all or nothing")
    async with AIOConsumer("127.0.0.1:7001", group_id="g") as consumer:
        await consumer.subscribe(["events"])
        async for record in consumer:
            ...
            await consumer.commit()

Each one wraps the synchronous client of the same options (``Producer``,
``Consumer``); every operation that can block is a coroutine, and none blocks
the caller's event loop.

What runs where
---------------
* **The caller's event loop** runs argument checks, the hand-over of records
  and results, and nothing that waits on the network or on a lock held for long.
* **The client's worker thread(s)** (a ``ThreadPoolExecutor`` owned by the
  object, created by ``start()`` and shut down by ``stop()``) run the sync
  client's blocking methods:

  - AIOProducer: one *send* thread runs ``Producer.send`` (which may wait up to
    ``max_block_ms`` for a topic's metadata or for buffer space) and
    ``begin_transaction``, one call at a time in call order, so records keep the
    order of their ``send()`` calls. A small *wait* pool runs what waits for
    delivery or the coordinator: ``flush``, ``init/commit/abort/prepare_transaction``,
    ``send_offsets_to_transaction``, ``partitions_for``, ``close``. Those first
    wait for the sends already asked for (a barrier through the send thread), so
    a ``flush()`` or ``commit_transaction()`` covers every earlier ``send()``.
  - AIOConsumer: one thread runs every ``Consumer`` call in call order (the sync
    Consumer is not thread-safe: this keeps it on one thread at a time). A
    ``getmany``/``getone``/``async for`` wait is cut into polls of at most
    ``POLL_SLICE_S``, so a ``commit()``, ``seek()`` or ``stop()`` asked for
    meanwhile waits for one slice at most.
* **The sync client's own I/O loop thread** does the network I/O, as before.
  A record's delivery completes there; ``send()`` hands it to the caller's
  loop with ``asyncio.wrap_future``.

Cancellation
------------
Cancelling a task awaiting one of these coroutines never breaks the client: an
operation not started yet in the worker is dropped; one already running
finishes there, in the background. For ``getmany``/``getone`` the records a
cancelled poll brings are kept and returned first by the next call (positions,
``position()`` and ``commit()`` do not count records that were not handed out),
and what such a poll raises is raised by the next call.
A cancelled ``send()`` either did not queue its record (not started) or did
(its delivery goes on); a cancelled ``commit_transaction()`` goes on in the
background and the next ``commit_transaction()`` waits for it, as the sync
producer's timeouts do.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import inspect
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from txlog.consumer import Consumer
from txlog.errors import ClientClosedError, ClientError, NoOffsetForPartitionError, TransactionAbortableError
from txlog.membership import GroupMetadata
from txlog.producer import Producer
from txlog.structs import (
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
    TransactionHandle,
    as_tp,
)
from txlog.transactions import TxnState

T = TypeVar("T")
POLL_SLICE_S = 0.5  # the longest one poll holds the consumer's worker thread
WAIT_THREADS = 4  # an AIOProducer's threads for flush / transaction calls


class _Worker:
    """A thread pool running a sync client's blocking calls; ``run`` awaits one
    without blocking the running loop. Cancelling the awaiting task drops a call
    not started yet; a started one finishes in its thread."""

    def __init__(self, name: str, threads: int = 1):
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    async def create(self, factory: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``factory(...)`` in the worker; if the caller is cancelled meanwhile, the
        client made anyway is closed (it owns a thread)."""
        loop = asyncio.get_running_loop()
        made = loop.run_in_executor(self._executor, functools.partial(factory, *args, **kwargs))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(_close_if_made)
            raise

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Runs ``function(*args)`` in the worker, not waited for (errors are dropped)."""
        self._executor.submit(function, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)  # what was queued still runs


def _close_if_made(made: asyncio.Future) -> None:
    if not made.cancelled() and made.exception() is None:
        threading.Thread(target=made.result().close, name="txlog-aio-close", daemon=True).start()


def _checked_options(client: type, bootstrap, options: dict[str, Any]) -> None:
    """Unknown option names fail at construction (TypeError), as the sync client's would."""
    inspect.signature(client).bind(bootstrap, **options)


# --- the producer ---------------------------------------------------------------------------------


class AIOProducer:
    """The asyncio face of :class:`~txlog.producer.Producer` (same
    keyword options; see that module for the delivery and transaction
    guarantees). ``await start()`` (or ``async with``) creates it, and, with
    ``transactional_id``, calls ``init_transactions()`` as aiokafka's start does;
    ``await stop()`` flushes and closes it."""

    def __init__(self, bootstrap, **options: Any):
        _checked_options(Producer, bootstrap, options)
        self._bootstrap, self._options = bootstrap, options
        self._producer: Producer | None = None
        self._sends: _Worker | None = None
        self._waits: _Worker | None = None
        self._closed = False
        self._initialized_by_start = False

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates the sync producer (in a worker thread) and, when transactional,
        initializes its transactions (fencing older producers with the id).
        Failed or cancelled, it closes what it made."""
        if self._closed:
            raise ClientClosedError("the AIOProducer was stopped; create a new one")
        if self._producer is not None:
            return
        self._sends = _Worker("txlog-aio-producer-send")
        self._waits = _Worker("txlog-aio-producer-wait", WAIT_THREADS)
        try:
            self._producer = await self._sends.create(Producer, self._bootstrap, **self._options)
            if self._options.get("transactional_id") is not None:
                await self._waits.run(self._producer.init_transactions)
                self._initialized_by_start = True
        except BaseException:
            self._closed = True
            if self._producer is not None:
                self._waits.submit(self._producer.close, 0)
            self._sends.shutdown()
            self._waits.shutdown()
            raise

    async def stop(self, timeout_s: float | None = None) -> None:
        """Flushes (up to ``timeout_s``; None: until the delivery timeouts decide),
        aborts an open transaction, closes. Sends asked for before it go first.
        Idempotent."""
        if self._closed or self._producer is None:
            self._closed = True
            return
        self._closed = True
        assert self._sends is not None and self._waits is not None
        try:
            await self._sends.run(_barrier)
            await self._waits.run(self._producer.close, timeout_s)
        finally:
            self._sends.shutdown()
            self._waits.shutdown()

    async def __aenter__(self) -> AIOProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    def _started(self) -> Producer:
        if self._closed:
            raise ClientClosedError("the AIOProducer is stopped")
        if self._producer is None:
            raise ClientClosedError("the AIOProducer is not started: await start() (or use async with) first")
        return self._producer

    async def _wait(self, function: Callable[..., T], *args: Any) -> T:
        """Runs a waiting call in the wait pool, after the sends already asked for."""
        self._started()
        assert self._sends is not None and self._waits is not None
        await self._sends.run(_barrier)
        return await self._waits.run(function, *args)

    # --- sending -------------------------------------------------------------------------------

    async def send(self, topic: str, value=None, key=None, *, partition: int | None = None,
                   headers=None, timestamp_ms: int | None = None) -> asyncio.Future[RecordMetadata]:
        """Queues one record (``Producer.send`` in the send thread: it may wait for
        the topic's metadata or buffer space) and returns an asyncio future of
        its :class:`RecordMetadata`: ``await (await producer.send(...))``.
        What ``Producer.send`` raises at once (bad arguments, a transaction
        state that takes no records, a closed producer) raises here."""
        producer = self._started()
        assert self._sends is not None
        delivery = await self._sends.run(producer.send, topic, value, key, partition, headers, timestamp_ms)
        return asyncio.wrap_future(delivery, loop=asyncio.get_running_loop())

    async def send_and_wait(self, topic: str, value=None, key=None, *, partition: int | None = None,
                            headers=None, timestamp_ms: int | None = None) -> RecordMetadata:
        """``send()`` and waits for the record's delivery."""
        delivery = await self.send(topic, value, key, partition=partition, headers=headers,
                                   timestamp_ms=timestamp_ms)
        return await delivery

    async def flush(self, timeout_s: float | None = None) -> None:
        """Waits until every record sent before it completed (``Producer.flush``)."""
        await self._wait(self._started().flush, timeout_s)

    async def partitions_for(self, topic: str) -> list[int]:
        """The topic's partitions (waiting up to ``max_block_ms`` for its metadata)."""
        return await self._wait(self._started().partitions_for, topic)

    # --- transactions ----------------------------------------------------------------------------

    async def init_transactions(self, timeout_s: float | None = None) -> None:
        """``Producer.init_transactions``. ``start()`` did it already for a
        transactional producer: then this returns at once (unless the producer
        failed fatally: it raises that error)."""
        producer = self._started()
        if self._initialized_by_start and producer.transaction_state not in (
                TxnState.UNINITIALIZED, TxnState.INITIALIZING, TxnState.FATAL_ERROR):
            return
        await self._wait(producer.init_transactions, timeout_s)

    async def begin_transaction(self) -> None:
        """Opens a transaction (in the send thread, in order with the sends)."""
        producer = self._started()
        assert self._sends is not None
        await self._sends.run(producer.begin_transaction)

    async def send_offsets_to_transaction(self, offsets: Mapping, group_id: str | GroupMetadata,
                                          timeout_s: float | None = None) -> None:
        """``Producer.send_offsets_to_transaction``: pass an AIOConsumer's
        ``group_metadata()`` so a fenced member's commit is refused."""
        await self._wait(self._started().send_offsets_to_transaction, offsets, group_id, timeout_s)

    async def commit_transaction(self, timeout_s: float | None = None) -> None:
        """``Producer.commit_transaction``, after the sends asked for before it."""
        await self._wait(self._started().commit_transaction, timeout_s)

    async def abort_transaction(self, timeout_s: float | None = None) -> None:
        """``Producer.abort_transaction``, after the sends asked for before it."""
        await self._wait(self._started().abort_transaction, timeout_s)

    async def prepare_transaction(self, prepared_timeout_ms: int = 0, timeout_s: float | None = None, *,
                                  metadata: bytes = b"") -> TransactionHandle:
        """``Producer.prepare_transaction`` (two-phase participation; ``metadata``
        goes to the group's checker if the transaction is checked back)."""
        return await self._wait(functools.partial(self._started().prepare_transaction, metadata=metadata),
                                prepared_timeout_ms, timeout_s)

    def transaction(self) -> _Transaction:
        """``async with producer.transaction():`` begins a transaction, commits it
        when the block ends normally and aborts it when the block raises (the
        exception then goes on). A commit that fails with
        TransactionAbortableError is aborted, then raised: the producer is ready
        for the next transaction either way, unless it failed fatally (fenced)."""
        self._started()
        return _Transaction(self)

    # --- observation (plain reads, they do not block) ----------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._started().producer_id

    @property
    def producer_epoch(self) -> int:
        return self._started().producer_epoch

    @property
    def transaction_state(self) -> TxnState | None:
        return self._started().transaction_state

    @property
    def stats(self):
        return self._started().stats


def _barrier() -> None:
    """Run in the send thread: returns once the sends queued before it ran."""


class _Transaction:
    """The context manager of :meth:`AIOProducer.transaction`."""

    def __init__(self, producer: AIOProducer):
        self._producer = producer

    async def __aenter__(self) -> AIOProducer:
        await self._producer.begin_transaction()
        return self._producer

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        producer = self._producer
        if exc_type is None:
            try:
                await producer.commit_transaction()
            except TransactionAbortableError:
                await producer.abort_transaction()
                raise
            return False
        # The block raised (or was cancelled): abort what is open, then let the exception go on.
        if producer.transaction_state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
            await producer.abort_transaction()
        return False


# --- the consumer --------------------------------------------------------------------------------


class _ListenerScope:
    """Set while an async rebalance listener of ``consumer`` runs on the caller's
    loop: the consumer's worker thread is then parked in ``poll`` waiting for
    it, so the listener's own calls run in a thread of their own."""

    def __init__(self, consumer: AIOConsumer):
        self.consumer = consumer
        self.active = True


_listener_scope: contextvars.ContextVar[_ListenerScope | None] = contextvars.ContextVar(
    "txlog_aio_listener_scope", default=None)


class AIOConsumer:
    """The asyncio face of :class:`~txlog.consumer.Consumer` (same
    keyword options and guarantees). ``await start()`` (or ``async with``)
    creates it; ``await stop()`` commits (with ``enable_auto_commit``), leaves
    the group and closes.

    Unlike aiokafka, ``subscribe``, ``assign``, ``seek``, ``pause`` ... are
    coroutines: each is a call of the sync consumer, made in the worker thread
    after the calls before it. ``assignment()``, ``paused()`` and
    ``group_metadata()`` are plain reads."""

    def __init__(self, bootstrap, **options: Any):
        _checked_options(Consumer, bootstrap, options)
        self._bootstrap, self._options = bootstrap, options
        timeout_ms = options.get("consumer_timeout_ms")
        self._iteration_timeout_s = None if timeout_ms is None else timeout_ms / 1000
        self._consumer: Consumer | None = None
        self._worker: _Worker | None = None
        self._closed = False
        # Records a poll brought that were not handed out yet (a getmany with
        # max_records, or a cancelled one). Filled by the worker, emptied by the
        # caller's loop; a poll runs only when it is empty.
        self._buffer: collections.deque[ConsumerRecord] = collections.deque()
        self._buffer_lock = threading.Lock()
        # What a poll raised, kept for the getmany that comes for it (the one that
        # asked may have been cancelled meanwhile): raised after the buffered records.
        self._poll_error: Exception | None = None

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates the sync consumer in the worker thread (no network yet)."""
        if self._closed:
            raise ClientClosedError("the AIOConsumer was stopped; create a new one")
        if self._consumer is not None:
            return
        self._worker = _Worker("txlog-aio-consumer")
        try:
            self._consumer = await self._worker.create(Consumer, self._bootstrap, **self._options)
        except BaseException:
            self._closed = True
            self._worker.shutdown()
            raise

    async def stop(self, timeout_s: float | None = None) -> None:
        """Gives records fetched but not handed out back (seeks to them, so an
        auto-commit does not count them), then ``Consumer.close``: commits with
        ``enable_auto_commit``, leaves the group. A ``getmany`` in progress
        raises ClientClosedError, an ``async for`` ends. Idempotent."""
        if self._closed or self._consumer is None:
            self._closed = True
            return
        self._closed = True
        assert self._worker is not None
        try:
            await self._worker.run(self._close_sync, self._consumer, timeout_s)
        finally:
            self._worker.shutdown()

    def _close_sync(self, consumer: Consumer, timeout_s: float | None) -> None:
        try:
            self._unbuffer_sync(consumer, None)
        finally:
            consumer.close(timeout_s)

    async def __aenter__(self) -> AIOConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    def _started(self) -> Consumer:
        if self._closed:
            raise ClientClosedError("the AIOConsumer is stopped")
        if self._consumer is None:
            raise ClientClosedError("the AIOConsumer is not started: await start() (or use async with) first")
        return self._consumer

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs a sync consumer call in the worker thread, after the ones before it
        (inside an async rebalance listener: in a thread of its own, see
        :class:`_ListenerScope`)."""
        scope = _listener_scope.get()
        if scope is not None and scope.active and scope.consumer is self:
            return await asyncio.to_thread(function, *args, **kwargs)
        assert self._worker is not None
        return await self._worker.run(function, *args, **kwargs)

    # --- assignment and positions -------------------------------------------------------------

    async def subscribe(self, topics: Iterable[str] | re.Pattern = (), *, pattern: str | re.Pattern | None = None,
                        on_assign: Callable | None = None, on_revoke: Callable | None = None,
                        on_lost: Callable | None = None, listener=None) -> None:
        """``Consumer.subscribe``: joins the group. The listeners run inside
        ``getmany``/``getone``, as the sync consumer's run inside ``poll``: a
        plain function in the worker thread, a coroutine function on this event
        loop (the poll waits for it; it may await this consumer's ``commit``,
        ``position``, ``seek``..., not ``getmany``). ``listener``: an object
        with aiokafka's ``on_partitions_assigned`` / ``on_partitions_revoked``
        (used when ``on_assign`` / ``on_revoke`` are not given)."""
        consumer = self._started()
        if listener is not None:
            on_assign = on_assign or getattr(listener, "on_partitions_assigned", None)
            on_revoke = on_revoke or getattr(listener, "on_partitions_revoked", None)
        loop = asyncio.get_running_loop()
        await self._call(consumer.subscribe, topics, pattern=pattern, on_assign=self._adapt(on_assign, loop),
                         on_revoke=self._adapt(on_revoke, loop), on_lost=self._adapt(on_lost, loop))

    def _adapt(self, callback: Callable | None, loop: asyncio.AbstractEventLoop) -> Callable | None:
        """A listener for the sync consumer (called in the worker thread): a
        coroutine it returns is run on ``loop``, and waited for."""
        if callback is None:
            return None

        def call(partitions: set[TopicPartition]) -> None:
            outcome = callback(partitions)
            if inspect.isawaitable(outcome):
                self._await_on(loop, outcome)

        return call

    def _await_on(self, loop: asyncio.AbstractEventLoop, awaitable) -> None:
        async def scoped():
            scope = _ListenerScope(self)
            token = _listener_scope.set(scope)
            try:
                return await awaitable
            finally:
                scope.active = False  # tasks the listener started keep the variable, not the scope
                _listener_scope.reset(token)

        if loop.is_closed() or not loop.is_running():
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise ClientClosedError("the event loop of the rebalance listener is not running")
        asyncio.run_coroutine_threadsafe(scoped(), loop).result()

    async def unsubscribe(self) -> None:
        """``Consumer.unsubscribe``: leaves the group; records not handed out are dropped."""
        await self._call(self._unsubscribe_sync, self._started())

    def _unsubscribe_sync(self, consumer: Consumer) -> None:
        consumer.unsubscribe()
        self._drop(lambda tp: True)

    async def assign(self, partitions: Iterable) -> None:
        """``Consumer.assign``: replaces the assignment ((topic, partition) pairs)."""
        tps = [as_tp(p) for p in partitions]
        await self._call(self._assign_sync, self._started(), tps)

    def _assign_sync(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.assign(tps)
        kept = set(tps)
        self._drop(lambda tp: tp not in kept)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer owns now (a plain read)."""
        return self._started().assignment()

    def paused(self) -> set[TopicPartition]:
        """The assigned partitions that are paused (a plain read)."""
        return self._started().paused()

    def group_metadata(self) -> GroupMetadata:
        """For ``AIOProducer.send_offsets_to_transaction`` (a plain read)."""
        return self._started().group_metadata()

    async def pause(self, *partitions) -> None:
        """``Consumer.pause``; records of them fetched but not handed out are
        given back (their positions move back to them)."""
        tps = [as_tp(p) for p in partitions]
        await self._call(self._pause_sync, self._started(), tps)

    def _pause_sync(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.pause(*tps)
        self._unbuffer_sync(consumer, set(tps))

    async def resume(self, *partitions) -> None:
        """``Consumer.resume``."""
        consumer = self._started()
        await self._call(consumer.resume, *[as_tp(p) for p in partitions])

    async def seek(self, partition, offset: int) -> None:
        """The next ``getmany`` returns ``partition``'s records from ``offset`` on."""
        tp = as_tp(partition)
        await self._call(self._seek_sync, self._started(), tp, offset)

    def _seek_sync(self, consumer: Consumer, tp: TopicPartition, offset: int) -> None:
        consumer.seek(tp, offset)
        self._drop(lambda t: t == tp)

    async def seek_to_beginning(self, *partitions) -> None:
        """To the log start offset (no argument: every assigned partition)."""
        await self._call(self._seek_to_sync, self._started(), [as_tp(p) for p in partitions], True)

    async def seek_to_end(self, *partitions) -> None:
        """To the end (the last stable offset under read_committed; no argument: every assigned partition)."""
        await self._call(self._seek_to_sync, self._started(), [as_tp(p) for p in partitions], False)

    def _seek_to_sync(self, consumer: Consumer, tps: list[TopicPartition], beginning: bool) -> None:
        (consumer.seek_to_beginning if beginning else consumer.seek_to_end)(*tps)
        moved = set(tps)
        self._drop(lambda tp: not moved or tp in moved)

    async def position(self, partition, timeout_s: float | None = None) -> int:
        """The offset of the next record ``getmany`` hands out for ``partition``."""
        tp = as_tp(partition)
        return await self._call(self._position_sync, self._started(), tp, timeout_s)

    def _position_sync(self, consumer: Consumer, tp: TopicPartition, timeout_s: float | None) -> int:
        first = self._first_buffered().get(tp)
        return first if first is not None else consumer.position(tp, timeout_s)

    async def committed(self, partition, timeout_s: float | None = None) -> int | None:
        """``Consumer.committed``: the group's committed offset for ``partition``, or None."""
        consumer = self._started()
        return await self._call(consumer.committed, as_tp(partition), timeout_s)

    async def committed_offsets(self, partitions: Iterable,
                                timeout_s: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        consumer = self._started()
        return await self._call(consumer.committed_offsets, [as_tp(p) for p in partitions], timeout_s)

    async def beginning_offsets(self, partitions: Iterable, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        consumer = self._started()
        return await self._call(consumer.beginning_offsets, [as_tp(p) for p in partitions], timeout_s)

    async def end_offsets(self, partitions: Iterable, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        consumer = self._started()
        return await self._call(consumer.end_offsets, [as_tp(p) for p in partitions], timeout_s)

    async def partitions_for(self, topic: str, timeout_s: float | None = None) -> list[int]:
        consumer = self._started()
        return await self._call(consumer.partitions_for, topic, timeout_s)

    # --- offsets ---------------------------------------------------------------------------------------

    async def commit(self, offsets: dict | None = None, timeout_s: float | None = None) -> None:
        """``Consumer.commit``. By default it commits what was handed out: the
        positions of the assigned partitions, where a partition with records
        fetched but not handed out yet commits the offset of the first of them."""
        await self._call(self._commit_sync, self._started(), offsets, timeout_s)

    def _commit_sync(self, consumer: Consumer, offsets: dict | None, timeout_s: float | None) -> None:
        if offsets is not None:
            consumer.commit(offsets, timeout_s)
            return
        firsts = self._first_buffered()
        if not firsts:
            consumer.commit(timeout_s=timeout_s)
            return
        to_commit: dict[TopicPartition, int] = {}
        for tp in consumer.assignment():
            if tp in firsts:
                to_commit[tp] = firsts[tp]
                continue
            try:
                to_commit[tp] = consumer.position(tp, timeout_s)
            except NoOffsetForPartitionError:
                continue  # no position to commit (the sync default skips it too)
            except ClientError:
                if tp in consumer.assignment():
                    raise
                # revoked meanwhile: no longer ours to commit
        consumer.commit(to_commit, timeout_s)

    # --- reading ---------------------------------------------------------------------------------------

    async def getmany(self, timeout_ms: float = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """The records that came within ``timeout_ms`` (0: what is there now),
        at most ``max_records`` (None: one poll's, up to ``max_poll_records``),
        by partition, each partition's in offset order; ``{}`` when none came.
        Polls run in the worker thread in slices of ``POLL_SLICE_S``; the event
        loop stays free meanwhile. Cancelling it loses nothing (module notes)."""
        if isinstance(timeout_ms, bool) or not timeout_ms >= 0:
            raise ValueError(f"timeout_ms must be a number >= 0, not {timeout_ms!r}")
        records = await self._get(max_records, timeout_ms / 1000)
        by_partition: dict[TopicPartition, list[ConsumerRecord]] = {}
        for record in records:
            by_partition.setdefault(TopicPartition(record.topic, record.partition), []).append(record)
        return by_partition

    async def getone(self) -> ConsumerRecord:
        """The next record, waiting as long as it takes (ClientClosedError once stopped)."""
        (record,) = await self._get(1, None)
        return record

    def __aiter__(self) -> AIOConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record; the iteration ends when the consumer is stopped or,
        with ``consumer_timeout_ms``, that long passes without a record."""
        self._started()
        try:
            records = await self._get(1, self._iteration_timeout_s)
        except ClientClosedError:
            if self._closed:
                raise StopAsyncIteration from None
            raise
        if not records:
            raise StopAsyncIteration
        return records[0]

    async def _get(self, max_records: int | None, timeout_s: float | None) -> list[ConsumerRecord]:
        """Up to ``max_records`` records within ``timeout_s`` (None: until one comes)."""
        if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int)
                                        or max_records < 1):
            raise ValueError(f"max_records must be an int >= 1 or None, not {max_records!r}")
        scope = _listener_scope.get()
        if scope is not None and scope.active and scope.consumer is self:
            raise RuntimeError("getmany()/getone() inside this consumer's rebalance listener would wait for itself")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        polled = False
        while True:
            consumer = self._started()
            records = self._take(max_records)
            if records:
                return records
            error = self._take_poll_error()
            if error is not None:
                raise error
            if polled and deadline is not None and loop.time() >= deadline:
                return []
            slice_s = POLL_SLICE_S if deadline is None else max(0.0, min(POLL_SLICE_S, deadline - loop.time()))
            assert self._worker is not None
            await self._worker.run(self._fill_sync, consumer, slice_s)
            polled = True

    def _fill_sync(self, consumer: Consumer, timeout_s: float) -> None:
        """In the worker: one poll into the buffer, unless it holds records already."""
        with self._buffer_lock:
            if self._buffer or self._poll_error is not None:
                return
        try:
            records = consumer.poll(timeout_s)
        except Exception as exc:  # noqa: BLE001 -- handed to the next getmany, see _take_poll_error
            with self._buffer_lock:
                self._poll_error = exc
            return
        with self._buffer_lock:
            self._buffer.extend(records)

    def _take_poll_error(self) -> Exception | None:
        with self._buffer_lock:
            error, self._poll_error = self._poll_error, None
        return error

    def _take(self, max_records: int | None) -> list[ConsumerRecord]:
        with self._buffer_lock:
            count = len(self._buffer) if max_records is None else min(max_records, len(self._buffer))
            return [self._buffer.popleft() for _ in range(count)]

    def _first_buffered(self) -> dict[TopicPartition, int]:
        firsts: dict[TopicPartition, int] = {}
        with self._buffer_lock:
            for record in self._buffer:
                firsts.setdefault(TopicPartition(record.topic, record.partition), record.offset)
        return firsts

    def _drop(self, which: Callable[[TopicPartition], bool]) -> dict[TopicPartition, int]:
        """Removes the buffered records of the partitions ``which`` picks; their first offsets."""
        firsts: dict[TopicPartition, int] = {}
        with self._buffer_lock:
            kept = []
            for record in self._buffer:
                tp = TopicPartition(record.topic, record.partition)
                if which(tp):
                    firsts.setdefault(tp, record.offset)
                else:
                    kept.append(record)
            self._buffer.clear()
            self._buffer.extend(kept)
        return firsts

    def _unbuffer_sync(self, consumer: Consumer, tps: set[TopicPartition] | None) -> None:
        """In the worker: gives buffered records back to the consumer (seeks to the
        first of each partition's), so its positions count only what was handed out."""
        firsts = self._drop(lambda tp: tps is None or tp in tps)
        assigned = consumer.assignment()
        for tp, offset in firsts.items():
            if tp in assigned:
                consumer.seek(tp, offset)


__all__ = ["AIOConsumer", "AIOProducer"]
