"""partition_svc/quota_servicer.py's Throttling charges request_percentage with
every call's handler time, a failed call's and a stream's last steps too (the
quota store and the authorizer are stand-ins: what they answer is not tested here)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from partition_svc.quota_servicer import Throttling

QUOTAS = {(("client-id", "busy"),): {"request_percentage": 1.0}}


class Context:
    def invocation_metadata(self):
        return (("txlog-client-id", "busy"),)

    def time_remaining(self):
        return 30.0


def throttling() -> Throttling:
    authorizer = SimpleNamespace(is_cluster_call=lambda context: False,
                                 caller=lambda context: SimpleNamespace(principal="User:ANONYMOUS"))
    return Throttling(SimpleNamespace(configs=QUOTAS), authorizer)


def busy(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def charged(throttled: Throttling) -> float:
    rate = throttled.tracker.rates[((("client-id", "busy"),), "request_percentage")]
    return sum(amount for _, amount in rate.windows)


def test_a_failed_calls_handler_time_is_charged():
    throttled = throttling()

    async def failing(request, context):
        busy(0.05)
        raise RuntimeError("the handler failed")

    servicer = SimpleNamespace(Produce=failing, Fetch=failing, FetchStream=failing)
    throttled.throttle(servicer)
    with pytest.raises(RuntimeError):
        asyncio.run(servicer.Produce(SimpleNamespace(ByteSize=lambda: 10), Context()))
    assert charged(throttled) >= 5, "50 ms of the thread: 5 hundredths of a second"


def test_a_streams_steps_after_its_last_chunk_are_charged():
    throttled = throttling()

    async def fetch_stream(request, context):
        async def chunks():
            yield b"chunk"
            busy(0.05)  # the stream's end takes the thread too

        return chunks()

    servicer = SimpleNamespace(Produce=fetch_stream, Fetch=fetch_stream, FetchStream=fetch_stream)
    throttled.throttle(servicer)

    async def drain():
        return [chunk async for chunk in await servicer.FetchStream(None, Context())]

    assert asyncio.run(drain()) == [b"chunk"]
    assert charged(throttled) >= 5
