"""Per-call metrics (services/runtime/metrics.py) read from the real Prometheus
registry they are exported to: the status a call is recorded with."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from prometheus_client import generate_latest

from services.runtime.metrics import ServiceMetrics


class Context:
    """A servicer context: the status a handler set (None when it set none)."""

    def __init__(self, code=None):
        self._code = code

    def code(self):
        return self._code


def recorded_statuses(metrics: ServiceMetrics) -> dict[str, float]:
    found = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("rpc_server_duration_milliseconds_count{"):
            status = line.split('rpc_grpc_status_code="', 1)[1].split('"', 1)[0]
            found[status] = float(line.rsplit(" ", 1)[1])
    return found


@pytest.fixture
def metrics():
    service = ServiceMetrics("test", SimpleNamespace(metrics_listen="127.0.0.1:0", otel_exporter="none"), lambda: None)
    yield service
    service.stop()


def test_a_call_its_caller_abandoned_is_cancelled_not_a_server_failure(metrics):
    async def abandoned(request, context):
        raise asyncio.CancelledError  # what grpc.aio does to a handler whose caller's deadline passed

    handler = metrics.measured("txlog.v1.PartitionService", "Fetch", abandoned)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(handler(None, Context()))
    assert recorded_statuses(metrics) == {str(grpc.StatusCode.CANCELLED.value[0]): 1.0}


def test_a_handler_that_fails_unexpectedly_is_unknown_and_one_that_answers_is_ok(metrics):
    async def broken(request, context):
        raise RuntimeError("bug")

    async def fine(request, context):
        return "answer"

    with pytest.raises(RuntimeError):
        asyncio.run(metrics.measured("s", "Broken", broken)(None, Context()))
    assert asyncio.run(metrics.measured("s", "Fine", fine)(None, Context())) == "answer"
    assert recorded_statuses(metrics) == {str(grpc.StatusCode.UNKNOWN.value[0]): 1.0, str(grpc.StatusCode.OK.value[0]): 1.0}


def test_a_metrics_endpoint_on_a_wildcard_host_is_registered_at_the_advertised_host():
    from txlog.net.addresses import reachable

    assert reachable("0.0.0.0:9464", "txlog-partition-svc-0.txlog:7001") == "txlog-partition-svc-0.txlog:9464"
    assert reachable("[::]:9464", "10.0.0.7:7001") == "10.0.0.7:9464"
    assert reachable("127.0.0.1:9464", "10.0.0.7:7001") == "127.0.0.1:9464", "a host that can be dialled stays"
