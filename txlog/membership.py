"""A subscribing consumer's membership of its group (issue 16, KIP-848), on
the consumer's event loop.

The member makes its member id (a UUID, KIP-1082) and keeps it for the
consumer's life. A background task heartbeats the group coordinator (the
leader of the group's ``__consumer_offsets`` partition) every interval the
coordinator answers, one heartbeat in flight at a time, with the
subscription when it joins or changes it and the partitions it owns; each
answer carries the partitions it may own now:

- new ones are owned at once (``on_change(added=...)``: the consumer starts
  fetching them);
- ones no longer in the answer are revoked cooperatively: the consumer stops
  fetching them at once (``on_change(revoked=...)``), its application gets
  ``on_revoke`` (and commits) in its next ``poll``, and only then does the
  next heartbeat report them as not owned, so no other member gets them
  before they are truly given up.

A heartbeat answered FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID means the
group has moved on without this member: it drops every partition
(``on_change(lost=...)``) and rejoins under the same member id at epoch 0.
Retriable errors (the coordinator moving) are retried with back-off.

A pattern subscription is resolved here, as Kafka's client does: every
``metadata_max_age_ms`` the member lists the cluster's topics and subscribes
to those whose whole name the pattern matches (internal topics, ``__``
first, never), so a topic created later is picked up at the next refresh.
A member whose pattern matches nothing yet does not join until it does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from txlog.errors import ClientError
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)

REJOIN_CODES = (ErrorCode.Value("FENCED_MEMBER_EPOCH"), ErrorCode.Value("UNKNOWN_MEMBER_ID"))
JOIN_INTERVAL_S = 0.05  # the first heartbeats follow each other quickly: the assignment comes in steps


def topics_matching(pattern: re.Pattern, names) -> frozenset[str]:
    """The topics a pattern subscription takes: whole-name matches, internal topics left out."""
    return frozenset(n for n in names if not n.startswith("__") and pattern.fullmatch(n))


@dataclass(frozen=True)
class GroupMetadata:
    """What a transaction's TxnOffsetCommit carries so that a zombie's commit
    is refused (Kafka's ConsumerGroupMetadata, KIP-447)."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


class Membership:
    def __init__(self, metadata: Metadata, transport, group_id: str, topics: frozenset[str], *,
                 on_change: Callable[..., None], session_timeout_ms: int, instance_id: str | None,
                 assignor: str | None, request_timeout_ms: float, retry_backoff_ms: float):
        self._metadata = metadata
        self._transport = transport
        self.group_id = group_id
        self.member_id = uuid.uuid4().hex
        self.epoch = -1  # -1: not in the group (yet, or any more)
        self.owned: frozenset[TopicPartition] = frozenset()
        self._revoking: frozenset[TopicPartition] = frozenset()  # reported revoked, not given up by the application yet
        self.subscribed = topics
        self._subscription_sent = False
        self._on_change = on_change
        self._session_timeout_ms = session_timeout_ms
        self._instance_id = instance_id
        self._assignor = assignor
        self._request_timeout_ms = request_timeout_ms
        self._backoff_s = retry_backoff_ms / 1000
        self._interval_s = JOIN_INTERVAL_S
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.last_error: ClientError | None = None
        self._pattern: re.Pattern | None = None
        self._pattern_refresh_s = 0.0
        self._pattern_due = 0.0  # time.monotonic() of the next resolution

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def subscribe(self, topics: frozenset[str]) -> None:
        self._pattern = None
        self._change_subscription(topics)

    def subscribe_pattern(self, pattern: re.Pattern, refresh_ms: float) -> None:
        """Subscribes to the topics ``pattern`` matches, resolved now and every ``refresh_ms``."""
        self._pattern, self._pattern_refresh_s, self._pattern_due = pattern, refresh_ms / 1000, 0.0
        self._wake.set()

    def _change_subscription(self, topics: frozenset[str]) -> None:
        if topics != self.subscribed:
            self.subscribed, self._subscription_sent = topics, False
            self._wake.set()

    async def _resolve_pattern(self) -> None:
        if self._pattern is None or time.monotonic() < self._pattern_due:
            return
        try:
            response = await self._metadata.fetch(all_topics=True)
        except ClientError as error:  # the next round asks again; the subscription stays as it was
            log.info("listing topics for a pattern subscription failed", extra={"group": self.group_id, "reason": error.message})
            self._pattern_due = time.monotonic() + self._backoff_s
            return
        self._pattern_due = time.monotonic() + self._pattern_refresh_s
        self._change_subscription(topics_matching(self._pattern, (t.name for t in response.topics if t.error.code == 0)))

    def _until_pattern_due(self, wait_s: float) -> float:
        return wait_s if self._pattern is None else max(0.0, min(wait_s, self._pattern_due - time.monotonic()))

    def metadata(self) -> GroupMetadata:
        return GroupMetadata(self.group_id, self.member_id, self.epoch) if self.epoch >= 0 else GroupMetadata(self.group_id)

    def revocation_done(self, revoked: frozenset[TopicPartition]) -> None:
        """The application has given ``revoked`` up: the next heartbeat (now) says so."""
        self.owned = self.owned - revoked
        self._revoking = self._revoking - revoked
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before the heartbeat: a wake during it (a revocation done) sends the next one at once
            await self._resolve_pattern()
            if self.epoch < 0 and not self.subscribed:  # a pattern that matches nothing yet: nothing to join with
                await self._sleep(self._until_pattern_due(self._backoff_s * 10))
                continue
            try:
                await self.heartbeat_once()
                self.last_error = None
                wait_s = self._interval_s
            except ClientError as error:
                self.last_error = error
                if error.code in REJOIN_CODES:
                    log.info("rejoining group", extra={"group": self.group_id, "reason": error.message})
                    self._lose_everything()
                    wait_s = 0
                else:
                    wait_s = self._backoff_s
            except asyncio.CancelledError:
                raise
            except Exception:  # a transport failure: the coordinator may have moved
                log.exception("heartbeat failed")
                wait_s = self._backoff_s
            await self._sleep(self._until_pattern_due(wait_s))

    async def _sleep(self, wait_s: float) -> None:
        """Until ``wait_s`` passed or something woke the member."""
        try:
            await asyncio.wait_for(self._wake.wait(), wait_s)
        except TimeoutError:
            pass

    def _lose_everything(self) -> None:
        lost, self.owned, self.epoch, self._subscription_sent = self.owned, frozenset(), -1, False
        self._revoking = frozenset()
        if lost:
            self._on_change(lost=lost)

    async def _call(self, request):
        address = await self._metadata.group_coordinator(self.group_id)
        try:
            return await self._transport.call(address, "ConsumerGroupHeartbeat", request, timeout_ms=self._request_timeout_ms)
        except ClientError as error:
            if error.retriable:  # NOT_COORDINATOR among them: ask again where the coordinator is
                self._metadata.forget_group_coordinator(self.group_id)
            raise

    def _request(self, epoch: int) -> partition_pb2.ConsumerGroupHeartbeatRequest:
        request = partition_pb2.ConsumerGroupHeartbeatRequest(group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
                                                              session_timeout_ms=self._session_timeout_ms)
        if self._instance_id:
            request.instance_id = self._instance_id
        if self._assignor:
            request.server_assignor = self._assignor
        if epoch == 0 or not self._subscription_sent:
            request.subscribed_topics.names.extend(sorted(self.subscribed))
        request.owned_partitions.SetInParent()
        request.owned_partitions.partitions.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(self.owned))
        return request

    async def heartbeat_once(self) -> None:
        request = self._request(max(self.epoch, 0))
        answer = await self._call(request)
        self._subscription_sent = True
        if answer.member_id:  # the coordinator's name for us is the one it knows (ours, unless it kept an older one)
            self.member_id = answer.member_id
        self.epoch = answer.member_epoch
        self._interval_s = max(answer.heartbeat_interval_ms / 1000, JOIN_INTERVAL_S)
        assigned = frozenset(TopicPartition(tp.topic, tp.partition) for tp in answer.assignment.partitions)
        # a revocation is reported once: later answers (before the application gave the partitions up) repeat it
        revoked, added = self.owned - assigned - self._revoking, assigned - self.owned
        if added:
            self.owned = self.owned | added
            self._on_change(added=added)
        if revoked:
            self._revoking = self._revoking | revoked
            self._on_change(revoked=revoked)  # owned until the application has given them up (revocation_done)
        if added or revoked:
            self._interval_s = JOIN_INTERVAL_S  # the next step of the assignment may follow at once

    async def leave(self) -> None:
        """Leaves the group (-2 for a static member: it keeps its partitions for its restart)."""
        if self._task is not None:
            self._task.cancel()
        if self.epoch < 0:
            return
        request = partition_pb2.ConsumerGroupHeartbeatRequest(group_id=self.group_id, member_id=self.member_id,
                                                              member_epoch=-2 if self._instance_id else -1)
        if self._instance_id:
            request.instance_id = self._instance_id
        try:
            await self._call(request)
        except (ClientError, OSError) as error:
            log.info("leaving the group failed; the coordinator removes the member after its session timeout",
                     extra={"group": self.group_id, "error": str(error)})
        self.epoch, self.owned = -1, frozenset()
