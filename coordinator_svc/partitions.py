"""How the coordinator talks to partition_svc: cluster metadata (leaders of
partitions, refreshed when a leader answers NOT_LEADER), and one channel per
leader. The coordinator is a client of the partition leaders like any other: the
transaction log and the markers go through their public RPCs.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from services import errors
from services.channels import open_channel
from services.errors import ErrorCode, TxlogError
from services.stubs.txlog.v1 import partition_pb2, partition_pb2_grpc
from services.zk import ServiceRegistry

METADATA_TTL_S = 30.0
NONE = ErrorCode.Value("NONE")


class PartitionClient:
    def __init__(self, registry: ServiceRegistry, timeout_s: float = 10.0):
        self.registry = registry
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._leaders: dict[tuple[str, int], tuple[str, float]] = {}
        self._partition_counts: dict[str, int] = {}

    def stub(self, address: str) -> partition_pb2_grpc.PartitionServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, timeout_s=self.timeout_s)
        return partition_pb2_grpc.PartitionServiceStub(channel)

    async def any_stub(self) -> partition_pb2_grpc.PartitionServiceStub:
        live = await asyncio.to_thread(self.registry.live, "partition_svc")
        if not live:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), "no partition_svc is live")
        return self.stub(sorted(live.values())[0])

    async def call(self, method: str, request):
        """A PartitionService call on any live instance."""
        stub = await self.any_stub()
        try:
            return await getattr(stub, method)(request)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def refresh(self, topics: list[str]) -> None:
        reply = await self.call("Metadata", partition_pb2.MetadataRequest(topics=topics))
        now = time.monotonic()
        for topic in reply.topics:
            if topic.error.code != NONE:
                continue
            self._partition_counts[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                if p.error.code == NONE:
                    self._leaders[(topic.name, p.partition)] = (p.leader_address, now)
                else:
                    self._leaders.pop((topic.name, p.partition), None)

    async def leader(self, topic: str, partition: int) -> str:
        known = self._leaders.get((topic, partition))
        if known is None or time.monotonic() - known[1] > METADATA_TTL_S:
            await self.refresh([topic])
            known = self._leaders.get((topic, partition))
        if known is None:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), f"{topic[:300]}-{partition} has no live leader")
        return known[0]

    def forget_leader(self, topic: str, partition: int) -> None:
        self._leaders.pop((topic, partition), None)

    async def partition_count(self, topic: str) -> int | None:
        """The topic's partition count (partition counts never change), None if it does not exist."""
        if topic not in self._partition_counts:
            await self.refresh([topic])
        return self._partition_counts.get(topic)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
