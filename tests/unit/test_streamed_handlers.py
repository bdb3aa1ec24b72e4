"""A server-streaming method as the runtime serves it (services.runtime.server.generic_handler):
its responses in order, the traces' interceptor on; a refusal before the stream and a
failure while it runs end the call with our status and code, as a unary call's do.

The servicer here is a stand-in (what it answers is not under test); the gRPC server,
the runtime's handlers and the tracing interceptor are the real ones."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from services.runtime import server
from txlog.net import telemetry
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import partition_pb2, partition_pb2_grpc

SERVICE = partition_pb2.DESCRIPTOR.services_by_name["PartitionService"]


class StreamingServicer:
    """FetchStream answers one response per partition named, each saying its offset;
    offset -1 refuses the request before the stream, -2 fails it with our error
    after the responses before it, -3 with an unexpected exception."""

    @server.rpc_handler
    async def FetchStream(self, request, context):
        if any(p.fetch_offset == -1 for p in request.fetch.partitions):
            raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), "offset -1 is refused before the stream")

        async def responses():
            for wanted in request.fetch.partitions:
                if wanted.fetch_offset == -2:
                    raise TxlogError(ErrorCode.Value("NOT_LEADER"), "no longer the leader")
                if wanted.fetch_offset == -3:
                    raise ValueError("a bug")
                await asyncio.sleep(0)
                yield partition_pb2.FetchResponse(results=[partition_pb2.FetchPartitionResult(
                    topic=wanted.topic, next_fetch_offset=wanted.fetch_offset)]).SerializeToString()

        return responses()


async def call(offsets: list[int]) -> tuple[list[int], grpc.aio.AioRpcError | None]:
    """The offsets the responses carried, and the call's failure if it failed."""
    grpc_server = grpc.aio.server(interceptors=telemetry.server_interceptors(TracerProvider()))
    grpc_server.add_generic_rpc_handlers((server.generic_handler(StreamingServicer(), SERVICE, traced=True),))
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    got, failure = [], None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = partition_pb2.FetchStreamRequest(fetch=partition_pb2.FetchRequest(
                partitions=[partition_pb2.FetchPartition(topic="t", fetch_offset=o) for o in offsets]))
            try:
                async for response in partition_pb2_grpc.PartitionServiceStub(channel).FetchStream(request, timeout=10):
                    got.append(response.results[0].next_fetch_offset)
            except grpc.aio.AioRpcError as exc:
                failure = exc
    finally:
        await grpc_server.stop(None)
    return got, failure


def test_the_responses_arrive_in_order_with_the_tracing_interceptor_on():
    got, failure = asyncio.run(call([5, 7, 9]))
    assert failure is None and got == [5, 7, 9]


def test_a_refusal_before_the_stream_is_the_calls_status_with_our_code():
    got, failure = asyncio.run(call([5, -1]))
    assert got == [] and failure.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INVALID_REQUEST" in failure.details() and "offset -1 is refused before the stream" in failure.details()


@pytest.mark.parametrize(("offset", "status", "said"), [
    (-2, grpc.StatusCode.UNAVAILABLE, "NOT_LEADER: no longer the leader"),
    (-3, grpc.StatusCode.INTERNAL, "UNKNOWN_SERVER_ERROR: ValueError in FetchStream"),
])
def test_a_failure_while_streaming_ends_the_call_after_the_responses_before_it(offset, status, said):
    got, failure = asyncio.run(call([5, 7, offset, 9]))
    assert got == [5, 7]
    assert failure.code() == status and failure.details() == said
