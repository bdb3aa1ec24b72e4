"""Overload through the real services (issue 36): a partition_svc at its bound of
calls in flight refuses the excess at once with RESOURCE_EXHAUSTED
(LIMIT_EXCEEDED) and a RetryInfo delay, stores nothing of a refused produce,
keeps answering health, counts its refusals in /metrics, and serves again once
calls end; the SDK's producer backs off on the refusals and delivers every
record once.

The load is long-polling fetches on an empty partition: each holds a slot for
its max_wait_ms, so the bound is reached without racing the clock."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import STORAGE_ONLY, running
from tests.integ.raw import Raw, plain_batch
from tests.integ.test_metrics import total
from tests.support.errors import error_name
from txlog import Producer
from txlog.protocol import errors
from txlog.v1 import partition_pb2, partition_pb2_grpc

BOUND = 8
CLIENT_SHARE = 6  # of them, what clients may take (reserved_internal_share 0.25)
POLL_MS = 9_000


@pytest.fixture
def cluster(tmp_path, zookeeper_for):
    shape = {**STORAGE_ONLY, "partition_svcs": 1,
             "service_args": {"partition_svc": ["--max-concurrent-rpcs", str(BOUND)]}}
    yield from running(tmp_path / "cluster", zookeeper_for, shape)


def poll_request(topic: str, offset: int) -> partition_pb2.FetchRequest:
    return partition_pb2.FetchRequest(max_wait_ms=POLL_MS, min_bytes=1, partitions=[
        partition_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset)])


async def fill(address: str, topic: str, end: int = 0) -> tuple[list[asyncio.Future], grpc.aio.AioRpcError, grpc.aio.Channel]:
    """More long polls at the log's ``end`` than the leader's bound, all at once:
    the polls it holds (an admitted poll waits its max_wait_ms with nothing
    arriving) and one of its refusals (they come at once)."""
    channel = grpc.aio.insecure_channel(address)
    stub = partition_pb2_grpc.PartitionServiceStub(channel)
    calls = [asyncio.ensure_future(stub.Fetch(poll_request(topic, end), timeout=60)) for _ in range(BOUND + 1)]
    done, held = await asyncio.wait(calls, timeout=POLL_MS / 1000 / 3)
    refusals = [call.exception() for call in done]
    assert refusals and all(isinstance(r, grpc.aio.AioRpcError) for r in refusals), \
        f"{BOUND + 1} long polls at once: {len(done)} ended early, as {refusals}"
    return list(held), refusals[0], channel


def test_the_excess_is_refused_at_once_and_served_again_when_calls_end(cluster):
    raw = Raw(cluster)
    topic = f"overload-{uuid.uuid4().hex[:8]}"
    raw.create_topic(topic, 1)
    address = raw.leaders(topic)[0]

    async def scenario():
        held, refusal, channel = await fill(address, topic)
        assert len(held) >= 1, "the leader admitted no client call at all"
        assert len(held) <= CLIENT_SHARE, f"{len(held)} client calls admitted: clients took the internal share"
        assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        decoded = errors.from_rpc_error(refusal)
        assert decoded.name == "LIMIT_EXCEEDED" and "max_concurrent_rpcs" in decoded.message
        assert decoded.retry_delay_ms and decoded.retry_delay_ms > 0

        stub = partition_pb2_grpc.PartitionServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as produce_refused:
            await stub.Produce(partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
                topic=topic, partition=0, batch=plain_batch([b"refused"]))]), timeout=10)
        assert produce_refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, "health is never refused"

        for poll in held:
            ended = (await poll).results[0]  # each ends at its max_wait_ms, nothing having arrived
            assert error_name(ended) == "NONE" and not ended.batches and ended.high_watermark == 0
        await channel.close()

    asyncio.run(scenario())
    assert raw.read_all(topic, 0) == [], "a refused produce stored nothing"
    result = raw.produce(topic, 0, plain_batch([b"after"]))
    assert error_name(result) == "NONE"
    assert [r.value for r in raw.read_all(topic, 0)] == [b"after"]
    assert total(cluster, "partition_svc", "txlog_rpc_refused_total") >= 2
    raw.close()


def test_the_producer_backs_off_on_refusals_and_delivers_every_record_once(cluster):
    raw = Raw(cluster)
    topic = f"overload-sdk-{uuid.uuid4().hex[:8]}"
    raw.create_topic(topic, 1)
    address = raw.leaders(topic)[0]
    values = [f"v{i}".encode() for i in range(50)]

    async def scenario():
        with Producer(cluster.state.bootstrap, enable_idempotence=True, linger_ms=5, request_timeout_ms=10_000,
                      delivery_timeout_ms=60_000) as producer:
            producer.send(topic, value=values[0], partition=0).result(timeout=30)  # its producer id and metadata, first
            held, _, channel = await fill(address, topic, end=1)
            futures = [producer.send(topic, value=v, partition=0) for v in values[1:]]
            producer.flush(timeout_s=60)
            for future in futures:
                future.result(timeout=0)
            retried = producer.metrics()["batches_retried"]
        assert retried >= 1, "the first sends met a full leader and were retried"
        for poll in held:
            await poll
        await channel.close()

    asyncio.run(scenario())
    assert sorted(r.value for r in raw.read_all(topic, 0)) == sorted(values)
    raw.close()
