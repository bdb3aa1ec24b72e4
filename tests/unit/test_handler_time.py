"""partition_svc/handler_time.py: a handler's time on the event loop, its steps
between the awaits that suspend it (request_percentage counts it), on a clock
the test moves."""

from __future__ import annotations

import asyncio

import pytest

from partition_svc.handler_time import Stopwatch, timed


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_only_the_steps_count_not_the_waits_between_them():
    clock, watch = Clock(), Stopwatch()

    async def handler():
        clock.now += 3  # work on the loop
        await asyncio.sleep(0.01)
        clock.now += 4
        return "answer"

    async def other_calls():  # the loop's time while the handler waits goes to others
        await asyncio.sleep(0.005)
        clock.now += 100

    async def main():
        other = asyncio.ensure_future(other_calls())
        answer = await timed(handler(), watch, clock)
        await other
        return answer

    assert asyncio.run(main()) == "answer"
    assert watch.seconds == 7


def test_what_the_handler_raises_is_passed_on_and_its_time_counted():
    clock, watch = Clock(), Stopwatch()

    async def handler():
        await asyncio.sleep(0)
        clock.now += 2
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(timed(handler(), watch, clock))
    assert watch.seconds == 2


def test_a_cancellation_reaches_the_handler_awaited():
    cleaned = []

    async def handler():
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)

    async def main():
        task = asyncio.ensure_future(timed(handler(), Stopwatch()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cleaned == [True]


def test_the_chunks_of_an_async_generator_are_timed_one_by_one():
    clock, watch = Clock(), Stopwatch()

    async def chunks():
        for cost in (1, 5):
            clock.now += cost
            await asyncio.sleep(0)
            yield cost

    async def main():
        stream, seen = chunks(), []
        for _ in range(2):
            seen.append((await timed(stream.__anext__(), watch, clock), watch.seconds))
            watch.seconds = 0
        with pytest.raises(StopAsyncIteration):
            await timed(stream.__anext__(), watch, clock)
        return seen

    assert asyncio.run(main()) == [(1, 1), (5, 5)]
