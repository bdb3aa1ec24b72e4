"""The Consumer: Kafka's consumer API, with partitions assigned by hand
(``assign``) or by its group (``subscribe``), synchronous for its callers,
backed by one event loop thread per Consumer.

Guarantees
----------
* ``poll`` returns records of the assigned partitions in offset order per
  partition, at most ``max_poll_records`` per call; with ``read_committed``
  (the default) only committed transactional records and non-transactional
  ones, never at or above the last stable offset (the leader filters).
* Start positions: the group's committed offsets when ``group_id`` is set and
  the group has one for the partition; else ``auto_offset_reset``
  ("earliest", "latest" -- the last stable offset under read_committed --, or
  "none": NoOffsetForPartitionError). A position that falls out of the log's
  range is reset the same way.
* ``commit`` stores offsets at the group's coordinator and returns once all are
  stored; by default it commits the current positions (the offset of the next
  record each partition would return).
* With ``enable_auto_commit`` the positions are committed every
  ``auto_commit_interval_ms`` from inside ``poll``, and on ``close``.

* ``subscribe`` joins the group (KIP-848, txlog/membership.py):
  the group's coordinator assigns the partitions and moves them between
  members cooperatively. A partition taken away stops being fetched at once;
  in the next ``poll``, its position is committed (with
  ``enable_auto_commit``) and ``on_revoke`` runs, and only then is it given
  up, so the next owner starts from that commit. ``on_assign`` runs in
  ``poll`` for partitions given; ``on_lost`` (else ``on_revoke``) for
  partitions lost when the group fenced this member (they may already be
  someone else's: commit nothing for them). Commits of a subscribed consumer
  carry its member id and epoch; the coordinator refuses a stale one
  (STALE_MEMBER_EPOCH). ``close`` leaves the group. ``group_metadata()`` is
  what ``Producer.send_offsets_to_transaction`` takes so that a zombie's
  transactional commit is refused too.

* ``subscribe(pattern=...)`` takes every topic whose whole name matches,
  internal ones left out, looked up again every ``metadata_max_age_ms``.
* ``pause`` stops fetching and returning a partition's records until
  ``resume``; its position and buffered records stay.
* Iterating over the consumer yields records one at a time, polling as
  needed, until ``close`` (or ``consumer_timeout_ms`` without a record).

Without ``subscribe``, partitions are assigned by the application (as Spark
does), and a group is only a name for committed offsets.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from txlog import serde, shutdown
from txlog._loop import LoopThread
from txlog.config import ConsumerConfig
from txlog.errors import ClientClosedError, ClientError, NoOffsetForPartitionError
from txlog.fetcher import Fetcher, list_offsets
from txlog.group import GroupOffsets
from txlog.membership import GroupMetadata, Membership
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.requests import retry_policy
from txlog.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition, as_tp
from txlog.transport import Transport, tls_files
from txlog.v1 import partition_pb2

ASSIGNED_PARTITIONS_MAX = 100_000
ITERATION_POLL_S = 1.0  # one poll's wait while iterating: a close() is seen within it


class Consumer:
    """Reads records from assigned partitions. Not thread-safe: use it from one
    thread at a time (as Kafka's consumer)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        group_id: str | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: float = 5000,
        max_poll_records: int = 500,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        fetch_max_wait_ms: float = 500,
        request_timeout_ms: float = 30_000,
        retry_backoff_ms: float = 100,
        default_api_timeout_ms: float = 60_000,
        metadata_max_age_ms: float = 300_000,
        transport=None,
        tracer_provider=None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token_file: str | None = None,
        session_timeout_ms: int = 45_000,
        group_instance_id: str | None = None,
        group_remote_assignor: str | None = None,
        consumer_timeout_ms: float | None = None,
        key_deserializer: str | serde.Deserializer | None = None,
        value_deserializer: str | serde.Deserializer | None = None,
        include_transaction_outcomes: bool = False,
        client_id: str = "",
    ):
        self._key_deserializer = serde.deserializer(key_deserializer, "key_deserializer")
        self._value_deserializer = serde.deserializer(value_deserializer, "value_deserializer")
        self.config = ConsumerConfig(
            group_id=group_id, isolation_level=isolation_level, auto_offset_reset=auto_offset_reset,
            enable_auto_commit=enable_auto_commit, auto_commit_interval_ms=auto_commit_interval_ms,
            max_poll_records=max_poll_records, fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes, fetch_max_wait_ms=fetch_max_wait_ms,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            default_api_timeout_ms=default_api_timeout_ms, metadata_max_age_ms=metadata_max_age_ms,
            include_transaction_outcomes=include_transaction_outcomes,
        )
        self._transport = transport or Transport(request_timeout_ms=int(request_timeout_ms),
                                                 tracer_provider=tracer_provider,
                                                 tls_files=tls_files(tls_ca, tls_cert, tls_key, token_file),
                                                 client_id=client_id)
        self._metadata = Metadata(self._transport, bootstrap, refresh_backoff_ms=retry_backoff_ms,
                                  max_age_ms=metadata_max_age_ms)
        self._fetcher = Fetcher(self._metadata, self._transport, self.config)
        self._group = None if group_id is None else GroupOffsets(
            self._metadata, self._transport, group_id, request_timeout_ms=request_timeout_ms)
        self._last_auto_commit_s = time.monotonic()
        self._closed = False
        self._loop = LoopThread("txlog-consumer")
        self._membership_options = {"session_timeout_ms": int(session_timeout_ms), "instance_id": group_instance_id,
                                    "assignor": group_remote_assignor}
        if consumer_timeout_ms is not None and (isinstance(consumer_timeout_ms, bool) or not consumer_timeout_ms >= 0):
            raise ValueError(f"consumer_timeout_ms must be a number >= 0 (or None: iterate until closed), not {consumer_timeout_ms!r}")
        self._iteration_timeout_s = None if consumer_timeout_ms is None else consumer_timeout_ms / 1000
        self._membership: Membership | None = None
        self._listeners: dict[str, Callable | None] = {}
        # assignment changes the loop thread saw, for poll() to act on in the application's thread
        self._changes: collections.deque = collections.deque()
        shutdown.close_at_exit(self)  # left open, it is closed at interpreter exit

    # --- assignment and positions -------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | re.Pattern = (), *, pattern: str | re.Pattern | None = None,
                  on_assign: Callable | None = None, on_revoke: Callable | None = None,
                  on_lost: Callable | None = None) -> None:
        """Joins the group (``group_id``) subscribed to ``topics``, or to every
        topic whose whole name ``pattern`` (a regular expression, or a compiled
        one passed as ``topics``) matches, looked up again every
        ``metadata_max_age_ms``; the group's coordinator assigns partitions (see
        the module's notes). Calling it again changes the subscription."""
        self._check_open()
        group = self._require_group()
        if isinstance(topics, re.Pattern):
            topics, pattern = (), topics
        if isinstance(topics, str):
            raise ValueError(f"subscribe takes a list of topic names (or pattern=...), not the string {topics!r}")
        wanted = frozenset(topics)
        if pattern is not None:
            if wanted:
                raise ValueError("subscribe to topics or to a pattern, not both")
            try:
                compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        elif not wanted or any(not isinstance(t, str) or not t for t in wanted):
            raise ValueError(f"subscribe to one or more topic names (or pattern=...), not {sorted(map(repr, wanted))}")
        if self._membership is None and self._fetcher.states:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "this consumer has assigned partitions; a consumer "
                              "either assign()s or subscribe()s")
        self._listeners = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        subscription = compiled if pattern is not None else wanted
        self._loop.run(self._subscribe(group.group_id, subscription), what="subscribe")

    async def _subscribe(self, group_id: str, subscription: frozenset[str] | re.Pattern) -> None:
        if self._membership is None:
            self._membership = Membership(self._metadata, self._transport, group_id, frozenset(), on_change=self._assignment_changed,
                                          request_timeout_ms=self.config.request_timeout_ms,
                                          retry_backoff_ms=self.config.retry_backoff_ms, **self._membership_options)
            self._membership.start()
        if isinstance(subscription, re.Pattern):
            self._membership.subscribe_pattern(subscription, self.config.metadata_max_age_ms)
        else:
            self._membership.subscribe(subscription)

    def _assignment_changed(self, *, added=frozenset(), revoked=frozenset(), lost=frozenset()) -> None:
        """On the loop thread: fetch what was added, stop fetching what went."""
        gone = revoked | lost
        positions = {tp: self._fetcher.states[tp].position for tp in gone if tp in self._fetcher.states}
        self._fetcher.assign([tp for tp in self._fetcher.states if tp not in gone] + sorted(added))
        if added:
            self._changes.append(("assign", frozenset(added), {}))
        if revoked:
            self._changes.append(("revoke", frozenset(revoked), positions))
        if lost:
            self._changes.append(("lost", frozenset(lost), {}))

    def _run_listeners(self) -> None:
        """In the application's thread (poll): commit and call back for the
        partitions that moved, then let the group hand revoked ones on."""
        while self._changes:
            kind, tps, positions = self._changes.popleft()
            try:
                if kind == "revoke" and self.config.enable_auto_commit:
                    committable = {tp: p for tp, p in positions.items() if p is not None}
                    if committable:
                        self.commit(committable)
                listener = self._listeners.get(kind) or (self._listeners.get("revoke") if kind == "lost" else None)
                if listener is not None:
                    listener(set(tps))
            finally:
                if kind == "revoke":
                    self._loop.run(self._call(self._membership.revocation_done, tps), what="revocation")

    async def _wait_for_assignment(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._fetcher.states and not self._changes and time.monotonic() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def unsubscribe(self) -> None:
        """Leaves the group; the consumer owns no partition after it."""
        self._check_open()
        if self._membership is None:
            return
        self._loop.run(self._membership.leave(), timeout_s=self.config.request_timeout_ms / 1000 + 5, what="leaving the group")
        self._loop.run(self._assign([]), what="unsubscribe")
        self._membership, self._changes = None, collections.deque()

    def group_metadata(self) -> GroupMetadata:
        """This consumer's group, member id and member epoch, for
        ``Producer.send_offsets_to_transaction`` (a zombie's commit is then refused)."""
        group = self._require_group()
        return self._membership.metadata() if self._membership is not None else GroupMetadata(group.group_id)

    def assign(self, partitions: Iterable) -> None:
        """Replaces the assignment with ``partitions`` ((topic, partition) pairs)."""
        self._check_open()
        if self._membership is not None:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "this consumer subscribe()d: its group assigns its "
                              "partitions (unsubscribe() first)")
        tps = list(dict.fromkeys(as_tp(p) for p in partitions))
        if len(tps) > ASSIGNED_PARTITIONS_MAX:
            raise ValueError(f"at most {ASSIGNED_PARTITIONS_MAX} partitions per consumer, not {len(tps)}")
        self._loop.run(self._assign(tps), what="assign")

    async def _assign(self, tps: list[TopicPartition]) -> None:
        self._fetcher.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer owns now ((topic, partition) pairs)."""
        return set(self._fetcher.states)

    def pause(self, *partitions) -> None:
        """Stops fetching ``partitions`` (assigned ones) and returning their
        records until ``resume``; their positions stay, and a paused partition
        the group keeps assigned stays paused across rebalances."""
        self._set_paused(partitions, True)

    def resume(self, *partitions) -> None:
        """Fetches ``partitions`` again, from where they were paused."""
        self._set_paused(partitions, False)

    def paused(self) -> set[TopicPartition]:
        """The assigned partitions that are paused."""
        return {tp for tp, state in self._fetcher.states.items() if state.paused}

    def _set_paused(self, partitions, paused: bool) -> None:
        self._check_open()
        tps = [as_tp(p) for p in partitions]
        self._loop.run(self._call(self._fetcher.set_paused, tps, paused), what="pause" if paused else "resume")

    def seek(self, partition, offset: int) -> None:
        """The next poll returns ``partition``'s records from ``offset`` on."""
        self._check_open()
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, not {offset!r}")
        tp = as_tp(partition)
        self._loop.run(self._call(self._fetcher.seek, tp, offset), what="seek")

    def seek_to_beginning(self, *partitions) -> None:
        """Moves to the log start offset (no argument: every assigned partition)."""
        self._reset(partitions, "earliest")

    def seek_to_end(self, *partitions) -> None:
        """Moves to the end: the last stable offset under read_committed, else the
        high watermark (no argument: every assigned partition)."""
        self._reset(partitions, "latest")

    def _reset(self, partitions, strategy: str) -> None:
        self._check_open()
        tps = [as_tp(p) for p in partitions] or list(self._fetcher.states)
        for tp in tps:
            self._loop.run(self._call(self._fetcher.request_reset, tp, strategy), what="seek")

    @staticmethod
    async def _call(function, *args):
        return function(*args)

    def position(self, partition, timeout_s: float | None = None) -> int:
        """The offset of the next record ``poll`` returns for ``partition``."""
        self._check_open()
        tp = as_tp(partition)
        timeout_ms = self._timeout_ms(timeout_s)
        return self._loop.run(self._position(tp, timeout_ms), timeout_s=timeout_ms / 1000 + 5, what="position")

    async def _position(self, tp: TopicPartition, timeout_ms: float) -> int:
        # Again while the group replaced the partition's state during a lookup (taken away and given back):
        # each round awaits the servers, and position()'s own timeout bounds them.
        while (state := self._fetcher._state(tp)).position is None:
            await self._ensure_positions(timeout_ms)
        return state.position

    async def _ensure_positions(self, timeout_ms: float) -> None:
        missing = self._fetcher.missing_positions()
        if missing and self._group is not None:
            # The membership task runs during the await: it may give partitions (asked about in the next
            # round, never reset unasked: they have committed offsets of their own), or take one away and
            # give it back (a new state, whose committed offset may have moved since it was asked).
            asked = {tp: self._fetcher.states[tp] for tp in missing}
            committed = await self._group.fetch(missing, policy=self._policy(timeout_ms),
                                                require_stable=self.config.isolation_level == "read_committed")
            missing = [tp for tp, state in asked.items() if self._fetcher.states.get(tp) is state
                       and state.position is None and state.reset_to is None]
            for tp in missing:
                if committed.get(tp) is not None:
                    self._fetcher.seek(tp, committed[tp])
            missing = [tp for tp in missing if asked[tp].position is None]
        for tp in missing:
            if self.config.auto_offset_reset == "none":
                raise NoOffsetForPartitionError(
                    f"no committed offset for {tp.topic}-{tp.partition} (group {self.config.group_id!r}) "
                    "and auto_offset_reset is 'none'; seek() to a position first")
            self._fetcher.request_reset(tp, self.config.auto_offset_reset)
        await self._fetcher.reset_positions(timeout_ms)

    def _policy(self, timeout_ms: float):
        return retry_policy(deadline_ms=timeout_ms, backoff_ms=self.config.retry_backoff_ms)

    def _timeout_ms(self, timeout_s: float | None) -> float:
        return self.config.default_api_timeout_ms if timeout_s is None else timeout_s * 1000

    # --- polling ------------------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> list[ConsumerRecord]:
        """Records fetched within ``timeout_s`` (an empty list when none came)."""
        self._check_open()
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        if self._membership is not None:
            self._run_listeners()
            if not self._fetcher.states:  # nothing assigned yet (or now): wait for the group
                self._loop.run(self._wait_for_assignment(timeout_s), timeout_s=timeout_s + 5, what="poll")
                self._run_listeners()
                return []
        elif not self._fetcher.states:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "poll() without assigned partitions; assign() or subscribe() first")
        if self.config.enable_auto_commit and \
                (time.monotonic() - self._last_auto_commit_s) * 1000 >= self.config.auto_commit_interval_ms:
            self.commit()
        timeout_ms = timeout_s * 1000
        records = self._loop.run(self._poll(timeout_ms),
                                 timeout_s=timeout_s + self.config.request_timeout_ms / 1000 + 5, what="poll")
        if self._key_deserializer is None and self._value_deserializer is None:
            return records
        return self._deserialized(records)

    def _deserialized(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        """The records with their keys and values read. At the first that does
        not read, the records before it are returned and every partition of it
        and of the records after it is rewound, so nothing is skipped: the next
        poll starts at that record and raises RecordDeserializationError."""
        done: list[ConsumerRecord] = []
        for index, record in enumerate(records):
            try:
                done.append(record._replace(
                    key=record.key if self._key_deserializer is None or record.key is None else self._key_deserializer(record.key),
                    value=record.value if self._value_deserializer is None or record.value is None
                    else self._value_deserializer(record.value)))
            except Exception as exc:  # noqa: BLE001 -- the application's deserializer: whatever it raises
                first: dict[TopicPartition, int] = {}
                for later in records[index:]:
                    first.setdefault(TopicPartition(later.topic, later.partition), later.offset)
                for tp, offset in first.items():
                    self.seek(tp, offset)
                if done:
                    return done
                tp = TopicPartition(record.topic, record.partition)
                raise serde.RecordDeserializationError(
                    tp, record.offset, f"{tp} offset {record.offset}: its deserializer failed: {type(exc).__name__}: {exc}; "
                    f"seek(({tp.topic!r}, {tp.partition}), {record.offset + 1}) to go on past it") from exc
        return done

    async def _poll(self, timeout_ms: float) -> list[ConsumerRecord]:
        deadline_s = time.monotonic() + timeout_ms / 1000
        while True:
            records = self._fetcher.drain(self.config.max_poll_records)
            if records:
                return records
            remaining_ms = (deadline_s - time.monotonic()) * 1000
            try:
                await self._ensure_positions(max(remaining_ms, 1.0))
            except ClientError as exc:  # positions are looked up again on the next round or poll
                if not exc.retriable:
                    raise
                if time.monotonic() >= deadline_s:
                    return []
                await asyncio.sleep(min(self.config.retry_backoff_ms / 1000, max(0.0, deadline_s - time.monotonic())))
                continue
            remaining_ms = (deadline_s - time.monotonic()) * 1000
            await self._fetcher.fetch_once(max(0.0, min(self.config.fetch_max_wait_ms, remaining_ms)))
            records = self._fetcher.drain(self.config.max_poll_records)
            if records or time.monotonic() >= deadline_s:
                return records

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one at a time, polled as needed, until the consumer is closed
        or, with ``consumer_timeout_ms``, that long passes without a record."""
        last_record_s = time.monotonic()
        while not self._closed:
            wait_s = ITERATION_POLL_S
            if self._iteration_timeout_s is not None:
                left_s = self._iteration_timeout_s - (time.monotonic() - last_record_s)
                if left_s <= 0:
                    return
                wait_s = min(wait_s, left_s)
            records = self.poll(wait_s)
            if records:
                last_record_s = time.monotonic()
            yield from records

    # --- offsets --------------------------------------------------------------------------------------

    def commit(self, offsets: dict | None = None, timeout_s: float | None = None) -> None:
        """Commits ``offsets`` ({(topic, partition): next offset to consume, or an
        OffsetAndMetadata to store text beside it}) for the group; by default the
        current positions of the assigned partitions."""
        self._check_open()
        group = self._require_group()
        timeout_ms = self._timeout_ms(timeout_s)
        if offsets is None:
            to_commit = {tp: s.position for tp, s in self._fetcher.states.items() if s.position is not None}
        else:
            to_commit = {as_tp(tp): offset for tp, offset in offsets.items()}
        member = self._membership.metadata() if self._membership is not None else None
        if to_commit:
            self._loop.run(group.commit(to_commit, policy=self._policy(timeout_ms), member=member),
                           timeout_s=timeout_ms / 1000 + 5, what="commit")
        self._last_auto_commit_s = time.monotonic()

    def committed(self, partition, timeout_s: float | None = None) -> int | None:
        """The group's committed offset for ``partition``, or None. Under
        read_committed, offsets still pending in an open transaction are waited
        for (KIP-447's require_stable), as Kafka's consumer does."""
        self._check_open()
        group = self._require_group()
        tp = as_tp(partition)
        timeout_ms = self._timeout_ms(timeout_s)
        require_stable = self.config.isolation_level == "read_committed"
        committed = self._loop.run(group.fetch([tp], policy=self._policy(timeout_ms), require_stable=require_stable),
                                   timeout_s=timeout_ms / 1000 + 5, what="committed")
        return committed.get(tp)

    def committed_offsets(self, partitions: Iterable, timeout_s: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of ``partitions``, each with the text
        committed beside it (None: nothing committed), waited for as ``committed``."""
        self._check_open()
        group = self._require_group()
        tps = [as_tp(p) for p in partitions]
        timeout_ms = self._timeout_ms(timeout_s)
        return self._loop.run(group.fetch_with_metadata(tps, policy=self._policy(timeout_ms),
                                                         require_stable=self.config.isolation_level == "read_committed"),
                              timeout_s=timeout_ms / 1000 + 5, what="committed")

    def beginning_offsets(self, partitions: Iterable, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        return self._list_offsets(partitions, partition_pb2.OFFSET_SPEC_EARLIEST, timeout_s)

    def end_offsets(self, partitions: Iterable, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """The end of each partition as this consumer sees it: the last stable
        offset under read_committed, else the high watermark."""
        spec = partition_pb2.OFFSET_SPEC_LAST_STABLE if self.config.isolation_level == "read_committed" \
            else partition_pb2.OFFSET_SPEC_LATEST
        return self._list_offsets(partitions, spec, timeout_s)

    def _list_offsets(self, partitions: Iterable, spec: int, timeout_s: float | None) -> dict[TopicPartition, int]:
        self._check_open()
        tps = [as_tp(p) for p in partitions]
        timeout_ms = self._timeout_ms(timeout_s)
        answers = self._loop.run(
            list_offsets(self._metadata, self._transport, dict.fromkeys(tps, spec), {}, timeout_ms=timeout_ms,
                         backoff_ms=self.config.retry_backoff_ms, request_timeout_ms=self.config.request_timeout_ms),
            timeout_s=timeout_ms / 1000 + 5, what="list offsets")
        return {tp: offset for tp, (offset, _) in answers.items()}

    def partitions_for(self, topic: str, timeout_s: float | None = None) -> list[int]:
        """The partitions of ``topic`` (UNKNOWN_TOPIC_OR_PARTITION if it does not exist)."""
        self._check_open()
        timeout_ms = self._timeout_ms(timeout_s)
        info = self._loop.run(self._metadata.wait_for_topic(topic, timeout_ms, wait_for_creation=False),
                              timeout_s=timeout_ms / 1000 + 5,
                              what=f"waiting for topic {topic!r}")
        return [p.partition for p in info.partitions]

    def _require_group(self) -> GroupOffsets:
        if self._group is None:
            raise ClientError(ErrorCode.Value("INVALID_GROUP_ID"), "this consumer has no group_id; pass group_id=...")
        return self._group

    # --- closing ------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed")

    def close(self, timeout_s: float | None = None) -> None:
        """Commits the positions (with ``enable_auto_commit``), then closes. Idempotent."""
        if self._closed:
            return
        try:
            if self.config.enable_auto_commit:
                self.commit(timeout_s=timeout_s)
            if self._membership is not None:
                self._loop.run(self._membership.leave(), timeout_s=self.config.request_timeout_ms / 1000 + 5, what="leaving the group")
        finally:
            self._closed = True
            try:
                self._loop.run(self._transport.close(), timeout_s=5, what="closing connections")
            finally:
                self._loop.stop()
                shutdown.closed(self)

    def metrics(self) -> dict[str, float]:
        """This consumer's figures since it started (Kafka's consumer
        metrics): fetch requests and failures, their latency (average and
        max, ms), records and bytes (keys and values) returned by poll, and
        the lag: per assigned partition the records between its position and
        the end a reader of this isolation level reaches (the last stable
        offset under read_committed), the largest and the sum, as of the last
        fetch."""
        stats = self._fetcher.stats
        answered = stats.fetch_requests - stats.fetch_errors
        read_committed = self.config.isolation_level == "read_committed"
        lags = [max((state.last_stable_offset if read_committed else state.high_watermark) - state.position, 0)
                for state in list(self._fetcher.states.values())
                if state.position is not None and state.high_watermark >= 0]
        return {
            "fetch_requests": stats.fetch_requests, "fetch_errors": stats.fetch_errors,
            "fetch_latency_avg_ms": round(stats.fetch_latency_ms_total / answered, 3) if answered else 0.0,
            "fetch_latency_max_ms": round(stats.fetch_latency_ms_max, 3),
            "records_consumed": stats.records_consumed, "bytes_consumed": stats.bytes_consumed,
            "records_lag_max": max(lags, default=0), "records_lag_sum": sum(lags),
            "assigned_partitions": len(self._fetcher.states),
        }

    def close_at_exit(self, timeout_s: float) -> None:
        self.close(timeout_s)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


