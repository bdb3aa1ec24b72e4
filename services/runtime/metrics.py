"""OpenTelemetry metrics of one service process.

Each process gets its own MeterProvider (tests run several in one
interpreter) with two optional readers: Prometheus text served at
``http://<metrics_listen>/metrics`` from the process's own registry, and OTLP
pushed every ``metrics_export_interval_ms`` when ``otel_exporter=otlp``.
Without either, the instruments still work and record into nothing read.

What every service measures is here: its calls (the gRPC semantic
conventions: ``rpc.server.duration`` in ms by service, method and gRPC status,
and ``txlog.rpc.errors`` by our error code) and its ZooKeeper session. Each
service adds its own instruments on ``meter``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable

import grpc
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from services.runtime import config as config_mod
from services.runtime import malloc
from txlog.net.telemetry import otlp_options
from txlog.protocol.errors import call_error, spec_of

log = logging.getLogger(__name__)

METRICS_SETTINGS: tuple[config_mod.Setting, ...] = (
    config_mod.Setting("metrics_listen", "", "host:port of the plaintext HTTP endpoint serving Prometheus metrics at "
                       "/metrics (port 0: any free port, logged and registered); empty: no endpoint"),
    config_mod.Setting("metrics_export_interval_ms", 15_000, "with otel_exporter=otlp, how often metrics are pushed to "
                       "otel_endpoint", config_mod.positive_int),
)

class ServiceMetrics:
    def __init__(self, service: str, cfg, zookeeper_connected: Callable[[], bool | None]):
        self.listen = getattr(cfg, "metrics_listen", "")
        self.address = ""
        self._http = None
        readers: list[MetricReader] = []
        self.registry = None
        if self.listen:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry()
            readers.append(PrometheusMetricReader(registry=self.registry))
        if getattr(cfg, "otel_exporter", "none") == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(
                OTLPMetricExporter(**otlp_options(cfg.otel_endpoint)),
                export_interval_millis=getattr(cfg, "metrics_export_interval_ms", 15_000)))
        self.provider = MeterProvider(resource=Resource.create({"service.name": service}), metric_readers=readers)
        self.meter = self.provider.get_meter("txlog")
        self.call_duration = self.meter.create_histogram(
            "rpc.server.duration", unit="ms", description="time to answer a call, by service, method and gRPC status")
        self.call_errors = self.meter.create_counter(
            "txlog.rpc.errors", description="calls answered with one of our error codes, by method and code")

        def zookeeper_session(_: CallbackOptions) -> Iterable[Observation]:
            connected = zookeeper_connected()
            if connected is not None:
                yield Observation(1 if connected else 0)

        self.meter.create_observable_gauge("txlog.zookeeper.connected", [zookeeper_session],
                                           description="1 while this process's ZooKeeper session is connected, else 0")
        self.meter.create_observable_gauge(
            "txlog.process.malloc", [lambda _: [Observation(value, {"state": state}) for state, value in malloc.heap_bytes().items()]],
            unit="By", description="the C allocator's bytes, in_use by the process or free and kept for reuse (glibc only)")
        self.meter.create_observable_gauge(
            "txlog.python.allocated_blocks", [lambda _: [Observation(sys.getallocatedblocks())]],
            description="Python objects' memory blocks allocated now (a leak of Python objects shows here)")

    def observe_admission(self, admission) -> None:
        """Gauges of what ``admission`` (services.runtime.admission) holds, and
        the count of calls it refused."""
        self.meter.create_observable_gauge(
            "txlog.rpc.in_flight", [lambda _: [Observation(admission.in_flight)]],
            description="calls this process is working on (bounded by max_concurrent_rpcs)")
        self.meter.create_observable_gauge(
            "txlog.rpc.in_flight_bytes", [lambda _: [Observation(admission.in_flight_bytes)]],
            description="request bytes of the calls this process is working on (bounded by max_queued_request_bytes)")
        self.meter.create_observable_counter(
            "txlog.rpc.refused", [lambda _: [Observation(admission.refused)]],
            description="calls refused at once because the process was at a bound (LIMIT_EXCEEDED)")

    def start(self) -> None:
        """Serves /metrics when metrics_listen is set; ``address`` is then its host:port."""
        if not self.listen:
            return
        from prometheus_client import start_http_server

        host, _, port = self.listen.rpartition(":")
        try:
            self._http, _ = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=self.registry)
        except (OSError, ValueError) as exc:
            raise config_mod.ConfigError(f"metrics_listen {self.listen!r}: {exc}") from None
        self.address = f"{host or '0.0.0.0'}:{self._http.server_port}"

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.provider.shutdown()

    def measured(self, service: str, method: str, handler):
        """``handler`` (a unary coroutine handler), its calls recorded."""
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        by_status: dict[str, dict] = {}
        errors_by_code: dict[int, dict] = {}

        async def measured_handler(request, context):
            started = time.perf_counter()
            call_error.set(None)
            status = grpc.StatusCode.OK
            try:
                return await handler(request, context)
            except asyncio.CancelledError:
                # The caller went (its deadline, a cancelled poll): not a server failure, whatever the context says.
                status = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                status = _status_of(context)
                raise
            finally:
                code = call_error.get()
                if code is not None:  # aborted with one of our codes: its status, whatever the context says
                    status = spec_of(code).grpc_status
                labels = by_status.get(status.name)
                if labels is None:
                    labels = by_status[status.name] = {**attributes, "rpc.grpc.status_code": status.value[0]}
                self.call_duration.record((time.perf_counter() - started) * 1000, labels)
                if code is not None:
                    coded = errors_by_code.get(code)
                    if coded is None:
                        coded = errors_by_code[code] = {"rpc.method": method, "error_code": _code_name(code)}
                    self.call_errors.add(1, coded)

        return measured_handler


def _status_of(context) -> grpc.StatusCode:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 -- a context that cannot say: the call failed unexpectedly
        return grpc.StatusCode.UNKNOWN
    if isinstance(code, grpc.StatusCode):
        return code
    return next((s for s in grpc.StatusCode if s.value[0] == code), grpc.StatusCode.UNKNOWN)


def _code_name(code: int) -> str:
    return spec_of(code).name
