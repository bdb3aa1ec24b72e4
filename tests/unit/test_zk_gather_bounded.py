"""zk.gather_in_chunks, the bounded concurrent gather of ZooKeeper reads used
by the controller, the resync and Metadata: order of results, reads in flight
never above the chunk size, what a read that raises does. The reader here is a
fake (sleeps, or waits until the test opens its gate, then answers): ZooKeeper
is not what this tests."""

import asyncio

import pytest

from services.coordination import zk


class Reader:
    """Answers ``key * 10`` after a delay that varies by key, counting the reads in flight."""

    def __init__(self, fail: set[int] = frozenset(), delay=lambda key: (key * 7 % 5) / 1000,  # later keys often end first
                 gates: dict[int, asyncio.Event] | None = None):
        self.fail = fail
        self.delay = delay
        self.gates = gates or {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.started: list[int] = []
        self.ended: list[int] = []
        self.answered: list[int] = []  # ended with an answer: neither failed nor cancelled

    async def __call__(self, key: int) -> int:
        self.started.append(key)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if key in self.gates:
                await self.gates[key].wait()
            else:
                await asyncio.sleep(self.delay(key))
            if key in self.fail:
                raise KeyError(key)
            self.answered.append(key)
            return key * 10
        finally:
            self.in_flight -= 1
            self.ended.append(key)


@pytest.mark.parametrize("count, chunk_size", [(0, 3), (1, 3), (7, 3), (9, 3), (10, 1), (5, 100)])
def test_results_in_key_order_and_never_more_in_flight_than_the_chunk_size(count, chunk_size):
    reader = Reader()
    keys = list(range(count))
    assert asyncio.run(zk.gather_in_chunks(reader, keys, chunk_size)) == [key * 10 for key in keys]
    assert sorted(reader.started) == keys  # each read once
    assert reader.most_in_flight == min(count, chunk_size)  # the reads of a chunk do run at once
    assert reader.in_flight == 0


def test_a_chunk_starts_only_once_every_read_of_the_one_before_ended():
    reader = Reader()
    chunks = []

    async def each_chunk(chunk_keys, results):
        assert reader.in_flight == 0
        assert sorted(reader.ended) == sorted(reader.started)  # nothing of the next chunk started yet
        chunks.append((list(chunk_keys), list(results)))

    assert asyncio.run(zk.gather_in_chunks(reader, list(range(7)), 3, each_chunk=each_chunk)) == [k * 10 for k in range(7)]
    assert chunks == [([0, 1, 2], [0, 10, 20]), ([3, 4, 5], [30, 40, 50]), ([6], [60])]


def test_a_read_that_raises_propagates_at_once_and_no_later_chunk_is_read():
    chunks = []

    async def each_chunk(chunk_keys, results):
        chunks.append(list(chunk_keys))

    async def run():
        gates = {3: asyncio.Event(), 4: asyncio.Event()}  # 3 and 4 are still reading when 5 fails
        reader = Reader(fail={5}, delay=lambda key: 0, gates=gates)
        with pytest.raises(KeyError) as raised:
            await zk.gather_in_chunks(reader, list(range(9)), 3, each_chunk=each_chunk)
        assert raised.value.args == (5,)
        assert sorted(reader.started) == [0, 1, 2, 3, 4, 5]  # chunk [6, 7, 8] never started
        assert chunks == [[0, 1, 2]]  # the chunk before was handed over; the failing one is not
        still_reading = reader.in_flight
        for gate in gates.values():
            gate.set()
        while reader.in_flight:  # each opened read ends at the loop's next turns
            await asyncio.sleep(0)
        return still_reading, sorted(reader.ended), sorted(reader.answered)

    # the failing chunk's other reads are not cancelled: still in flight when it raised, they run to their end
    assert asyncio.run(run()) == (2, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4])


def test_an_exception_of_each_chunk_propagates_and_no_later_chunk_is_read():
    reader = Reader()

    async def each_chunk(chunk_keys, results):
        raise RuntimeError("taking the states failed")

    with pytest.raises(RuntimeError):
        asyncio.run(zk.gather_in_chunks(reader, list(range(6)), 2, each_chunk=each_chunk))
    assert sorted(reader.started) == [0, 1]
