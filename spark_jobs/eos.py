"""Exactly-once consume-process-produce runs on Spark.

A run plans, on the driver, one offset range per input partition: from the
group's committed offset to the last stable offset. One Spark task per range
then, on an executor:

1. inits the transactional id ``<job>:<topic>:<partition>`` (the same for every
   run and every attempt): this fences any earlier attempt or run still
   holding the id, and completes (aborts) what it left open;
2. reads the group's committed offset for the partition again, now that no
   one else can commit it, and starts there: a task whose range was already
   committed (a stage retry, a speculative copy, a second run) writes nothing;
3. reads the range with read_committed, applies the transformation, sends its
   output and the range's end offset in one transaction, and commits.

So each input record affects the output exactly once, whatever fails: an
attempt that dies or is fenced before its commit leaves nothing visible, and
the offset commit that would make a later attempt skip the range is in the
same transaction as the output.

A task fenced by another run's task (a zombie run started alongside) waits
until that transaction is finished and starts again at step 1; a fenced task
does not fence back while the other one works, so two runs never livelock.

With ``commit_scope="job"`` a run commits as one: jobs whose output depends on
several input partitions (an aggregation with a shuffle) are exactly-once too.
``transform`` then maps the run's input DataFrame (the ``txlog`` source's
columns) to the output DataFrame (the ``txlog`` writer's columns). A run, on
the driver:

1. inits the transactional id ``<job>/offsets``: this fences every earlier run
   of the job; an earlier run whose offsets were prepared but not committed
   has them aborted, so its group commit can never succeed any more;
2. plans one range per input partition from the group's committed offsets,
   read now (waiting for pending offset commits) up to the last stable offset;
3. puts the ranges' end offsets in the offsets transaction and prepares it;
4. writes the transformed DataFrame through the ``txlog`` writer with
   transactional-id prefix ``<job>`` and that prepared transaction in
   ``groupCommitWith``: every task prepares its output, and the driver commits
   all of it and the input offsets in one group commit (``spark_jobs.writing``).

Whatever dies, the output and the offsets are committed together or not at
all; a zombie run's commit fails once a newer run has started.

With ``delivery="at-least-once"`` the same run uses an idempotent producer and
commits the offsets after the output is acknowledged (no transaction): the
baseline the benchmark compares with.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from pyspark import TaskContext

from spark_jobs import options, planning, reading, tracing
from spark_jobs.writing import SendFailures, abort_earlier_runs, abort_quietly
from txlog import Admin, Consumer, Producer
from txlog.admin import MAX_TRANSACTION_TIMEOUT_MS_DEFAULT
from txlog.errors import ProducerFencedError
from txlog.protocol import TransactionState, names
from txlog.structs import ConsumerRecord
from txlog.two_phase import new_run_id, wait_until

log = logging.getLogger("spark_jobs.eos")

DELIVERY_MODES = ("exactly-once", "at-least-once")
COMMIT_SCOPES = ("partition", "job")
FENCED_ROUNDS_MAX = 5


class OutputRecord(NamedTuple):
    key: bytes | str | None
    value: bytes | str | None
    headers: tuple[tuple[str, bytes], ...] = ()


Transform = Callable[..., Iterable[OutputRecord]]  # (records, source range, **transform_args)


@dataclass(frozen=True)
class EosJob:
    """``transform``: "module:function", a ``Transform`` called with the records, the
    range they come from and ``transform_args``; named rather than pickled so
    that executors import the same code the driver names."""

    name: str
    bootstrap: str
    input_topics: tuple[str, ...]
    output_topic: str
    group: str
    transform: str
    transform_args: Mapping[str, Any] = field(default_factory=dict)
    delivery: str = "exactly-once"
    transaction_timeout_ms: int = 60_000
    commit_scope: str = "partition"
    client_tls: Mapping[str, str] = field(default_factory=dict)  # the SDK's tls_ca= / tls_cert= / tls_key=
    trace_context: Mapping[str, str] = field(default_factory=dict)  # the run's span, for the tasks' (tracing.py)

    @property
    def spark_tls_options(self) -> dict[str, str]:
        """The same files as the txlog data source's tlsCa / tlsCert / tlsKey options."""
        keywords = {keyword: option for option, keyword in options.TLS_OPTIONS.items()}
        return {keywords[keyword]: path for keyword, path in self.client_tls.items() if path}

    def __post_init__(self):
        if self.delivery not in DELIVERY_MODES:
            raise options.OptionError(f"delivery must be one of {DELIVERY_MODES}, not {self.delivery!r}")
        if self.commit_scope not in COMMIT_SCOPES:
            raise options.OptionError(f"commit_scope must be one of {COMMIT_SCOPES}, not {self.commit_scope!r}")
        if self.commit_scope == "job" and self.delivery != "exactly-once":
            raise options.OptionError("commit_scope='job' is a way of committing exactly once; it takes no other delivery")
        if not options.TRANSACTIONAL_ID_PREFIX_RE.fullmatch(self.name):
            raise options.OptionError(f"a job name must be 1-200 characters of [a-zA-Z0-9._-], not {self.name!r}")
        if not self.input_topics or not all(names.is_topic_name(t) for t in (*self.input_topics, self.output_topic)):
            raise options.OptionError(f"input topics {list(self.input_topics)} and output topic {self.output_topic!r} "
                                      "must be valid topic names (at least one input)")
        if not names.is_group_id(self.group):
            raise options.OptionError(f"group {self.group!r} is not a valid group id (1 to 255 characters of [a-zA-Z0-9._-])")
        if not 0 < self.transaction_timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS_DEFAULT:
            raise options.OptionError(f"transaction_timeout_ms must be 1..{MAX_TRANSACTION_TIMEOUT_MS_DEFAULT} "
                                      f"(the coordinators' default maximum), not {self.transaction_timeout_ms}")
        load_transform(self.transform)

    def transactional_id(self, offsets: planning.OffsetRange) -> str:
        # ":" is in neither job nor topic names: two jobs never share an id
        return f"{self.name}:{offsets.topic}:{offsets.partition}"

    @property
    def offsets_transactional_id(self) -> str:
        """commit_scope="job": the id of the offsets transaction, in the job's transaction group."""
        return f"{self.name}/offsets"


@dataclass(frozen=True)
class RangeResult:
    """What one task did. ``status``: committed, or skipped when the group's
    committed offset was already at the range's end."""

    topic: str
    partition: int
    planned_start: int
    start: int
    end: int
    status: str
    records_in: int
    records_out: int
    attempt: int
    fenced_rounds: int
    transactional_id: str | None
    producer_epoch: int


def load_transform(spec: str) -> Transform:
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise options.OptionError(f"a transform is named module:function, not {spec!r}")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise options.OptionError(f"cannot load the transform {spec!r}: {exc}") from None
    if not callable(function):
        raise options.OptionError(f"the transform {spec!r} is not callable")
    return function


def plan(job: EosJob) -> list[planning.OffsetRange]:
    """One range per input partition, from the group's committed offset to the LSO.
    Never split: the range's end is the offset committed for its partition."""
    return planning.plan(options.ReadOptions(
        bootstrap=job.bootstrap, topics=job.input_topics,
        starting=options.StartingOffsets(options.EARLIEST, group=job.group), ending=options.EndingOffsets(),
        isolation="read_committed", max_records_per_split=None, fail_on_data_loss=True, poll_timeout_s=120.0,
        client_tls=job.client_tls))


def run_once(spark, job: EosJob) -> list[RangeResult]:
    if job.commit_scope == "job":
        return _run_as_one(spark, job)
    ranges = plan(job)
    log.info("planned %d ranges", len(ranges), extra={"fields": {"job": job.name, "ranges": [
        {"topic": r.topic, "partition": r.partition, "from": r.start, "to": r.end} for r in ranges]}})
    if not ranges:
        return []
    spark.sparkContext.setJobDescription(f"{job.name}: {len(ranges)} ranges of {','.join(job.input_topics)}")
    with tracing.run_span("txlog.spark.run", {"txlog.job": job.name, "txlog.group": job.group,
                                              "txlog.ranges": len(ranges)}) as trace_context:
        traced = replace(job, trace_context=trace_context)
        results = spark.sparkContext.parallelize(ranges, len(ranges)).map(lambda r: process_range(traced, r)).collect()
    for result in results:
        log.info("range %s-%d %s", result.topic, result.partition, result.status, extra={"fields": asdict(result)})
    return results


def _run_as_one(spark, job: EosJob) -> list[RangeResult]:
    """commit_scope="job" (see the module docstring). The results' record counts are -1:
    the driver does not see them (the writer's commit logs its total)."""
    transform = load_transform(job.transform)
    with Producer(job.bootstrap, **job.client_tls, transactional_id=job.offsets_transactional_id,
                  transaction_timeout_ms=job.transaction_timeout_ms) as offsets_producer:
        offsets_producer.init_transactions()  # fences earlier runs before reading where they got to
        ranges = plan(job)
        if not ranges:
            # nothing to write, but this run aborts what earlier ones left undecided all the same, as one that
            # writes does first: an attempt Spark gave up on may prepare after its run's commit, and would hold
            # the output's last stable offset until the next run that writes
            abort_earlier_runs(job.bootstrap, job.name, new_run_id(), job.client_tls)
            return []
        log.info("planned %d ranges for one commit", len(ranges), extra={"fields": {"job": job.name, "ranges": [
            {"topic": r.topic, "partition": r.partition, "from": r.start, "to": r.end} for r in ranges]}})
        offsets_producer.begin_transaction()
        offsets_producer.send_offsets_to_transaction({r.tp: r.end for r in ranges}, job.group)
        handle = offsets_producer.prepare_transaction()
        spark.sparkContext.setJobDescription(f"{job.name}: one commit of {len(ranges)} ranges of {','.join(job.input_topics)}")
        try:
            output = transform(read_ranges(spark, job, ranges), **job.transform_args)
            (output.write.format("txlog").option("bootstrap", job.bootstrap).options(**job.spark_tls_options)
             .option("topic", job.output_topic)
             .option("transactionalIdPrefix", job.name).option("transactionTimeoutMs", str(job.transaction_timeout_ms))
             .option("groupCommitWith", json.dumps([list(handle)])).mode("append").save())
        except BaseException:
            _abort_offsets(job, handle)
            raise
    return [RangeResult(r.topic, r.partition, r.start, r.start, r.end, "committed", -1, -1, 0, 0,
                        job.offsets_transactional_id, handle.producer_epoch) for r in ranges]


def read_ranges(spark, job: EosJob, ranges: list[planning.OffsetRange]):
    """The planned ranges as a DataFrame of the ``txlog`` source (read_committed).
    Every input partition is named: one without a range reads from the latest
    offset to the same latest offset, nothing (an unnamed one would read from
    the earliest)."""
    with Consumer(job.bootstrap, **job.client_tls) as consumer:
        tps = planning.partitions_of(consumer, job.input_topics)
    planned = {(r.topic, r.partition): r for r in ranges}

    def offsets_json(pick) -> str:
        by_topic: dict[str, dict[str, int]] = {}
        for tp in tps:
            by_topic.setdefault(tp[0], {})[str(tp[1])] = pick(planned[tp]) if tp in planned else options.LATEST
        return json.dumps(by_topic)

    return (spark.read.format("txlog").option("bootstrap", job.bootstrap).options(**job.spark_tls_options)
            .option("topic", ",".join(job.input_topics))
            .option("startingOffsets", offsets_json(lambda r: r.start))
            .option("endingOffsets", offsets_json(lambda r: r.end)).load())


def _abort_offsets(job: EosJob, handle) -> None:
    """The write failed: its offsets must not commit. One a group decision
    committed meanwhile (an ambiguous failure) stays committed, with its output."""
    try:
        with Admin(job.bootstrap, **job.client_tls) as admin:
            admin.complete_transaction(handle, False)
    except Exception as exc:  # the next run's init aborts it anyway
        log.warning("aborting the offsets transaction %s failed: %s", handle, exc)


def process_range(job: EosJob, offsets: planning.OffsetRange) -> RangeResult:
    """One range's transaction, in a span of the run's trace (tracing.py)."""
    attributes = {"txlog.partitions": [f"{offsets.topic}-{offsets.partition}"], "txlog.range": f"{offsets.start}-{offsets.end}",
                  "txlog.transactional_id": job.transactional_id(offsets) if job.delivery == "exactly-once" else ""}
    with tracing.task_span(job.trace_context, "txlog.spark.range", attributes) as tracer_provider:
        return _process_range(job, offsets, tracer_provider)


def _process_range(job: EosJob, offsets: planning.OffsetRange, tracer_provider) -> RangeResult:
    transform = load_transform(job.transform)
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    if job.delivery == "at-least-once":
        return _at_least_once(job, offsets, transform, attempt)
    tid = job.transactional_id(offsets)
    for fenced_rounds in range(FENCED_ROUNDS_MAX):
        with Producer(job.bootstrap, **job.client_tls, transactional_id=tid, transaction_timeout_ms=job.transaction_timeout_ms,
                      tracer_provider=tracer_provider) as producer:
            try:
                producer.init_transactions()
                start = _committed(job, offsets)
                if start >= offsets.end:
                    return _result(offsets, start, "skipped", 0, 0, attempt, fenced_rounds, tid, producer)
                producer.begin_transaction()
                records_in, records_out = _send_output(job, producer, offsets, start, transform, None)
                # the offsets last: while they are pending, the group's offsets are unstable to OffsetFetch
                producer.send_offsets_to_transaction({offsets.tp: offsets.end}, job.group)
                producer.commit_transaction()  # raises if any record failed
                return _result(offsets, start, "committed", records_in, records_out, attempt, fenced_rounds, tid,
                               producer)
            except ProducerFencedError:
                log.warning("%s was fenced by another attempt or run; waiting for its transaction to finish", tid)
            except BaseException:
                abort_quietly(producer)
                raise
        _wait_until_finished(job, tid)
        time.sleep(random.uniform(0, 0.2 * (fenced_rounds + 1)))  # two fenced tasks do not re-init in step
    raise RuntimeError(f"{tid}: fenced {FENCED_ROUNDS_MAX} times in a row; other runs of job {job.name!r} "
                       "keep taking this partition")


def _at_least_once(job: EosJob, offsets, transform: Transform, attempt: int) -> RangeResult:
    start = _committed(job, offsets)
    if start >= offsets.end:
        return RangeResult(offsets.topic, offsets.partition, offsets.start, start, offsets.end, "skipped", 0, 0,
                           attempt, 0, None, -1)
    failures = SendFailures()
    with Producer(job.bootstrap, **job.client_tls) as producer:
        records_in, records_out = _send_output(job, producer, offsets, start, transform, failures)
        producer.flush()
        failures.raise_first()
    with Consumer(job.bootstrap, **job.client_tls, group_id=job.group) as consumer:
        consumer.commit({offsets.tp: offsets.end})
    return RangeResult(offsets.topic, offsets.partition, offsets.start, start, offsets.end, "committed", records_in,
                       records_out, attempt, 0, None, -1)


def _committed(job: EosJob, offsets: planning.OffsetRange) -> int:
    """Where the partition's unprocessed input starts now: the group's committed
    offset (waiting out pending transactional commits), or the planned start."""
    with Consumer(job.bootstrap, **job.client_tls, group_id=job.group, isolation_level="read_committed") as consumer:
        committed = consumer.committed(offsets.tp)
    return offsets.start if committed is None else committed


def _send_output(job: EosJob, producer: Producer, offsets: planning.OffsetRange, start: int, transform: Transform,
                 failures: SendFailures | None) -> tuple[int, int]:
    """Sends the transformed records; ``failures`` watches each send (None in a transaction,
    whose commit fails anyway if a record did)."""
    unread = planning.OffsetRange(offsets.topic, offsets.partition, start, offsets.end)
    counted = _Counted(reading.read_range(job.bootstrap, unread, client_tls=job.client_tls))
    records_out = 0
    for output in transform(iter(counted), unread, **job.transform_args):
        sent = producer.send(job.output_topic, value=output.value, key=output.key, headers=list(output.headers) or None)
        if failures is not None:
            failures.watch(sent)
        records_out += 1
    return counted.count, records_out


class _Counted:
    def __init__(self, records: Iterator[ConsumerRecord]):
        self.records, self.count = records, 0

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for record in self.records:
            self.count += 1
            yield record


def _wait_until_finished(job: EosJob, tid: str) -> None:
    """Until the transaction that fenced us is no longer open, at most its timeout
    (the coordinator aborts it then) plus a margin; past that the caller goes on
    and is fenced again, or fences it."""
    with Admin(job.bootstrap, **job.client_tls) as admin:
        def finished() -> bool:
            (description,) = admin.describe_transactions([tid])
            return not TransactionState(description.state).is_open

        with contextlib.suppress(TimeoutError):
            wait_until(finished, job.transaction_timeout_ms / 1000 + 10, f"transaction {tid} still open")


def _result(offsets, start, status, records_in, records_out, attempt, fenced_rounds, tid, producer) -> RangeResult:
    return RangeResult(offsets.topic, offsets.partition, offsets.start, start, offsets.end, status, records_in,
                       records_out, attempt, fenced_rounds, tid, producer.producer_epoch)
