"""Structured logs: one JSON object per line on stderr.

Every line has ``ts`` (ISO 8601, UTC), ``level``, ``service``, ``logger`` and
``msg``; fields passed as ``extra={"fields": {...}}`` are merged in, and the
current OpenTelemetry trace and span ids are added when a span is active, so a
log line can be found from a trace and back.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from opentelemetry import trace


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            entry["trace_id"] = format(span_context.trace_id, "032x")
            entry["span_id"] = format(span_context.span_id, "016x")
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kazoo logs every reconnect attempt at INFO/WARNING; keep its noise at WARNING.
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))


def fields(**values) -> dict:
    """``log.info("msg", extra=fields(partition=3))`` adds structured fields to a line."""
    return {"fields": values}
