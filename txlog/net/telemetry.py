"""OpenTelemetry tracing, with the trace context carried across gRPC calls.

Each service gets its own TracerProvider (so tests can hold several, each with an
in-memory exporter); the gRPC server interceptor continues the trace the caller
sent in its metadata (W3C traceparent), and the client interceptors send it.
"""

from __future__ import annotations

import json
import os
import sys

from google.protobuf.descriptor import FieldDescriptor
from opentelemetry import trace
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

from txlog.protocol import errors

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


OTEL_ENDPOINT_DEFAULT = "http://127.0.0.1:4317"
STANDARD_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def otlp_options(endpoint: str, environ=os.environ) -> dict:
    """The OTLP exporters' options for ``otel_endpoint``. Left at its default
    while a standard OTEL_EXPORTER_OTLP_*ENDPOINT variable is set: none, so
    the exporters follow the standard variables alone (endpoint, _INSECURE,
    _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY, _HEADERS). Otherwise that
    endpoint: https uses TLS (with the standard certificate variables), http not."""
    if endpoint == OTEL_ENDPOINT_DEFAULT and any(environ.get(name) for name in STANDARD_ENDPOINT_VARIABLES):
        return {}
    return {"endpoint": endpoint, "insecure": endpoint.startswith("http://")}


# What a span of a call says it touched: the request's identifiers (top level,
# or in its batches: a Produce batch carries the producer id and epoch), and
# the partitions it names, as topic-partition strings (at most
# PARTITIONS_SHOWN_MAX, with the count beside them).
SPAN_ID_FIELDS = {"transactional_id": "txlog.transactional_id", "producer_id": "txlog.producer_id",
                  "producer_epoch": "txlog.producer_epoch", "group_id": "txlog.group", "member_id": "txlog.member_id",
                  "coordinator_epoch": "txlog.coordinator_epoch"}
PARTITIONS_SHOWN_MAX = 16
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def request_attributes(request) -> dict:
    """The span attributes of a request (a protobuf message): cheap, it reads
    two levels of fields and never the records."""
    attributes: dict = {}
    partitions: list[str] = []
    for field, value in request.ListFields():
        if field.name in SPAN_ID_FIELDS and field.type != _MESSAGE:
            attributes[SPAN_ID_FIELDS[field.name]] = value
        elif field.type == _MESSAGE:
            for item in (value if field.is_repeated else [value]):
                _nested_attributes(item, attributes, partitions)
    if partitions:
        attributes["txlog.partitions"] = partitions[:PARTITIONS_SHOWN_MAX]
        attributes["txlog.partition_count"] = len(partitions)
        attributes["txlog.topics"] = sorted({p.rsplit("-", 1)[0] for p in partitions})
    return attributes


def _nested_attributes(item, attributes: dict, partitions: list[str], depth: int = 1) -> None:
    """One nested message: its topic and partition, the identifiers it carries
    (a Produce batch's producer, a marker's transaction), and at the second
    level the partitions it lists (a marker's). Records are never read."""
    if not hasattr(item, "ListFields"):  # a map entry's key or a scalar
        return
    topic = None
    for field, value in item.ListFields():
        if field.name == "topic" and isinstance(value, str):
            topic = value
        elif field.name in SPAN_ID_FIELDS and field.type != _MESSAGE:
            attributes.setdefault(SPAN_ID_FIELDS[field.name], value)
        elif field.name == "batch":  # a produce batch: whose it is
            for name in ("producer_id", "producer_epoch"):
                attributes.setdefault(SPAN_ID_FIELDS[name], getattr(value, name))
        elif field.type == _MESSAGE and field.is_repeated and depth < 2 and field.name in ("partitions", "topics"):
            for nested in value:
                _nested_attributes(nested, attributes, partitions, depth + 1)
    if topic is not None:
        partitions.append(f"{topic}-{getattr(item, 'partition', 0)}")


def annotated(handler):
    """``handler`` (a unary coroutine handler) whose call's span carries what
    the request touched and, when it is refused, our error code."""

    async def annotated_handler(request, context):
        errors.call_error.set(None)
        span = trace.get_current_span()
        if span.is_recording() and hasattr(request, "ListFields"):
            span.set_attributes(request_attributes(request))
        try:
            return await handler(request, context)
        finally:
            code = errors.call_error.get()
            if code is not None and span.is_recording():
                span.set_attribute("txlog.error_code", errors.spec_of(code).name)

    return annotated_handler


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
