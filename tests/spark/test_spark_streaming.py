"""Structured Streaming with the ``txlog`` source and the exactly-once ``txlog``
sink, on real Spark (local mode) and a real cluster: micro-batches bounded and
resumed from the checkpoint, new partitions, lost offsets, executor failures,
the driver killed at the two worst moments of a commit, availableNow reruns,
update mode and the foreachBatch helper."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import spark_transforms
from inputs import create, produce
from outputs import counts, expected_views, expected_windows, read_all, undecided_transactions, views_of, windows_of
from pyspark.errors import StreamingQueryException
from spark_env import worker_pythonpath
from support.waiting import wait_until

from spark_jobs import sample_events, streaming_sink, windowed_counts
from txlog import Admin

WINDOW_MS = 60_000
WATERMARK_MS = 3_600_000  # the sample events arrive out of order and in runs; none is late by an hour
EVENTS = 3000
INPUT, OUTPUT, GROUP = "events", "event-counts", "windowed-counts"
QUERY_S = 240
# Spark gives a new (non-daemon) Python worker 10 s, hard-coded, to connect back; a streaming source's runner is one,
# started with each query. On a CPU-starved machine it can miss that and the query fails before reading anything:
# the tests start such a query again (from its checkpoint: what a scheduler does), a few times at most.
WORKER_LATE = "Python worker failed to connect back"
STARTS_MAX = 3


def available_now(start):
    """``start()`` (an availableNow query) run to its end, started again while its Python worker came up late."""
    for attempt in range(1, STARTS_MAX + 1):
        query = start()
        try:
            query.awaitTermination(QUERY_S)
            return query
        except StreamingQueryException as failed:
            if WORKER_LATE not in str(failed) or attempt == STARTS_MAX:
                raise


def stream(spark, bootstrap: str, topic: str, **options):
    read = spark.readStream.format("txlog").option("bootstrap", bootstrap).option("topic", topic)
    for name, value in options.items():
        read = read.option(name, str(value))
    return read.load()


def sink(df, bootstrap: str, topic: str, checkpoint, mode: str = "append"):
    return (df.writeStream.format("txlog").option("bootstrap", bootstrap).option("topic", topic)
            .option("checkpointLocation", str(checkpoint)).outputMode(mode))


def values_of(bootstrap: str, topic: str) -> list[str]:
    return [r.value.decode() for r in read_all(bootstrap, topic)]


# --- the sample events, with times near now: the streaming job's watermark follows event time, and
# malformed events count in the window of their append time ----------------------------------------

def now_start_ms() -> int:
    start = int(time.time() * 1000) - 20 * 60_000
    return start - start % WINDOW_MS


def closing_event(start_ms: int) -> tuple[str, str]:
    """An event past every sample window and the watermark: in append mode the
    micro-batch after the one that read it (under availableNow, the run's last,
    which reads nothing) writes the windows it closed; its own window stays
    open, so it is in no output."""
    return "closer", json.dumps({"user": "closer", "page": "/", "ts": start_ms + 4 * 3_600_000, "bytes": 1})


def assert_each_window_once(bootstrap: str, start_ms: int) -> None:
    counted = counts(bootstrap, OUTPUT)
    keys = [(c["section"], c["window_start_ms"]) for c in counted]
    repeated = [k for k, n in collections.Counter(keys).items() if n > 1]
    assert repeated == [], f"windows written more than once: {repeated}"
    assert views_of(counted) == expected_views(EVENTS)
    assert windows_of(counted) == expected_windows(EVENTS, start_ms=start_ms)
    assert undecided_transactions(bootstrap, "txlog-stream-") == []


def streaming_report(bootstrap: str, checkpoint) -> dict:
    """The job's report, run again while its Python worker came up late (``WORKER_LATE``)."""
    for attempt in range(1, STARTS_MAX + 1):
        job = streaming_job(bootstrap, checkpoint)
        stdout, stderr = job.communicate(timeout=QUERY_S)
        if job.returncode == 0 or WORKER_LATE not in stderr or attempt == STARTS_MAX:
            assert job.returncode == 0, stderr[-5000:]
            (report,) = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"run"')]
            return report


def streaming_job(bootstrap: str, checkpoint, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m spark_jobs.windowed_counts --streaming --once`` (availableNow, append mode)
    in a process group of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.windowed_counts", "--streaming", "--once", "--checkpoint", str(checkpoint),
         "--output-mode", "append", "--bootstrap", bootstrap, "--input-topic", INPUT, "--output-topic", OUTPUT,
         "--group", GROUP, "--watermark-ms", str(WATERMARK_MS), "--spark-master", "local[2,4]"],
        env={**os.environ, "PYTHONPATH": worker_pythonpath(), **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture
def topics(txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([(INPUT, 4), (OUTPUT, 2)])
    return bootstrap


@pytest.mark.timeout(1200)  # three jobs, each its own JVM, on a loaded machine
def test_an_available_now_query_run_three_times_with_new_input_between_counts_each_event_once(topics, tmp_path):
    bootstrap, start_ms = topics, now_start_ms()
    events = sample_events.events(EVENTS, start_ms=start_ms)
    runs = [events[:1000], events[1000:2000], [*events[2000:], closing_event(start_ms)]]
    for arrived in runs:
        sample_events.load(bootstrap, INPUT, arrived)
        report = streaming_report(bootstrap, tmp_path / "checkpoint")
        assert report["run"]["records_in"] == len(arrived)  # each run reads what arrived since the last, no more
    assert_each_window_once(bootstrap, start_ms)


@pytest.mark.timeout(1200)  # two jobs, each its own JVM, on a loaded machine
@pytest.mark.parametrize("moment", ["before", "after"])
def test_a_driver_killed_at_a_commit_then_restarted_from_the_checkpoint_writes_each_window_once(topics, tmp_path, moment):
    """Killed between the tasks' prepares and the group commit, the batch's output is
    prepared and invisible; killed after the group commit, before Spark logs the
    batch as done, Spark runs it again on restart and that run commits nothing."""
    bootstrap, start_ms = topics, now_start_ms()
    checkpoint, held = tmp_path / "checkpoint", tmp_path / "held"
    held.mkdir()
    sample_events.load(bootstrap, INPUT, [*sample_events.events(EVENTS, start_ms=start_ms), closing_event(start_ms)])
    for attempt in range(1, STARTS_MAX + 1):
        killed = streaming_job(bootstrap, checkpoint, {streaming_sink.HOLD_ENV: moment, streaming_sink.HOLD_DIR_ENV: str(held)})
        try:
            wait_until(lambda job=killed: any(held.iterdir()) or job.poll() is not None, QUERY_S, "the commit to be held")
        finally:
            if killed.poll() is None:
                os.killpg(killed.pid, signal.SIGKILL)
            stderr = killed.communicate(timeout=30)[1]
        if any(held.iterdir()) or WORKER_LATE not in stderr or attempt == STARTS_MAX:
            assert any(held.iterdir()), stderr[-5000:]
            break
    if moment == "before":
        assert read_all(bootstrap, OUTPUT) == []
        assert undecided_transactions(bootstrap, "txlog-stream-") != []  # the tasks' prepared output
    else:
        assert_each_window_once(bootstrap, start_ms)
    (marker,) = held.iterdir()
    report = streaming_report(bootstrap, checkpoint)
    assert report["batches"][0]["batch"] == int(marker.name.removeprefix("held-"))  # Spark ran the killed batch again
    assert_each_window_once(bootstrap, start_ms)


def test_a_stream_through_failing_first_task_attempts_is_written_exactly_once(spark, topics, tmp_path):
    from pyspark.sql import functions as F

    bootstrap = topics
    create(bootstrap, "copied", 1)
    for partition in range(4):
        produce(bootstrap, INPUT, [f"p{partition}-{i}" for i in range(200)], partition=partition)
    failing = F.udf(spark_transforms.first_attempts_fail, "int")
    available_now(lambda: sink(stream(spark, bootstrap, INPUT).select("value", failing("value").alias("partition")),
                               bootstrap, "copied", tmp_path / "checkpoint").trigger(availableNow=True).start())
    written = values_of(bootstrap, "copied")
    assert sorted(written) == sorted(f"p{p}-{i}" for p in range(4) for i in range(200))
    with Admin(bootstrap) as admin:  # the first attempts did fail, and their transactions were aborted
        assert admin.list_transactions(states=["CompleteAbort"], prefix="txlog-stream-") != []
    assert undecided_transactions(bootstrap, "txlog-stream-") == []


def test_micro_batches_keep_to_max_records_per_trigger_and_take_up_new_partitions(spark, topics, tmp_path):
    bootstrap = topics
    create(bootstrap, "bounded", 2)
    for partition in range(2):
        produce(bootstrap, "bounded", [f"p{partition}-{i}" for i in range(15)], partition=partition)
    seen: list[list[str]] = []
    for attempt in range(1, STARTS_MAX + 1):
        query = (stream(spark, bootstrap, "bounded", maxRecordsPerTrigger=10).writeStream
                 .foreachBatch(lambda df, _: seen.append([r.value.decode() for r in df.select("value").collect()]))
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds").start())
        wait_until(lambda running=query: seen or running.exception() is not None, QUERY_S, "the first micro-batch")
        failed = query.exception()
        if failed is None or WORKER_LATE not in str(failed) or attempt == STARTS_MAX:
            assert failed is None, failed
            break
    try:
        wait_until(lambda: sum(map(len, seen)) >= 30, QUERY_S, "the first 30 records")
        with Admin(bootstrap) as admin:
            admin.create_partitions({"bounded": 3})
        produce(bootstrap, "bounded", [f"p2-{i}" for i in range(5)], partition=2)
        wait_until(lambda: sum(map(len, seen)) >= 35, QUERY_S, "the new partition's records")
    finally:
        query.stop()
    assert max(len(batch) for batch in seen) <= 10
    everything = [v for batch in seen for v in batch]
    assert sorted(everything) == sorted([f"p{p}-{i}" for p in range(2) for i in range(15)] + [f"p2-{i}" for i in range(5)])


def collect_available_now(spark, bootstrap: str, topic: str, checkpoint, seen: list[str], **options):
    """One availableNow run of ``topic``'s values into ``seen``; the query's failure, or None."""
    try:
        available_now(lambda: stream(spark, bootstrap, topic, **options).writeStream
                      .foreachBatch(lambda df, _: seen.extend(r.value.decode() for r in df.select("value").collect()))
                      .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    except StreamingQueryException as failed:
        return failed
    return None


def test_a_query_restarted_after_retention_passed_its_offsets_fails_unless_told_to_skip(spark, topics, tmp_path):
    bootstrap = topics
    create(bootstrap, "trimmed", 1)
    produce(bootstrap, "trimmed", [f"a{i}" for i in range(5)])
    checkpoint, seen = tmp_path / "checkpoint", []

    def run(**options):
        return collect_available_now(spark, bootstrap, "trimmed", checkpoint, seen, **options)

    assert run() is None and seen == [f"a{i}" for i in range(5)]
    produce(bootstrap, "trimmed", [f"b{i}" for i in range(5)])
    with Admin(bootstrap) as admin:
        admin.delete_records({("trimmed", 0): 7})
    failed = run()
    assert failed is not None and "offsets 5 to 7 are no longer in the log" in str(failed)
    assert run(failOnDataLoss="false") is None
    assert seen == [f"a{i}" for i in range(5)] + ["b2", "b3", "b4"]


def test_a_topic_deleted_or_created_again_under_a_query_fails_it_unless_told_to_skip(spark, topics, tmp_path):
    bootstrap = topics
    create(bootstrap, "recreated", 1)
    produce(bootstrap, "recreated", [f"old{i}" for i in range(5)])
    checkpoint, seen = tmp_path / "checkpoint", []

    def run(**options):
        return collect_available_now(spark, bootstrap, "recreated", checkpoint, seen, **options)

    assert run() is None and seen == [f"old{i}" for i in range(5)]
    with Admin(bootstrap) as admin:
        admin.delete_topics(["recreated"])
        wait_until(lambda: "recreated" not in admin.list_topics(), QUERY_S, "the topic's deletion")
    failed = run()
    assert failed is not None and "recreated-0 is gone (its topic was deleted)" in str(failed)
    create(bootstrap, "recreated", 1)
    produce(bootstrap, "recreated", ["new0", "new1"])
    failed = run()
    assert failed is not None and "its log ends at 2, before offset 5 the query reached" in str(failed)
    assert run(failOnDataLoss="false") is None
    assert seen == [f"old{i}" for i in range(5)] + ["new0", "new1"]


def test_update_mode_through_foreach_batch_writes_each_windows_totals_so_far_and_the_last_of_a_key_holds_them(
        spark, topics, tmp_path):
    bootstrap, start_ms = topics, now_start_ms()
    sample_events.load(bootstrap, INPUT, sample_events.events(EVENTS, start_ms=start_ms))
    counted = windowed_counts.streaming_counts(stream(spark, bootstrap, INPUT, maxRecordsPerTrigger=1000), WINDOW_MS, WATERMARK_MS)
    query = available_now(lambda: counted.writeStream.outputMode("update")
                          .option("checkpointLocation", str(tmp_path / "checkpoint"))
                          .foreachBatch(lambda batch, batch_id: streaming_sink.write_batch_exactly_once(
                              batch, batch_id, bootstrap=bootstrap, topic=OUTPUT))
                          .trigger(availableNow=True).start())
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # at most 1,000 offsets a micro-batch
    assert windows_of(last_of_each_key(bootstrap)) == expected_windows(EVENTS, start_ms=start_ms)
    assert len(counts(bootstrap, OUTPUT)) > len(last_of_each_key(bootstrap))  # earlier micro-batches' totals so far
    assert undecided_transactions(bootstrap, "txlog-stream-") == []


def last_of_each_key(bootstrap: str) -> list[dict]:
    last = {}
    for record in read_all(bootstrap, OUTPUT):
        last[record.key] = json.loads(record.value)
    return list(last.values())


def test_the_foreach_batch_helper_writes_a_micro_batch_once_however_often_it_is_called(spark, topics, tmp_path):
    bootstrap = topics
    create(bootstrap, "helped", 1)
    produce(bootstrap, INPUT, [f"v{i}" for i in range(20)], partition=0)

    def write(df, batch_id):
        streaming_sink.write_batch_exactly_once(df.select("value"), batch_id, bootstrap=bootstrap, topic="helped",
                                                transactional_id_prefix="helper-query")

    query = available_now(lambda: stream(spark, bootstrap, INPUT).writeStream.foreachBatch(write).option(
        "checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert sorted(values_of(bootstrap, "helped")) == sorted(f"v{i}" for i in range(20))
    last_batch = query.lastProgress["batchId"]
    again = spark.createDataFrame([("again",)], "value string")
    assert not streaming_sink.write_batch_exactly_once(again, last_batch, bootstrap=bootstrap, topic="helped",
                                                       transactional_id_prefix="helper-query")
    assert streaming_sink.write_batch_exactly_once(again, last_batch + 1, bootstrap=bootstrap, topic="helped",
                                                   transactional_id_prefix="helper-query")
    assert sorted(values_of(bootstrap, "helped")) == sorted([f"v{i}" for i in range(20)] + ["again"])
