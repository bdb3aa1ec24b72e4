"""The exactly-once job on real Spark (local mode) and a real cluster: task
failures, a zombie run beside a live one, a run killed mid-way, re-runs."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import pytest
from outputs import (
    WINDOW_MS,
    assert_tiles,
    committed_offsets,
    counts,
    end_offsets,
    expected_views,
    expected_windows,
    open_transactions,
    read_all,
    source_ranges,
    views_of,
    windows_of,
)
from spark_env import job_report, worker_pythonpath
from support.waiting import wait_until

from spark_jobs import eos, sample_events
from txlog import Admin

EVENTS = 4000
INPUT, OUTPUT, GROUP = "events", "event-counts", "windowed-counts"


@pytest.fixture
def loaded(txn_cluster):
    """The cluster, with EVENTS sample events in a 4-partition input topic; yields the bootstrap."""
    bootstrap = txn_cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([(INPUT, 4), (OUTPUT, 2)])
    sample_events.load(bootstrap, INPUT, sample_events.events(EVENTS))
    return bootstrap


def job(bootstrap: str, transform: str = "spark_jobs.windowed_counts:count_views") -> eos.EosJob:
    return eos.EosJob(name=GROUP, bootstrap=bootstrap, input_topics=(INPUT,), output_topic=OUTPUT, group=GROUP,
                      transform=transform, transform_args={"window_ms": WINDOW_MS})


def assert_exactly_once(bootstrap: str) -> list[dict]:
    """The committed output counts every input record once, the output's input ranges
    tile each partition, the group's offsets are at the end, no transaction is open."""
    counted = counts(bootstrap, OUTPUT)
    assert views_of(counted) == expected_views(EVENTS)
    assert windows_of(counted) == expected_windows(EVENTS)
    ends = end_offsets(bootstrap, INPUT)
    ranges = source_ranges(counted)
    assert sorted(ranges) == sorted(ends)
    for partition, end in ends.items():
        assert_tiles(ranges[partition], end)
    assert committed_offsets(bootstrap, GROUP, INPUT) == ends
    assert open_transactions(bootstrap, GROUP) == []
    return counted


def run_job_process(bootstrap: str, transform: str, env: dict[str, str]) -> subprocess.Popen:
    """``python -m spark_jobs.windowed_counts --once`` in a process group of its own (JVM and workers included)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.windowed_counts", "--once", "--bootstrap", bootstrap,
         "--input-topic", INPUT, "--output-topic", OUTPUT, "--group", GROUP, "--spark-master", "local[2,4]",
         "--transform", transform],
        env={**os.environ, "PYTHONPATH": worker_pythonpath(), **env}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


def ranges_reported(process: subprocess.Popen, timeout_s: float = 240) -> list[dict]:
    return job_report(process, timeout_s)["ranges"]


def test_a_run_counts_every_event_once_and_a_second_run_changes_nothing(spark, loaded):
    results = eos.run_once(spark, job(loaded))
    assert sorted(r.partition for r in results) == [0, 1, 2, 3]
    assert {r.status for r in results} == {"committed"}
    assert sum(r.records_in for r in results) == EVENTS
    counted = assert_exactly_once(loaded)

    assert eos.run_once(spark, job(loaded)) == []  # nothing new since the committed offsets
    assert counts(loaded, OUTPUT) == counted

    # new input: the next run reads only that, from the committed offsets
    more = sample_events.events(EVENTS + 400)[EVENTS:]
    sample_events.load(loaded, INPUT, more)
    results = eos.run_once(spark, job(loaded))
    assert sum(r.records_in for r in results) == 400
    assert all(r.start == r.planned_start > 0 for r in results)
    assert views_of(counts(loaded, OUTPUT)) == expected_views(EVENTS + 400)


def test_tasks_failing_in_their_first_attempt_after_sending_leave_no_trace(spark, loaded):
    results = eos.run_once(spark, job(loaded, "spark_transforms:flaky_counts"))
    by_partition = {r.partition: r for r in results}
    assert {p: r.attempt for p, r in by_partition.items()} == {0: 1, 1: 0, 2: 1, 3: 0}  # retried by Spark
    assert_exactly_once(loaded)
    # the failed attempts' half outputs did reach the log, and were aborted
    uncommitted = read_all(loaded, OUTPUT, "read_uncommitted")
    committed = read_all(loaded, OUTPUT)
    aborted = collections.Counter(r.value for r in uncommitted) - collections.Counter(r.value for r in committed)
    assert aborted and set(aborted) <= {r.value for r in committed}  # copies of what the retries then committed


@pytest.mark.timeout(900)  # two Spark jobs side by side, on a machine other tests load too
def test_a_zombie_run_beside_a_live_one_lets_one_output_per_range_become_visible(loaded, tmp_path):
    # the zombie holds transactions open with half its output sent until the second run is over (a fixed
    # pause raced the second run's start-up on a loaded machine: the zombie sometimes finished first)
    release = tmp_path / "release-the-zombie"
    zombie = run_job_process(loaded, "spark_transforms:slow_counts", {"SLOW_SECONDS": "200", "SLOW_UNTIL_FILE": str(release)})
    try:
        wait_until(lambda: open_transactions(loaded, GROUP), 300, "the first run's open transactions")
        live = run_job_process(loaded, "spark_jobs.windowed_counts:count_views", {})
        live_ranges = ranges_reported(live)
    finally:
        release.touch()
        zombie_ranges = ranges_reported(zombie, 420)  # it has up to four ranges to redo or skip, fenced first

    assert_exactly_once(loaded)
    # each input range was committed by exactly one of the two runs; the other skipped it, or had not
    # planned it because the range was committed before it planned
    for partition in range(4):
        statuses = sorted(r["status"] for r in zombie_ranges + live_ranges if r["partition"] == partition)
        assert statuses in (["committed"], ["committed", "skipped"]), (partition, zombie_ranges, live_ranges)
    assert any(r["status"] == "skipped" for r in zombie_ranges + live_ranges)
    assert sum(r["fenced_rounds"] for r in zombie_ranges + live_ranges) >= 1  # someone was fenced


@pytest.mark.timeout(900)  # two Spark jobs one after the other, on a machine other tests load too
def test_a_run_killed_mid_way_then_run_again_is_exactly_once(loaded):
    # with local[2], the tasks of partitions 0 and 1 finish first; those of 2 and 3 then hang with half sent
    killed = run_job_process(loaded, "spark_transforms:slow_counts", {"SLOW_PARTITIONS": "2,3", "SLOW_SECONDS": "300"})
    try:
        def half_done():
            committed = committed_offsets(loaded, GROUP, INPUT)
            return committed[0] is not None and committed[1] is not None and \
                {t.transactional_id for t in open_transactions(loaded, GROUP)} == {f"{GROUP}:{INPUT}:2", f"{GROUP}:{INPUT}:3"}

        # a deadline, not a duration: a job's JVM and tasks take several times longer under the suite's load
        wait_until(half_done, 420, "partitions 0 and 1 committed, 2 and 3 open")
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=30)
    committed_before = committed_offsets(loaded, GROUP, INPUT)
    assert committed_before[2] is None and committed_before[3] is None

    rerun = ranges_reported(run_job_process(loaded, "spark_jobs.windowed_counts:count_views", {}))
    assert sorted((r["partition"], r["status"]) for r in rerun) == [(2, "committed"), (3, "committed")]
    assert_exactly_once(loaded)
    assert len(read_all(loaded, OUTPUT, "read_uncommitted")) > len(read_all(loaded, OUTPUT))  # the killed run's halves


def test_one_trace_runs_from_the_job_through_each_ranges_transaction_to_its_commit(loaded):
    more = sample_events.events(EVENTS + 8_000)[EVENTS + 7_000:]  # input no earlier run has counted
    sample_events.load(loaded, INPUT, more)
    job_process = run_job_process(loaded, "spark_jobs.windowed_counts:count_views", {"TXLOG_OTEL_EXPORTER": "console"})
    stdout, stderr = job_process.communicate(timeout=240)
    assert job_process.returncode == 0, stderr[-3000:]
    (report,) = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"run"')]
    committed = {r["partition"] for r in report["ranges"] if r["status"] == "committed"}
    assert committed, "the new input was counted"
    spans = [json.loads(line)["span"] for line in stderr.splitlines() if line.startswith('{"span"')]
    (run,) = [s for s in spans if s["name"] == "txlog.spark.run"]
    trace_id = run["context"]["trace_id"]
    ranges = [s for s in spans if s["name"] == "txlog.spark.range" and s["context"]["trace_id"] == trace_id]
    assert {int(s["attributes"]["txlog.partitions"][0].rsplit("-", 1)[1]) for s in ranges} >= committed
    assert all(s["parent_id"] == run["context"]["span_id"] for s in ranges), "each range's span a child of the run's"
    end_txns = [s for s in spans if s["name"].endswith("/EndTxn") and s["context"]["trace_id"] == trace_id]
    range_ids = {s["context"]["span_id"] for s in ranges}
    assert len(end_txns) >= len(committed) and all(s["parent_id"] in range_ids for s in end_txns), \
        "each commit's EndTxn call in its range's span, so the coordinator and the markers continue the trace"
