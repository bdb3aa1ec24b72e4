"""Benchmark: the exactly-once Spark job against the same job without
transactions - records/s of ``spark_jobs.eos`` running ``windowed_counts``
over the same input, with ``delivery="exactly-once"`` and with
``delivery="at-least-once"`` (an idempotent producer, offsets committed after
the output), measured in the same run on the same Spark session.

What it measures, on a local cluster started for the run (services/tooling/cluster.py:
ZooKeeper, one producer_id_svc, two partition_svc, two coordinator_svc as real
processes, defaults: fsync on), once the coordinators have settled who owns
which transaction log partition:

* the input: ``--warmup-records`` then ``--records`` page-view events
  (spark_jobs.sample_events, about 90 bytes of key + JSON each, keyed by user)
  loaded with an idempotent producer into one topic of ``--partitions``
  partitions; the generation and the load of the timed records are timed
  apart and reported, not part of the ratio;
* a warm-up, untimed: both modes once over the warm-up records, so that the
  JVM, the Python workers, the clients' first connections and the
  coordinators' first metadata look-ups are not billed to whichever mode runs
  first. The exactly-once runs use the warm-up's transactional ids, so the
  coordinators that own them have already looked up the output topic. A
  failed warm-up attempt is reported in ``warmup.failed_attempts`` and run
  again (it resumes where its committed ranges left it);
* the job, ``spark_jobs.eos.run_once`` on ``local[2]`` (one task per input
  partition, two at a time), ``--rounds`` rounds, each mode once a round, the
  order reversed every other round (ABBA: a drift over the run weighs on both
  modes alike). Each mode has one job name (so the same transactional ids
  every run, as a scheduled job has) and one output topic; each run has a
  group of its own, committed past the warm-up records before it starts, so
  every run reads exactly the ``--records`` timed records. A run's time is the
  wall time of ``run_once``: planning on the driver, the Spark job, the
  results back. records/s = input records / that time; per mode, the median
  of the rounds (and the best) is the figure.

Every run is checked: one range per input partition, every range committed,
records_in summed over the ranges = the input records, and the run's output,
read back with read_committed, has as many records as the run produced and
counts as many views as input records. A failed check exits 1 with no report.

Target: the exactly-once records/s >= 90% of the at-least-once records/s.

Why the baseline runs in the same run: on two shared cores (Spark's JVM and
Python workers, this driver, ZooKeeper and five Python services) an absolute
records/s means little; the ratio to the same work without transactions, on
the same machine minutes apart, holds anywhere. CPU seconds of every process
come from /proc (bench/measure.py), Spark's Python workers (children of the
JVM) counted together, to show where the time goes.

Prints one JSON object to stdout (the Spark JVM and its workers write to
stderr only: the script points its own stdout there and keeps the real one for
the report); progress goes to stderr. Run it as
``python -m bench.spark_eos [--records N] [--rounds R] [--partitions P]``;
``--records 20000 --rounds 1`` is a quick smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from bench.measure import CLOCK_TICKS, Phase, progress

MODES = ("exactly-once", "at-least-once")
TRANSFORM = "spark_jobs.windowed_counts:count_views"
WINDOW_MS = 60_000
MASTER = "local[2]"
INPUT_TOPIC = "bench-eos-input"
OUTPUT_TOPICS = {"exactly-once": "bench-eos-out-exactly-once", "at-least-once": "bench-eos-out-at-least-once"}
JOB_NAMES = {"exactly-once": "bench-eos-exactly-once", "at-least-once": "bench-eos-at-least-once"}
WARMUP_RECORDS = 20_000
TARGET = 0.9
SETTLE_TIMEOUT_S = 60.0
READ_BACK_TIMEOUT_S = 60.0
WARMUP_ATTEMPTS_MAX = 3


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="input records (default 1000000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the input topic = Spark tasks per run (default 4)")
    parser.add_argument("--output-partitions", type=int, default=4, help="partitions of each output topic (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs per mode, the order reversed every other round (default 2)")
    parser.add_argument("--warmup-records", type=int, default=WARMUP_RECORDS, help=f"records of the untimed warm-up runs (default {WARMUP_RECORDS})")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample events (default 1)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the cluster's directory (its logs) and say where")
    args = parser.parse_args(argv)
    if min(args.records, args.partitions, args.output_partitions, args.rounds, args.warmup_records) <= 0:
        parser.error("counts must be positive")
    return args


# --- CPU of Spark's Python workers -------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid``'s descendants: the live ones, and the ones
    they and ``pid`` have reaped (cutime + cstime), so that a worker that exits
    within a phase still counts; None where /proc is missing."""
    own = _stat_fields(pid)
    if own is None:
        return None
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    ticks = int(own[13]) + int(own[14])  # reaped children of pid itself
    stack = list(children.get(pid, ()))
    while stack:
        child = stack.pop()
        fields = _stat_fields(child)
        if fields is not None:
            ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
            stack.extend(children.get(child, ()))
    return ticks / CLOCK_TICKS


class SparkPhase(Phase):
    """A Phase that also counts the CPU of the Spark JVM's descendants (the Python
    daemon and its workers) as ``spark_python_workers``."""

    def __init__(self, pids: dict[str, int], jvm_pid: int):
        super().__init__(pids)
        self.jvm_pid = jvm_pid
        self._workers_before: float | None = None

    def __enter__(self) -> SparkPhase:
        self._workers_before = descendants_cpu_seconds(self.jvm_pid)
        return super().__enter__()

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        after = descendants_cpu_seconds(self.jvm_pid)
        self.cpu["spark_python_workers"] = None if after is None or self._workers_before is None \
            else after - self._workers_before


# --- the cluster, the input, the output -------------------------------------------------------------


def wait_until_settled(local) -> None:
    """The coordinators own their share of the transaction log: the same wait as
    the tests' transactional cluster, so that no partition
    moves while a mode is timed."""
    local.wait_until_coordinators_settle(timeout_s=SETTLE_TIMEOUT_S)


def create_topics(bootstrap: str, topics: list[tuple[str, int]]) -> None:
    from txlog import Admin

    with Admin(bootstrap) as admin:
        admin.create_topics(topics)


def load_input(bootstrap: str, topic: str, records: int, seed: int) -> dict:
    from spark_jobs import sample_events

    started = time.perf_counter()
    generated = sample_events.events(records, seed)
    generated_s = time.perf_counter() - started
    payload_bytes = sum(len(key.encode()) + len(value.encode()) for key, value in generated)
    started = time.perf_counter()
    sample_events.load(bootstrap, topic, generated)
    load_s = time.perf_counter() - started
    return {
        "records": records,
        "payload_bytes": payload_bytes,
        "record_bytes_mean": round(payload_bytes / records, 1),
        "generate_seconds": round(generated_s, 3),
        "load_seconds": round(load_s, 3),
        "load_records_per_s": round(records / load_s, 1),
    }


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """The last stable offset of each partition of ``topic``."""
    from txlog import Consumer

    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        answers = consumer.end_offsets([(topic, p) for p in range(partitions)])
    return {(tp.topic, tp.partition): offset for tp, offset in answers.items()}


def commit_group(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Where a fresh group starts: past the warm-up records."""
    from txlog import Consumer

    with Consumer(bootstrap, group_id=group) as consumer:
        consumer.commit(offsets)


def output_views(bootstrap: str, since: dict[tuple[str, int], int]) -> tuple[int, int]:
    """(records, views summed) read with read_committed from ``since`` to the LSO."""
    from txlog import Consumer

    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="none") as consumer:
        consumer.assign(list(since))
        for tp, offset in since.items():
            consumer.seek(tp, offset)
        ends = {(tp.topic, tp.partition): offset for tp, offset in consumer.end_offsets(list(since)).items()}
        records = views = 0
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in since):
            if time.monotonic() > deadline:
                raise CheckFailed(f"reading the output back: not at its end after {READ_BACK_TIMEOUT_S:.0f} s")
            for record in consumer.poll(timeout_s=1.0):
                if record.offset < ends[(record.topic, record.partition)]:
                    records += 1
                    views += json.loads(record.value)["views"]
    return records, views


# --- the runs -------------------------------------------------------------------------------------


class CheckFailed(RuntimeError):
    """A run did not consume and produce what it should have."""


@dataclass(frozen=True)
class Setup:
    bootstrap: str
    args: argparse.Namespace
    pids: dict[str, int]
    jvm_pid: int
    warmup_ends: dict[tuple[str, int], int]  # where the timed runs start: past the warm-up records
    record_bytes: float


def job_for(bootstrap: str, mode: str, group: str):
    """The job of ``mode``: one name (so the same transactional ids) for every run
    of a mode, as a scheduled job has, and a group of the run's own."""
    from spark_jobs import eos

    return eos.EosJob(name=JOB_NAMES[mode], bootstrap=bootstrap, input_topics=(INPUT_TOPIC,),
                      output_topic=OUTPUT_TOPICS[mode], group=group, transform=TRANSFORM,
                      transform_args={"window_ms": WINDOW_MS}, delivery=mode)


def check_run(what: str, results, records: int, partitions: int, bootstrap: str,
              output_since: dict[tuple[str, int], int], *, resumed: bool = False) -> dict:
    """Every range committed (or, in a run resumed after a failed attempt, skipped),
    ``records`` consumed, and the output read back counts ``records`` views."""
    statuses = sorted({r.status for r in results})
    allowed = {"committed", "skipped"} if resumed else {"committed"}
    records_in = sum(r.records_in for r in results)
    records_out = sum(r.records_out for r in results)
    ranges_ok = len(results) <= partitions if resumed else len(results) == partitions  # resumed: done ones are not planned
    if not ranges_ok or not set(statuses) <= allowed or (not resumed and records_in != records):
        raise CheckFailed(f"{what}: {len(results)} ranges (expected {partitions}), statuses {statuses} (expected "
                          f"{sorted(allowed)}), records_in {records_in} (expected {records})")
    read_back, views = output_views(bootstrap, output_since)
    if views != records or (not resumed and read_back != records_out):
        raise CheckFailed(f"{what}: read back {read_back} output records (the run produced {records_out}) counting "
                          f"{views} views (expected {records})")
    return {"ranges": len(results), "records_in": records_in, "records_out": records_out,
            "fenced_rounds": sum(r.fenced_rounds for r in results),
            "attempts_retried": sum(r.attempt > 0 for r in results)}


def warm_up(spark, bootstrap: str, args: argparse.Namespace, partitions: int) -> dict:
    """Both modes over the warm-up records at the start of the input, untimed. A
    failed attempt is reported and the run started again (the same job and group:
    it resumes where the committed ranges left it, as a scheduled job would)."""
    from spark_jobs import eos

    seconds, failures = {}, []
    for mode in MODES:
        job = job_for(bootstrap, mode, f"{JOB_NAMES[mode]}-warmup")
        since = end_offsets(bootstrap, OUTPUT_TOPICS[mode], args.output_partitions)
        started = time.perf_counter()
        for attempt in range(WARMUP_ATTEMPTS_MAX):
            try:
                results = eos.run_once(spark, job)
                break
            except Exception as exc:  # the Py4J or Python error of a failed Spark job
                reason = failure_reason(exc)
                failures.append({"mode": mode, "attempt": attempt, "error": reason})
                progress(f"  warm-up {mode}: attempt {attempt} failed: {reason}")
                if attempt + 1 == WARMUP_ATTEMPTS_MAX:
                    raise CheckFailed(f"warm-up {mode}: {WARMUP_ATTEMPTS_MAX} attempts failed") from exc
        seconds[mode] = round(time.perf_counter() - started, 3)
        check_run(f"warm-up {mode}", results, args.warmup_records, partitions, bootstrap, since,
                  resumed=attempt > 0)
        progress(f"  warm-up {mode}: {seconds[mode]} s")
    return {"records": args.warmup_records, "seconds": seconds, "failed_attempts": failures}


def failure_reason(exc: BaseException) -> str:
    """The last line of the error that names an exception (the txlog or Python one a
    task raised, under the Py4J and Spark wrapping), else its last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line or "Exception:" in line]
    return (named or lines or [type(exc).__name__])[-1][:500]


def timed_run(spark, setup: Setup, mode: str, round_index: int) -> dict:
    from spark_jobs import eos

    args = setup.args
    job = job_for(setup.bootstrap, mode, f"{JOB_NAMES[mode]}-round-{round_index}")
    commit_group(setup.bootstrap, job.group, setup.warmup_ends)
    since = end_offsets(setup.bootstrap, job.output_topic, args.output_partitions)
    with SparkPhase(setup.pids, setup.jvm_pid) as phase:
        results = eos.run_once(spark, job)
    checked = check_run(f"round {round_index} {mode}", results, args.records, args.partitions, setup.bootstrap, since)
    rates = phase.rates(args.records, setup.record_bytes)
    spent = [v for v in phase.cpu.values() if v is not None]
    cpu_total_s = sum(spent) if len(spent) == len(phase.cpu) else None
    progress(f"  round {round_index} {mode}: {rates['seconds']:.2f} s, {rates['records_per_s']:.0f} records/s, "
             f"CPU s {rates['cpu_seconds']}")
    return {"round": round_index, "mode": mode, "group": job.group, **checked, **rates,
            # CPU of the cluster, Spark and this driver: what a neighbour on the box takes is not in it
            "cpu_seconds_total": None if cpu_total_s is None else round(cpu_total_s, 3),
            "records_per_cpu_second": None if not cpu_total_s else round(args.records / cpu_total_s, 1),
            # the Python workers are in phase.cpu, so "other" is what runs outside the cluster and Spark
            "cpu_utilisation_outside_these_processes": phase.others_cpu_utilisation()}


def summarise(runs: list[dict], modes=MODES) -> dict:
    """Per mode, over the rounds: the median records/s (the figure), the best, the spread."""
    per_mode = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        rates = [r["records_per_s"] for r in mine]
        per_mode[mode] = {
            "records_per_s": round(statistics.median(rates), 1),  # the figure: the median of the rounds
            "records_per_s_best": max(rates),
            "records_per_s_rounds": rates,
            "seconds_median": round(statistics.median(r["seconds"] for r in mine), 3),
            "seconds_rounds": [r["seconds"] for r in mine],
            "spread_pct": round((max(rates) - min(rates)) / statistics.median(rates) * 100, 2),
            "cpu_seconds_total_rounds": [r["cpu_seconds_total"] for r in mine],
            "records_per_cpu_second": None if any(r["records_per_cpu_second"] is None for r in mine)
            else round(statistics.median(r["records_per_cpu_second"] for r in mine), 1),
            "others_cpu_utilisation_rounds": [r["cpu_utilisation_outside_these_processes"]["other_processes"] for r in mine],
        }
    return per_mode


def settled_cluster(workdir: str):
    """A local cluster in ``workdir`` (ZooKeeper, 1 producer_id_svc, 2 partition_svc, 2 coordinator_svc),
    once its coordinators have settled; stop it with ``down()``."""
    from services.tooling.cluster import LocalCluster

    local = LocalCluster(os.path.join(workdir, "cluster"))
    progress(f"starting ZooKeeper, 1 producer_id_svc, 2 partition_svc, 2 coordinator_svc in {local.dir}")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=2)
    try:
        wait_until_settled(local)
    except BaseException:
        local.down()
        raise
    return local


def measure(workdir: str, args: argparse.Namespace) -> dict:
    from spark_jobs import session

    local = settled_cluster(workdir)
    spark = None
    try:
        bootstrap = local.state.bootstrap
        create_topics(bootstrap, [(INPUT_TOPIC, args.partitions)]
                      + [(topic, args.output_partitions) for topic in OUTPUT_TOPICS.values()])
        progress(f"loading {args.warmup_records} warm-up events into {INPUT_TOPIC} ({args.partitions} partitions)")
        load_input(bootstrap, INPUT_TOPIC, args.warmup_records, args.seed + 1)
        warmup_ends = end_offsets(bootstrap, INPUT_TOPIC, args.partitions)

        progress(f"starting Spark on {MASTER}")
        started = time.perf_counter()
        spark = session.build(MASTER, "bench-spark-eos")
        session_s = time.perf_counter() - started
        jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        pids = {"bench_driver": os.getpid(), "spark_jvm": jvm_pid,
                **{name: info.pid for name, info in sorted(local.state.services.items())}}
        progress(f"warm-up: both modes over the {args.warmup_records} warm-up records")
        warmup = warm_up(spark, bootstrap, args, args.partitions)

        progress(f"loading {args.records} events into {INPUT_TOPIC} (the timed runs start past the warm-up records)")
        data = load_input(bootstrap, INPUT_TOPIC, args.records, args.seed)
        progress(f"  generated in {data['generate_seconds']} s, loaded in {data['load_seconds']} s "
                 f"({data['load_records_per_s']:.0f} records/s)")

        setup = Setup(bootstrap, args, pids, jvm_pid, warmup_ends, data["payload_bytes"] / args.records)
        runs = []
        for round_index in range(args.rounds):
            order = MODES if round_index % 2 == 0 else MODES[::-1]
            progress(f"round {round_index}: {' then '.join(order)}")
            for mode in order:
                runs.append(timed_run(spark, setup, mode, round_index))
        return {"spark": {"version": spark.version, "master": MASTER, "session_start_seconds": round(session_s, 3)},
                "input": {**data, "topic": INPUT_TOPIC, "timed_runs_start_at": {f"{t}-{p}": o for (t, p), o in warmup_ends.items()}},
                "output_topics": OUTPUT_TOPICS, "job_names": JOB_NAMES,
                "warmup": warmup, "runs": runs, "modes": summarise(runs)}
    finally:
        if spark is not None:
            spark.stop()
        progress("stopping the cluster")
        local.down()


def measured_beside_spark(measure: Callable[[str, argparse.Namespace], dict], args: argparse.Namespace,
                          prefix: str) -> tuple[dict, float, TextIO] | None:
    """``measure(workdir, args)`` in a fresh work directory (kept with
    ``args.keep_workdir``), with fd 1 pointed at stderr: the Spark JVM and the
    Python workers it forks inherit it, and whatever they print must not mix
    with the report. Returns the figures, the seconds they took and the real
    stdout for the report; None (said on stderr) when a check failed."""
    report_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    workdir = tempfile.mkdtemp(prefix=prefix)
    try:
        started = time.perf_counter()
        figures = measure(workdir, args)
        return figures, time.perf_counter() - started, report_out
    except CheckFailed as exc:
        progress(f"FAILED: {exc}")
        return None
    finally:
        if args.keep_workdir:
            progress(f"the run's directory (the cluster's logs in cluster/logs) is kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def write_report(report: dict, out: TextIO) -> None:
    """The report, one JSON object, on the stdout ``measured_beside_spark`` kept."""
    json.dump(report, out, indent=2)
    out.write("\n")
    out.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    measured = measured_beside_spark(measure, args, "txlog-bench-spark-eos-")
    if measured is None:
        return 1
    figures, total_s, report_out = measured
    modes = figures.pop("modes")
    eos, alo = modes["exactly-once"], modes["at-least-once"]
    ratio = eos["records_per_s"] / alo["records_per_s"]
    report = {
        "benchmark": "spark_eos: the exactly-once windowed_counts job vs the same job with an idempotent producer "
                     "(at-least-once), same input, same Spark session",
        "parameters": {
            "records": args.records,
            "partitions": args.partitions,
            "output_partitions": args.output_partitions,
            "rounds": args.rounds,
            "warmup_records": args.warmup_records,
            "transform": TRANSFORM,
            "window_ms": WINDOW_MS,
            "master": MASTER,
            "seed": args.seed,
            "mb": "10^6 bytes of payload (key + value)",
        },
        "machine": {"cpus": os.cpu_count()},
        "records": args.records,
        "partitions": args.partitions,
        "load_seconds": figures["input"]["load_seconds"],
        "exactly_once": eos,
        "at_least_once": alo,
        "ratio_exactly_once_to_at_least_once": round(ratio, 4),
        "ratio_of_best_runs": round(eos["records_per_s_best"] / alo["records_per_s_best"], 4),
        # records per CPU second of the tracked processes: how much of the gap is work rather than waiting
        # or a neighbour's CPU (others_cpu_utilisation_rounds: the CPUs the rest of the box kept busy)
        "ratio_of_records_per_cpu_second": None if not (eos["records_per_cpu_second"] and alo["records_per_cpu_second"])
        else round(eos["records_per_cpu_second"] / alo["records_per_cpu_second"], 4),
        "target": TARGET,
        "met": ratio >= TARGET,
        "total_seconds": round(total_s, 1),
        **figures,
    }
    write_report(report, report_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
