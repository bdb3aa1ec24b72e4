"""Allocates producer-id blocks through the ZooKeeper store.

The allocator remembers the block and version it last wrote, so when nobody else
writes in between an allocation is exactly one ZooKeeper operation (the
conditional set). On a version conflict it forgets, reads again and retries
(with back-off); when a write's outcome is unknown (connection lost mid-call) it
also forgets, so the next allocation starts from what ZooKeeper holds: a block
possibly written but never answered is skipped, never handed out twice.
Allocations in one process are serialized by a lock, so they never conflict
with each other.
"""

from __future__ import annotations

import asyncio

from producer_id_svc.core import ProducerIdBlock, next_block
from producer_id_svc.store import ProducerIdBlockStore, VersionConflict
from services.errors import ErrorCode, TxlogError
from services.retry import RetryPolicy


def conflict_retry_policy() -> RetryPolicy:
    return RetryPolicy(attempts_max=50, backoff_initial_ms=2.0, backoff_max_ms=100.0, jitter=0.5)


class BlockAllocator:
    def __init__(self, store: ProducerIdBlockStore, block_size: int, retry: RetryPolicy | None = None):
        self.store = store
        self.block_size = block_size
        self.retry = retry or conflict_retry_policy()
        self._lock = asyncio.Lock()
        self._known: tuple[ProducerIdBlock | None, int | None] | None = None
        self.zookeeper_writes = 0
        self.zookeeper_reads = 0
        self.version_conflicts = 0

    async def allocate(self, requester_id: int) -> ProducerIdBlock:
        async with self._lock:
            try:
                return await self.retry.run(
                    lambda: self._attempt(requester_id), lambda exc: isinstance(exc, VersionConflict)
                )
            except VersionConflict as exc:
                raise TxlogError(
                    ErrorCode.Value("REQUEST_TIMED_OUT"),
                    f"gave up after {self.retry.attempts_max} conflicting writes to {self.store.path}; retry",
                ) from exc

    async def _attempt(self, requester_id: int) -> ProducerIdBlock:
        if self._known is None:
            self.zookeeper_reads += 1
            self._known = await self.store.read()
        latest, version = self._known
        block = next_block(latest, requester_id, self.block_size)
        self._known = None  # until the write is known to have happened
        self.zookeeper_writes += 1
        try:
            if version is None:
                new_version = await self.store.create(block)
            else:
                new_version = await self.store.write(block, version)
        except VersionConflict:
            self.version_conflicts += 1
            raise
        self._known = (block, new_version)
        return block
