"""The job's transformation with faults injected, for the Spark tests. Named
by the tests as ``spark_transforms:<function>``; the Python workers import
this module from PYTHONPATH (conftest.worker_pythonpath)."""

from __future__ import annotations

import os
import time

from pyspark import TaskContext

from spark_jobs.windowed_counts import count_views

SHIPPED_S = 1.0  # longer than the producer's linger: what was sent before it is in the log


def _partitions(name: str) -> set[int]:
    return {int(p) for p in os.environ.get(name, "").split(",") if p}


def flaky_counts(records, source, window_ms=60_000):
    """The first attempt of a task reading a partition in FAIL_PARTITIONS (default
    0,2) sends half its output, waits until it is in the log, then fails."""
    outputs = list(count_views(records, source, window_ms))
    failing = TaskContext.get().attemptNumber() == 0 and source.partition in (_partitions("FAIL_PARTITIONS") or {0, 2})
    for i, output in enumerate(outputs):
        if failing and i == len(outputs) // 2:
            time.sleep(SHIPPED_S)
            raise RuntimeError(f"injected failure in the first attempt of the task reading partition {source.partition}")
        yield output


def slow_counts(records, source, window_ms=60_000):
    """A task reading a partition in SLOW_PARTITIONS (all when unset) sends half its
    output, then holds its transaction open for SLOW_SECONDS before the rest."""
    outputs = list(count_views(records, source, window_ms))
    slow = _partitions("SLOW_PARTITIONS")
    pause_s = float(os.environ.get("SLOW_SECONDS", "10")) if not slow or source.partition in slow else 0.0
    for i, output in enumerate(outputs):
        if i == len(outputs) // 2 and pause_s:
            time.sleep(pause_s)
        yield output
