"""Admission of calls (services.runtime.admission): the bounds on calls and
request bytes in flight, the share kept for the cluster's own calls, refusals
answered LIMIT_EXCEEDED with a retry delay, and every slot given back; first as
rules, then through a real gRPC server with the runtime's handlers.

The servicer in the server tests is a stand-in whose calls wait until the test
lets them go (what it answers is not under test); the gRPC server, the
runtime's handler chain and the health service are the real ones."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st

from services.runtime import admission as admission_module
from services.runtime import server
from services.runtime.admission import REFUSAL_RETRY_MS, UNREAD_SIZE_INITIAL, Admission, Limits, is_internal
from txlog.net.identity import PEER_METADATA, metadata_value
from txlog.protocol import errors
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

LIMIT_EXCEEDED = ErrorCode.Value("LIMIT_EXCEEDED")


def admission(max_rpcs=8, max_bytes=1000, share=0.25) -> Admission:
    return Admission(Limits(max_rpcs, max_bytes, share), rng=random.Random(7))


# --- the rules ------------------------------------------------------------------------------------


def test_client_calls_stop_at_their_share_and_internal_calls_go_on_to_the_whole_bound():
    bounds = admission(max_rpcs=8)
    for _ in range(6):  # 8 * (1 - 0.25)
        assert bounds.admit(False, 1) is None
    refused = bounds.admit(False, 1)
    assert refused is not None and refused.code == LIMIT_EXCEEDED and "max_concurrent_rpcs" in refused.message
    assert bounds.admit(True, 1) is None and bounds.admit(True, 1) is None
    assert bounds.admit(True, 1) is not None
    assert (bounds.in_flight, bounds.refused) == (8, 2)


def test_bytes_are_admitted_below_the_bound_whatever_the_call_and_refused_once_reached():
    bounds = admission(max_bytes=1000)  # clients: 750
    assert bounds.admit(False, 5000) is None, "a call larger than the bound is admitted while bytes are below it"
    refused = bounds.admit(False, 1)
    assert refused is not None and "max_queued_request_bytes" in refused.message
    bounds.release(5000)
    assert bounds.admit(False, 700) is None and bounds.admit(False, 49) is None
    assert bounds.admit(False, 1) is None, "749 < 750: still below the client bound"
    assert bounds.admit(False, 1) is not None
    assert bounds.admit(True, 1) is None, "internal calls have the reserved quarter"


def test_a_refusal_asks_for_a_jittered_delay_and_takes_no_slot():
    bounds = admission(max_rpcs=4)
    for _ in range(3):
        bounds.admit(False, 10)
    delays = set()
    for _ in range(50):
        refused = bounds.admit(False, 10)
        assert refused.retriable
        delays.add(refused.retry_delay_ms)
    assert all(REFUSAL_RETRY_MS * 0.5 <= d <= REFUSAL_RETRY_MS * 1.5 for d in delays) and len(delays) > 5
    assert (bounds.in_flight, bounds.in_flight_bytes) == (3, 30)


def test_the_clusters_own_calls_are_known_by_method():
    assert is_internal("txlog.v1.ReplicationService", "ReplicaFetch")
    assert is_internal("txlog.v1.PartitionService", "WriteTxnMarkers")
    assert is_internal("txlog.v1.ProducerIdService", "AllocateProducerIds")
    assert not is_internal("txlog.v1.PartitionService", "Produce")
    assert not is_internal("txlog.v1.CoordinatorService", "EndTxn")


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 400), st.booleans()), max_size=80),
       st.integers(1, 12), st.integers(1, 2000))
def test_any_sequence_of_calls_stays_within_the_bounds(steps, max_rpcs, max_bytes):
    """Invariants over any interleaving of starts and ends: calls in flight never pass
    the bound (clients never their share), bytes never pass the bound by more than
    one request, and what ends gives back exactly what it took."""
    bounds = admission(max_rpcs=max_rpcs, max_bytes=max_bytes)
    running: list[int] = []
    for internal, size, end_one in steps:
        if end_one and running:
            bounds.release(running.pop(0))
            continue
        before = bounds.in_flight
        if bounds.admit(internal, size) is None:
            running.append(size)
            limit = bounds.limits.max_rpcs if internal else bounds.limits.client_rpcs
            assert before < limit
        assert bounds.in_flight <= bounds.limits.max_rpcs
        assert bounds.in_flight_bytes < bounds.limits.max_bytes + 400
        assert (bounds.in_flight, bounds.in_flight_bytes) == (len(running), sum(running))


# --- through a real gRPC server ---------------------------------------------------------------------


class HeldServicer:
    """Fetch, FetchStream, Produce and WriteTxnMarkers wait until ``release`` is set."""

    def __init__(self):
        self.release = asyncio.Event()
        self.started = 0

    @server.rpc_handler
    async def Fetch(self, request, context):
        self.started += 1
        await self.release.wait()
        return partition_pb2.FetchResponse()

    @server.rpc_handler
    async def Produce(self, request, context):
        self.started += 1
        await self.release.wait()
        return partition_pb2.ProduceResponse(results=[partition_pb2.ProducePartitionResult(topic=b.topic) for b in request.batches])

    @server.rpc_handler
    async def WriteTxnMarkers(self, request, context):
        self.started += 1
        await self.release.wait()
        return partition_pb2.WriteTxnMarkersResponse()

    @server.rpc_handler
    async def FetchStream(self, request, context):
        async def responses():
            self.started += 1
            yield partition_pb2.FetchResponse()
            await self.release.wait()

        return responses()


async def until(condition, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def served(bounds: Admission, scenario):
    servicer = HeldServicer()
    grpc_server = grpc.aio.server()
    descriptor = partition_pb2.DESCRIPTOR.services_by_name["PartitionService"]
    grpc_server.add_generic_rpc_handlers((server.generic_handler(servicer, descriptor, admission=bounds),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            servicer.channel = channel
            await scenario(servicer, partition_pb2_grpc.PartitionServiceStub(channel), health_pb2_grpc.HealthStub(channel))
    finally:
        servicer.release.set()
        await grpc_server.stop(None)


def test_through_a_server_the_excess_is_refused_at_once_while_markers_and_health_are_served():
    bounds = admission(max_rpcs=4)  # clients: 3

    async def scenario(servicer, stub, health_stub):
        held = [asyncio.ensure_future(stub.Fetch(partition_pb2.FetchRequest(), timeout=20)) for _ in range(3)]
        await until(lambda: servicer.started == 3)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Fetch(partition_pb2.FetchRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        decoded = errors.from_rpc_error(refused.value)
        assert decoded.code == LIMIT_EXCEEDED and "overloaded" in decoded.message
        assert decoded.retry_delay_ms is not None and decoded.retry_delay_ms > 0
        marker = asyncio.ensure_future(stub.WriteTxnMarkers(partition_pb2.WriteTxnMarkersRequest(), timeout=20))
        await until(lambda: servicer.started == 4)
        answer = await health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        servicer.release.set()
        await asyncio.gather(*held, marker)
        assert bounds.in_flight == 0 and bounds.in_flight_bytes == 0
        await stub.Fetch(partition_pb2.FetchRequest(), timeout=5)

    asyncio.run(served(bounds, scenario))


def test_a_stream_holds_its_slot_until_the_client_cancels_it():
    bounds = admission(max_rpcs=2)  # clients: 1

    async def scenario(servicer, stub, _):
        stream = stub.FetchStream(partition_pb2.FetchStreamRequest(), timeout=20)
        await stream.read()
        assert bounds.in_flight == 1
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Fetch(partition_pb2.FetchRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        stream.cancel()
        await until(lambda: bounds.in_flight == 0)
        servicer.release.set()
        await stub.Fetch(partition_pb2.FetchRequest(), timeout=5)
        assert bounds.in_flight == 0

    asyncio.run(served(bounds, scenario))


def test_a_call_that_fails_gives_its_slot_back():
    bounds = admission(max_rpcs=4)

    async def scenario(servicer, stub, _):
        fetch = servicer.channel.unary_unary("/txlog.v1.PartitionService/Fetch")  # raw bytes, not a FetchRequest
        for _ in range(6):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await fetch(b"\xff\xff\xff", timeout=5)
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bounds.in_flight == 0 and bounds.refused == 0

    asyncio.run(served(bounds, scenario))


def test_a_call_the_cluster_makes_to_itself_takes_the_reserved_share_whatever_its_method():
    bounds = admission(max_rpcs=4)  # clients: 3
    bounds.cluster_call = lambda context: metadata_value(context, PEER_METADATA) is not None

    async def scenario(servicer, stub, _):
        held = [asyncio.ensure_future(stub.Fetch(partition_pb2.FetchRequest(), timeout=20)) for _ in range(3)]
        await until(lambda: servicer.started == 3)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Fetch(partition_pb2.FetchRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        peer = asyncio.ensure_future(stub.Fetch(partition_pb2.FetchRequest(), timeout=20, metadata=((PEER_METADATA, "1"),)))
        await until(lambda: servicer.started == 4)
        servicer.release.set()
        await asyncio.gather(*held, peer)

    asyncio.run(served(bounds, scenario))


def test_a_produce_is_read_only_once_admitted_so_a_refused_one_is_never_parsed(monkeypatch):
    bounds = admission(max_rpcs=2)  # clients: 1
    parsed = []
    real_parser = server._parser

    def counting_parser(message_class):  # the real parser, its calls counted
        parse = real_parser(message_class)
        return lambda data: parsed.append(message_class.DESCRIPTOR.name) or parse(data)

    monkeypatch.setattr(server, "_parser", counting_parser)
    batch = partition_pb2.PartitionBatch(topic="t", batch=common_pb2.RecordBatch(records=[common_pb2.Record(value=b"v" * 1000)]))
    request = partition_pb2.ProduceRequest(acks=-1, batches=[batch])

    async def scenario(servicer, stub, _):
        held = asyncio.ensure_future(stub.Produce(request, timeout=20))
        await until(lambda: servicer.started == 1)
        assert (bounds.in_flight, bounds.in_flight_bytes) == (1, request.ByteSize()), "its bytes count once read"
        assert bounds.unread_size == pytest.approx(0.9 * UNREAD_SIZE_INITIAL + 0.1 * request.ByteSize()), \
            "the next unread one is taken to weigh the mean read"
        produce = servicer.channel.unary_unary("/txlog.v1.PartitionService/Produce")  # raw bytes
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await produce(request.SerializeToString(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and bounds.refused == 1
        assert parsed == ["ProduceRequest"], "the refused request was never parsed"
        servicer.release.set()
        assert [r.topic for r in (await held).results] == ["t"]
        with pytest.raises(grpc.aio.AioRpcError) as malformed:  # admitted, it is read and found malformed
            await produce(b"\xff\xff\xff", timeout=5)
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await until(lambda: (bounds.in_flight, bounds.in_flight_bytes) == (0, 0))  # released after the status went

    asyncio.run(served(bounds, scenario))


def test_an_unread_produce_weighs_the_mean_request_so_a_burst_meets_the_byte_bound():
    bounds = admission(max_rpcs=100, max_bytes=4 * UNREAD_SIZE_INITIAL)  # clients: 3 MiB

    async def scenario(servicer, stub, _):
        produce = servicer.channel.stream_unary("/txlog.v1.PartitionService/Produce")
        silent = [produce() for _ in range(3)]  # opened, their requests not sent: each taken to weigh 1 MiB
        await until(lambda: bounds.in_flight == 3)
        assert bounds.in_flight_bytes == 3 * UNREAD_SIZE_INITIAL
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Produce(partition_pb2.ProduceRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for call in silent:
            call.cancel()
        await until(lambda: (bounds.in_flight, bounds.in_flight_bytes) == (0, 0))

    asyncio.run(served(bounds, scenario))


def test_a_request_that_does_not_arrive_in_time_or_at_all_gives_its_slot_back(monkeypatch):
    monkeypatch.setattr(admission_module, "REQUEST_READ_TIMEOUT_S", 0.2)
    bounds = admission(max_rpcs=4)

    async def scenario(servicer, stub, _):
        produce = servicer.channel.stream_unary("/txlog.v1.PartitionService/Produce")
        with pytest.raises(grpc.aio.AioRpcError) as slow:
            await produce(timeout=10)  # the request never written
        assert errors.from_rpc_error(slow.value).name == "REQUEST_TIMED_OUT", slow.value
        empty = produce(timeout=10)
        await empty.done_writing()  # the call's end, with no request at all
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await empty
        assert errors.from_rpc_error(missing.value).name == "INVALID_REQUEST" and "no request" in missing.value.details()
        await until(lambda: (bounds.in_flight, bounds.in_flight_bytes) == (0, 0))
        assert servicer.started == 0

    asyncio.run(served(bounds, scenario))
