"""OpenTelemetry tracing, with the trace context carried across gRPC calls.

Each service gets its own TracerProvider (so tests can hold several, each with an
in-memory exporter); the gRPC server interceptor continues the trace the caller
sent in its metadata (W3C traceparent), and the client interceptors send it.
"""

from __future__ import annotations

import json
import sys

from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, negate, service_name
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

EXPORTERS = ("none", "console", "otlp")


class JsonLinesSpanExporter(SpanExporter):
    """Writes each finished span as one JSON line (the console exporter's
    pretty-printed form spans many lines and mixes badly with JSON logs)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def export(self, spans: list[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.stream.write(json.dumps({"span": json.loads(span.to_json())}) + "\n")
        self.stream.flush()
        return SpanExportResult.SUCCESS


def tracer_provider(service: str, exporter: str = "none", endpoint: str = "", span_exporter: SpanExporter | None = None) -> TracerProvider:
    """A provider for one service. ``span_exporter`` (tests) overrides ``exporter``."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(**otlp_options(endpoint))))
    elif exporter != "none":
        raise ValueError(f"unknown trace exporter {exporter!r}; expected one of {EXPORTERS}")
    return provider


def otlp_options(endpoint: str) -> dict:
    """The OTLP exporters' options for ``otel_endpoint``: an https endpoint
    uses TLS (the exporters read the standard OTEL_EXPORTER_OTLP_CERTIFICATE,
    _CLIENT_CERTIFICATE, _CLIENT_KEY and _HEADERS themselves), http not."""
    return {"endpoint": endpoint, "insecure": endpoint.startswith("http://")}


# Health checks are not traced: probes every few seconds would drown the traces,
# and the aio interceptor breaks Health.Watch, a streaming handler written with
# context.write rather than as an async generator.
UNTRACED_SERVICES = ("grpc.health.v1.Health",)


def server_interceptors(provider: TracerProvider) -> list:
    traced = negate(any_of(*[service_name(name) for name in UNTRACED_SERVICES]))
    return [aio_server_interceptor(tracer_provider=provider, filter_=traced)]


def client_interceptors(provider: TracerProvider | None) -> list:
    """Interceptors that send the current trace context; ``None`` uses the global provider."""
    return list(aio_client_interceptors(tracer_provider=provider))
