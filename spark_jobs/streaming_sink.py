"""The exactly-once streaming sink of the ``txlog`` data source
(``df.writeStream.format("txlog")``, outputMode append: Spark's Python sinks
take no other), and the same for ``foreachBatch`` (any output mode).

Every micro-batch commits atomically, once, whatever dies:

1. Each task attempt of micro-batch B writes its rows in a transaction of its
   own, ``P/r<B>-<run>.p<task partition>.t<task attempt id>`` (``<run>``: the
   query run's id, new at every start from the checkpoint), prepares it and
   returns its handle (``spark_jobs.writing.write_task``, as a batch write's
   tasks do). ``P`` is the query's transaction group: the
   ``transactionalIdPrefix`` option, by default ``txlog-stream-<query id>``
   (the query id stays the same across restarts from the checkpoint).
2. The driver's commit of B (``batch_commit``, step by step) opens the
   query's ledger (``batch_ledger``), which fences earlier drivers, and asks
   whether B is recorded there. If it is, an earlier driver committed B and
   died before Spark logged it: this run's transactions of B are aborted and
   nothing is committed.
3. Otherwise every other undecided transaction of P is aborted (failed task
   attempts, speculative copies that lost, what a driver killed before its
   group commit left prepared) and waited for until none is open, and the
   tasks' handles are committed in one CommitTransactionGroup of P together
   with a ledger transaction that records B.

So a micro-batch Spark runs again after a driver failure commits nothing
twice; an executor failure or a task retry is handled as in a batch write
(each attempt has its own transactional id; only the handles Spark hands the
driver commit). The sink needs a checkpoint (Spark's own, as for any sink).

Failure tests stop the driver at the two worst moments through
``TXLOG_SPARK_HOLD_COMMIT`` (``before`` or ``after`` the group commit, with
``TXLOG_SPARK_HOLD_DIR``): the commit writes ``<dir>/held-<B>`` there and
waits for as long as the process lives, so the test can kill -9 it right
there. Unset, as in production, it does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from spark_jobs import options, writing
from spark_jobs.batch_commit import BatchCommit, LedgerAheadError
from spark_jobs.batch_ledger import BatchLedger
from spark_jobs.options import OptionError, WriteOptions
from txlog import Admin, TransactionHandle
from txlog.two_phase import GroupWrite, task_transactional_id

log = logging.getLogger("spark_jobs.streaming_sink")

DEFAULT_PREFIX = "txlog-stream-"
# Spark's local properties of a micro-batch's tasks
QUERY_ID_PROPERTY, BATCH_ID_PROPERTY, RUN_ID_PROPERTY = "sql.streaming.queryId", "streaming.sql.batchId", "spark.jobGroup.id"
HOLD_ENV, HOLD_DIR_ENV = "TXLOG_SPARK_HOLD_COMMIT", "TXLOG_SPARK_HOLD_DIR"


@dataclass(frozen=True)
class StreamTaskReport(WriterCommitMessage):
    prefix: str
    batch_id: int
    task: writing.TaskReport


def query_prefix(options: WriteOptions, query_id: str) -> str:
    return options.transactional_id_prefix or f"{DEFAULT_PREFIX}{query_id}"


def task_run(batch_id: int, run_id: str) -> str:
    """A micro-batch's run within the prefix: ``r<batch id>-<the query run's id, hex>``."""
    return f"r{batch_id}-{run_id.replace('-', '').lower()}"


class TxlogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions):
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamTaskReport:
        context = TaskContext.get()
        query_id, batch_id, run_id = (context.getLocalProperty(p) for p in (QUERY_ID_PROPERTY, BATCH_ID_PROPERTY, RUN_ID_PROPERTY))
        if not (query_id and batch_id and run_id):
            raise OptionError("txlog: a streaming write runs inside a streaming query (writeStream ... start())")
        prefix = query_prefix(self.options, query_id)
        tid = task_transactional_id(prefix, task_run(int(batch_id), run_id), context.partitionId(), context.taskAttemptId())
        report = writing.write_task(self.options, iterator, context.partitionId(), context.attemptNumber(), tid, None)
        return StreamTaskReport(prefix, int(batch_id), report)

    def commit(self, messages: list[StreamTaskReport | None], batchId: int) -> None:
        reports = [m for m in messages if m is not None]
        stale = [r.batch_id for r in reports if r.batch_id != batchId]
        if stale:
            raise RuntimeError(f"txlog: micro-batch {batchId} was handed task reports of batches {sorted(set(stale))}")
        handles = [r.task.handle for r in reports if r.task.handle]
        if not handles:  # no task had a row: nothing to commit and nothing a re-run could write twice, but what
            # attempts of it prepared (a straggler, a retried task's first attempt) must not hold the output's LSO
            if reports:
                abort_task_transactions(self.options, reports[0].prefix)
            return
        records = sum(r.task.records for r in reports)
        if commit_batch(self.options, reports[0].prefix, batchId, handles):
            log.info("txlog micro-batch %d committed: %d records to %s in %d tasks", batchId, records, self.options.topic,
                     len(reports))
        else:  # expected once after a driver died between its group commit and Spark's commit log
            log.warning("txlog micro-batch %d was committed before under %s: this run's %d records are aborted (a "
                        "query restarted from a new checkpoint needs a new transactionalIdPrefix)", batchId,
                        reports[0].prefix, records)

    def abort(self, messages: list[StreamTaskReport | None], batchId: int) -> None:
        reports = [m for m in messages if m is not None]
        prefix = reports[0].prefix if reports else self.options.transactional_id_prefix
        if prefix is None:  # the default prefix comes from the tasks: the query's next commit aborts what they left
            log.warning("txlog micro-batch %d failed; its prepared attempts are aborted by the query's next commit", batchId)
            return
        log.warning("txlog micro-batch %d failed; aborted its transactions %s", batchId,
                    abort_task_transactions(self.options, prefix))


def abort_task_transactions(write_options: WriteOptions, prefix: str, settled: bool = False) -> list[str]:
    """Every undecided task transaction of the query (the ledger's is not one);
    ``settled``: and waits until none is open."""
    with Admin(write_options.bootstrap, **write_options.client_tls) as admin:
        tasks = GroupWrite(admin, write_options.bootstrap, prefix, None)
        return tasks.abort_others_settled(set()) if settled else tasks.abort()


def commit_batch(options: WriteOptions, prefix: str, batch_id: int, handles: list[TransactionHandle]) -> bool:
    """Commits ``handles`` as micro-batch ``batch_id`` of the query of ``prefix``,
    unless it was committed before (``batch_commit``); True if this call committed it."""
    with BatchLedger(options.bootstrap, prefix, options.topic, options.client_tls, options.transaction_timeout_ms) as ledger, \
            Admin(options.bootstrap, **options.client_tls) as admin:
        commit = BatchCommit(LedgerCluster(ledger, admin, GroupWrite(admin, options.bootstrap, prefix, None)), batch_id, handles)
        committed = commit.run(before_commit=lambda: hold_if_asked("before", batch_id))
        if committed:
            hold_if_asked("after", batch_id)
        return committed


class LedgerCluster:
    """``batch_commit.Cluster`` on the real cluster: the query's ledger and its task transactions."""

    def __init__(self, ledger: BatchLedger, admin: Admin, tasks: GroupWrite):
        self.ledger, self.admin, self.tasks = ledger, admin, tasks

    def fence(self) -> None:
        self.ledger.fence()

    def last_committed(self) -> int | None:
        return self.ledger.last_committed()

    def abort_undecided(self, keep: frozenset[str]) -> None:
        self.tasks.abort_others_settled(set(keep))

    def record(self, batch_id: int) -> TransactionHandle:
        return self.ledger.prepare(batch_id)

    def group_commit(self, handles: list[TransactionHandle]) -> None:
        self.admin.commit_transaction_group(self.tasks.prefix, handles)

    def abort_record(self, handle: TransactionHandle) -> None:
        abort_recorded(self.admin, handle)


def abort_recorded(admin: Admin, recorded: TransactionHandle) -> None:
    """The group commit failed: the ledger transaction must not commit. One a
    group decision committed meanwhile (an ambiguous failure) stays committed."""
    try:
        admin.complete_transaction(recorded, False)
    except Exception as exc:  # the next commit's ledger init aborts it anyway
        log.warning("aborting the ledger transaction %s failed: %s", recorded, exc)


def hold_if_asked(moment: str, batch_id: int) -> None:
    """The failure tests' stop (module docstring)."""
    if os.environ.get(HOLD_ENV) != moment:
        return
    directory = os.environ[HOLD_DIR_ENV]
    with open(os.path.join(directory, f"held-{batch_id}"), "w") as marker:
        marker.write(moment)
    while True:
        time.sleep(3600)


def write_batch_exactly_once(batch_df, batch_id: int, *, bootstrap: str, topic: str,
                             transactional_id_prefix: str | None = None, **write_options: str) -> bool:
    """For ``foreachBatch`` (and for what the sink cannot take: Spark's Python
    sinks accept outputMode append only, ``foreachBatch`` any): writes
    ``batch_df`` to ``topic`` as micro-batch ``batch_id``, once: a micro-batch
    Spark runs again after it was committed writes nothing. The query's
    transaction group is ``transactional_id_prefix``, by default
    ``txlog-stream-<query id>`` as for the sink (one per query: a new
    checkpoint is a new query). ``write_options``: more options of the
    ``txlog`` writer (TLS, ``transactionTimeoutMs``). True if this call
    committed the batch.

        query = df.writeStream.foreachBatch(lambda batch, batch_id: write_batch_exactly_once(
            batch, batch_id, bootstrap=B, topic="out")).option("checkpointLocation", D).start()
    """
    prefix = transactional_id_prefix or f"{DEFAULT_PREFIX}{running_query_id(batch_df)}"
    parsed = options.parse_write({**write_options, "bootstrap": bootstrap, "topic": topic, "transactionalIdPrefix": prefix})
    with BatchLedger(bootstrap, prefix, topic, parsed.client_tls, parsed.transaction_timeout_ms) as ledger:
        ledger.fence()
        last = ledger.last_committed()
        if last is not None and last >= batch_id:
            if last > batch_id:
                raise LedgerAheadError(f"micro-batch {batch_id}: the ledger of {prefix!r} already records batch {last}; "
                                       "a query restarted from a new checkpoint needs a new transactional_id_prefix")
            log.warning("txlog micro-batch %d was committed before under %s: not written again", batch_id, prefix)
            return False
        recorded = ledger.prepare(batch_id)
        try:
            # what earlier runs of the query left undecided is aborted and settled first, as the sink's commit does:
            # abort markers trailing this write's commit would let readers see it on some partitions before others
            abort_task_transactions(parsed, prefix, settled=True)
            (batch_df.write.format("txlog").options(**write_options).option("bootstrap", bootstrap).option("topic", topic)
             .option("transactionalIdPrefix", prefix)
             .option("groupCommitWith", json.dumps([list(recorded)])).mode("append").save())
        except BaseException:
            with Admin(bootstrap, **parsed.client_tls) as admin:
                abort_recorded(admin, recorded)
            raise
    return True


def running_query_id(batch_df) -> str:
    """The id of the streaming query whose foreachBatch is running (Spark sets it on the thread)."""
    query_id = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        raise OptionError("txlog: write_batch_exactly_once without transactional_id_prefix runs inside a streaming "
                          "query's foreachBatch")
    return query_id
