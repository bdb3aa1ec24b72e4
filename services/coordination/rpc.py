"""The one client txlog's processes use to call each other: the coordinator
calling partition leaders (transaction log, markers, group offsets) and
producer_id_svc, a partition leader asking a coordinator to verify a
transaction and producer_id_svc for ids.

One channel per address, kept for the process's life (channels reconnect by
themselves); the live instances of a kind from the ZooKeeper registry; the
partition leaders from Metadata, cached for :data:`METADATA_TTL_S` and
forgotten by whoever sees NOT_LEADER; a failed call comes back as the
:class:`~txlog.protocol.errors.TxlogError` it stands for. Retrying is the caller's
choice (:class:`txlog.protocol.retry.RetryPolicy`): only the caller knows whether a
repeat is safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from services.coordination.peer_routes import PeerRoutes
from services.coordination.zk import ServiceRegistry
from txlog.net.channels import CALL_TIMEOUT_S_DEFAULT, ChannelCache
from txlog.net.identity import PEER_METADATA
from txlog.net.tls import TlsFiles
from txlog.protocol import errors
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import (
    coordinator_pb2_grpc,
    partition_pb2,
    partition_pb2_grpc,
    producer_id_pb2_grpc,
    replication_pb2_grpc,
)

METADATA_TTL_S = 30.0
NONE = ErrorCode.Value("NONE")
Reply = TypeVar("Reply")


async def answer_of(call: Callable[[], Awaitable[Reply]]) -> Reply:
    """``call()``'s answer; a failed call raised as the TxlogError it stands for."""
    try:
        return await call()
    except grpc.RpcError as exc:
        raise errors.from_rpc_error(exc) from None


class PeerClient:
    def __init__(self, registry: ServiceRegistry, timeout_s: float = CALL_TIMEOUT_S_DEFAULT, tls_files: TlsFiles | None = None,
                 routes: PeerRoutes | None = None):
        """``tls_files``: this instance's own certificate, key and CA (its
        --tls-* settings): other instances see it as the client of their calls.
        ``routes``: where each registered address is dialled (its --peer-routes-file)."""
        self.registry = registry
        self.routes = routes or PeerRoutes("")
        self.timeout_s = timeout_s
        # marked as the cluster's own calls (admission's reserved share, no client quota: txlog.net.identity)
        self._channels = ChannelCache(timeout_s=timeout_s, tls_files=tls_files, metadata=((PEER_METADATA, "1"),))
        # Servers applications run (transaction checkers) are dialled with this instance's certificate but never
        # its bearer token: whoever registered the address would otherwise hold a service's (super user's) token.
        self._application_channels = ChannelCache(
            timeout_s=timeout_s, tls_files=dataclasses.replace(tls_files, token="") if tls_files is not None else None)
        self._leaders: dict[tuple[str, int], tuple[str, float]] = {}
        self._partition_counts: dict[str, int] = {}

    # --- channels and stubs ------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(self.routes.dialled(address))

    def application_channel(self, address: str) -> grpc.aio.Channel:
        """A channel to a server an application runs (no bearer token on it)."""
        return self._application_channels.get(address)

    def stub(self, address: str) -> partition_pb2_grpc.PartitionServiceStub:
        """A partition_svc at ``address``."""
        return partition_pb2_grpc.PartitionServiceStub(self.channel(address))

    def replication_stub(self, address: str) -> replication_pb2_grpc.ReplicationServiceStub:
        """The replication rpcs of a partition_svc at ``address`` (internal)."""
        return replication_pb2_grpc.ReplicationServiceStub(self.channel(address))

    def coordinator_stub(self, address: str) -> coordinator_pb2_grpc.CoordinatorServiceStub:
        return coordinator_pb2_grpc.CoordinatorServiceStub(self.channel(address))

    def producer_id_stub(self, address: str) -> producer_id_pb2_grpc.ProducerIdServiceStub:
        return producer_id_pb2_grpc.ProducerIdServiceStub(self.channel(address))

    async def live(self, kind: str) -> dict[int, str]:
        """{node id: address} of the live instances of a service kind."""
        return await asyncio.to_thread(self.registry.live, kind)

    async def any_partition_svc(self) -> partition_pb2_grpc.PartitionServiceStub:
        live = await self.live("partition_svc")
        if not live:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), "no partition_svc is live")
        return self.stub(sorted(live.values())[0])

    async def call_any_partition_svc(self, method: str, request):
        """A PartitionService call on any live instance (Metadata, CreateTopics)."""
        stub = await self.any_partition_svc()
        return await answer_of(lambda: getattr(stub, method)(request))

    # --- partition leaders -------------------------------------------------------------

    async def refresh(self, topics: list[str]) -> None:
        reply = await self.call_any_partition_svc("Metadata", partition_pb2.MetadataRequest(topics=topics))
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
        await self._channels.close()
        await self._application_channels.close()
