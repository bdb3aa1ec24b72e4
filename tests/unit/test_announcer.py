"""The controller's announcements (partition_svc.announcer): a pass is not held
by an instance it cannot reach (killed, its registration not expired yet),
which counts as untold; a connected instance is waited for; to each instance
the announcements arrive in the order the passes made them.

The instances here are real gRPC servers with a stand-in ReplicationService
that records what it is told (what it does with a state is not under test);
the unreachable one is a port nothing listens on."""

from __future__ import annotations

import asyncio
import socket

import grpc

from partition_svc.announcer import LEADER_AND_ISR_TIMEOUT_S, Announcer
from partition_svc.election import LeaderAndIsr
from partition_svc.topics import TopicInfo
from services.coordination.rpc import PeerClient
from services.runtime import server
from txlog.v1 import replication_pb2

SERVICE = replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"]
INFO = TopicInfo(name="events", partition_count=1, configs={}, replicas=((0, 1, 2),), internal=False)


def states(leader_epoch: int):
    return [(INFO, 0, LeaderAndIsr(leader=0, leader_epoch=leader_epoch, isr=(0, 1), controller_epoch=1,
                                   zk_version=leader_epoch, zk_mzxid=leader_epoch))]


class Recording:
    """Records the leader epochs it is told; a state of a leader epoch in ``delays_s`` is answered that late."""

    def __init__(self, delays_s: dict[int, float] | None = None):
        self.told: list[int] = []
        self.delays_s = delays_s or {}

    @server.rpc_handler
    async def LeaderAndIsr(self, request, context):
        epoch = request.partitions[0].leader_epoch
        await asyncio.sleep(self.delays_s.get(epoch, 0.0))
        self.told.append(epoch)
        return replication_pb2.LeaderAndIsrResponse()


async def start(servicer) -> tuple[grpc.aio.Server, str]:
    instance = grpc.aio.server()
    instance.add_generic_rpc_handlers((server.generic_handler(servicer, SERVICE),))
    port = instance.add_insecure_port("127.0.0.1:0")
    await instance.start()
    return instance, f"127.0.0.1:{port}"


def unused_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_an_unreachable_instance_does_not_hold_the_pass_and_is_untold():
    async def scenario():
        live = Recording()
        instance, address = await start(live)
        peers = PeerClient(None)
        announcer = Announcer(9, peers, wait_s=0.2)
        dead = unused_address()
        try:
            untold = await announcer.announce(1, {1: address, 2: dead}, states(1), set(), states(1))
            assert untold == {2}
            assert live.told == [1]
            assert not announcer._last[2][1].done(), \
                f"the pass returned while its LeaderAndIsr to the dead instance still waits (up to {LEADER_AND_ISR_TIMEOUT_S} s)"
        finally:
            for _, task in announcer._last.values():
                task.cancel()
            await peers.close()
            await instance.stop(None)

    asyncio.run(scenario())


def test_a_connected_slow_instance_is_waited_for_and_told_in_order():
    async def scenario():
        slow = Recording({2: 0.6, 3: 0.6})
        instance, address = await start(slow)
        peers = PeerClient(None)
        announcer = Announcer(9, peers, wait_s=0.1)
        try:
            await announcer.announce(1, {1: address}, states(1), set(), states(1))  # connects the channel
            assert await announcer.announce(1, {1: address}, states(2), set(), states(2)) == set(), \
                "connected: waited for past wait_s, not counted untold"
            first = asyncio.ensure_future(announcer.announce(1, {1: address}, states(3), set(), states(3)))
            second = asyncio.ensure_future(announcer.announce(1, {1: address}, states(4), set(), states(4)))
            await asyncio.gather(first, second)
            assert slow.told == [1, 2, 3, 4], "the later announcement waited for the slow one before it"
        finally:
            await peers.close()
            await instance.stop(None)

    asyncio.run(scenario())
