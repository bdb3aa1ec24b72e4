"""Traces of the exactly-once jobs: a run is a span on the driver, each
range's transaction a span in its task, a child of the run's (its context
travels with the job to the executors), and the task's producer carries it
on to the coordinator (EndTxn) and from there to every partition's markers:
one trace from the run to the log.

On where TXLOG_OTEL_EXPORTER (the services' setting: console or otlp) is set
in the driver's and the executors' environment, with TXLOG_OTEL_ENDPOINT for
otlp; off (nothing recorded) otherwise. Spans are flushed when each ends:
Spark may stop a Python worker right after its task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider

from services import telemetry

_providers: dict[tuple[str, str], TracerProvider] = {}


def provider() -> TracerProvider | None:
    """This process's provider for the job's spans (one per process), or None when tracing is off."""
    exporter = os.environ.get("TXLOG_OTEL_EXPORTER", "none")
    if exporter == "none":
        return None
    key = (exporter, os.environ.get("TXLOG_OTEL_ENDPOINT", telemetry.OTEL_ENDPOINT_DEFAULT))
    if key not in _providers:
        _providers[key] = telemetry.tracer_provider("spark-job", *key)
    return _providers[key]


@contextlib.contextmanager
def run_span(name: str, attributes: Mapping) -> Iterator[dict[str, str]]:
    """A span around a run on the driver; yields its context for the tasks (W3C traceparent; {} when off)."""
    spans = provider()
    if spans is None:
        yield {}
        return
    with spans.get_tracer("txlog.spark").start_as_current_span(name, attributes=dict(attributes)):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier
    spans.force_flush()


@contextlib.contextmanager
def task_span(parent: Mapping[str, str], name: str, attributes: Mapping) -> Iterator[TracerProvider | None]:
    """A span in a task, a child of the run's (``parent``: run_span's context);
    yields the provider for the task's clients (None when off)."""
    spans = provider()
    if spans is None:
        yield None
        return
    try:
        with spans.get_tracer("txlog.spark").start_as_current_span(
                name, context=propagate.extract(dict(parent)), attributes=dict(attributes)):
            yield spans
    finally:
        spans.force_flush()
