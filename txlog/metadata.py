"""The client's cache of cluster metadata: topic -> partitions -> leader
(address, epoch), the live partition_svc addresses, group coordinators and
transaction coordinators.

Any partition_svc answers ``Metadata`` (as any Kafka broker does), so the cache
starts from the bootstrap addresses and then asks whichever known server
answers, rotating past unreachable ones.

Guarantees
----------
* Reads (:meth:`Metadata.topic`, :meth:`partition_count`, :meth:`leader`) never
  block and are safe from any thread: the topic table is an immutable snapshot
  swapped whole by the loop thread.
* Concurrent refreshes are coalesced into one Metadata call, and refreshes
  happen at most once per ``refresh_backoff_ms`` unless awaited explicitly; a
  snapshot older than ``max_age_ms`` is refreshed on the next use.
* Handlers mark the cache stale with :meth:`request_update` when a server
  answers NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE (also
  what an unreachable server reads as) or a leader-epoch error: the sorting
  lives in ``errors.action_for``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from txlog.errors import Action, ClientError, action_for, error_for, from_proto
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition
from txlog.v1 import partition_pb2

NONE = ErrorCode.Value("NONE")
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION")
REFRESH_BACKOFF_MS_DEFAULT = 100
MAX_AGE_MS_DEFAULT = 300_000
BOOTSTRAP_ADDRESSES_MAX = 1000


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of addresses -> a list of ``host:port``."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [item.strip() for item in items if item and item.strip()]
    if not addresses:
        raise ValueError("bootstrap must name at least one partition_svc address host:port")
    if len(addresses) > BOOTSTRAP_ADDRESSES_MAX:
        raise ValueError(f"at most {BOOTSTRAP_ADDRESSES_MAX} bootstrap addresses, not {len(addresses)}")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a bootstrap address is host:port, not {address!r}")
    return addresses


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader_id: int
    leader_address: str
    leader_epoch: int
    error_code: int = NONE
    error_message: str = ""
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()

    @property
    def has_leader(self) -> bool:
        return self.error_code == NONE and bool(self.leader_address)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: tuple[PartitionInfo, ...]
    error_code: int = NONE
    error_message: str = ""
    is_internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return self.error_code == NONE and bool(self.partitions)


def topic_info(proto: partition_pb2.TopicMetadata) -> TopicInfo:
    partitions = tuple(
        sorted(
            (
                PartitionInfo(proto.name, p.partition, p.leader_id, p.leader_address, p.leader_epoch,
                              p.error.code, p.error.message, tuple(p.replicas), tuple(p.isr))
                for p in proto.partitions
            ),
            key=lambda p: p.partition,
        )
    )
    return TopicInfo(proto.name, partitions, proto.error.code, proto.error.message, proto.is_internal,
                     dict(proto.configs))


def newest_leaders(fresh: TopicInfo, known: TopicInfo | None) -> TopicInfo:
    """``fresh``, but a partition whose leader epoch is older than the one
    known keeps the known leader (Kafka's KIP-232): a server that has not
    heard of a failover yet must not send the client back to a deposed leader,
    which could answer from a log behind the one it already read."""
    if known is None or not known.exists or len(known.partitions) != len(fresh.partitions):
        return fresh
    partitions = tuple(old if old.leader_epoch > new.leader_epoch else new
                       for new, old in zip(fresh.partitions, known.partitions, strict=True))
    return replace(fresh, partitions=partitions)


class Metadata:
    """The metadata cache of one client; its coroutines run on the client's loop."""

    def __init__(
        self,
        transport,
        bootstrap: str | Sequence[str],
        *,
        refresh_backoff_ms: float = REFRESH_BACKOFF_MS_DEFAULT,
        max_age_ms: float = MAX_AGE_MS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._transport = transport
        self._bootstrap = parse_bootstrap(bootstrap)
        self._brokers: list[str] = list(self._bootstrap)
        self._next_broker = 0
        self._topics: dict[str, TopicInfo] = {}
        self._tracked: set[str] = set()
        self._group_coordinators: dict[str, str] = {}
        self._txn_coordinators: dict[str, str] = {}
        self._stale = True
        self._last_refresh_s = float("-inf")
        self._refreshing: asyncio.Task | None = None
        self._listeners: list[Callable[[], None]] = []
        self._refresh_backoff_ms = refresh_backoff_ms
        self._max_age_ms = max_age_ms
        self._clock = clock

    # --- reads (any thread) --------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def partition_count(self, name: str) -> int | None:
        """The topic's partition count, or None when the topic is not (yet) known."""
        info = self._topics.get(name)
        return len(info.partitions) if info is not None and info.exists else None

    def leader(self, tp: TopicPartition) -> PartitionInfo | None:
        """The partition's leader, or None when unknown or leaderless."""
        info = self._topics.get(tp.topic)
        if info is None or not info.exists or not 0 <= tp.partition < len(info.partitions):
            return None
        partition = info.partitions[tp.partition]
        return partition if partition.has_leader else None

    @property
    def brokers(self) -> list[str]:
        return list(self._brokers)

    # --- updates (loop thread) -------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs on the loop after every refresh (a sender wakes up)."""
        self._listeners.append(listener)

    def track(self, topics: Iterable[str]) -> None:
        """Keeps ``topics`` in every future refresh."""
        new = set(topics) - self._tracked
        if new:
            self._tracked |= new
            self._stale = True

    def request_update(self) -> None:
        """Marks the cache stale: the next :meth:`maybe_refresh` refreshes it."""
        self._stale = True

    def needs_refresh(self) -> bool:
        age_ms = (self._clock() - self._last_refresh_s) * 1000
        return self._stale or age_ms >= self._max_age_ms

    def maybe_refresh(self) -> None:
        """Starts a background refresh if the cache is stale or old, none is
        running, and the last one was at least ``refresh_backoff_ms`` ago."""
        if self._refreshing is not None and not self._refreshing.done():
            return
        if not self.needs_refresh():
            return
        if (self._clock() - self._last_refresh_s) * 1000 < self._refresh_backoff_ms:
            return
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh_quietly())

    def refresh_delay_ms(self) -> float:
        """How long until :meth:`maybe_refresh` may start the next refresh."""
        return max(0.0, self._refresh_backoff_ms - (self._clock() - self._last_refresh_s) * 1000)

    async def _refresh_quietly(self) -> None:
        try:
            await self._refresh_once()
        except ClientError:
            pass  # stays stale; the next maybe_refresh() tries again after the backoff

    async def refresh(self, topics: Iterable[str] = ()) -> None:
        """Refreshes now (joining a refresh in progress, then running one more if
        it did not cover ``topics``); raises the last error if no server answered."""
        self.track(topics)
        running = self._refreshing
        if running is not None and not running.done():
            await asyncio.shield(running)
            if not self._stale and all(t in self._topics for t in topics):
                return
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh_once())
        await asyncio.shield(self._refreshing)

    async def _refresh_once(self) -> None:
        self._stale = False  # a stale mark made during this call triggers the next refresh
        self._last_refresh_s = self._clock()
        try:
            response = await self.fetch(sorted(self._tracked))
        except ClientError:
            self._stale = True
            raise
        for listener in self._listeners:
            listener()
        return response

    async def fetch(self, topics: Sequence[str] = (), *, all_topics: bool = False,
                    group_ids: Sequence[str] = (), transactional_ids: Sequence[str] = (),
                    describe_cluster: bool = False) -> partition_pb2.MetadataResponse:
        """One Metadata call (to the first known server that answers); updates the cache."""
        request = partition_pb2.MetadataRequest(topics=list(topics), all_topics=all_topics, group_ids=list(group_ids),
                                                transactional_ids=list(transactional_ids), describe_cluster=describe_cluster)
        response = await self.call_any("Metadata", request)
        self._apply(response)
        return response

    def _apply(self, response: partition_pb2.MetadataResponse) -> None:
        topics = dict(self._topics)
        for proto in response.topics:
            topics[proto.name] = newest_leaders(topic_info(proto), topics.get(proto.name))
        self._topics = topics
        brokers = [b.address for b in response.brokers if b.address]
        if brokers:
            self._brokers = brokers + [a for a in self._bootstrap if a not in brokers]
        for coordinator in response.group_coordinators:
            if coordinator.error.code == NONE and coordinator.address:
                self._group_coordinators[coordinator.key] = coordinator.address
            else:
                self._group_coordinators.pop(coordinator.key, None)
        for coordinator in response.transaction_coordinators:
            if coordinator.error.code == NONE and coordinator.address:
                self._txn_coordinators[coordinator.key] = coordinator.address
            else:
                self._txn_coordinators.pop(coordinator.key, None)

    async def call_any(self, rpc: str, request, *, timeout_ms: float | None = None):
        """Calls ``rpc`` on the known servers in turn until one answers; a server
        that fails with a retriable error is passed over. Raises the last error."""
        last: ClientError | None = None
        for _ in range(len(self._brokers)):
            address = self._brokers[self._next_broker % len(self._brokers)]
            try:
                return await self._transport.call(address, rpc, request, timeout_ms=timeout_ms)
            except ClientError as exc:
                if not exc.retriable:
                    raise
                last = exc
                self._next_broker += 1
        assert last is not None
        raise error_for(last.code, f"no server of {', '.join(self._brokers)} answered {rpc}; last error: {last.message}"
                                   f"{_connection_hint(self._transport, last)}", retry_delay_ms=last.retry_delay_ms)

    async def wait_for_topic(self, topic: str, timeout_ms: float, *, wait_for_creation: bool = True) -> TopicInfo:
        """The topic's metadata, refreshing (with back-off) until it is known or
        ``timeout_ms`` passes: then UNKNOWN_TOPIC_OR_PARTITION (or the last error).
        With ``wait_for_creation=False`` a server saying the topic does not exist
        ends the wait at once (only unreachable servers are waited for)."""
        deadline_s = self._clock() + timeout_ms / 1000
        delay_ms = self._refresh_backoff_ms
        last_error: ClientError | None = None
        while True:
            info = self.topic(topic)
            if info is not None and info.exists:
                return info
            if info is not None and info.error_code not in (NONE, UNKNOWN_TOPIC_OR_PARTITION) \
                    and action_for(info.error_code) is Action.FAIL:
                raise error_for(info.error_code, info.error_message or f"topic {topic!r} cannot be used")
            if info is not None and info.error_code == UNKNOWN_TOPIC_OR_PARTITION and not wait_for_creation:
                raise error_for(UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist")
            remaining_ms = (deadline_s - self._clock()) * 1000
            if remaining_ms <= 0:
                if last_error is not None and (info is None or info.error_code == NONE):
                    raise last_error
                raise error_for(UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {topic!r} is not in the cluster metadata after {timeout_ms:.0f} ms; "
                                "create it first (txlog topics create)")
            try:
                if info is not None:  # asked already; wait before asking again
                    await asyncio.sleep(min(delay_ms, remaining_ms) / 1000)
                    delay_ms = min(delay_ms * 2, 1000)
                await self.refresh([topic])
                last_error = None
            except ClientError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
                await asyncio.sleep(min(delay_ms, max(remaining_ms, 0)) / 1000)
                delay_ms = min(delay_ms * 2, 1000)

    async def group_coordinator(self, group_id: str, *, refresh: bool = False) -> str:
        """The address of the group's coordinator (the partition_svc leading its
        ``__consumer_offsets`` partition)."""
        if refresh or group_id not in self._group_coordinators:
            response = await self.fetch(group_ids=[group_id])
            for coordinator in response.group_coordinators:
                if coordinator.key == group_id and coordinator.error.code != NONE:
                    raise from_proto(coordinator.error)
            if group_id not in self._group_coordinators:
                raise error_for(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"),
                                f"no coordinator is known for group {group_id!r}")
        return self._group_coordinators[group_id]

    def forget_group_coordinator(self, group_id: str) -> None:
        self._group_coordinators.pop(group_id, None)

    async def transaction_coordinator(self, transactional_id: str, *, refresh: bool = False) -> str:
        """The address of the transaction coordinator of ``transactional_id``
        (Metadata ``transaction_coordinators``); COORDINATOR_NOT_AVAILABLE
        (retriable) while no coordinator owns the id's partition."""
        if refresh or transactional_id not in self._txn_coordinators:
            response = await self.fetch(transactional_ids=[transactional_id])
            for coordinator in response.transaction_coordinators:
                if coordinator.key == transactional_id and coordinator.error.code != NONE:
                    raise from_proto(coordinator.error)
            if transactional_id not in self._txn_coordinators:
                raise error_for(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"),
                                f"no transaction coordinator is known for transactional id {transactional_id!r}")
        return self._txn_coordinators[transactional_id]

    def forget_transaction_coordinator(self, transactional_id: str) -> None:
        self._txn_coordinators.pop(transactional_id, None)

    def known_transaction_coordinators(self) -> list[str]:
        """Every coordinator address seen so far (for FindCoordinator)."""
        return sorted(set(self._txn_coordinators.values()))


def _connection_hint(transport, last: ClientError) -> str:
    """What to check when no server could even be reached: a TLS mismatch
    looks like any refused connection from the client's side."""
    uses_tls = getattr(transport, "uses_tls", None)
    if uses_tls is None or "UNAVAILABLE" not in last.message:
        return ""
    if uses_tls:
        return (" (this client uses TLS: the servers must present a certificate its tls_ca signed, "
                "and accept its tls_cert when they require one)")
    return " (this client connects in plaintext: a cluster that runs TLS needs tls_ca, and for mutual TLS tls_cert and tls_key)"
