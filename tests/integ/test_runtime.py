"""The service runtime: health, reflection, graceful shutdown, trace propagation."""

import asyncio
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from producer_id_svc import server as producer_id_server
from services.coordination import zk
from services.runtime import config
from services.runtime.server import SERVER_SETTINGS, ServiceRuntime, rpc_handler
from services.tooling.cluster import health_serving, pid_alive
from txlog.net import telemetry
from txlog.net.channels import open_channel
from txlog.two_phase import wait_until
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc

REQUEST = producer_id_pb2.AllocateProducerIdsRequest(requester_id=1)


def runtime_config(cluster, **overrides):
    settings = [*config.COMMON_SETTINGS, *SERVER_SETTINGS, *producer_id_server.SETTINGS]
    cfg = config.load("test", settings, ["--listen", "127.0.0.1:0", "--zookeeper", cluster.state.zookeeper], {})
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_health_and_reflection_of_a_service_process(cluster):
    service = cluster.add_service("producer_id_svc", 0)
    with grpc.insecure_channel(service.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "txlog.v1.ProducerIdService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        database = ProtoReflectionDescriptorDatabase(channel)
        assert "txlog.v1.ProducerIdService" in set(database.get_services())
        method = database.FindFileContainingSymbol("txlog.v1.ProducerIdService").service[0].method[0]
        assert method.name == "AllocateProducerIds"


def test_sigterm_stops_the_process_with_status_0_and_deregisters(cluster):
    service = cluster.add_service("producer_id_svc", 0)
    registry_client = zk.connect(cluster.state.zookeeper)
    try:
        registry = zk.ServiceRegistry(registry_client, cluster.state.zookeeper_root)
        assert registry.live("producer_id_svc") == {0: service.address}
        assert cluster.stop(service.name, grace_s=15) == 0
        # the deregistration reaches this client as a watch event, a moment after the delete
        wait_until(lambda: registry.live("producer_id_svc") == {}, 30, "the instance gone from the live list")
    finally:
        registry_client.stop()
        registry_client.close()
    lines = [json.loads(line) for line in open(service.log) if line.startswith("{")]
    assert [line["msg"] for line in lines][-2:] == ["shutting down", "stopped"]
    assert not pid_alive(service.pid)


@pytest.mark.own_zookeeper  # stops ZooKeeper
def test_sigterm_stops_the_process_with_status_0_while_zookeeper_is_gone(cluster):
    # found by orphaned services that hung in shutdown: deregistering waited for a ZooKeeper that never came back
    service = cluster.add_service("producer_id_svc", 1)
    cluster.kill("zookeeper")
    try:
        wait_until(lambda: not health_serving(service.address), 30, "the service noticing ZooKeeper gone")
        assert cluster.stop(service.name, grace_s=30) == 0, "stopped by SIGTERM, not killed after the grace period"
    finally:
        cluster.start("zookeeper")
    lines = [json.loads(line) for line in open(service.log) if line.startswith("{")]
    assert [line["msg"] for line in lines][-1] == "stopped"


class SlowServicer(producer_id_pb2_grpc.ProducerIdServiceServicer):
    """Stands in for a service whose calls take a while (the runtime is under test):
    a call is held, in flight, until the test sets ``release``."""

    def __init__(self):
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    @rpc_handler
    async def AllocateProducerIds(self, request, context):
        self.started.set()
        await self.release.wait()
        return producer_id_pb2.AllocateProducerIdsResponse(first_producer_id=42, count=1)


async def start_slow_runtime(cluster):
    runtime = ServiceRuntime("slow_svc", runtime_config(cluster))
    servicer = SlowServicer()
    runtime.add_servicer(servicer, producer_id_server.SERVICE)
    return runtime, servicer, await runtime.start()


def test_shutdown_drains_in_flight_calls_and_refuses_new_ones(cluster):
    async def run():
        runtime, servicer, port = await start_slow_runtime(cluster)
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
            watched = [(await watch.read()).status]
            in_flight = asyncio.ensure_future(stub.AllocateProducerIds(REQUEST))
            await servicer.started.wait()
            stopping = asyncio.ensure_future(runtime.stop(grace_s=5))
            watched.append((await watch.read()).status)
            with pytest.raises(grpc.RpcError) as refused:
                await stub.AllocateProducerIds(REQUEST, timeout=10)
            assert not in_flight.done()  # still held: the stop waits for it
            servicer.release.set()
            reply = await in_flight
            await stopping
            return reply, refused.value.code(), watched

    reply, refused_code, watched = asyncio.run(run())
    assert reply.first_producer_id == 42
    assert refused_code == grpc.StatusCode.UNAVAILABLE
    assert watched == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING]


def test_shutdown_grace_period_bounds_the_wait(cluster):
    async def run():
        runtime, servicer, port = await start_slow_runtime(cluster)
        async with open_channel(f"127.0.0.1:{port}") as channel:
            in_flight = asyncio.ensure_future(producer_id_pb2_grpc.ProducerIdServiceStub(channel).AllocateProducerIds(REQUEST))
            await servicer.started.wait()
            await runtime.stop(grace_s=0.1)  # the call is never released: the grace period ends the wait
            with pytest.raises(grpc.RpcError) as info:
                await in_flight
            return info.value.code()

    assert asyncio.run(run()) in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


def test_one_trace_spans_client_and_server(cluster):
    server_spans, client_spans = InMemorySpanExporter(), InMemorySpanExporter()

    async def run():
        runtime = ServiceRuntime(producer_id_server.KIND, runtime_config(cluster), span_exporter=server_spans)
        await producer_id_server.build(runtime)
        port = await runtime.start()
        client_provider = telemetry.tracer_provider("test-client", span_exporter=client_spans)
        try:
            with client_provider.get_tracer("test").start_as_current_span("caller") as caller:
                async with open_channel(f"127.0.0.1:{port}", tracer_provider=client_provider) as channel:
                    await producer_id_pb2_grpc.ProducerIdServiceStub(channel).AllocateProducerIds(REQUEST)
            return caller.get_span_context()
        finally:
            await runtime.stop(grace_s=1)

    caller = asyncio.run(run())
    client_rpc = [s for s in client_spans.get_finished_spans() if "AllocateProducerIds" in s.name]
    server_rpc = [s for s in server_spans.get_finished_spans() if "AllocateProducerIds" in s.name]
    assert len(client_rpc) == 1 and len(server_rpc) == 1
    assert client_rpc[0].context.trace_id == caller.trace_id == server_rpc[0].context.trace_id
    assert server_rpc[0].parent.span_id == client_rpc[0].context.span_id
    assert server_rpc[0].resource.attributes["service.name"] == "producer_id_svc"


def test_trace_context_crosses_into_a_service_process(cluster):
    service = cluster.add_service("producer_id_svc", 0, ["--otel-exporter", "console"])
    client_spans = InMemorySpanExporter()
    provider = telemetry.tracer_provider("test-client", span_exporter=client_spans)

    async def run():
        with provider.get_tracer("test").start_as_current_span("caller") as caller:
            async with open_channel(service.address, tracer_provider=provider) as channel:
                await producer_id_pb2_grpc.ProducerIdServiceStub(channel).AllocateProducerIds(REQUEST)
        return format(caller.get_span_context().trace_id, "032x")

    trace_id = asyncio.run(run())
    deadline = time.monotonic() + 10
    server_spans = []
    while not server_spans and time.monotonic() < deadline:
        server_spans = [
            json.loads(line)["span"] for line in open(service.log)
            if line.startswith('{"span"') and "AllocateProducerIds" in line
        ]
        time.sleep(0.1)
    assert server_spans, "the service exported no span for the call"
    assert server_spans[0]["context"]["trace_id"] == "0x" + trace_id


@pytest.mark.own_zookeeper  # stops ZooKeeper
def test_health_is_not_serving_while_zookeeper_is_away(cluster):
    async def run():
        runtime = ServiceRuntime(producer_id_server.KIND, runtime_config(cluster, zookeeper_session_timeout_s=4.0))
        await producer_id_server.build(runtime)
        port = await runtime.start()
        statuses = []
        try:
            async with open_channel(f"127.0.0.1:{port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)

                async def status():
                    return (await health.Check(health_pb2.HealthCheckRequest())).status

                statuses.append(await status())
                await asyncio.to_thread(cluster.kill, "zookeeper")
                for _ in range(100):
                    if await status() != health_pb2.HealthCheckResponse.SERVING:
                        break
                    await asyncio.sleep(0.1)
                statuses.append(await status())
                await asyncio.to_thread(cluster.start, "zookeeper")
                for _ in range(200):
                    if await status() == health_pb2.HealthCheckResponse.SERVING:
                        break
                    await asyncio.sleep(0.1)
                statuses.append(await status())
        finally:
            await runtime.stop(grace_s=1)
        return statuses

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert asyncio.run(run()) == [serving, not_serving, serving]


def test_advertised_address_defaults_to_listen_host_and_bound_port():
    from txlog.net.addresses import advertised

    assert advertised("127.0.0.1:0", 4242, "") == "127.0.0.1:4242"
    assert advertised("0.0.0.0:7100", 7100, "") != "0.0.0.0:7100"
    assert advertised("0.0.0.0:7100", 7100, "pid-0.pid:7100") == "pid-0.pid:7100"


def test_garbage_request_bytes_are_invalid_argument_with_our_code(cluster):
    from test_producer_ids import error_info

    service = cluster.add_service("producer_id_svc", 0)
    with grpc.insecure_channel(service.address) as channel:
        raw = channel.unary_unary(
            "/txlog.v1.ProducerIdService/AllocateProducerIds",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for garbage in (b"\xff\xff\xff\x07", b"\x08"):
            with pytest.raises(grpc.RpcError) as info:
                raw(garbage, timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid txlog.v1.AllocateProducerIdsRequest" in info.value.details()
            assert error_info(info.value).reason == "INVALID_REQUEST"
