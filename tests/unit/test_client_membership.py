"""The SDK's group membership (txlog/membership.py) against a
scripted coordinator: what it reports to the consumer as heartbeats are
answered (a fake coordinator: the heartbeat protocol is what is tested)."""

from __future__ import annotations

import asyncio

from txlog.membership import Membership
from txlog.structs import TopicPartition
from txlog.v1 import common_pb2, partition_pb2

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class Coordinator:
    def __init__(self, member_id: str | None = None):
        self.answers: list[frozenset] = []
        self.requests: list = []
        self.member_id = member_id  # None: the member's own id back

    async def group_coordinator(self, group_id, *, refresh=False):
        return "127.0.0.1:1"

    async def call(self, address, rpc, request, *, timeout_ms=None):
        assert rpc == "ConsumerGroupHeartbeat"
        self.requests.append(request)
        return partition_pb2.ConsumerGroupHeartbeatResponse(
            member_id=self.member_id or request.member_id, member_epoch=3, heartbeat_interval_ms=1000,
            assignment=partition_pb2.TopicPartitions(
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in self.answers.pop(0)]))


def test_a_revocation_repeated_by_later_answers_is_reported_once_and_the_partition_given_up_once():
    coordinator = Coordinator()
    changes = []
    membership = Membership(coordinator, coordinator, "g", frozenset({"t"}), on_change=lambda **c: changes.append(c),
                            session_timeout_ms=10_000, instance_id=None, assignor=None, request_timeout_ms=1000,
                            retry_backoff_ms=10)

    async def run():
        coordinator.answers = [frozenset({A, B}), frozenset({A}), frozenset({A}), frozenset({A}), frozenset({A, B})]
        await membership.heartbeat_once()
        await membership.heartbeat_once()  # B taken away: revoked
        await membership.heartbeat_once()  # the application has not given B up yet: B still owned, not revoked again
        membership.revocation_done(frozenset({B}))
        await membership.heartbeat_once()
        await membership.heartbeat_once()  # B given back later: a new assignment

    asyncio.run(run())
    assert changes == [{"added": frozenset({A, B})}, {"revoked": frozenset({B})}, {"added": frozenset({B})}]
    owned = [{(tp.topic, tp.partition) for tp in r.owned_partitions.partitions} for r in coordinator.requests]
    assert owned == [set(), {("t", 0), ("t", 1)}, {("t", 0), ("t", 1)}, {("t", 0)}, {("t", 0)}]


def test_the_member_heartbeats_under_the_id_the_coordinator_answered_with():
    """A coordinator that names the member otherwise (one that kept a
    restarted static member's first id) is followed: heartbeats under the
    old id would be refused as an unknown member."""
    coordinator = Coordinator(member_id="kept-from-before-the-restart")
    membership = Membership(coordinator, coordinator, "g", frozenset({"t"}), on_change=lambda **c: None,
                            session_timeout_ms=10_000, instance_id="worker-a", assignor=None, request_timeout_ms=1000,
                            retry_backoff_ms=10)

    async def run():
        coordinator.answers = [frozenset({A}), frozenset({A})]
        await membership.heartbeat_once()
        await membership.heartbeat_once()

    asyncio.run(run())
    first, second = coordinator.requests
    assert first.member_id != "kept-from-before-the-restart"
    assert second.member_id == "kept-from-before-the-restart" and membership.metadata().member_id == second.member_id
