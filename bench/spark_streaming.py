"""Benchmark: Spark Structured Streaming through the ``txlog`` source and the
exactly-once ``txlog`` sink - records/s of a streaming query against the batch
exactly-once job over the same input, the latency of a micro-batch's write and
commit, and the end-to-end latency of a record at a 1 s trigger.

What it measures, on a local cluster started for the run (services/tooling/cluster.py:
ZooKeeper, one producer_id_svc, two partition_svc, two coordinator_svc as real
processes, defaults: fsync on), once the coordinators have settled who owns
which transaction log partition, with one Spark session on ``local[2]``:

1. Throughput, streaming vs batch, the same counting over the same input.
   ``--records`` page-view events (spark_jobs.sample_events, times near now)
   are loaded into one topic of ``--partitions`` partitions.

   * batch: ``spark_jobs.eos.run_once`` with the windowed_counts job of
     bench/spark_eos.py (``count_views``, exactly-once, commit_scope
     "partition": one task and one transaction per input partition), a group
     of the run's own, so it reads every record; timed: the wall time of
     ``run_once``;
   * streaming: ``spark.readStream.format("txlog")`` ->
     ``windowed_counts.streaming_counts`` (1 min windows, 1 h watermark) ->
     ``writeStream.format("txlog")``, outputMode append,
     ``trigger(availableNow=True)``, a fresh checkpoint each run. In append
     mode a window is written once, in the first micro-batch after the
     watermark passed it; an availableNow run ends with a micro-batch that
     reads nothing and writes what the run's events closed. So the query
     reads the input topic together with a one-partition "closing" topic of
     its own holding one event 4 h after the sample events (it moves the
     watermark past every sample window): the run reads ``--records`` + 1
     records and writes every window. Timed: the wall time from ``start()`` to
     the end of ``awaitTermination()``.

   Both write through transactions to an output topic of their own; every
   run is checked: the output records it added, read back with
   read_committed, count as many views as input records (the batch runs also
   as spark_eos checks them: one committed range per partition). A failed
   check exits 1 with no report.

   Before the timed runs, both are run once, untimed, over ``--warmup-records``
   events in a topic of their own, so that
   the JVM, the Python workers and the clients' first look-ups are billed to
   neither. Then ``--rounds`` rounds, each mode once a round, the order
   reversed every other round (ABBA); per mode the median of the rounds is
   the figure.

2. Micro-batch write + commit latency, and the commit alone. A second query,
   a stateless copy (``select("value")``) from a latency input topic to a
   latency output topic through the ``txlog`` sink, trigger processingTime
   ``--trigger-seconds`` (1 s), runs for ``--stream-seconds`` (after
   ``--latency-warmup-seconds`` that are not counted) while a producer thread
   sends ``--filler-records`` records every 100 ms. From
   ``query.recentProgress``, each micro-batch's ``durationMs["addBatch"]``
   (the tasks' reads, writes and prepares, then the sink's driver-side
   commit) is ``micro_batch_write_and_commit_ms``; ``triggerExecution`` (the
   whole micro-batch, offsets and checkpoint included) is reported beside it.
   The commit alone cannot be told apart in Spark's figures, so it is timed
   outside Spark, in this process: ``--commit-samples`` times, a task's
   transaction is written as a sink task writes it (transactional id
   ``<prefix>/r<batch>-<run>.p0.t0``, 10 records, prepared), then
   ``streaming_sink.commit_batch`` - what ``TxlogStreamWriter.commit`` calls
   (the ledger opened and asked, other transactions of the prefix aborted
   and settled, one group commit with the ledger's record) - is timed:
   ``micro_batch_commit_ms``. One untimed commit first (batch 0: the ledger's
   first use). Each commit opens its clients anew, as the sink's does.

3. End-to-end latency at the 1 s trigger, in the same query as 2: a second
   producer thread sends one record every 200 ms (``--probe-interval-ms``)
   carrying its send time (``{"probe": n, "sent_ns": time.monotonic_ns()}``,
   this process's monotonic clock); a read_committed Consumer in this process
   (fetch_max_wait_ms 50: its wake-ups add at most that) reads the output
   topic from the beginning and takes, for each probe, the time from its send
   to its arrival: send, the wait for the next trigger, the micro-batch, the
   commit, the transaction markers, the fetch. p50/p99/max over the probes
   sent within the measured ``--stream-seconds``. At the end the producers
   stop, every record sent must come out exactly once (checked), then the
   query stops.

Why ratios: on two shared cores (Spark's JVM and Python workers, this driver,
ZooKeeper and five Python services) an absolute records/s means little; the
streaming query's records/s against the batch job's, on the same machine
minutes apart, holds anywhere. The latencies are absolute (and bounded below
by the trigger interval), but the commit alone against the whole micro-batch
shows which share of a micro-batch the exactly-once commit takes. CPU seconds
of every process come from /proc (bench/measure.py), Spark's Python workers
counted together (bench/spark_eos.py ``SparkPhase``).

Prints one JSON object to stdout (the Spark JVM and its workers write to
stderr only: the script points its own stdout there and keeps the real one for
the report); progress goes to stderr. Run it as
``python -m bench.spark_streaming [--records N] [--rounds R] [--partitions P] ...``;
``--quick`` (sets ``--records 20000 --rounds 1 --stream-seconds 10
--commit-samples 10``, over whatever was given for them) is a smoke test of
about two minutes (the defaults take several times as long).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from bench.measure import latency_summary, progress
from bench.spark_eos import (
    CheckFailed,
    SparkPhase,
    check_run,
    create_topics,
    end_offsets,
    failure_reason,
    job_for,
    measured_beside_spark,
    output_views,
    settled_cluster,
    summarise,
    write_report,
)

MODES = ("batch", "streaming")
WINDOW_MS = 60_000
WATERMARK_MS = 3_600_000  # the sample events come out of order within 10 minutes; none is an hour late
MASTER = "local[2]"
INPUT_TOPIC, WARMUP_TOPIC = "bench-stream-input", "bench-stream-warmup"
CLOSE_TOPIC = "bench-stream-close-{label}"  # each streaming run's closing events, one partition
OUTPUT_TOPICS = {"batch": "bench-stream-out-batch", "streaming": "bench-stream-out-streaming"}
BATCH_JOB = "bench-stream-batch"
LATENCY_IN, LATENCY_OUT, COMMIT_TOPIC = "bench-stream-latency-in", "bench-stream-latency-out", "bench-stream-commit"
COMMIT_SAMPLE_RECORDS = 10
FILLER_INTERVAL_S = 0.1
CATCH_UP_TIMEOUT_S = 120.0
READ_BACK_SETTLE_S = 30.0  # a commit answers once decided; read_committed readers see it once its markers are written
QUICK = {"records": 20_000, "rounds": 1, "stream_seconds": 10.0, "commit_samples": 10}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="input records of the throughput runs (default 200000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the input topics (default 4)")
    parser.add_argument("--output-partitions", type=int, default=4, help="partitions of each output topic (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs per mode, the order reversed every other round (default 2)")
    parser.add_argument("--warmup-records", type=int, default=5_000, help="records of the untimed warm-up runs, in a topic of their own (default 5000)")
    parser.add_argument("--stream-seconds", type=float, default=30.0, help="measured time of the 1 s trigger query (default 30)")
    parser.add_argument("--latency-warmup-seconds", type=float, default=5.0, help="time the 1 s trigger query runs before it is measured (default 5)")
    parser.add_argument("--trigger-seconds", type=float, default=1.0, help="processingTime trigger of the latency query (default 1)")
    parser.add_argument("--filler-records", type=int, default=5, help="records the filler producer sends every 100 ms (default 5)")
    parser.add_argument("--probe-interval-ms", type=float, default=200.0, help="one probe record every this many ms (default 200)")
    parser.add_argument("--commit-samples", type=int, default=50, help="timed streaming_sink.commit_batch calls (default 50)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample events (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: sets --records 20000 --rounds 1 --stream-seconds 10 --commit-samples 10")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the cluster's directory (its logs) and say where")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if min(args.records, args.partitions, args.output_partitions, args.rounds, args.warmup_records, args.commit_samples,
           args.filler_records) <= 0 or min(args.stream_seconds, args.trigger_seconds, args.probe_interval_ms) <= 0 \
            or args.latency_warmup_seconds < 0:
        parser.error("counts and times must be positive")
    return args


# --- the input ----------------------------------------------------------------------------------


def now_start_ms() -> int:
    """The sample events' start: 20 minutes ago, on a window boundary (the
    watermark follows event time, and malformed events count in the window of
    their append time, now: both must be behind the closing events)."""
    start = int(time.time() * 1000) - 20 * 60_000
    return start - start % WINDOW_MS


def closing_event(start_ms: int) -> tuple[str, str]:
    """An event 4 h after the sample events: it moves the watermark past all of
    their windows; its own window stays open, so it is in no output."""
    return "closer", json.dumps({"user": "closer", "page": "/", "ts": start_ms + 4 * 3_600_000, "bytes": 1})


def load_events(bootstrap: str, topic: str, records: int, seed: int, start_ms: int) -> dict:
    """spark_eos's ``load_input`` with the events' times from ``start_ms`` (it
    takes the fixed sample start): the same figures."""
    from spark_jobs import sample_events

    started = time.perf_counter()
    generated = sample_events.events(records, seed, start_ms)
    generated_s = time.perf_counter() - started
    payload_bytes = sum(len(key.encode()) + len(value.encode()) for key, value in generated)
    started = time.perf_counter()
    sample_events.load(bootstrap, topic, generated)
    load_s = time.perf_counter() - started
    return {"records": records, "start_ms": start_ms, "payload_bytes": payload_bytes,
            "record_bytes_mean": round(payload_bytes / records, 1), "generate_seconds": round(generated_s, 3),
            "load_seconds": round(load_s, 3), "load_records_per_s": round(records / load_s, 1)}


def read_back(bootstrap: str, since: dict[tuple[str, int], int], views_expected: int) -> tuple[int, int, float]:
    """(records, views, seconds waited) of ``output_views``, read again for up to
    READ_BACK_SETTLE_S while the views fall short (markers not written yet)."""
    started = time.monotonic()
    while True:
        records, views = output_views(bootstrap, since)
        if views >= views_expected or time.monotonic() - started > READ_BACK_SETTLE_S:
            return records, views, round(time.monotonic() - started, 3)
        time.sleep(0.5)


# --- throughput: batch and streaming ---------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    bootstrap: str
    args: argparse.Namespace
    pids: dict[str, int]
    jvm_pid: int
    checkpoints: str
    record_bytes: float
    start_ms: int  # the sample events' start, warm-up and timed input alike


def batch_job(bootstrap: str, input_topic: str, group: str):
    """spark_eos's exactly-once windowed_counts job, on this benchmark's topics."""
    return dataclasses.replace(job_for(bootstrap, "exactly-once", group), name=BATCH_JOB, input_topics=(input_topic,),
                               output_topic=OUTPUT_TOPICS["batch"])


def batch_run(spark, setup: Setup, input_topic: str, records: int, label: str) -> dict:
    from spark_jobs import eos

    job = batch_job(setup.bootstrap, input_topic, f"{BATCH_JOB}-{label}")
    since = end_offsets(setup.bootstrap, job.output_topic, setup.args.output_partitions)
    with SparkPhase(setup.pids, setup.jvm_pid) as phase:
        results = eos.run_once(spark, job)
    started = time.monotonic()
    while True:  # the markers of the tasks' commits may follow the run: read again for a while
        try:
            checked = check_run(f"{label} batch", results, records, setup.args.partitions, setup.bootstrap, since)
            break
        except CheckFailed:
            if time.monotonic() - started > READ_BACK_SETTLE_S:
                raise
            time.sleep(0.5)
    return {"mode": "batch", "group": job.group, **checked, "read_back_waited_s": round(time.monotonic() - started, 3),
            **rates_of(phase, records, setup.record_bytes)}


def counts_writer(spark, bootstrap: str, input_topic: str, close_topic: str, checkpoint: str):
    from spark_jobs import windowed_counts

    events = (spark.readStream.format("txlog").option("bootstrap", bootstrap).option("topic", f"{input_topic},{close_topic}")
              .option("startingOffsets", "earliest").load())
    counted = windowed_counts.streaming_counts(events, WINDOW_MS, WATERMARK_MS)
    return (counted.writeStream.format("txlog").option("bootstrap", bootstrap).option("topic", OUTPUT_TOPICS["streaming"])
            .option("checkpointLocation", checkpoint).outputMode("append").trigger(availableNow=True))


def available_now(writer, what: str) -> list[dict]:
    """Starts the query and waits until it ends; its micro-batches' progress."""
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:  # StreamingQueryException: the Py4J or Python error of the failed micro-batch
        raise CheckFailed(f"{what}: the query failed: {failure_reason(exc)}") from exc
    return [json.loads(p.json) for p in query.recentProgress]


def streaming_run(spark, setup: Setup, input_topic: str, records: int, start_ms: int, label: str) -> dict:
    """One availableNow run of the counting query (module docstring), timed."""
    from spark_jobs import sample_events

    bootstrap = setup.bootstrap
    close_topic = CLOSE_TOPIC.format(label=label)
    create_topics(bootstrap, [(close_topic, 1)])
    sample_events.load(bootstrap, close_topic, [closing_event(start_ms)])
    since = end_offsets(bootstrap, OUTPUT_TOPICS["streaming"], setup.args.output_partitions)
    checkpoint = os.path.join(setup.checkpoints, label)
    with SparkPhase(setup.pids, setup.jvm_pid) as phase:
        progress_reports = available_now(counts_writer(spark, bootstrap, input_topic, close_topic, checkpoint), f"{label} streaming")
    read_in = sum(p["numInputRows"] for p in progress_reports)
    if read_in != records + 1:
        raise CheckFailed(f"{label} streaming: the run read {read_in} records (expected {records} + 1 closing event)")
    read_back_records, views, waited_s = read_back(bootstrap, since, records)
    if views != records:
        raise CheckFailed(f"{label} streaming: read back {read_back_records} output records counting {views} views "
                          f"(expected {records})")
    return {"mode": "streaming", "checkpoint": checkpoint, "close_topic": close_topic,
            "micro_batches": len(progress_reports), "records_in": read_in, "records_out": read_back_records,
            "read_back_waited_s": waited_s, "micro_batch_durations_ms": [p["durationMs"] for p in progress_reports],
            **rates_of(phase, records, setup.record_bytes)}


def rates_of(phase: SparkPhase, records: int, record_bytes: float) -> dict:
    rates = phase.rates(records, record_bytes)
    spent = [v for v in phase.cpu.values() if v is not None]
    cpu_total_s = sum(spent) if len(spent) == len(phase.cpu) else None
    return {**rates, "cpu_seconds_total": None if cpu_total_s is None else round(cpu_total_s, 3),
            "records_per_cpu_second": None if not cpu_total_s else round(records / cpu_total_s, 1),
            "cpu_utilisation_outside_these_processes": phase.others_cpu_utilisation()}


def throughput(spark, setup: Setup) -> dict:
    args = setup.args
    progress(f"warm-up: both modes over the {args.warmup_records} records of {WARMUP_TOPIC}")
    warmup = {}
    for mode in MODES:
        started = time.perf_counter()
        if mode == "batch":
            batch_run(spark, setup, WARMUP_TOPIC, args.warmup_records, "warmup")
        else:
            streaming_run(spark, setup, WARMUP_TOPIC, args.warmup_records, setup.start_ms, "warmup")
        warmup[mode] = round(time.perf_counter() - started, 3)
        progress(f"  warm-up {mode}: {warmup[mode]} s")
    runs = []
    for round_index in range(args.rounds):
        order = MODES if round_index % 2 == 0 else MODES[::-1]
        progress(f"round {round_index}: {' then '.join(order)}")
        for mode in order:
            label = f"round-{round_index}"
            if mode == "batch":
                run = batch_run(spark, setup, INPUT_TOPIC, args.records, label)
            else:
                run = streaming_run(spark, setup, INPUT_TOPIC, args.records, setup.start_ms, label)
            runs.append({"round": round_index, **run})
            progress(f"  round {round_index} {mode}: {run['seconds']:.2f} s, {run['records_per_s']:.0f} records/s, "
                     f"CPU s {run['cpu_seconds_total']}")
    return {"warmup": {"records": args.warmup_records, "seconds": warmup}, "runs": runs, "modes": summarise(runs, MODES)}


# --- latency: the 1 s trigger query, and the commit alone ----------------------------------------------


class Paced(threading.Thread):
    """Calls ``tick(producer, n)`` every ``interval_s`` until stopped; keeps its first error."""

    def __init__(self, name: str, bootstrap: str, interval_s: float, tick, linger_ms: float):
        super().__init__(name=name, daemon=True)
        self.bootstrap, self.interval_s, self.tick, self.linger_ms = bootstrap, interval_s, tick, linger_ms
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.sent = 0

    def run(self) -> None:
        from spark_jobs.writing import SendFailures
        from txlog import Producer

        failures = SendFailures()
        try:
            with Producer(self.bootstrap, linger_ms=self.linger_ms) as producer:
                due = time.monotonic()
                while not self.stopping.is_set():
                    for future in self.tick(producer, self.sent):
                        failures.watch(future)
                        self.sent += 1
                    due += self.interval_s
                    self.stopping.wait(max(0.0, due - time.monotonic()))
                producer.flush()
            failures.raise_first()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


class OutputReader(threading.Thread):
    """Reads the latency output with read_committed; the time from each probe's
    send to its arrival, and every value once."""

    def __init__(self, bootstrap: str, partitions: int):
        super().__init__(name="output-reader", daemon=True)
        self.bootstrap, self.partitions = bootstrap, partitions
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.arrivals: dict[int, tuple[int, float]] = {}  # probe -> (sent_ns, latency s)
        self.values: set[bytes] = set()
        self.duplicates = 0

    def run(self) -> None:
        from txlog import Consumer

        try:
            with Consumer(self.bootstrap, isolation_level="read_committed", fetch_max_wait_ms=50) as consumer:
                tps = [(LATENCY_OUT, p) for p in range(self.partitions)]
                consumer.assign(tps)
                consumer.seek_to_beginning(*tps)
                while not self.stopping.is_set():
                    for record in consumer.poll(timeout_s=0.2):
                        now_ns = time.monotonic_ns()
                        if record.value in self.values:
                            self.duplicates += 1
                            continue
                        self.values.add(record.value)
                        if record.value.startswith(b"{"):
                            probe = json.loads(record.value)
                            self.arrivals[probe["probe"]] = (probe["sent_ns"], (now_ns - probe["sent_ns"]) / 1e9)
        except BaseException as exc:
            self.error = exc


def latency_query(spark, bootstrap: str, checkpoint: str, trigger_s: float):
    source = (spark.readStream.format("txlog").option("bootstrap", bootstrap).option("topic", LATENCY_IN)
              .option("startingOffsets", "earliest").load())
    return (source.select("value").writeStream.format("txlog").option("bootstrap", bootstrap).option("topic", LATENCY_OUT)
            .option("checkpointLocation", checkpoint).outputMode("append")
            .trigger(processingTime=f"{trigger_s} seconds").start())


def last_batch_id(query) -> int:
    last = query.lastProgress
    return -1 if last is None else last["batchId"]


def latency_run(spark, setup: Setup) -> dict:
    """The 1 s trigger query (module docstring, 2 and 3)."""
    args, bootstrap = setup.args, setup.bootstrap
    create_topics(bootstrap, [(LATENCY_IN, args.partitions), (LATENCY_OUT, args.output_partitions)])
    query = latency_query(spark, bootstrap, os.path.join(setup.checkpoints, "latency"), args.trigger_seconds)
    filler = Paced("filler", bootstrap, FILLER_INTERVAL_S, lambda producer, sent: [
        producer.send(LATENCY_IN, value=f"filler-{sent + i}") for i in range(args.filler_records)], linger_ms=5)
    probes = Paced("probes", bootstrap, args.probe_interval_ms / 1000, lambda producer, sent: [
        producer.send(LATENCY_IN, value=json.dumps({"probe": sent, "sent_ns": time.monotonic_ns()}))], linger_ms=0)
    reader = OutputReader(bootstrap, args.output_partitions)
    threads = (reader, filler, probes)
    try:
        for thread in threads:
            thread.start()
        progress(f"  {args.latency_warmup_seconds:.0f} s unmeasured, then {args.stream_seconds:.0f} s measured")
        time.sleep(args.latency_warmup_seconds)
        measured_from_ns, batch_before = time.monotonic_ns(), last_batch_id(query)
        time.sleep(args.stream_seconds)
        measured_to_ns, batch_last = time.monotonic_ns(), last_batch_id(query)
        for thread in (filler, probes):
            thread.stopping.set()
            thread.join()
            if thread.error is not None:
                raise CheckFailed(f"the {thread.name} producer failed: {thread.error!r}")
        sent = filler.sent + probes.sent
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while len(reader.values) < sent and time.monotonic() < deadline and reader.is_alive() and query.isActive:
            time.sleep(0.2)
        time.sleep(2 * args.trigger_seconds)  # a duplicate would come after the last record
    finally:
        reader.stopping.set()
        reader.join()
        for thread in (filler, probes):
            thread.stopping.set()
        failed = query.exception()
        query.stop()
    if failed is not None:
        raise CheckFailed(f"the latency query failed: {failure_reason(failed)}")
    if reader.error is not None:
        raise CheckFailed(f"reading the latency output failed: {reader.error!r}")
    if len(reader.values) != sent or reader.duplicates:
        raise CheckFailed(f"latency query: {sent} records sent, {len(reader.values)} distinct ones read back with "
                          f"read_committed, {reader.duplicates} duplicates")
    latencies = [latency for sent_ns, latency in reader.arrivals.values() if measured_from_ns <= sent_ns < measured_to_ns]
    batches = [json.loads(p.json) for p in query.recentProgress]
    measured = [b for b in batches if batch_before < b["batchId"] <= batch_last and b["numInputRows"] > 0]
    if not measured or not latencies:
        raise CheckFailed(f"latency query: {len(measured)} micro-batches and {len(latencies)} probes in the measured time")
    return {
        "trigger_seconds": args.trigger_seconds,
        "measured_seconds": round((measured_to_ns - measured_from_ns) / 1e9, 3),
        "records_sent": {"filler": filler.sent, "probes": probes.sent},
        "records_read_back": len(reader.values), "duplicates": reader.duplicates,
        "micro_batches_measured": len(measured),
        "micro_batch_ids": [measured[0]["batchId"], measured[-1]["batchId"]],
        "records_per_micro_batch_mean": round(statistics.fmean(b["numInputRows"] for b in measured), 1),
        "micro_batch_write_and_commit_ms": latency_summary([b["durationMs"]["addBatch"] / 1000 for b in measured]),
        "micro_batch_trigger_execution_ms": latency_summary([b["durationMs"]["triggerExecution"] / 1000 for b in measured]),
        "end_to_end_latency_ms": {**latency_summary(latencies), "probes": len(latencies)},
    }


def commit_samples(setup: Setup) -> dict:
    """``streaming_sink.commit_batch`` timed alone (module docstring, 2): batch 0
    untimed, then ``--commit-samples`` batches, each with one task's prepared
    transaction of 10 records."""
    from spark_jobs import options, streaming_sink
    from txlog import Producer
    from txlog.two_phase import task_transactional_id

    args, bootstrap = setup.args, setup.bootstrap
    create_topics(bootstrap, [(COMMIT_TOPIC, args.output_partitions)])
    write_options = options.parse_write({"bootstrap": bootstrap, "topic": COMMIT_TOPIC}, streaming=True)
    prefix = f"{streaming_sink.DEFAULT_PREFIX}bench-{uuid.uuid4()}"  # as a query's default prefix
    run_id = str(uuid.uuid4())  # as Spark's run id: task_run() keeps its hex digits
    since = end_offsets(bootstrap, COMMIT_TOPIC, args.output_partitions)
    seconds, prepare_seconds = [], []
    for batch_id in range(args.commit_samples + 1):
        tid = task_transactional_id(prefix, streaming_sink.task_run(batch_id, run_id), 0, 0)
        started = time.perf_counter()
        with Producer(bootstrap, transactional_id=tid, transaction_timeout_ms=write_options.transaction_timeout_ms) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(COMMIT_SAMPLE_RECORDS):
                producer.send(COMMIT_TOPIC, value=json.dumps({"batch": batch_id, "n": i, "views": 1}))
            handle = producer.prepare_transaction()
        prepared_s = time.perf_counter() - started
        started = time.perf_counter()
        committed = streaming_sink.commit_batch(write_options, prefix, batch_id, [handle])
        took_s = time.perf_counter() - started
        if not committed:
            raise CheckFailed(f"commit_batch of batch {batch_id} said it was committed before")
        if batch_id > 0:
            seconds.append(took_s)
            prepare_seconds.append(prepared_s)
    records, views, waited_s = read_back(bootstrap, since, COMMIT_SAMPLE_RECORDS * (args.commit_samples + 1))
    if records != views or views != COMMIT_SAMPLE_RECORDS * (args.commit_samples + 1):
        raise CheckFailed(f"commit samples: read back {records} records (expected "
                          f"{COMMIT_SAMPLE_RECORDS * (args.commit_samples + 1)})")
    return {"samples": len(seconds), "records_per_commit": COMMIT_SAMPLE_RECORDS, "prefix": prefix,
            "micro_batch_commit_ms": latency_summary(seconds),
            "task_write_and_prepare_ms": latency_summary(prepare_seconds),
            "read_back_records": records, "read_back_waited_s": waited_s}


# --- the run --------------------------------------------------------------------------------------


def measure(workdir: str, args: argparse.Namespace) -> dict:
    from spark_jobs import session

    local = settled_cluster(workdir)
    spark = None
    try:
        bootstrap = local.state.bootstrap
        create_topics(bootstrap, [(INPUT_TOPIC, args.partitions), (WARMUP_TOPIC, args.partitions)]
                      + [(topic, args.output_partitions) for topic in OUTPUT_TOPICS.values()])
        start_ms = now_start_ms()
        progress(f"loading {args.warmup_records} warm-up events into {WARMUP_TOPIC} ({args.partitions} partitions)")
        load_events(bootstrap, WARMUP_TOPIC, args.warmup_records, args.seed + 1, start_ms)
        progress(f"loading {args.records} events into {INPUT_TOPIC} ({args.partitions} partitions)")
        data = load_events(bootstrap, INPUT_TOPIC, args.records, args.seed, start_ms)
        progress(f"  generated in {data['generate_seconds']} s, loaded in {data['load_seconds']} s "
                 f"({data['load_records_per_s']:.0f} records/s)")

        progress(f"starting Spark on {MASTER}")
        started = time.perf_counter()
        # every micro-batch's progress of the latency query, not the last 100
        spark = session.build(MASTER, "bench-spark-streaming", {"spark.sql.streaming.numRecentProgressUpdates": "100000"})
        session_s = time.perf_counter() - started
        jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        pids = {"bench_driver": os.getpid(), "spark_jvm": jvm_pid,
                **{name: info.pid for name, info in sorted(local.state.services.items())}}
        checkpoints = os.path.join(workdir, "checkpoints")
        os.makedirs(checkpoints)
        setup = Setup(bootstrap, args, pids, jvm_pid, checkpoints, data["payload_bytes"] / args.records, start_ms)

        figures = throughput(spark, setup)
        progress(f"latency: a copy query at a {args.trigger_seconds:g} s trigger, {args.filler_records} records every "
                 f"100 ms and a probe every {args.probe_interval_ms:g} ms")
        figures["latency"] = latency_run(spark, setup)
        lat = figures["latency"]
        progress(f"  addBatch p50 {lat['micro_batch_write_and_commit_ms']['p50']} ms, end to end p50 "
                 f"{lat['end_to_end_latency_ms']['p50']} ms p99 {lat['end_to_end_latency_ms']['p99']} ms")
        progress(f"commit alone: {args.commit_samples} streaming_sink.commit_batch calls")
        figures["commit"] = commit_samples(setup)
        progress(f"  commit_batch p50 {figures['commit']['micro_batch_commit_ms']['p50']} ms")
        return {"spark": {"version": spark.version, "master": MASTER, "session_start_seconds": round(session_s, 3)},
                "input": {**data, "topic": INPUT_TOPIC}, "output_topics": OUTPUT_TOPICS, **figures}
    finally:
        if spark is not None:
            spark.stop()
        progress("stopping the cluster")
        local.down()


def main(argv=None) -> int:
    args = parse_args(argv)
    measured = measured_beside_spark(measure, args, "txlog-bench-spark-streaming-")
    if measured is None:
        return 1
    figures, total_s, report_out = measured
    modes = figures.pop("modes")
    batch, streaming = modes["batch"], modes["streaming"]
    latency, commit = figures.pop("latency"), figures.pop("commit")
    report = {
        "benchmark": "spark_streaming: the txlog source -> windowed counts -> exactly-once txlog sink as a Structured "
                     "Streaming query (availableNow) vs the batch exactly-once job, same input, same Spark session; "
                     "micro-batch commit and end-to-end latency at a 1 s trigger",
        "parameters": {
            "records": args.records,
            "partitions": args.partitions,
            "output_partitions": args.output_partitions,
            "rounds": args.rounds,
            "warmup_records": args.warmup_records,
            "window_ms": WINDOW_MS,
            "watermark_ms": WATERMARK_MS,
            "stream_seconds": args.stream_seconds,
            "latency_warmup_seconds": args.latency_warmup_seconds,
            "trigger_seconds": args.trigger_seconds,
            "filler_records_per_100ms": args.filler_records,
            "probe_interval_ms": args.probe_interval_ms,
            "commit_samples": args.commit_samples,
            "master": MASTER,
            "seed": args.seed,
            "quick": args.quick,
        },
        "machine": {"cpus": os.cpu_count()},
        "records": args.records,
        "partitions": args.partitions,
        "batch": batch,
        "streaming": streaming,
        # the figure: records / the streaming query's counting run against records / run_once
        "ratio_streaming_to_batch": round(streaming["records_per_s"] / batch["records_per_s"], 4),
        "ratio_of_best_runs": round(streaming["records_per_s_best"] / batch["records_per_s_best"], 4),
        "ratio_of_records_per_cpu_second": None if not (streaming["records_per_cpu_second"] and batch["records_per_cpu_second"])
        else round(streaming["records_per_cpu_second"] / batch["records_per_cpu_second"], 4),
        "micro_batch_write_and_commit_ms": latency["micro_batch_write_and_commit_ms"],
        "micro_batch_commit_ms": commit["micro_batch_commit_ms"],
        "end_to_end_latency_ms": latency["end_to_end_latency_ms"],
        "total_seconds": round(total_s, 1),
        "latency_query": latency,
        "commit_alone": commit,
        **figures,
    }
    write_report(report, report_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
