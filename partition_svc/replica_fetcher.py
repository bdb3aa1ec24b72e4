"""A follower's side of replication: one fetcher per leader instance,
fetching every partition this instance follows from it in one long-polled
ReplicaFetch (as Kafka's replica fetcher threads do).

Before a partition's first fetch from a leader (and whenever the leader says
the logs diverge), the follower truncates its log to where it agrees with
the leader's: OffsetForLeaderEpoch rounds (leader_epochs.truncation_step),
so an old leader's unreplicated tail never survives. It then stores the
leader's batches byte for byte at the leader's offsets, awaits their
durability, and only then fetches again: the offset it fetches from is what
it holds durably, which is what the leader counts toward the high watermark.
Each answer also carries the leader's log start: the follower moves its own
to it (up to its high watermark: Partition.follow_log_start), durably, before
it fetches again; each fetch says the follower's log start, which the leader
counts toward the low watermark DeleteRecords waits for (isr.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from partition_svc.partition import Partition
from services.coordination.rpc import PeerClient, answer_of
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.leader_epochs import AskAgain, truncation_step
from txlog.protocol.names import TopicPartition
from txlog.v1 import replication_pb2

log = logging.getLogger(__name__)


class FetchingReplicas(Protocol):
    """What a fetcher needs of its replica manager (replica_manager.ReplicaManager)."""

    node_id: int
    fetch_wait_ms: int
    fetch_bytes_max: int
    storage_zxid: int | None
    peers: PeerClient

    async def live_nodes(self) -> dict[int, str]: ...

    async def refresh(self, topic: str, index: int) -> None: ...


NONE = ErrorCode.Value("NONE")
STALE = {ErrorCode.Value(c) for c in ("FENCED_LEADER_EPOCH", "NOT_LEADER", "UNKNOWN_TOPIC_OR_PARTITION")}
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0


@dataclass
class Followed:
    partition: Partition
    leader_epoch: int
    truncated: bool = False


class ReplicaFetcher:
    def __init__(self, manager: FetchingReplicas, leader_id: int):
        self.manager = manager
        self.leader_id = leader_id
        self.followed: dict[TopicPartition, Followed] = {}
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def add(self, key: TopicPartition, partition: Partition, leader_epoch: int) -> None:
        self.followed[key] = Followed(partition, leader_epoch)
        self._changed.set()

    def remove(self, key: TopicPartition) -> None:
        self.followed.pop(key, None)

    def follows(self, key: TopicPartition, leader_epoch: int) -> bool:
        followed = self.followed.get(key)
        return followed is not None and followed.leader_epoch == leader_epoch

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        backoff = BACKOFF_S
        while True:
            if not self.followed:
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                address = (await self.manager.live_nodes()).get(self.leader_id)
                if address is None:
                    raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), f"node {self.leader_id} is not live")
                stub = self.manager.peers.replication_stub(address)
                await self._truncate(stub)
                await self._fetch(stub)
                backoff = BACKOFF_S
            except asyncio.CancelledError:
                raise
            except TxlogError as exc:
                log.debug("replica fetch failed", extra=fields(leader=self.leader_id, error=exc.message))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception:
                log.exception("replica fetch failed", extra=fields(leader=self.leader_id))
                await asyncio.sleep(BACKOFF_MAX_S)

    async def _truncate(self, stub) -> None:
        """OffsetForLeaderEpoch rounds for every partition not truncated yet."""
        asking = {key: f.partition.epochs.latest_epoch for key, f in self.followed.items() if not f.truncated}
        while asking:
            for key in [k for k, epoch in asking.items() if epoch < 0]:  # nothing written in any epoch: nothing to keep
                await self._truncate_to(key, 0)
                del asking[key]
            if not asking:
                return
            request = replication_pb2.OffsetForLeaderEpochRequest(replica_id=self.manager.node_id, partitions=[
                replication_pb2.OffsetForLeaderEpochPartition(topic=topic, partition=index, leader_epoch=epoch,
                                                              current_leader_epoch=self.followed[(topic, index)].leader_epoch)
                for (topic, index), epoch in asking.items() if (topic, index) in self.followed])
            reply = await answer_of(lambda request=request: stub.OffsetForLeaderEpoch(request))
            asked_again = {}
            for result in reply.results:
                key = (result.topic, result.partition)
                followed = self.followed.get(key)
                if followed is None:
                    continue
                if result.error.code != NONE:
                    await self._on_error(key, result.error)
                    continue
                step = truncation_step(followed.partition.epochs, followed.partition.next_offset, result.leader_epoch, result.end_offset)
                if isinstance(step, AskAgain):
                    asked_again[key] = step.epoch
                else:
                    await self._truncate_to(key, step)
            asking = asked_again

    async def _truncate_to(self, key: TopicPartition, offset: int) -> None:
        followed = self.followed[key]
        partition = followed.partition
        if offset < partition.next_offset:
            log.warning("truncating diverging log", extra=fields(topic=key[0], partition=key[1], to=offset,
                                                                 log_end=partition.next_offset, leader=self.leader_id))
        await partition.truncate(offset)  # after a deposed leader's appends still queued for the writer
        followed.truncated = True

    async def _fetch(self, stub) -> None:
        ready = {key: f for key, f in self.followed.items() if f.truncated}
        if not ready:
            return
        request = replication_pb2.ReplicaFetchRequest(
            replica_id=self.manager.node_id, max_wait_ms=self.manager.fetch_wait_ms, max_bytes=self.manager.fetch_bytes_max,
            storage_zxid=self.manager.storage_zxid,
            partitions=[replication_pb2.ReplicaFetchPartition(
                topic=topic, partition=index, leader_epoch=f.leader_epoch, fetch_offset=f.partition.next_offset,
                last_fetched_epoch=f.partition.epochs.latest_epoch, log_start_offset=f.partition.log_start_offset)
                for (topic, index), f in ready.items()])
        reply = await answer_of(lambda: stub.ReplicaFetch(request, timeout=self.manager.fetch_wait_ms / 1000 + 30))
        written, refused, log_starts = [], 0, []
        for result in reply.results:
            key = (result.topic, result.partition)
            followed = self.followed.get(key)
            if followed is None or followed is not ready.get(key):
                continue  # it changed while the fetch was out
            if result.error.code != NONE:
                if result.error.code == ErrorCode.Value("OFFSET_OUT_OF_RANGE") and result.log_start_offset > followed.partition.next_offset:
                    # the leader's retention deleted what this replica still lacks: start over at its log start
                    await followed.partition.start_over_at(result.log_start_offset,
                                                           lambda key=key, followed=followed: self.followed.get(key) is followed)
                    continue
                await self._on_error(key, result.error)
                refused += 1
                continue
            log_starts.append((followed.partition, result.log_start_offset))
            if result.HasField("diverging_epoch"):
                followed.truncated = False
                continue
            try:
                durable = followed.partition.append_replicated(
                    [(b.base_offset, b.leader_epoch, b.value) for b in result.batches], result.high_watermark,
                    result.replicated_end_offset)
            except ValueError as exc:  # the logs disagree where they should not: find where again
                log.error("replica log out of step with the leader", extra=fields(topic=key[0], partition=key[1], error=str(exc)))
                followed.truncated = False
                refused += 1
                continue
            if durable is not None:
                written.append(durable)
        if written:
            await asyncio.gather(*written)
        moved = [partition.follow_log_start(log_start) for partition, log_start in log_starts]  # up to the high watermark just moved
        await asyncio.gather(*(future for future in moved if future is not None))
        if not written and refused == len(reply.results):
            raise TxlogError(ErrorCode.Value("NOT_LEADER"), f"node {self.leader_id} refused every partition fetched")

    async def _on_error(self, key: TopicPartition, error) -> None:
        if error.code in STALE:
            await self.manager.refresh(*key)  # this replica's view is older than the leader's: read the state again
        else:
            log.debug("replica fetch refused", extra=fields(topic=key[0], partition=key[1], error=error.message))
