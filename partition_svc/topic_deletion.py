"""Topic deletion (Kafka's DeleteTopics in ZooKeeper mode, issue 17).

Guarantees: from the moment a topic is marked for deletion it is unknown to
every request on every instance that has seen the mark (Metadata, Produce,
Fetch, offsets: UNKNOWN_TOPIC_OR_PARTITION); it is gone, and a topic of its
name may be created afresh, only once every instance that held a replica of
it has deleted its copies (every RocksDB key: log, epochs, metadata,
producer states, aborted index, pending offsets) and the leaders of
__consumer_offsets have tombstoned the groups' committed offsets for it. An
instance down meanwhile holds the deletion up, as a Kafka broker offline
halts a topic's deletion, and deletes its copies when it comes back: the
partitions are never resurrected, and never reappear under a new topic of
the same name.

State Transitions (per topic; all in ZooKeeper, so a controller failover
loses nothing: the mark is what survives)
    LIVE -> MARKED: DeleteTopics creates the mark, conditional on the topic's
        node (topics.py mark_for_deletion).
    MARKED -> MARKED, acknowledged by n: instance n saw the mark (at its
        start, or by a watch), deleted its replicas of the topic and
        tombstoned the committed offsets of it in the __consumer_offsets
        partitions it leads.
    MARKED -> GONE: the controller, once every instance awaited
        (awaited_nodes) has acknowledged, removes the topic's nodes, its
        reassignments and the mark in one transaction fenced by its epoch.

Error Handling
--------------
A bad request as a whole (no topic, too many, one named twice, a negative
timeout) is the call's INVALID_REQUEST and nothing is marked. Per topic: an
internal topic is INVALID_REQUEST, one that does not exist (or an invalid
name) UNKNOWN_TOPIC_OR_PARTITION, one not gone by the timeout
REQUEST_TIMED_OUT (retriable: the deletion goes on; asking again waits for
it again). An instance whose offsets could not be replicated does not
acknowledge and tries again on its next read of the marks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kazoo.recipe.watchers import ChildrenWatch

from partition_svc import log_format, validation
from partition_svc.log_store import LogStore
from partition_svc.partition import now_ms
from partition_svc.producer_state import Reject
from partition_svc.replica_manager import ReplicaManager
from partition_svc.topics import INTERNAL_PREFIX, TopicInfo, TopicRegistry
from services.coordination import zk
from services.runtime.logs import fields
from txlog.protocol import CONSUMER_OFFSETS_TOPIC
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.names import is_topic_name
from txlog.v1 import partition_pb2

log = logging.getLogger(__name__)

DELETE_TOPICS_TIMEOUT_MS_DEFAULT = 30_000  # the contract's default wait (timeout_ms 0)
DELETE_TOPICS_TIMEOUT_MS_MAX = 300_000  # longer waits are cut to this
DELETION_RECHECK_MS = 1_000  # a waiting DeleteTopics reads the marks itself this often besides the watch's news


# --- the rules (pure) -----------------------------------------------------------------


def timeout_ms_of(requested_ms: int) -> int:
    """The request's wait, ms: the default for 0, at most the limit; INVALID_REQUEST when negative."""
    if requested_ms < 0:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), f"timeout_ms must not be negative, got {requested_ms}")
    return min(requested_ms or DELETE_TOPICS_TIMEOUT_MS_DEFAULT, DELETE_TOPICS_TIMEOUT_MS_MAX)


def refusal(name: str) -> TxlogError | None:
    """Why a topic may not be deleted, whatever ZooKeeper holds (None when it may)."""
    if not is_topic_name(name):
        return TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"topic {name[:300]!r} does not exist (not a topic name)")
    if name.startswith(INTERNAL_PREFIX):
        return TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                          f"{name} is internal (names starting with {INTERNAL_PREFIX!r}): the services it serves need it")
    return None


def awaited_nodes(info: TopicInfo | None, offsets_leaders: Iterable[int]) -> frozenset[int]:
    """The instances whose acknowledgement completes a deletion: every replica
    of the topic (its node may already be gone after a half-done removal:
    then none) and every leader of a __consumer_offsets partition (no leader: none)."""
    replicas = {n for members in info.replicas for n in members} if info is not None else set()
    return frozenset(replicas | {n for n in offsets_leaders if n >= 0})


# --- the controller's part --------------------------------------------------------------


async def finish_deletions(topics: TopicRegistry, controller: tuple[str, int]) -> set[str]:
    """Removes every marked topic whose awaited instances have all
    acknowledged (while ``controller``, the epoch path and the version it
    set, is still the controller); the topics still pending."""
    marked = await topics.read_marks()
    if not marked:
        return set()
    offsets = await topics.versioned(CONSUMER_OFFSETS_TOPIC, deleting=True)
    leaders = []
    if offsets is not None:
        states = await asyncio.gather(*(topics.state(CONSUMER_OFFSETS_TOPIC, p) for p in range(offsets[0].partition_count)))
        leaders = [s.leader for s in states if s is not None]
    pending = set()
    for name in sorted(marked):
        versioned = await topics.versioned(name, deleting=True)
        waiting = awaited_nodes(versioned[0] if versioned else None, leaders) - await topics.deletion_acks(name)
        if waiting:
            pending.add(name)
            continue
        if await topics.remove(name, controller):
            log.info("topic deleted", extra=fields(topic=name))
        else:
            pending.add(name)  # something changed meanwhile (a late ISR write, an acknowledgement): next time
    return pending


# --- each instance's part ---------------------------------------------------------------


class TopicDeletion:
    """This instance's side of deletions: it marks topics for DeleteTopics
    and waits, and it carries out every mark it sees (at its start, then as
    a ZooKeeper watch reports them); a watch of the topics also drops the
    cached nodes of topics gone meanwhile."""

    def __init__(self, node_id: int, topics: TopicRegistry, replicas: ReplicaManager, store: LogStore,
                 limits: validation.BatchLimits, on_dropped: Callable[[str], None], *, refresh_ms: int):
        self.node_id = node_id
        self.topics = topics
        self.replicas = replicas
        self.store = store
        self.limits = limits
        self.on_dropped = on_dropped
        self.refresh_ms = refresh_ms
        self._wake = asyncio.Event()
        self._marks_moved = asyncio.Event()  # set, and replaced, on every change of the marks

    async def start(self) -> None:
        """Reads the marks (before the replicas are recovered: a marked
        topic's partitions are not loaded) and watches them, and the topics."""
        for path in (self.topics.deletions_base, self.topics.base):
            await zk.call(self.topics.client, "ensure_path", path)
        await self.topics.read_marks()
        loop = asyncio.get_running_loop()
        ChildrenWatch(self.topics.client, self.topics.deletions_base,
                      lambda children: loop.call_soon_threadsafe(self._marks_changed, set(children)))
        ChildrenWatch(self.topics.client, self.topics.base,
                      lambda children: loop.call_soon_threadsafe(self.topics.forget_gone, set(children)))

    def _marks_changed(self, marked: set[str]) -> None:
        self.topics.marks_seen(marked)
        self._wake.set()
        moved, self._marks_moved = self._marks_moved, asyncio.Event()
        moved.set()

    async def run_forever(self) -> None:
        """Carries out the marks as they come, and again every ``refresh_ms``
        while one is not acknowledged here (its offsets were not replicated);
        no ZooKeeper read while there is no mark."""
        while True:
            self._wake.clear()
            try:
                await self.carry_out(set(self.topics.deleting))
            except TxlogError as exc:
                log.warning("topic deletion pass failed", extra=fields(error=exc.message))
            except Exception:
                log.exception("topic deletion pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.refresh_ms / 1000)
            except TimeoutError:
                pass

    async def carry_out(self, marked: set[str]) -> None:
        """Deletes what this instance holds of each marked topic, then
        acknowledges (run by run_forever alone: one pass at a time)."""
        for name in sorted(marked):
            if self.node_id in await self.topics.deletion_acks(name):
                continue
            dropped = await self.replicas.drop_topic(name)
            self.on_dropped(name)
            offsets = await self._tombstone_offsets(name)
            if offsets is None:
                continue  # not replicated: the next pass tries again
            await self.topics.acknowledge_deletion(name, self.node_id)
            log.info("topic deletion carried out here", extra=fields(topic=name, replicas=dropped, offsets=offsets))

    async def _tombstone_offsets(self, name: str) -> int | None:
        """Tombstones the groups' committed offsets of the topic in every
        __consumer_offsets partition led here (as DeleteGroupOffsets writes
        them); how many, or None when a write was not replicated."""
        count = 0
        for (topic, index), partition in list(self.replicas.partitions.items()):
            if topic != CONSUMER_OFFSETS_TOPIC or not partition.is_leader:
                continue
            keys = [log_format.group_offset_key(group, name, p)
                    for group in sorted(self.store.group_ids()) if partition_for_id(group, partition.partition_count) == index
                    for t, p, _, _ in self.store.group_offsets(group) if t == name]
            if not keys:
                continue
            outcome = partition.commit_offsets([(key, None) for key in keys], now_ms(), self.limits)
            if isinstance(outcome, Reject) or not await outcome:
                log.warning("group offsets of a deleted topic not replicated", extra=fields(topic=name, offsets_partition=index))
                return None
            count += len(keys)
        return count

    # --- DeleteTopics ---------------------------------------------------------------------

    async def delete_topics(self, names: list[str], requested_timeout_ms: int) -> partition_pb2.DeleteTopicsResponse:
        """Marks each topic and waits until every marked one is gone, or the timeout."""
        timeout_ms = timeout_ms_of(requested_timeout_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        reply = partition_pb2.DeleteTopicsResponse()
        waiting = {}
        for name in names:
            result = reply.results.add(topic=name)
            refused = refusal(name)
            if refused is None and not await self.topics.mark_for_deletion(name):
                refused = TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"topic {name!r} does not exist")
            if refused is not None:
                result.error.CopyFrom(error_proto(refused.code, refused.message))
            else:
                waiting[name] = result
                log.info("topic marked for deletion", extra=fields(topic=name))
        if waiting:
            self._wake.set()
        while waiting:
            moved = self._marks_moved
            for name in [name for name in waiting if not await self.topics.is_marked(name)]:
                del waiting[name]
            if not waiting or loop.time() >= deadline:
                break
            try:
                await asyncio.wait_for(moved.wait(), min(DELETION_RECHECK_MS / 1000, max(0.0, deadline - loop.time())))
            except TimeoutError:
                pass
        for name, result in waiting.items():
            result.error.CopyFrom(error_proto(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                              f"topic {name!r} is being deleted, not gone yet after {timeout_ms} ms (an instance "
                                              "holding a replica may be down): the deletion goes on"))
        return reply
