"""Transport.fetch against real gRPC servers: the chunks of a FetchStream as they
come; against a server without FetchStream (older than it: UNIMPLEMENTED), one
Fetch, and Fetch from then on; a failure after chunks raises, the chunks before
it having been yielded.

The servers are stand-ins answering by a script (what they answer is not under
test); the gRPC servers and the SDK's transport are the real ones."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from txlog.errors import ClientError
from txlog.transport import Transport
from txlog.v1 import partition_pb2

SERVICE = "txlog.v1.PartitionService"


def response(offset: int) -> bytes:
    return partition_pb2.FetchResponse(results=[partition_pb2.FetchPartitionResult(topic="t", next_fetch_offset=offset)]).SerializeToString()


class Script:
    def __init__(self, streams: bool, fail_after: int | None = None):
        self.streams, self.fail_after = streams, fail_after
        self.calls: list[str] = []

    def handlers(self) -> grpc.GenericRpcHandler:
        async def fetch(request, context):
            self.calls.append("Fetch")
            return response(100)

        async def fetch_stream(request, context):
            self.calls.append("FetchStream")
            for i in range(3):
                if i == self.fail_after:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the leader went away")
                yield response(i)

        methods = {"Fetch": grpc.unary_unary_rpc_method_handler(fetch)}
        if self.streams:
            methods["FetchStream"] = grpc.unary_stream_rpc_method_handler(fetch_stream)
        return grpc.method_handlers_generic_handler(SERVICE, methods)


async def fetches(script: Script, seen: list[list[int]], rounds: int = 1) -> list[list[int]]:
    """The next_fetch_offset of each response Transport.fetch yielded, per round, into ``seen``."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((script.handlers(),))
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    transport = Transport(request_timeout_ms=10_000)
    try:
        for _ in range(rounds):
            seen.append([])
            async for reply in transport.fetch(address, partition_pb2.FetchRequest()):
                seen[-1].append(reply.results[0].next_fetch_offset)
    finally:
        await transport.close()
        await server.stop(None)
    return seen


def test_the_chunks_of_a_stream_come_as_the_server_sends_them():
    script = Script(streams=True)
    assert asyncio.run(fetches(script, [], rounds=2)) == [[0, 1, 2], [0, 1, 2]]
    assert script.calls == ["FetchStream", "FetchStream"]


def test_a_server_without_fetch_stream_is_fetched_from_with_fetch_from_then_on():
    script = Script(streams=False)
    assert asyncio.run(fetches(script, [], rounds=2)) == [[100], [100]]
    assert script.calls == ["Fetch", "Fetch"], "the stream was asked once; the server's answer is remembered"


def test_a_failure_after_some_chunks_raises_after_they_were_yielded():
    script = Script(streams=True, fail_after=2)
    seen: list[list[int]] = []
    with pytest.raises(ClientError) as failure:
        asyncio.run(fetches(script, seen))
    assert seen == [[0, 1]] and failure.value.retriable and "the leader went away" in str(failure.value)
    assert script.calls == ["FetchStream"], "a stream that failed after chunks is not retried as Fetch"
