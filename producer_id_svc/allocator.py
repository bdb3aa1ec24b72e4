"""Allocates producer-id blocks through the ZooKeeper store.

Guarantees and costs:
- The allocator remembers the block and version it last wrote, so when nobody
  else writes in between, an allocation is exactly one ZooKeeper operation (the
  conditional set).
- Requests that arrive while a write is in flight wait, and are then served
  together by one write that reserves their blocks as one contiguous range (the
  node records that range): under load there is at most one write per block,
  and throughput is not bounded by ZooKeeper's write latency.
- With ``prefetch`` (the default), after answering it reserves the next block
  in the background, so a lone caller does not wait for ZooKeeper at all: still
  one write per block, and a crash loses at most the one block reserved ahead
  (a gap, never a repeat).
- On a version conflict it forgets what it knew, reads again and retries with
  back-off. When a write's outcome is unknown (connection lost mid-call) it also
  forgets, so the next allocation starts from what ZooKeeper holds: a range
  possibly written but never answered is skipped, never handed out twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from producer_id_svc.core import ProducerIdBlock, next_block
from producer_id_svc.store import ProducerIdBlockStore, VersionConflict
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.retry import RetryPolicy

REQUESTS_PER_WRITE_MAX = 256

log = logging.getLogger(__name__)


def conflict_retry_policy() -> RetryPolicy:
    return RetryPolicy(attempts_max=50, backoff_initial_ms=2.0, backoff_max_ms=100.0, jitter=0.5)


class BlockAllocator:
    def __init__(
        self, store: ProducerIdBlockStore, block_size: int, retry: RetryPolicy | None = None, *, prefetch: bool = True
    ):
        self.store = store
        self.block_size = block_size
        self.retry = retry or conflict_retry_policy()
        self.prefetch = prefetch
        self._lock = asyncio.Lock()
        self._waiting: list[tuple[int, asyncio.Future]] = []
        self._prefetched: ProducerIdBlock | None = None
        self._prefetch_task: asyncio.Task | None = None
        self._known: tuple[ProducerIdBlock | None, int | None] | None = None
        self.zookeeper_writes = 0
        self.zookeeper_reads = 0
        self.version_conflicts = 0

    async def allocate(self, requester_id: int) -> ProducerIdBlock:
        mine = asyncio.get_running_loop().create_future()
        self._waiting.append((requester_id, mine))
        async with self._lock:
            if not mine.done():
                await self._serve_waiting()
        self._start_prefetch(requester_id)
        return await mine

    async def _serve_waiting(self) -> None:
        group = self._waiting[:REQUESTS_PER_WRITE_MAX]
        del self._waiting[: len(group)]
        if self._prefetched is not None:
            requester_id, waiter = group.pop(0)
            waiter.set_result(dataclasses.replace(self._prefetched, requester_id=requester_id))
            self._prefetched = None
        if not group:
            return
        try:
            blocks = await self._allocate_range([requester for requester, _ in group])
        except BaseException as exc:
            for _, waiter in group:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        for (_, waiter), block in zip(group, blocks, strict=True):
            waiter.set_result(block)

    def _start_prefetch(self, requester_id: int) -> None:
        if self.prefetch and self._prefetched is None and (self._prefetch_task is None or self._prefetch_task.done()):
            self._prefetch_task = asyncio.ensure_future(self._reserve_ahead(requester_id))

    async def _reserve_ahead(self, requester_id: int) -> None:
        try:
            async with self._lock:
                if self._prefetched is None:
                    [self._prefetched] = await self._allocate_range([requester_id])
        except Exception as exc:  # the next request allocates in its own path and reports the error
            log.debug("reserving a block ahead failed: %s", exc)

    async def _allocate_range(self, requester_ids: list[int]) -> list[ProducerIdBlock]:
        """One block per requester, all reserved by one write (the node names the first requester)."""
        try:
            reserved = await self.retry.run(
                lambda: self._attempt(requester_ids[0], len(requester_ids)), lambda exc: isinstance(exc, VersionConflict)
            )
        except VersionConflict as exc:
            raise TxlogError(
                ErrorCode.Value("REQUEST_TIMED_OUT"),
                f"gave up after {self.retry.attempts_max} conflicting writes to {self.store.path}; retry",
            ) from exc
        starts = range(reserved.block_start, reserved.block_end + 1, self.block_size)
        return [
            ProducerIdBlock(requester_id, start, start + self.block_size - 1)
            for requester_id, start in zip(requester_ids, starts, strict=True)
        ]

    async def _attempt(self, requester_id: int, block_count: int) -> ProducerIdBlock:
        if self._known is None:
            self.zookeeper_reads += 1
            self._known = await self.store.read()
        latest, version = self._known
        reserved = next_block(latest, requester_id, self.block_size * block_count)
        self._known = None  # until the write is known to have happened
        self.zookeeper_writes += 1
        try:
            if version is None:
                new_version = await self.store.create(reserved)
            else:
                new_version = await self.store.write(reserved, version)
        except VersionConflict:
            self.version_conflicts += 1
            raise
        self._known = (reserved, new_version)
        return reserved
