"""Traces of the exactly-once jobs: a run is a span on the driver, each
range's transaction a span in its task, a child of the run's (its context
travels with the job to the executors), and the task's producer carries it
on to the coordinator (EndTxn) and from there to every partition's markers:
one trace from the run to the log.

The data source's writer (writing.py) likewise: a write is a span on the
driver, each task's transaction a child of it, and the commit (or abort) on
the driver another child, the group commit's calls inside it. Spark makes the
writer in one Python process and commits it in another, so the write's span
is a ``DeferredSpan``: its ids are chosen when the write begins (the tasks'
spans name it as their parent from then on), and it is recorded whole, with
that start time, by the process that commits.

On where TXLOG_OTEL_EXPORTER (the services' setting: console or otlp) is set
in the driver's and the executors' environment, with TXLOG_OTEL_ENDPOINT for
otlp; off (nothing recorded) otherwise. Spans are flushed when each ends:
Spark may stop a Python worker right after its task.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from txlog.net import telemetry

_providers: dict[tuple[str, str], TracerProvider] = {}
# (trace id, span id) of the deferred span being recorded now (end_span), in this context only.
_chosen_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("txlog_chosen_span_ids", default=None)


class _IdsChosenAhead(RandomIdGenerator):
    """Random ids, except for a deferred span recorded with the ids it was given when it began."""

    def generate_trace_id(self) -> int:
        chosen = _chosen_ids.get()
        return chosen[0] if chosen is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        chosen = _chosen_ids.get()
        return chosen[1] if chosen is not None else super().generate_span_id()


def provider() -> TracerProvider | None:
    """This process's provider for the job's spans (one per process), or None when tracing is off."""
    exporter = os.environ.get("TXLOG_OTEL_EXPORTER", "none")
    if exporter == "none":
        return None
    key = (exporter, os.environ.get("TXLOG_OTEL_ENDPOINT", telemetry.OTEL_ENDPOINT_DEFAULT))
    if key not in _providers:
        made = telemetry.tracer_provider("spark-job", *key)
        made.id_generator = _IdsChosenAhead()  # before any tracer is made: each takes the provider's generator
        _providers[key] = made
    return _providers[key]


@contextlib.contextmanager
def run_span(name: str, attributes: Mapping) -> Iterator[dict[str, str]]:
    """A span around a run on the driver; yields its context for the tasks (W3C traceparent; {} when off)."""
    spans = provider()
    if spans is None:
        yield {}
        return
    try:
        with spans.get_tracer("txlog.spark").start_as_current_span(name, attributes=dict(attributes)):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier
    finally:  # a failed run's span (with its error) is the one most wanted
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


def annotate(attributes: Mapping) -> None:
    """Adds ``attributes`` to the current span (nothing when tracing is off)."""
    trace.get_current_span().set_attributes(dict(attributes))


@dataclass(frozen=True)
class DeferredSpan:
    """A span begun in one process and recorded whole in another (picklable:
    it travels inside the writer Spark hands from process to process)."""

    name: str
    trace_id: int
    span_id: int
    start_time_ns: int
    attributes: Mapping = field(default_factory=dict)
    parent: Mapping[str, str] = field(default_factory=dict)  # the context it began in (W3C traceparent; {}: a root)

    @property
    def context(self) -> dict[str, str]:
        """Its context for its children (task_span's ``parent``)."""
        span = NonRecordingSpan(SpanContext(self.trace_id, self.span_id, is_remote=True,
                                            trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier


def begin_span(name: str, attributes: Mapping) -> DeferredSpan | None:
    """A deferred span beginning now, in the current span's trace (a new one
    when there is none); None when tracing is off."""
    spans = provider()
    if spans is None:
        return None
    current = trace.get_current_span().get_span_context()
    parent: dict[str, str] = {}
    propagate.inject(parent)
    trace_id = current.trace_id if current.is_valid else spans.id_generator.generate_trace_id()
    return DeferredSpan(name, trace_id, spans.id_generator.generate_span_id(), time.time_ns(), dict(attributes), parent)


@contextlib.contextmanager
def ending(span: DeferredSpan | None, name: str, attributes: Mapping) -> Iterator[TracerProvider | None]:
    """A span ``name``, a child of ``span``, around the step that ends it (a
    write's commit or abort); then ``span`` is recorded, ending now, failed if
    the step raised. Yields the provider for the step's clients (None when off)."""
    failure: BaseException | None = None
    try:
        with task_span(span.context if span is not None else {}, name, attributes) as spans:
            yield spans
    except BaseException as exc:
        failure = exc
        raise
    finally:
        end_span(span, failure)


def end_span(span: DeferredSpan | None, failure: BaseException | None = None) -> None:
    """Records ``span`` with the ids and start time it began with, ending now."""
    spans = provider()
    if span is None or spans is None:
        return
    token = _chosen_ids.set((span.trace_id, span.span_id))
    try:
        recorded = spans.get_tracer("txlog.spark").start_span(
            span.name, context=propagate.extract(dict(span.parent)), attributes=dict(span.attributes),
            start_time=span.start_time_ns)
    finally:
        _chosen_ids.reset(token)
    if failure is not None:
        recorded.record_exception(failure)
        recorded.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))
    recorded.end()
    spans.force_flush()
