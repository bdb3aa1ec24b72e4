"""Batch writes of the ``txlog`` data source.

With ``transactionalIdPrefix`` P the whole write commits atomically: every
record of the job becomes visible to read_committed readers at once, or none
does. It is the SDK's two-phase group write (txlog/two_phase.py),
driven from Spark's DataSourceWriter hooks:

1. On the driver, the write gets a run id R, and first aborts what earlier
   runs of P left undecided (a driver killed between its tasks' prepares and
   its group commit): every Prepared or Ongoing task transaction ``P/<run>...``
   of another run. The coordinator refuses to abort one a group decision
   committed, so nothing decided is undone.
2. Each task attempt writes its rows in its own transaction, transactional id
   ``P/R.p<task partition>.t<task attempt id>`` (unique per attempt: a
   speculative copy never fences the attempt Spark will choose), prepares it
   and returns its handle as its WriterCommitMessage.
3. The driver's ``commit`` first aborts every other open or prepared transaction
   of run R (failed attempts, speculative copies that lost) and waits until their
   ABORT markers are written: one still open would hold its partitions' last
   stable offset below records of the commit, so read_committed readers would see
   the commit's records before it and not those after. Then it commits exactly the handles Spark hands it (one per
   partition that had rows, from the attempts that succeeded; a task without rows opens no transaction), plus those of the ``groupCommitWith``
   option, in one CommitTransactionGroup of group P. ``abort`` aborts every
   transaction of run R.

P is the transaction group (the part of an id before "/"), so all of a job's
transactions are decided by one coordinator. P names one job: two jobs writing
with the same prefix at once abort each other's undecided transactions.

Without the prefix the rows go through a plain idempotent producer: each
task's rows are written at least once. Every row a task attempt sent stays
visible, whether the attempt succeeded or not: an attempt that fails (Spark
ends a writer's input normally when the step before it fails, so the attempt
may even finish sending part of its rows) leaves what it sent, and its retry
sends the rows again; a task that succeeded and that Spark runs again (a stage
retry, a speculative copy that also finishes) writes its rows a second time;
a job that fails leaves what its tasks sent. Use the prefix for exactly once.

With TXLOG_OTEL_EXPORTER set (tracing.py), a write is one trace: its span on
the driver (txlog.spark.write: topic, prefix, run), each task attempt's
transaction a child (txlog.spark.write.task: its transactional id, producer
id and epoch; the producer's calls inside it), and the commit or abort on the
driver another (txlog.spark.write.commit / .abort: the committed
transactional ids; the group commit's calls inside it, so the coordinator
and the markers continue the trace).
"""

from __future__ import annotations

import datetime
import itertools
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructType, TimestampType

from spark_jobs import tracing
from spark_jobs.options import OptionError, WriteOptions
from txlog import Admin, Consumer, Producer, TransactionHandle
from txlog.errors import ClientError
from txlog.two_phase import GroupWrite, task_transactional_id

log = logging.getLogger("spark_jobs.writing")

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
    with Consumer(options.bootstrap, **options.client_tls) as consumer:
        try:
            consumer.partitions_for(options.topic, timeout_s=30)
        except ClientError as exc:
            raise OptionError(f"txlog: cannot write to topic {options.topic!r}: {exc}") from None


@dataclass(frozen=True)
class TaskReport(WriterCommitMessage):
    task_partition: int
    attempt: int
    records: int
    handle: TransactionHandle | None  # the prepared transaction (None: a plain write)


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


def begin_write_span(options: WriteOptions, run: str) -> tracing.DeferredSpan | None:
    """The write's span, begun on the driver as Spark makes the writer (None when tracing is off)."""
    return tracing.begin_span("txlog.spark.write", {"txlog.topic": options.topic, "txlog.run": run,
                                                    "txlog.transactional_id_prefix": options.transactional_id_prefix or ""})


class TxlogWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, run: str, span: tracing.DeferredSpan | None = None):
        self.options = options
        self.run = run
        self.span = span  # the write's, for its tasks' and its commit's spans

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        context = TaskContext.get()
        task_partition, attempt = context.partitionId(), context.attemptNumber()
        prefix = self.options.transactional_id_prefix
        tid = task_transactional_id(prefix, self.run, task_partition, context.taskAttemptId()) if prefix else None
        attributes = {"txlog.topic": self.options.topic, "txlog.transactional_id": tid or "",
                      "txlog.task_partition": task_partition, "txlog.attempt": attempt}
        with tracing.task_span(self.span.context if self.span else {}, "txlog.spark.write.task", attributes) as spans:
            return write_task(self.options, iterator, task_partition, attempt, tid, spans)

    def commit(self, messages: list[TaskReport]) -> None:
        total = sum(m.records for m in messages)
        prefix = self.options.transactional_id_prefix
        handles = [m.handle for m in messages if m.handle] + list(self.options.group_commit_with) if prefix else []
        attributes = {"txlog.topic": self.options.topic, "txlog.run": self.run, "txlog.records": total,
                      "txlog.transactional_ids": [h.transactional_id for h in handles]}
        with tracing.ending(self.span, "txlog.spark.write.commit", attributes) as tracer_provider:
            self._commit(messages, total, handles, tracer_provider)

    def _commit(self, messages: list[TaskReport], total: int, handles: list[TransactionHandle], tracer_provider) -> None:
        prefix = self.options.transactional_id_prefix
        if prefix:
            with Admin(self.options.bootstrap, tracer_provider=tracer_provider, **self.options.client_tls) as admin:
                aborted = GroupWrite(admin, self.options.bootstrap, prefix, self.run).commit(handles)
            log.info("txlog write committed: %d records to %s in %d tasks as one group commit of %s (run %s); "
                     "aborted %d other attempts", total, self.options.topic, len(messages), prefix, self.run,
                     len(aborted))
        else:
            log.info("txlog write finished: %d records to %s in %d tasks", total, self.options.topic, len(messages))

    def abort(self, messages: list[TaskReport | None]) -> None:
        """The job failed: with a prefix, every transaction of this run is aborted
        (nothing of it becomes visible); a plain write keeps what finished tasks wrote."""
        prefix = self.options.transactional_id_prefix
        with tracing.ending(self.span, "txlog.spark.write.abort", {"txlog.topic": self.options.topic, "txlog.run": self.run}) \
                as tracer_provider:
            self._abort(messages, prefix, tracer_provider)

    def _abort(self, messages: list[TaskReport | None], prefix: str | None, tracer_provider) -> None:
        if prefix:
            with Admin(self.options.bootstrap, tracer_provider=tracer_provider, **self.options.client_tls) as admin:
                aborted = GroupWrite(admin, self.options.bootstrap, prefix, self.run).abort()
            log.warning("txlog write aborted: run %s of %s; aborted transactions %s", self.run, prefix, aborted)
        else:
            log.warning("txlog write failed: %d tasks had finished and their rows stay visible",
                        sum(1 for m in messages if m is not None))


def write_task(options: WriteOptions, iterator: Iterator[pa.RecordBatch], task_partition: int, attempt: int,
               tid: str | None, tracer_provider) -> TaskReport:
    """One task attempt's rows: in transaction ``tid``, prepared (its handle in the
    report), or with ``tid`` None through an idempotent producer, flushed. A
    task without rows opens no transaction (its report has no handle): a
    streaming aggregation runs a task per shuffle partition, most of them
    empty in a small micro-batch."""
    failures = SendFailures()
    records = 0
    handle = None
    iterator = iter(iterator)
    first = next((batch for batch in iterator if batch.num_rows), None)
    if first is None:
        return TaskReport(task_partition, attempt, 0, None)
    iterator = itertools.chain([first], iterator)
    with Producer(options.bootstrap, transactional_id=tid, transaction_timeout_ms=options.transaction_timeout_ms,
                  tracer_provider=tracer_provider, **options.client_tls) as producer:
        if tid:
            producer.init_transactions()
            producer.begin_transaction()
        try:
            for batch in iterator:
                for row in rows(batch):
                    sent = send_row(producer, options.topic, row)
                    if not tid:  # a transaction's prepare fails by itself if a record did
                        failures.watch(sent)
                    records += 1
            if tid:
                handle = producer.prepare_transaction(options.prepared_timeout_ms)
            else:
                producer.flush()
                failures.raise_first()
        except BaseException:
            if tid:
                abort_quietly(producer)
            raise
        finally:
            tracing.annotate({"txlog.producer_id": producer.producer_id, "txlog.producer_epoch": producer.producer_epoch,
                              "txlog.records": records})
        return TaskReport(task_partition, attempt, records, handle)  # close() leaves a prepared transaction


def abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(timeout_s=30)
    except Exception as exc:  # the next init of this id aborts it anyway (or the coordinator's timeout does)
        log.warning("aborting the task's transaction failed: %s", exc)


def abort_earlier_runs(bootstrap: str, prefix: str, run: str, client_tls: Mapping[str, str] | None = None) -> list[str]:
    """What a run of ``prefix`` whose driver died before its group commit left undecided."""
    with Admin(bootstrap, **(client_tls or {})) as admin:
        return GroupWrite(admin, bootstrap, prefix, run).abort_earlier_runs()
