"""Batch writes of the ``txlog`` data source.

With ``transactionalIdPrefix`` P the whole write commits atomically: every
record of the job becomes visible to read_committed readers at once, or none
does. It is two-phase:

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
   the commit's records before it and not those after. Then it commits exactly the handles Spark hands it (one per partition,
   from the attempts that succeeded), plus those of the ``groupCommitWith``
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
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructType, TimestampType

from services.client import Admin, Consumer, Producer, TransactionHandle
from services.client.admin import OPEN_STATES
from services.client.errors import ClientError, InvalidTxnStateError, ProducerFencedError
from spark_jobs.options import OptionError, WriteOptions

log = logging.getLogger("spark_jobs.writing")

# Transactions a run leaves undecided: Ongoing (an attempt died while writing) and
# Prepared (nobody committed it). Prepare* and Complete* are decided already.
UNDECIDED_STATES = ("Ongoing", "Prepared")
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


def new_run_id() -> str:
    """Unique per write: milliseconds since the epoch (runs sort by age) and randomness."""
    return f"r{int(time.time() * 1000)}-{os.urandom(3).hex()}"


def transactional_id(prefix: str, run: str, task_partition: int, task_attempt_id: int) -> str:
    return f"{prefix}/{run}.p{task_partition}.t{task_attempt_id}"


def task_id_pattern(prefix: str) -> re.Pattern:
    """Matches the transactional ids of every run's tasks under ``prefix``; group 1 is the run."""
    return re.compile(re.escape(prefix) + r"/(r\d+-[0-9a-f]+)\.p\d+\.t\d+")


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


class TxlogWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, run: str):
        self.options = options
        self.run = run

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        context = TaskContext.get()
        task_partition, attempt = context.partitionId(), context.attemptNumber()
        prefix = self.options.transactional_id_prefix
        tid = transactional_id(prefix, self.run, task_partition, context.taskAttemptId()) if prefix else None
        failures = SendFailures()
        records = 0
        handle = None
        with Producer(self.options.bootstrap, transactional_id=tid,
                      transaction_timeout_ms=self.options.transaction_timeout_ms) as producer:
            if tid:
                producer.init_transactions()
                producer.begin_transaction()
            try:
                for batch in iterator:
                    for row in rows(batch):
                        sent = send_row(producer, self.options.topic, row)
                        if not tid:  # a transaction's prepare fails by itself if a record did
                            failures.watch(sent)
                        records += 1
                if tid:
                    handle = producer.prepare_transaction(self.options.prepared_timeout_ms)
                else:
                    producer.flush()
                    failures.raise_first()
            except BaseException:
                if tid:
                    abort_quietly(producer)
                raise
            return TaskReport(task_partition, attempt, records, handle)  # close() leaves a prepared transaction

    def commit(self, messages: list[TaskReport]) -> None:
        total = sum(m.records for m in messages)
        prefix = self.options.transactional_id_prefix
        if prefix:
            handles = [m.handle for m in messages] + list(self.options.group_commit_with)
            with Admin(self.options.bootstrap) as admin:
                # the others first, markers written: see the module docstring, step 3
                aborted = abort_others_settled(admin, self.options.bootstrap, prefix, self.run,
                                               keep={h.transactional_id for h in handles})
                admin.commit_transaction_group(prefix, handles)
            log.info("txlog write committed: %d records to %s in %d tasks as one group commit of %s (run %s); "
                     "aborted %d other attempts", total, self.options.topic, len(messages), prefix, self.run,
                     len(aborted))
        else:
            log.info("txlog write finished: %d records to %s in %d tasks", total, self.options.topic, len(messages))

    def abort(self, messages: list[TaskReport | None]) -> None:
        """The job failed: with a prefix, every transaction of this run is aborted
        (nothing of it becomes visible); a plain write keeps what finished tasks wrote."""
        prefix = self.options.transactional_id_prefix
        if prefix:
            with Admin(self.options.bootstrap) as admin:
                aborted = abort_run(admin, self.options.bootstrap, prefix, self.run, keep=set())
            log.warning("txlog write aborted: run %s of %s; aborted transactions %s", self.run, prefix, aborted)
        else:
            log.warning("txlog write failed: %d tasks had finished and their rows stay visible",
                        sum(1 for m in messages if m is not None))


def abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(timeout_s=30)
    except Exception as exc:  # the next init of this id aborts it anyway (or the coordinator's timeout does)
        log.warning("aborting the task's transaction failed: %s", exc)


def abort_run(admin: Admin, bootstrap: str, prefix: str, run: str, keep: set[str]) -> list[str]:
    """Aborts every undecided transaction of ``run`` but those in ``keep``."""
    pattern = task_id_pattern(prefix)
    listings = [t for t in admin.list_transactions(states=UNDECIDED_STATES, prefix=f"{prefix}/{run}.")
                if pattern.fullmatch(t.transactional_id) and t.transactional_id not in keep]
    return abort_undecided(admin, bootstrap, listings)


def abort_others_settled(admin: Admin, bootstrap: str, prefix: str, run: str, keep: set[str],
                         timeout_s: float = 120) -> list[str]:
    """Aborts every transaction of ``run`` outside ``keep`` and waits until none
    is open or completing (an abort returns once it is decided; its markers
    follow). One a late attempt opens meanwhile is aborted in the next round."""
    pattern = task_id_pattern(prefix)
    deadline = time.monotonic() + timeout_s
    aborted: list[str] = []
    while True:
        aborted += abort_run(admin, bootstrap, prefix, run, keep)
        busy = sorted(t.transactional_id for t in admin.list_transactions(states=OPEN_STATES, prefix=f"{prefix}/{run}.")
                      if pattern.fullmatch(t.transactional_id) and t.transactional_id not in keep)
        if not busy:
            return aborted
        if time.monotonic() > deadline:
            raise TimeoutError(f"transactions {busy[:10]} of run {run} of {prefix!r} were still open or completing "
                               f"after {timeout_s:.0f} s; the write is not committed")
        time.sleep(0.1)


def abort_earlier_runs(bootstrap: str, prefix: str, run: str) -> list[str]:
    """Aborts the undecided task transactions of every run of ``prefix`` but ``run``:
    what a run whose driver died before its group commit left behind."""
    pattern = task_id_pattern(prefix)
    with Admin(bootstrap) as admin:
        listings = []
        for t in admin.list_transactions(states=UNDECIDED_STATES, prefix=f"{prefix}/"):
            matched = pattern.fullmatch(t.transactional_id)
            if matched and matched.group(1) != run:
                listings.append(t)
        aborted = abort_undecided(admin, bootstrap, listings)
    if aborted:
        log.warning("aborted %d undecided transactions of earlier runs of %s: %s", len(aborted), prefix, aborted)
    return aborted


def abort_undecided(admin: Admin, bootstrap: str, listings) -> list[str]:
    """Prepared ones by their handle; Ongoing ones by a new producer with the id,
    which fences the attempt still writing (if any) and aborts its transaction.
    One a group decision committed meanwhile stays committed."""
    aborted = []
    for listing in listings:
        try:
            if listing.state == "Prepared":
                admin.complete_transaction(listing.handle, False)
            else:
                with Producer(bootstrap, transactional_id=listing.transactional_id) as producer:
                    producer.init_transactions()
            aborted.append(listing.transactional_id)
        except InvalidTxnStateError as exc:  # decided as committed: that is its outcome
            log.info("%s was committed meanwhile: %s", listing.transactional_id, exc)
        except ProducerFencedError:  # someone else ended it already
            pass
    return aborted
