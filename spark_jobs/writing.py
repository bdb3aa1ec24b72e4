"""Batch writes of the ``txlog`` data source.

With ``transactionalIdPrefix`` each task writes all its rows in one
transaction, under the transactional id ``<prefix>-<task partition>`` (never
the attempt number): a retried or speculative attempt re-inits the same id,
which fences the previous attempt and aborts its open transaction, so a failed
attempt leaves nothing visible to read_committed readers. Without the prefix
the rows go through a plain idempotent producer.

What a plain write guarantees, exactly: each task's rows become visible
exactly once per successful attempt. A task that succeeded and that Spark
runs again (a stage retry after a lost executor, a speculative copy that also
finishes) writes its rows a second time, and a job that fails after some tasks
committed leaves those tasks' rows visible. End-to-end exactly-once needs the
input offsets in the same transaction (``spark_jobs.eos``).
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructType, TimestampType

from services.client import Admin, Consumer, Producer
from services.client.errors import ClientError
from spark_jobs.options import OptionError, WriteOptions

log = logging.getLogger("spark_jobs.writing")

ABORTABLE_STATES = ("Ongoing",)  # a dead attempt left it open; Prepare* finish by themselves
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
BYTES_TYPES = (BinaryType, StringType)
COLUMN_TYPES = {
    "value": BYTES_TYPES,
    "key": BYTES_TYPES,
    "partition": (IntegerType, LongType),
    "headers": (ArrayType,),
    "timestamp": (TimestampType, LongType),
}


def check_schema(schema: StructType) -> None:
    """The DataFrame's columns: ``value`` (binary or string) and optionally
    ``key``, ``partition``, ``headers`` (array of struct<key, value>) and
    ``timestamp`` (timestamp, or long milliseconds)."""
    names = [field.name for field in schema.fields]
    if "value" not in names:
        raise OptionError(f"txlog: the DataFrame written needs a 'value' column (binary or string); it has {names}")
    for field in schema.fields:
        allowed = COLUMN_TYPES.get(field.name)
        if allowed is None:
            raise OptionError(f"txlog: column {field.name!r} is not written to a topic; the columns are {sorted(COLUMN_TYPES)}")
        if not isinstance(field.dataType, allowed):
            raise OptionError(f"txlog: column {field.name!r} has type {field.dataType.simpleString()}, "
                              f"expected {' or '.join(t.typeName() for t in allowed)}")
        if field.name == "headers":
            element = field.dataType.elementType
            if not (isinstance(element, StructType) and [f.name for f in element.fields] == ["key", "value"]
                    and isinstance(element.fields[0].dataType, StringType)
                    and isinstance(element.fields[1].dataType, BYTES_TYPES)):
                raise OptionError("txlog: column 'headers' must be array<struct<key: string, value: binary>>, "
                                  f"not {field.dataType.simpleString()}")


def check_topic(options: WriteOptions) -> None:
    with Consumer(options.bootstrap) as consumer:
        try:
            consumer.partitions_for(options.topic, timeout_s=30)
        except ClientError as exc:
            raise OptionError(f"txlog: cannot write to topic {options.topic!r}: {exc}") from None


def transactional_id(prefix: str, task_partition: int) -> str:
    return f"{prefix}-{task_partition}"


@dataclass(frozen=True)
class TaskReport(WriterCommitMessage):
    task_partition: int
    attempt: int
    records: int
    transactional_id: str | None
    producer_id: int
    producer_epoch: int


class SendFailures:
    """The first failure among a producer's sends, without keeping a future per record."""

    def __init__(self):
        self._lock = threading.Lock()
        self.first: BaseException | None = None

    def watch(self, future) -> None:
        future.add_done_callback(self._done)

    def _done(self, future) -> None:
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self.first = self.first or exc

    def raise_first(self) -> None:
        if self.first is not None:
            raise self.first


def rows(batch: pa.RecordBatch) -> Iterator[dict]:
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    for i in range(batch.num_rows):
        yield {name: values[i] for name, values in columns.items()}


def send_row(producer: Producer, topic: str, row: dict):
    timestamp = row.get("timestamp")
    if isinstance(timestamp, datetime.datetime):  # exact: float seconds * 1000 loses a millisecond now and then
        aware = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=datetime.UTC)
        timestamp = (aware - EPOCH) // datetime.timedelta(milliseconds=1)
    headers = [(h["key"], h["value"]) for h in row.get("headers") or ()]
    return producer.send(topic, value=row["value"], key=row.get("key"), partition=row.get("partition"),
                         headers=headers or None, timestamp_ms=timestamp)


class TxlogWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions):
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        context = TaskContext.get()
        task_partition, attempt = context.partitionId(), context.attemptNumber()
        prefix = self.options.transactional_id_prefix
        tid = transactional_id(prefix, task_partition) if prefix else None
        failures = SendFailures()
        records = 0
        with Producer(self.options.bootstrap, transactional_id=tid,
                      transaction_timeout_ms=self.options.transaction_timeout_ms) as producer:
            if tid:
                producer.init_transactions()  # fences an earlier attempt of this task and aborts what it left open
                producer.begin_transaction()
            try:
                for batch in iterator:
                    for row in rows(batch):
                        sent = send_row(producer, self.options.topic, row)
                        if not tid:  # a transaction's commit fails by itself if a record did
                            failures.watch(sent)
                        records += 1
                if tid:
                    producer.commit_transaction()
                else:
                    producer.flush()
                    failures.raise_first()
            except BaseException:
                if tid:
                    abort_quietly(producer)
                raise
            return TaskReport(task_partition, attempt, records, tid, producer.producer_id, producer.producer_epoch)

    def commit(self, messages: list[TaskReport]) -> None:
        total = sum(m.records for m in messages)
        log.info("txlog write committed: %d records to %s in %d tasks", total, self.options.topic, len(messages))

    def abort(self, messages: list[TaskReport | None]) -> None:
        """The job failed. Committed tasks stay committed (see the module docstring);
        transactions of this prefix a dead attempt left open are aborted now instead
        of holding back read_committed readers until their timeout."""
        prefix = self.options.transactional_id_prefix
        if prefix:
            aborted = abort_lingering(self.options.bootstrap, prefix)
            log.warning("txlog write aborted: %d tasks had committed; aborted lingering transactions %s",
                        sum(1 for m in messages if m is not None), aborted)


def abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(timeout_s=30)
    except Exception as exc:  # the next init of this id aborts it anyway (or the coordinator's timeout does)
        log.warning("aborting the task's transaction failed: %s", exc)


def abort_lingering(bootstrap: str, prefix: str) -> list[str]:
    """Re-inits every open transactional id ``<prefix>-<n>``, which aborts its transaction."""
    with Admin(bootstrap) as admin:
        open_ids = sorted({t.transactional_id for t in admin.list_transactions(states=ABORTABLE_STATES)
                           if t.transactional_id.startswith(prefix + "-")
                           and t.transactional_id[len(prefix) + 1:].isdigit()})
    for tid in open_ids:
        with Producer(bootstrap, transactional_id=tid) as producer:
            producer.init_transactions()
    return open_ids
