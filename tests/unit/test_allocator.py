"""BlockAllocator's use of the store: one write per block when uncontended, a
fresh read after a conflict or an unknown outcome. The store here is an
in-memory fake with ZooKeeper's conditional-write semantics (the allocator is
under test, not ZooKeeper; tests/integ runs the real one)."""

import asyncio

import pytest

from producer_id_svc.allocator import BlockAllocator
from producer_id_svc.core import ProducerIdBlock
from producer_id_svc.store import VersionConflict
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.retry import RetryPolicy


class VersionedNode:
    """One node with a version, as ZooKeeper keeps it."""

    def __init__(self):
        self.block = None
        self.version = None
        self.reads = self.writes = 0
        self.fail_next_write_after_applying = False
        self.path = "/test/latest_producer_id_block"

    async def read(self):
        self.reads += 1
        return self.block, self.version

    async def create(self, block):
        if self.version is not None:
            raise VersionConflict(self.path)
        return await self._apply(block)

    async def write(self, block, expected_version):
        if expected_version != self.version:
            raise VersionConflict(self.path)
        return await self._apply(block)

    async def _apply(self, block):
        await asyncio.sleep(0)  # a real write suspends the caller; others may queue meanwhile
        self.writes += 1
        self.block, self.version = block, (0 if self.version is None else self.version + 1)
        if self.fail_next_write_after_applying:
            self.fail_next_write_after_applying = False
            raise TxlogError(ErrorCode.Value("ZOOKEEPER_UNAVAILABLE"), "connection lost after the write")
        return self.version


def _no_wait_policy(attempts_max=50):
    async def sleep(_):
        return None

    return RetryPolicy(attempts_max=attempts_max, sleep=sleep)


def test_uncontended_allocation_is_one_write_per_block_after_the_first_read():
    node = VersionedNode()
    allocator = BlockAllocator(node, 1000, _no_wait_policy(), prefetch=False)

    async def run():
        return [await allocator.allocate(1) for _ in range(10)]

    blocks = asyncio.run(run())
    assert [b.block_start for b in blocks] == list(range(0, 10000, 1000))
    assert (node.reads, node.writes) == (1, 10)


def test_another_writer_in_between_causes_one_reread_and_no_overlap():
    node = VersionedNode()
    allocator = BlockAllocator(node, 1000, _no_wait_policy(), prefetch=False)

    async def run():
        first = await allocator.allocate(1)
        # another allocator process takes the next block behind our back
        node.block, node.version = ProducerIdBlock(2, 1000, 1999), node.version + 1
        second = await allocator.allocate(1)
        return first, second

    first, second = asyncio.run(run())
    assert (first.block_start, second.block_start) == (0, 2000)
    assert node.reads == 2


def test_after_an_unknown_outcome_the_next_allocation_rereads_and_skips_the_block():
    node = VersionedNode()
    allocator = BlockAllocator(node, 1000, _no_wait_policy(), prefetch=False)

    async def run():
        await allocator.allocate(1)
        node.fail_next_write_after_applying = True
        with pytest.raises(TxlogError):
            await allocator.allocate(1)  # written, but the answer was lost
        return await allocator.allocate(1)

    block = asyncio.run(run())
    assert block.block_start == 2000  # 1000..1999 is skipped, never handed out twice


def test_concurrent_allocations_in_one_process_never_conflict():
    node = VersionedNode()
    allocator = BlockAllocator(node, 10, _no_wait_policy(), prefetch=False)

    async def run():
        return await asyncio.gather(*[allocator.allocate(1) for _ in range(50)])

    blocks = asyncio.run(run())
    assert sorted(b.block_start for b in blocks) == list(range(0, 500, 10))
    assert all(b.size == 10 for b in blocks)
    assert allocator.version_conflicts == 0


def test_requests_waiting_on_a_write_share_the_next_write():
    node = VersionedNode()
    allocator = BlockAllocator(node, 10, _no_wait_policy(), prefetch=False)

    async def run():
        return await asyncio.gather(*[allocator.allocate(i) for i in range(50)])

    blocks = asyncio.run(run())
    assert node.writes == 2  # the first request alone, then the 49 that queued behind it
    assert node.block == ProducerIdBlock(1, 10, 499)  # the node records the range and its first requester
    assert [(b.requester_id, b.block_start) for b in blocks] == [(i, 10 * i) for i in range(50)]


def test_endless_conflicts_give_a_retriable_error():
    class AlwaysConflicting(VersionedNode):
        async def write(self, block, expected_version):
            raise VersionConflict(self.path)

        async def create(self, block):
            raise VersionConflict(self.path)

    allocator = BlockAllocator(AlwaysConflicting(), 1000, _no_wait_policy(attempts_max=5), prefetch=False)
    with pytest.raises(TxlogError) as info:
        asyncio.run(allocator.allocate(1))
    assert info.value.retriable and "5 conflicting writes" in info.value.message


def test_prefetch_answers_from_a_block_reserved_ahead_one_write_per_block():
    node = VersionedNode()
    allocator = BlockAllocator(node, 1000, _no_wait_policy())

    async def run():
        blocks = []
        for requester_id in range(10):
            blocks.append(await allocator.allocate(requester_id))
            await asyncio.sleep(0)  # let the reservation ahead run, as a caller's round trip would
            await asyncio.sleep(0)
        return blocks

    blocks = asyncio.run(run())
    assert [(b.requester_id, b.block_start) for b in blocks] == [(i, 1000 * i) for i in range(10)]
    assert node.writes == 11  # one block per answer, plus the one reserved ahead
    assert node.block.block_start == 10000


def test_a_failed_reservation_ahead_is_not_an_error_for_anyone():
    node = VersionedNode()
    allocator = BlockAllocator(node, 1000, _no_wait_policy())

    async def run():
        first = await allocator.allocate(1)
        node.fail_next_write_after_applying = True  # the reservation ahead loses its answer
        for _ in range(3):
            await asyncio.sleep(0)
        return first, await allocator.allocate(1)

    first, second = asyncio.run(run())
    assert (first.block_start, second.block_start) == (0, 2000)  # 1000..1999 skipped, never repeated
