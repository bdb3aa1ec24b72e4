"""Sends COMMIT/ABORT markers to the leaders of a transaction's partitions.

One WriteTxnMarkers per leader, holding every partition it leads of the
transactions being completed (one, or the members of a group commit); partitions are retried, after refreshing metadata when their leader
moved, until every one has acknowledged. A leader that answers
TRANSACTION_COORDINATOR_FENCED has seen a newer owner of this transaction's log
partition: the sender stops, and so does this coordinator for that partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass

from services.coordination.rpc import PeerClient, answer_of
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.retry import RetryPolicy
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)
NONE = ErrorCode.Value("NONE")
FENCED = ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED")
# The partition has moved past this marker (a newer epoch of the producer wrote
# there, which only happens after this transaction ended) or is gone: done.
# Nothing else counts as written: a marker refused for any other reason (say
# INVALID_TXN_STATE, a transaction open at the marker's own epoch) is retried,
# and a warning is logged every 50 rounds, rather than reported complete while
# the partition's LSO stays held.
SETTLED = {ErrorCode.Value("INVALID_PRODUCER_EPOCH")}
# Partitions named in one WriteTxnMarkers, below partition_svc's per-request
# limit. A group commit needing more on one leader is sent in several requests,
# and is then visible on that leader's partitions in steps.
PARTITIONS_PER_REQUEST_MAX = 5_000


@dataclass(frozen=True)
class MarkerSet:
    """The markers of one transaction: its id, the producer id and epoch they carry, its partitions."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: frozenset


class MarkerSender:
    def __init__(self, client: PeerClient):
        self.client = client
        self.backoff = RetryPolicy(backoff_initial_ms=20, backoff_max_ms=1000)

    async def write(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool, coordinator_epoch: int, partitions
    ) -> None:
        await self.write_all([MarkerSet(transactional_id, producer_id, producer_epoch, frozenset(partitions))], committed, coordinator_epoch)

    async def write_all(self, transactions: list[MarkerSet], committed: bool, coordinator_epoch: int, *, seal_prepared: bool = False) -> None:
        """Writes the markers of several transactions with the same outcome. A
        leader gets every marker it needs in one WriteTxnMarkers, which it applies
        at once: the transactions of a group commit become visible together on
        each of its partitions. With ``seal_prepared`` it writes the seals of
        prepared transactions instead (their own epoch; nothing in the log)."""
        remaining = {(i, tp) for i, txn in enumerate(transactions) for tp in txn.partitions}
        attempt = 0
        while remaining:
            by_leader: dict[str, list[tuple[int, tuple[str, int]]]] = defaultdict(list)
            for i, tp in sorted(remaining):
                try:
                    by_leader[await self.client.leader(*tp)].append((i, tp))
                except TxlogError:
                    pass  # no leader right now: next round
            results = await asyncio.gather(
                *[
                    self._send(address, items[start : start + PARTITIONS_PER_REQUEST_MAX], transactions, committed, coordinator_epoch, seal_prepared)
                    for address, items in by_leader.items()
                    for start in range(0, len(items), PARTITIONS_PER_REQUEST_MAX)
                ]
            )
            for acknowledged in results:
                remaining -= acknowledged
            if remaining:
                attempt += 1
                if attempt % 50 == 0:
                    log.warning(
                        "markers still unacknowledged",
                        extra=fields(transactional_ids=sorted({transactions[i].transactional_id for i, _ in remaining}),
                                     partitions=sorted({tp for _, tp in remaining})),
                    )
                await asyncio.sleep(self.backoff.delay_ms(min(attempt, 10)) / 1000)

    async def _send(self, address, items, transactions, committed, coordinator_epoch, seal_prepared) -> set:
        by_transaction: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for i, tp in items:
            by_transaction[i].append(tp)
        order = sorted(by_transaction)
        request = partition_pb2.WriteTxnMarkersRequest(
            markers=[
                partition_pb2.TxnMarker(
                    producer_id=transactions[i].producer_id,
                    producer_epoch=transactions[i].producer_epoch,
                    committed=committed,
                    coordinator_epoch=coordinator_epoch,
                    transactional_id=transactions[i].transactional_id,
                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in by_transaction[i]],
                    seal_prepared=seal_prepared,
                )
                for i in order
            ]
        )
        try:
            reply = await answer_of(lambda: self.client.stub(address).WriteTxnMarkers(request))
        except TxlogError as error:
            for _, tp in items:
                self.client.forget_leader(*tp)
            if error.retriable:
                return set()
            raise error from None
        acknowledged = set()
        for i, marker_result in zip(order, reply.markers, strict=True):
            for result in marker_result.results:
                tp = (result.partition.topic, result.partition.partition)
                code = result.error.code
                if code == NONE or code in SETTLED:
                    acknowledged.add((i, tp))
                elif code == FENCED:
                    raise TxlogError(FENCED, result.error.message)
                elif code == ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION") and not await self._exists(tp):
                    acknowledged.add((i, tp))  # the topic is gone; nothing is left to mark
                else:
                    self.client.forget_leader(*tp)
        return acknowledged

    async def _exists(self, tp: tuple[str, int]) -> bool:
        await self.client.refresh([tp[0]])
        count = await self.client.partition_count(tp[0])
        return count is not None and tp[1] < count
