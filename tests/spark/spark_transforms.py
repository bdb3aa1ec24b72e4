"""The job's transformation with faults injected, for the Spark tests. Named
by the tests as ``spark_transforms:<function>``; the Python workers import
this module from PYTHONPATH (conftest.worker_pythonpath)."""

from __future__ import annotations

import os
import signal
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


def first_attempts_fail(value: bytes) -> int:
    """A streamed row's output partition: 0, except for one row in a task's first attempt: a
    partition the output does not have, so that attempt fails after its other rows were sent."""
    return 99 if TaskContext.get().attemptNumber() == 0 and value.endswith(b"-150") else 0


def slow_counts(records, source, window_ms=60_000):
    """A task reading a partition in SLOW_PARTITIONS (all when unset) sends half its
    output, then holds its transaction open for SLOW_SECONDS before the rest; with
    SLOW_UNTIL_FILE, until that file exists (SLOW_SECONDS at most)."""
    outputs = list(count_views(records, source, window_ms))
    slow = _partitions("SLOW_PARTITIONS")
    pause_s = float(os.environ.get("SLOW_SECONDS", "10")) if not slow or source.partition in slow else 0.0
    release = os.environ.get("SLOW_UNTIL_FILE")
    for i, output in enumerate(outputs):
        if i == len(outputs) // 2 and pause_s:
            _hold(pause_s, release)
        yield output


def _hold(pause_s: float, release: str | None) -> None:
    """Keeps the task's transaction open: until ``release`` exists (polled, at most
    ``pause_s``), or, without one, for ``pause_s`` (then the pause is the point)."""
    if not release:
        time.sleep(pause_s)
        return
    deadline = time.monotonic() + pause_s
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)


PADDING_BYTES = 200_000  # a header this large pushes the rows before it through every buffer on the way


def faulty_key_counts(records, output_partitions=4, fail_partitions=(), kill_partitions=(), slow_partitions=(),
                      slow_seconds=0.0, always_fail_partitions=()):
    """``key_counts.count_per_key`` (a shuffle) with the faults of ``with_faults`` in the
    tasks that write its output (task partition = one of the ``output_partitions``)."""
    from spark_jobs.key_counts import count_per_key

    counts = count_per_key(records, output_partitions)
    return with_faults(counts, fail_partitions, kill_partitions, slow_partitions, slow_seconds, always_fail_partitions)


def with_faults(df, fail_partitions=(), kill_partitions=(), slow_partitions=(), slow_seconds=0.0,
                always_fail_partitions=()):
    """``df`` (the ``txlog`` writer's columns, without ``headers``) with faults injected in its
    tasks, after the writing task has sent half its rows. The first attempt of a task in
    ``fail_partitions`` then raises; one in ``kill_partitions`` kills its own Python worker
    with SIGKILL (an executor dying, as local mode has it); every attempt of a task in
    ``always_fail_partitions`` raises; a task in ``slow_partitions`` holds its transaction
    open for ``slow_seconds`` before the rest.

    The rows go through Spark to the writing task (a Python worker of its own) in Arrow
    batches of spark.sql.execution.arrow.maxRecordsPerBatch rows (the tests make it 2),
    through buffers flushed when full: the half sent before a fault carries a large header
    (the ``headers`` column, empty on the other rows) so that all but about its last batch
    reach the writer, which sends them, before the fault. So a failing task with more than a
    few rows leaves records to abort in the log."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(df.schema.fields + [StructField("headers", ArrayType(header))])
    arrow_schema, df_arrow_schema = to_arrow_schema(schema), to_arrow_schema(df.schema)
    fail, kill, slow, always = set(fail_partitions), set(kill_partitions), set(slow_partitions), \
        set(always_fail_partitions)

    def with_headers(table, padded: bool):
        headers = [[{"key": "padding", "value": b"." * PADDING_BYTES}] if padded else [] for _ in range(table.num_rows)]
        return pa.Table.from_arrays([*table.columns, pa.array(headers, arrow_schema.field("headers").type)],
                                    schema=arrow_schema).to_batches()

    def inject(batches):
        context = TaskContext.get()
        task, attempt = context.partitionId(), context.attemptNumber()
        if task in always or (attempt == 0 and task in fail):
            def fault():
                raise RuntimeError(f"injected failure in attempt {attempt} of task {task}")
        elif attempt == 0 and task in kill:
            def fault():
                os.kill(os.getpid(), signal.SIGKILL)
        elif task in slow:
            def fault():
                time.sleep(slow_seconds)
        else:
            for batch in batches:
                yield from with_headers(pa.Table.from_batches([batch]), padded=False)
            return
        batches = list(batches)
        table = pa.Table.from_batches(batches) if batches else df_arrow_schema.empty_table()
        half = table.num_rows // 2
        yield from with_headers(table.slice(0, half), padded=True)
        time.sleep(SHIPPED_S)  # the writer sends what it got
        fault()
        yield from with_headers(table.slice(half), padded=False)

    return df.mapInArrow(inject, schema)
