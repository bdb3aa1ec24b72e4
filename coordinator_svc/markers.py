"""Sends COMMIT/ABORT markers to the leaders of a transaction's partitions.

One WriteTxnMarkers per leader, holding every partition of the transaction it
leads; partitions are retried, after refreshing metadata when their leader
moved, until every one has acknowledged. A leader that answers
TRANSACTION_COORDINATOR_FENCED has seen a newer owner of this transaction's log
partition: the sender stops, and so does this coordinator for that partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import grpc

from coordinator_svc.partitions import PartitionClient
from services import errors
from services.errors import ErrorCode, TxlogError
from services.logs import fields
from services.retry import RetryPolicy
from services.stubs.txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)
NONE = ErrorCode.Value("NONE")
FENCED = ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED")
# The partition has moved past this marker (a newer epoch of the producer wrote
# there, which only happens after this transaction ended) or is gone: done.
SETTLED = {ErrorCode.Value("INVALID_PRODUCER_EPOCH")}


class MarkerSender:
    def __init__(self, client: PartitionClient):
        self.client = client
        self.backoff = RetryPolicy(backoff_initial_ms=20, backoff_max_ms=1000)

    async def write(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool, coordinator_epoch: int, partitions
    ) -> None:
        remaining = set(partitions)
        attempt = 0
        while remaining:
            by_leader: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for tp in sorted(remaining):
                try:
                    by_leader[await self.client.leader(*tp)].append(tp)
                except TxlogError:
                    pass  # no leader right now: next round
            results = await asyncio.gather(
                *[self._send(address, tps, transactional_id, producer_id, producer_epoch, committed, coordinator_epoch) for address, tps in by_leader.items()]
            )
            for acknowledged in results:
                remaining -= acknowledged
            if remaining:
                attempt += 1
                if attempt % 50 == 0:
                    log.warning("markers still unacknowledged", extra=fields(transactional_id=transactional_id, partitions=sorted(remaining)))
                await asyncio.sleep(self.backoff.delay_ms(min(attempt, 10)) / 1000)

    async def _send(self, address, tps, transactional_id, producer_id, producer_epoch, committed, coordinator_epoch) -> set:
        request = partition_pb2.WriteTxnMarkersRequest(
            markers=[
                partition_pb2.TxnMarker(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    committed=committed,
                    coordinator_epoch=coordinator_epoch,
                    transactional_id=transactional_id,
                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps],
                )
            ]
        )
        try:
            reply = await self.client.stub(address).WriteTxnMarkers(request)
        except grpc.RpcError as exc:
            error = errors.from_rpc_error(exc)
            for tp in tps:
                self.client.forget_leader(*tp)
            if error.retriable:
                return set()
            raise error from None
        acknowledged = set()
        for result in reply.markers[0].results:
            tp = (result.partition.topic, result.partition.partition)
            code = result.error.code
            if code == NONE or code in SETTLED:
                acknowledged.add(tp)
            elif code == FENCED:
                raise TxlogError(FENCED, result.error.message)
            elif code == ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION") and not await self._exists(tp):
                acknowledged.add(tp)  # the topic is gone; nothing is left to mark
            else:
                self.client.forget_leader(*tp)
        return acknowledged

    async def _exists(self, tp: tuple[str, int]) -> bool:
        await self.client.refresh([tp[0]])
        count = await self.client.partition_count(tp[0])
        return count is not None and tp[1] < count
