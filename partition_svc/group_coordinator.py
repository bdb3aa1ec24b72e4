"""The consumer-group coordinator of one partition_svc instance (issue 16):
the groups whose ``__consumer_offsets`` partition it leads, where their
offsets live too (Kafka's group coordinator is that partition's leader).

Each group is a consumer_group.ConsumerGroup fed with heartbeats, the clock
(members whose session ran out are removed every ``expiry_interval_ms``)
and the subscribed topics' partition counts. Membership is durable: what a
heartbeat (or a session's expiry) changed is written to the group's
``__consumer_offsets`` partition as membership records
(consumer_group.records(), log_format.membership_key), with acks=all, before
the heartbeat is answered; every replica materializes them as it does
offsets. The group in memory is tied to the leader epoch it was loaded
under: when leadership moves (or comes back), the new coordinator rebuilds
the group from the records (consumer_group.restore, sessions restarted), so
members keep their ids, epochs and partitions: no rebalance. A group's
changes are made one at a time (its lock) and appended in that order; a
heartbeat is answered once everything appended before its answer was made
is replicated (which lets concurrent heartbeats share a write). A failed
write drops the group from memory, so the next heartbeat sees what the log
holds.
"""

from __future__ import annotations

import asyncio
import logging
import time

from partition_svc import assignors, consumer_group, log_format
from partition_svc.consumer_group import ConsumerGroup, GroupError, Heartbeat
from partition_svc.producer_state import Reject
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.protocol.names import is_topic_name
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)

SESSION_TIMEOUT_MS_DEFAULT = 45_000
SESSION_TIMEOUT_MS_RANGE = (1_000, 1_800_000)
REBALANCE_TIMEOUT_MS_DEFAULT, REBALANCE_TIMEOUT_MS_MAX = 300_000, 3_600_000
MEMBER_ID_MAX = 255
SUBSCRIBED_TOPICS_MAX = 10_000


def now_ms() -> int:
    return int(time.time() * 1000)


def group_error(error: GroupError) -> TxlogError:
    return TxlogError(ErrorCode.Value(error.code), error.message)


def invalid(message: str) -> TxlogError:
    return TxlogError(ErrorCode.Value("INVALID_REQUEST"), message)


def check_member_id(member_id: str) -> None:
    # ids are echoed in errors, whose messages travel in headers of a few KiB
    if len(member_id) > MEMBER_ID_MAX:
        raise invalid(f"member_id is {len(member_id)} characters, more than {MEMBER_ID_MAX}")


def heartbeat_of(request: partition_pb2.ConsumerGroupHeartbeatRequest) -> Heartbeat:
    """The request as the pure core takes it; INVALID_REQUEST saying what is wrong."""
    check_member_id(request.member_id)
    if request.HasField("instance_id") and not 0 < len(request.instance_id) <= MEMBER_ID_MAX:
        raise invalid(f"instance_id must be 1 to {MEMBER_ID_MAX} characters, got {len(request.instance_id)}")
    if request.HasField("server_assignor") and request.server_assignor not in assignors.ASSIGNORS:
        raise invalid(f"unknown server_assignor {request.server_assignor[:50]!r}; known: {', '.join(assignors.ASSIGNORS)}")
    if request.member_epoch < consumer_group.STATIC_LEAVE_EPOCH:
        raise invalid(f"member_epoch {request.member_epoch}: 0 joins, -1 leaves, -2 leaves for a restart, else the epoch answered")
    if request.member_epoch != consumer_group.JOIN_EPOCH and not request.member_id:
        raise invalid("a member that is not joining names its member_id")
    subscribed = None
    if request.HasField("subscribed_topics"):
        names = list(request.subscribed_topics.names)
        if len(names) > SUBSCRIBED_TOPICS_MAX:
            raise invalid(f"subscribed to {len(names)} topics, more than {SUBSCRIBED_TOPICS_MAX}")
        bad = [n[:300] for n in names if not is_topic_name(n)]
        if bad:
            raise invalid(f"subscribed topic names that cannot be: {bad[:5]}")
        if not names and request.member_epoch == consumer_group.JOIN_EPOCH:
            raise invalid("a member joins subscribed to at least one topic")
        subscribed = frozenset(names)
    owned = None
    if request.HasField("owned_partitions"):
        owned = frozenset((tp.topic, tp.partition) for tp in request.owned_partitions.partitions)
    session = request.session_timeout_ms if request.HasField("session_timeout_ms") else SESSION_TIMEOUT_MS_DEFAULT
    low, high = SESSION_TIMEOUT_MS_RANGE
    if not low <= session <= high:
        raise invalid(f"session_timeout_ms must be within {low}..{high}, got {session}")
    rebalance = request.rebalance_timeout_ms if request.HasField("rebalance_timeout_ms") else REBALANCE_TIMEOUT_MS_DEFAULT
    if not low <= rebalance <= REBALANCE_TIMEOUT_MS_MAX:
        raise invalid(f"rebalance_timeout_ms must be within {low}..{REBALANCE_TIMEOUT_MS_MAX}, got {rebalance}")
    return Heartbeat(request.member_id, request.member_epoch, request.instance_id if request.HasField("instance_id") else None,
                     subscribed, owned, session, request.server_assignor if request.HasField("server_assignor") else None, rebalance)


class GroupCoordinator:
    def __init__(self, view, *, heartbeat_interval_ms: int, expiry_interval_ms: int = 500):
        self.view = view  # cluster_view.ClusterView: where groups are coordinated, the store, the limits
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.expiry_interval_ms = expiry_interval_ms
        self.groups: dict[str, tuple[tuple[int, int], ConsumerGroup]] = {}  # id -> ((partition, leader epoch), group)
        self.locks: dict[str, asyncio.Lock] = {}  # a group's changes, one at a time, appended in that order
        self.pending: dict[str, asyncio.Future] = {}  # a group's last append, until replicated

    async def _group(self, group_id: str, *, create: bool) -> ConsumerGroup | None:
        """The group as this coordinator knows it (rebuilt from its membership
        records when first asked under this leader epoch); NOT_COORDINATOR when
        it is not the group's."""
        partition = await self.view.group_partition(group_id)
        lease = (partition.index, partition.leader_epoch)
        known = self.groups.get(group_id)
        if known is not None and known[0] == lease:
            return known[1]
        self.pending.pop(group_id, None)  # an append of the group as it was before does not hold up this one
        records = await asyncio.to_thread(self.view.store.group_membership, group_id)
        if records:
            group = ConsumerGroup.restore(group_id, records, now_ms(), heartbeat_interval_ms=self.heartbeat_interval_ms)
            log.info("group loaded from its membership records", extra=fields(
                group=group_id, members=len(group.members), group_epoch=group.group_epoch, leader_epoch=lease[1]))
        elif create:
            group = ConsumerGroup(group_id, heartbeat_interval_ms=self.heartbeat_interval_ms)
        else:
            self.groups.pop(group_id, None)
            return None
        self.groups[group_id] = (lease, group)
        return group

    def lock(self, group_id: str) -> asyncio.Lock:
        return self.locks.setdefault(group_id, asyncio.Lock())

    def _write(self, group_id: str, group: ConsumerGroup, partition) -> asyncio.Future | None:
        """Appends what changed in ``group`` to its partition (in the order the
        changes were made: the caller holds the group's lock) and returns the
        future of its replication (acks=all), or of an earlier append still
        pending; None when nothing is pending. Awaited by ``_written``."""
        records = group.records()
        if records:
            changes = [(log_format.membership_key(group_id, member_id), value) for member_id, value in records]
            outcome = partition.commit_offsets(changes, now_ms(), self.view.limits)
            if isinstance(outcome, Reject):
                self.groups.pop(group_id, None)
                raise self._not_written(group_id, partition)
            self.pending[group_id] = outcome
        pending = self.pending.get(group_id)
        if pending is not None and pending.done() and pending.result():
            del self.pending[group_id]  # replicated: nothing left to wait for
            return None
        return pending

    async def _written(self, group_id: str, group: ConsumerGroup, partition, pending: asyncio.Future | None) -> None:
        """Waits until every change made so far (and so what an answer shows) is
        replicated: appends are in order, so the last one pending covers them all.
        If it fails, the group is dropped from memory (the next heartbeat
        rebuilds it from what the log holds) and the caller gets a retriable error."""
        if pending is None or await asyncio.shield(pending):
            return
        if self.groups.get(group_id, (None, None))[1] is group:
            self.groups.pop(group_id, None)
        raise self._not_written(group_id, partition)

    @staticmethod
    def _not_written(group_id: str, partition) -> TxlogError:
        return TxlogError(ErrorCode.Value("NOT_COORDINATOR"), f"group {group_id!r}: {partition.topic}-{partition.index} "
                          "stopped being led here before the group's change was replicated; find the coordinator again and retry")

    async def heartbeat(self, request: partition_pb2.ConsumerGroupHeartbeatRequest) -> partition_pb2.ConsumerGroupHeartbeatResponse:
        beat = heartbeat_of(request)
        async with self.lock(request.group_id):
            group = await self._group(request.group_id, create=beat.member_epoch == consumer_group.JOIN_EPOCH)
            if group is None:
                raise TxlogError(ErrorCode.Value("UNKNOWN_MEMBER_ID"), f"member {request.member_id!r} is not in group "
                                 f"{request.group_id!r} (it left or timed out); rejoin with member epoch 0")
            topics = set(beat.subscribed or ()) | {t for m in group.members.values() for t in m.subscribed}
            counts = {}
            for name in topics:
                info = await self.view.topics.get(name)
                counts[name] = info.partition_count if info is not None else 0
            epoch_before = group.group_epoch
            try:
                answer = group.heartbeat(beat, now_ms(), counts)
            except GroupError as error:
                raise group_error(error) from None
            partition = await self.view.group_partition(request.group_id)
            pending = self._write(request.group_id, group, partition)
        await self._written(request.group_id, group, partition, pending)
        if group.group_epoch != epoch_before:
            log.info("group epoch", extra=fields(group=group.group_id, group_epoch=group.group_epoch, members=len(group.members)))
        reply = partition_pb2.ConsumerGroupHeartbeatResponse(member_id=answer.member_id, member_epoch=answer.member_epoch,
                                                            heartbeat_interval_ms=answer.heartbeat_interval_ms)
        if beat.member_epoch not in (consumer_group.LEAVE_EPOCH, consumer_group.STATIC_LEAVE_EPOCH):
            reply.assignment.SetInParent()
            reply.assignment.partitions.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(answer.assigned))
        return reply

    async def list_groups(self) -> partition_pb2.ListGroupsResponse:
        reply = partition_pb2.ListGroupsResponse()
        names = set(self.groups) | await asyncio.to_thread(self.view.store.group_ids)
        for group_id in sorted(names):
            try:
                group = await self._group(group_id, create=False)
            except TxlogError:  # another instance coordinates it (this one follows its partition)
                continue
            reply.groups.add(group_id=group_id, state=group.state() if group else "Empty",
                             members=len(group.members) if group else 0)
        return reply

    async def describe(self, group_ids: list[str]) -> partition_pb2.DescribeGroupsResponse:
        reply = partition_pb2.DescribeGroupsResponse()
        for group_id in group_ids:
            item = reply.groups.add(group_id=group_id)
            try:
                group = await self._group(group_id, create=False)
            except TxlogError as exc:
                item.error.CopyFrom(error_proto(exc.code, exc.message))
                continue
            if group is None:
                item.state = "Empty"
                continue
            item.state, item.group_epoch, item.assignment_epoch, item.assignor = (
                group.state(), group.group_epoch, group.assignment_epoch, group.assignor)
            for member in group.describe():
                described = item.members.add(member_id=member.member_id, member_epoch=member.member_epoch,
                                             state=member.state or "", subscribed_topics=sorted(member.subscribed))
                if member.instance_id:
                    described.instance_id = member.instance_id
                described.assigned.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(member.assigned))
                described.revoking.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(member.revoking))
        return reply

    def forget(self, group_id: str) -> None:
        """A deleted group: listed no more (until someone joins or commits)."""
        self.groups.pop(group_id, None)

    async def check_empty(self, group_id: str) -> None:
        group = await self._group(group_id, create=False)
        if group is not None and group.members:
            raise TxlogError(ErrorCode.Value("NON_EMPTY_GROUP"), f"group {group_id!r} has {len(group.members)} live members: "
                             "stop its consumers (they leave on close) before deleting it")

    async def subscribed_topics(self, group_id: str) -> frozenset[str]:
        """The topics the group's live members subscribe to."""
        group = await self._group(group_id, create=False)
        return frozenset() if group is None else frozenset(t for m in group.members.values() for t in m.subscribed)

    async def check_commit(self, group_id: str, member_id: str, member_epoch: int | None) -> None:
        """Refuses a commit a member could not make now (KIP-447)."""
        check_member_id(member_id)
        group = await self._group(group_id, create=False)
        epoch = -1 if member_epoch is None else member_epoch
        if group is None:
            if member_id:
                raise TxlogError(ErrorCode.Value("UNKNOWN_MEMBER_ID"), f"member {member_id!r} is not in group {group_id!r}: "
                                 "its commit is refused (rejoin first)")
            return
        try:
            group.check_commit(member_id, epoch)
        except GroupError as error:
            raise group_error(error) from None

    async def expire(self) -> None:
        for group_id, (_, group) in list(self.groups.items()):
            async with self.lock(group_id):
                if self.groups.get(group_id, (None, None))[1] is not group:
                    continue  # reloaded or dropped meanwhile
                gone = group.expire(now_ms())
                if not gone:
                    continue
                log.info("members timed out", extra=fields(group=group_id, members=gone, group_epoch=group.group_epoch))
                partition = await self.view.group_partition(group_id)
                pending = self._write(group_id, group, partition)
            await self._written(group_id, group, partition, pending)

    async def expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.expiry_interval_ms / 1000)
            try:
                await self.expire()
            except TxlogError as exc:  # the next round (or the group's next coordinator) removes them
                log.info("expiring group members not written", extra=fields(error=exc.message))
            except Exception:
                log.exception("expiring group members failed")
