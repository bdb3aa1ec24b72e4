"""Jobs committed as one (two-phase) on real Spark (local mode) and a real
cluster: an aggregation with a shuffle whose tasks fail or lose their Python
worker, a driver killed between its tasks' prepares and its group commit,
read_committed readers watching runs commit, a write that fails for good, and
what crashed write runs left undecided."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading

import pytest
from outputs import committed_offsets, end_offsets, key_totals, read_all, undecided_transactions
from pyspark.sql import functions as F
from spark_env import worker_pythonpath
from spark_transforms import with_faults
from support.waiting import refused_for_now, wait_until

from services.coordination import coordinators
from services.tooling.cluster import LocalCluster
from spark_jobs import eos
from spark_jobs.writing import abort_earlier_runs
from txlog import Admin, Consumer, Producer
from txlog.protocol import TRANSACTION_STATE_TOPIC
from txlog.two_phase import new_run_id

KEYS = 60
OUTPUT_PARTITIONS = 4  # writing tasks of a job: the shuffle's partitions
ARROW_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"
TASK_ID = re.compile(r"[^/]+/(?P<run>r\d+-[0-9a-f]+)\.p(?P<partition>\d+)\.t(?P<task_attempt_id>\d+)")
DECIDED_ABORTED = ("CompleteAbort", "Empty")  # Empty: an attempt fenced by init_transactions after its abort
COMPLETING = ("PrepareCommit", "PrepareAbort", "PrepareEpochFence")  # decided, markers being written

JOB_PROCESS = """
import json, sys
from spark_jobs import eos, session
settings = json.loads(sys.argv[1])
spark = session.build("local[2,4]", "two-phase-job", {"spark.sql.execution.arrow.maxRecordsPerBatch": "2"})
try:
    job = eos.EosJob(**{**settings, "input_topics": tuple(settings["input_topics"])})
    print(json.dumps([r.partition for r in eos.run_once(spark, job)]), flush=True)
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """One cluster for the module: every test uses topics and prefixes of its own."""
    local = LocalCluster(tmp_path_factory.mktemp("spark-two-phase") / "cluster")
    local.up(service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200",
                                               "--ownership-check-interval-ms", "300"]})
    try:
        local.wait_until_coordinators_settle()
        yield local.state.bootstrap
    finally:
        local.down(grace_s=5)


@pytest.fixture(scope="module", autouse=True)
def small_arrow_batches(spark):
    """Rows reach a writing task in Arrow batches of 2: an attempt that fails half-way through
    its rows has sent most of the first half (see spark_transforms.with_faults), so its
    transaction has records in the log to abort."""
    previous = spark.conf.get(ARROW_BATCH_ROWS, None)
    spark.conf.set(ARROW_BATCH_ROWS, "2")
    yield
    if previous is None:
        spark.conf.unset(ARROW_BATCH_ROWS)
    else:
        spark.conf.set(ARROW_BATCH_ROWS, previous)


def create(bootstrap: str, *topics: tuple[str, int]) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics(list(topics))


def produce_keyed(bootstrap: str, topic: str, count: int, seed: int) -> collections.Counter:
    """``count`` records with keys k0..k59 (spread over the topic's partitions by key); their keys counted."""
    rng = random.Random(seed)
    keys = [f"k{rng.randrange(KEYS)}" for _ in range(count)]
    with Producer(bootstrap) as producer:
        sent = [producer.send(topic, value=b"x", key=key) for key in keys]
        producer.flush()
    for future in sent:
        future.result(timeout=30)
    return collections.Counter(keys)


def key_count_job(bootstrap: str, name: str, source: str, sink: str, **faults) -> eos.EosJob:
    return eos.EosJob(name=name, bootstrap=bootstrap, input_topics=(source,), output_topic=sink, group=name,
                      transform="spark_transforms:faulty_key_counts",
                      transform_args={"output_partitions": OUTPUT_PARTITIONS, **faults}, commit_scope="job")


def write(df, bootstrap: str, topic: str, prefix: str) -> None:
    (df.write.format("txlog").option("bootstrap", bootstrap).option("topic", topic)
     .option("transactionalIdPrefix", prefix).mode("append").save())


def task_transactions(bootstrap: str, prefix: str) -> dict[str, dict[str, tuple[int, str]]]:
    """Per run of ``prefix`` (run ids sort by age), its task transactions: id -> (task partition, state)."""
    with Admin(bootstrap) as admin:
        listed = admin.list_transactions(prefix=f"{prefix}/")
    runs: dict[str, dict[str, tuple[int, str]]] = collections.defaultdict(dict)
    for t in listed:
        matched = TASK_ID.fullmatch(t.transactional_id)
        if matched:
            runs[matched["run"]][t.transactional_id] = (int(matched["partition"]), t.state)
    return dict(sorted(runs.items()))


def states(bootstrap: str, transactional_ids) -> dict[str, str]:
    with Admin(bootstrap) as admin:
        return {d.transactional_id: d.state for d in admin.describe_transactions(list(transactional_ids))}


def every_coordinator_timer_ran(bootstrap: str, control_topic: str) -> None:
    """Returns once the transaction timer of every __transaction_state partition's owner has run a pass
    after this call: a control transaction on each partition, with a 1 s timeout, aborted by that timer."""
    with Admin(bootstrap) as admin:
        (state_topic,) = admin.describe_topics([TRANSACTION_STATE_TOPIC])
    count = len(state_topic.partitions)
    control_ids: dict[int, str] = {}
    for i in range(10_000):
        control_ids.setdefault(coordinators.transaction_log_partition(f"{control_topic}-{i}", count), f"{control_topic}-{i}")
    assert len(control_ids) == count, control_ids
    create(bootstrap, (control_topic, 1))
    controls = [Producer(bootstrap, transactional_id=tid, transaction_timeout_ms=1000) for tid in control_ids.values()]
    try:
        for control in controls:
            control.init_transactions()
            control.begin_transaction()
            control.send(control_topic, value=b"control", partition=0).result(timeout=30)
        wait_until(lambda: set(states(bootstrap, control_ids.values()).values()) == {"CompleteAbort"}, 60,
                   lambda: f"the timers aborting the control transactions: {states(bootstrap, control_ids.values())}")
    finally:
        for control in controls:
            control.close()


def settled_states(bootstrap: str, transactional_ids) -> dict[str, str]:
    """Their states once none is between a decision and its markers (a completion returns once decided)."""
    found: dict[str, str] = {}

    def settled():
        found.update(states(bootstrap, transactional_ids))
        return not set(found.values()) & set(COMPLETING)

    wait_until(settled, 30, lambda: f"the markers of {found}")
    return found


def assert_all_decided(bootstrap: str, prefix: str) -> None:
    """No transaction of ``prefix`` is left Ongoing or Prepared; those decided have their markers written soon."""
    assert [t for t in undecided_transactions(bootstrap, prefix) if t.state not in COMPLETING] == []
    wait_until(lambda: undecided_transactions(bootstrap, prefix) == [], 30, f"the markers of {prefix}")


def assert_earlier_runs_decided_by_later_sweeps(bootstrap: str, prefix: str, timeout_s: float = 60) -> None:
    """Every transaction of ``prefix`` ends decided once later runs sweep what earlier ones left. One
    sweep may not be the last needed: an attempt Spark gave up on (its transform failed upstream, so its
    writer saw its input end) may open or prepare its transaction even after the run that followed swept,
    while the machine starves its Python worker; the next run's sweep (each poll here) aborts it."""
    swept: list[str] = []

    def decided() -> bool:
        swept.extend(abort_earlier_runs(bootstrap, prefix, new_run_id()))
        return not undecided_transactions(bootstrap, f"{prefix}/")

    wait_until(decided, timeout_s, lambda: f"undecided: {undecided_transactions(bootstrap, f'{prefix}/')}")
    print(f"late attempts the later sweeps aborted: {swept}")  # shown with a failure below


def assert_committed_once_per_task(run: dict[str, tuple[int, str]], failed: set[int]) -> None:
    """One transaction per task committed (by the group commit); every other one, those of
    the attempts that failed (exactly the tasks in ``failed``), aborted."""
    committed = sorted(p for p, state in run.values() if state == "CompleteCommit")
    assert committed == list(range(OUTPUT_PARTITIONS)), run
    neither = {tid: state for tid, (_, state) in run.items() if state not in ("CompleteCommit", *DECIDED_ABORTED)}
    assert neither == {}, run
    assert {p for p, state in run.values() if state != "CompleteCommit"} == failed, run


def assert_job_exactly_once(bootstrap: str, name: str, source: str, sink: str, expected: collections.Counter) -> None:
    """No transaction of the job is left Ongoing or Prepared; once the markers of its
    decisions are written, the committed output counts each input record once and the
    group's offsets are at the input's end."""
    assert_all_decided(bootstrap, f"{name}/")
    assert_output_exactly_once(bootstrap, name, source, sink, expected)


def assert_output_exactly_once(bootstrap: str, name: str, source: str, sink: str, expected: collections.Counter) -> None:
    """The committed output counts each input record once and the group's offsets are at the input's end.
    Right after a run whose tasks failed, not more: an attempt Spark gave up on may still open or prepare
    its transaction after the run's commit (its writer saw its input end), until the next run aborts it."""
    assert key_totals(bootstrap, sink) == dict(expected)
    assert committed_offsets(bootstrap, name, source) == end_offsets(bootstrap, source)


def aborted_copies(bootstrap: str, topic: str) -> collections.Counter:
    """The records only read_uncommitted sees (aborted ones), by value."""
    uncommitted = collections.Counter(r.value for r in read_all(bootstrap, topic, "read_uncommitted"))
    return uncommitted - collections.Counter(r.value for r in read_all(bootstrap, topic))


def test_a_shuffle_job_whose_tasks_fail_or_lose_their_worker_counts_every_record_once(spark, bootstrap):
    name, source, sink = "kc", "kc-in", "kc-out"
    create(bootstrap, (source, 4), (sink, 2))
    expected = produce_keyed(bootstrap, source, 3000, seed=1)

    # task 1 raises half-way in its first attempt, task 2 kills its Python worker half-way
    results = eos.run_once(spark, key_count_job(bootstrap, name, source, sink, fail_partitions=[1],
                                                kill_partitions=[2]))
    assert sorted(r.partition for r in results) == [0, 1, 2, 3]
    assert {r.status for r in results} == {"committed"}
    assert_output_exactly_once(bootstrap, name, source, sink, expected)

    expected += produce_keyed(bootstrap, source, 1000, seed=2)
    results = eos.run_once(spark, key_count_job(bootstrap, name, source, sink, fail_partitions=[0, 3],
                                                kill_partitions=[1]))
    assert sorted(r.partition for r in results) == [0, 1, 2, 3]
    assert all(r.start > 0 for r in results)  # from the offsets the first run committed
    assert_output_exactly_once(bootstrap, name, source, sink, expected)

    # a run with no new input aborts what the failed attempts of the runs before may have left undecided
    assert eos.run_once(spark, key_count_job(bootstrap, name, source, sink)) == []
    assert_output_exactly_once(bootstrap, name, source, sink, expected)
    assert_earlier_runs_decided_by_later_sweeps(bootstrap, name)

    # Read under later sweeps too: an attempt Spark gave up on may open its transaction even after the check
    # above (suite run 46: p3 of the second run opened one then); the sweep that follows aborts it.
    def runs_decided():
        abort_earlier_runs(bootstrap, name, new_run_id())
        first, second = task_transactions(bootstrap, name).values()
        assert_committed_once_per_task(first, failed={1, 2})
        assert_committed_once_per_task(second, failed={0, 1, 3})
        return True

    wait_until(runs_decided, 60, "each task committed once and every other attempt aborted, under later sweeps",
               ignoring=lambda exc: isinstance(exc, AssertionError) or refused_for_now(exc))
    # the failed attempts' halves reached the log and were aborted: copies of rows their retries committed
    aborted = aborted_copies(bootstrap, sink)
    assert aborted and set(aborted) <= {r.value for r in read_all(bootstrap, sink)}


def run_job_process(job: eos.EosJob, log_path) -> subprocess.Popen:
    """``job`` run once by a driver process of its own, in a process group of its own (JVM and workers included)."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-c", JOB_PROCESS, json.dumps(dataclasses.asdict(job))],
                                env={**os.environ, "PYTHONPATH": worker_pythonpath()}, stdout=subprocess.PIPE,
                                stderr=log, text=True, start_new_session=True)


def kill_all(process: subprocess.Popen) -> None:
    """SIGKILL to the process group of ``process`` and to every process group under it: Spark's
    Python daemon makes a group of its own for its workers, which would outlive the driver
    for a moment (a writer whose input the dead JVM cut short then prepares what it got)."""
    children = collections.defaultdict(list)
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        children[int(fields[1])].append((int(entry), int(fields[2])))
    groups, parents = {process.pid}, [process.pid]
    while parents:
        for child, group in children[parents.pop()]:
            groups.add(group)
            parents.append(child)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(900)  # a job process of its own (a JVM starting) beside the session, on a machine other tests load too
def test_a_driver_killed_between_prepares_and_group_commit_commits_nothing_and_the_rerun_aborts_it(
        spark, bootstrap, tmp_path):
    name, source, sink = "killed", "killed-in", "killed-out"
    create(bootstrap, (source, 3), (sink, 2))
    expected = produce_keyed(bootstrap, source, 2000, seed=3)
    eos.run_once(spark, key_count_job(bootstrap, name, source, sink))
    assert_job_exactly_once(bootstrap, name, source, sink, expected)
    totals_before, offsets_before = key_totals(bootstrap, sink), committed_offsets(bootstrap, name, source)
    earlier_runs = set(task_transactions(bootstrap, name))
    expected += produce_keyed(bootstrap, source, 1000, seed=4)

    # task 1 holds its transaction open with half its rows sent; the other three prepare theirs
    log_path = tmp_path / "job.log"
    process = run_job_process(key_count_job(bootstrap, name, source, sink, slow_partitions=[1], slow_seconds=600),
                              log_path)
    killed: dict[str, tuple[int, str]] = {}
    try:
        def prepared_but_task_1():
            assert process.poll() is None, f"the job process ended: {log_path.read_text()[-3000:]}"
            runs = task_transactions(bootstrap, name)
            killed.clear()
            for run, transactions in runs.items():
                if run not in earlier_runs:
                    killed.update(transactions)
            return sorted(killed.values()) == [(0, "Prepared"), (1, "Ongoing"), (2, "Prepared"), (3, "Prepared")] \
                and states(bootstrap, [f"{name}/offsets"])[f"{name}/offsets"] == "Prepared"

        wait_until(prepared_but_task_1, 420,
                   lambda: f"three tasks and the offsets prepared, task 1 writing; the run's tasks: {killed}")
    finally:
        kill_all(process)
        process.communicate(timeout=30)

    # the driver died before its group commit: none of the run is visible, and what it prepared stays
    # prepared (no timeout of the coordinator's aborts it soon); its offsets, pending in the prepared
    # offsets transaction, are not readable as committed (the re-run's ranges show they never were)
    assert key_totals(bootstrap, sink) == totals_before
    every_coordinator_timer_ran(bootstrap, f"{name}-control")  # the pass that would abort them, had a timeout
    assert states(bootstrap, killed) == {tid: state for tid, (_, state) in killed.items()}
    assert states(bootstrap, [f"{name}/offsets"]) == {f"{name}/offsets": "Prepared"}

    results = eos.run_once(spark, key_count_job(bootstrap, name, source, sink))
    assert {r.partition: r.start for r in results} == offsets_before  # the killed run's offsets never counted
    assert_job_exactly_once(bootstrap, name, source, sink, expected)
    after = states(bootstrap, killed)
    assert {tid: after[tid] for tid, (p, _) in killed.items() if p != 1} == \
        {tid: "CompleteAbort" for tid, (p, _) in killed.items() if p != 1}
    assert all(after[tid] in DECIDED_ABORTED for tid, (p, _) in killed.items() if p == 1), after
    *_, rerun = task_transactions(bootstrap, name).values()
    assert_committed_once_per_task(rerun, failed=set())
    assert aborted_copies(bootstrap, sink)  # the killed run's records are in the log, aborted


def test_read_committed_sees_each_run_whole_or_not_at_all(spark, bootstrap):
    name, source, sink = "whole", "whole-in", "whole-out"
    create(bootstrap, (source, 3), (sink, 1))  # one output partition: one marker request per group commit
    cumulative: list[dict[str, int]] = [{}]  # the committed totals after 0, 1, 2... runs
    snapshots: list[dict[str, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll():
        """A read_committed reader's totals, each time it has read all there is (up to the LSO)."""
        try:
            with Consumer(bootstrap, isolation_level="read_committed") as consumer:
                tp = (sink, 0)
                consumer.assign([tp])
                consumer.seek_to_beginning(tp)
                totals = collections.Counter()
                while not stop.is_set():
                    for record in consumer.poll(timeout_s=0.05):
                        value = json.loads(record.value)
                        totals[value["key"]] += value["count"]
                    if consumer.position(tp) >= consumer.end_offsets([tp])[tp]:
                        snapshots.append(dict(totals))
        except BaseException as exc:
            errors.append(exc)

    def wait_for_snapshots(count: int) -> None:
        """Until ``count`` more snapshots were taken: the last one wholly after now."""
        taken = len(snapshots)
        wait_until(lambda: len(snapshots) >= taken + count or errors, 60, f"{count} more snapshots")

    def wait_until_seen(totals: dict[str, int]) -> None:
        """Until the reader has read ``totals``: a run's commit returns once decided, its markers follow,
        and an attempt Spark gave up on may hold the LSO until the next run sweeps it (each poll sweeps so)."""
        def seen() -> bool:
            abort_earlier_runs(bootstrap, name, new_run_id())
            return bool(errors) or (bool(snapshots) and snapshots[-1] == totals)

        wait_until(seen, 90, lambda: f"the reader's totals {snapshots[-1:]} reaching {totals}")

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        expected = collections.Counter()
        for run, faults in enumerate([{}, {"fail_partitions": [0, 2], "kill_partitions": [3]},
                                      {"fail_partitions": [0], "kill_partitions": [1]}]):
            expected += produce_keyed(bootstrap, source, 1500, seed=10 + run)
            wait_for_snapshots(2)
            eos.run_once(spark, key_count_job(bootstrap, name, source, sink, **faults))
            cumulative.append(dict(expected))
            wait_until_seen(cumulative[-1])
    finally:
        stop.set()
        poller.join(60)
    assert not errors, errors

    runs_seen = [cumulative.index(s) if s in cumulative else None for s in snapshots]
    if None in runs_seen:
        partial = runs_seen.index(None)
        raise AssertionError(f"snapshot {partial} of {len(snapshots)} (after {runs_seen[:partial][-1:]} runs) is no "
                             f"run's total: {snapshots[partial]}; the totals after each run: {cumulative}")
    assert runs_seen == sorted(runs_seen)  # never back
    assert set(runs_seen) == {0, 1, 2, 3}
    assert_job_exactly_once(bootstrap, name, source, sink, expected)
    assert aborted_copies(bootstrap, sink)  # the failed attempts did send records read_committed never showed


def rows(spark):
    """300 rows in 3 partitions of 100 (task p holds row-<100p>..row-<100p+99>)."""
    return spark.range(0, 300, numPartitions=3).select(F.concat(F.lit("row-"), F.col("id").cast("string")).alias("value"))


def test_a_write_that_fails_for_good_leaves_nothing_visible_then_one_that_succeeds_is_visible_whole(spark, bootstrap):
    prefix, sink = "failing", "failing-out"
    create(bootstrap, (sink, 2))
    # task 0 fails in all 4 attempts (each after a second with half its rows sent); tasks 1 and 2 prepare
    with pytest.raises(Exception, match="injected failure in attempt 3 of task 0"):
        write(with_faults(rows(spark), always_fail_partitions=[0]), bootstrap, sink, prefix)

    assert read_all(bootstrap, sink) == []
    uncommitted = {r.value.decode() for r in read_all(bootstrap, sink, "read_uncommitted")}
    assert {f"row-{i}" for i in range(100, 300)} <= uncommitted  # the tasks that succeeded had sent theirs
    assert_all_decided(bootstrap, f"{prefix}/")
    (failed_run,) = task_transactions(bootstrap, prefix).values()
    by_task = collections.defaultdict(list)
    for task, state in failed_run.values():
        by_task[task].append(state)
    assert by_task[1] == by_task[2] == ["CompleteAbort"], failed_run  # prepared, then aborted by the driver
    assert len(by_task[0]) == 4 and set(by_task[0]) <= set(DECIDED_ABORTED), failed_run

    write(rows(spark), bootstrap, sink, prefix)
    assert_all_decided(bootstrap, f"{prefix}/")
    assert sorted(r.value.decode() for r in read_all(bootstrap, sink)) == sorted(f"row-{i}" for i in range(300))
    _, succeeded_run = task_transactions(bootstrap, prefix).values()
    assert sorted(succeeded_run.values()) == [(p, "CompleteCommit") for p in range(3)]


def test_a_write_aborts_what_crashed_runs_of_its_prefix_left_undecided_and_nothing_else(spark, bootstrap):
    prefix, sink, elsewhere = "crashed", "crashed-out", "crashed-elsewhere"
    create(bootstrap, (sink, 1), (elsewhere, 1))

    def prepared(transactional_id: str, topic: str, values: list[str]):
        with Producer(bootstrap, transactional_id=transactional_id) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for value in values:
                producer.send(topic, value=value, partition=0)
            return producer.prepare_transaction()  # close() leaves it Prepared

    crashed = prepared(f"{prefix}/r1-abcdef.p0.t0", sink, ["crashed-0", "crashed-1"])
    # a run whose task was still writing: its producer is not closed (close() would abort)
    writing_id = f"{prefix}/r2-abcdef.p1.t5"
    writing = Producer(bootstrap, transactional_id=writing_id, transaction_timeout_ms=600_000)
    try:
        writing.init_transactions()
        writing.begin_transaction()
        writing.send(sink, value="writing-0", partition=0).result(timeout=30)
        # Prepared too, but no task transaction of a run: another prefix's, and one of the prefix's
        # own group that is no task's (as an EosJob's offsets transaction)
        other = prepared("other/r1-abcdef.p0.t0", elsewhere, ["other-0"])
        offsets = prepared(f"{prefix}/offsets", elsewhere, ["offsets-0"])
        assert states(bootstrap, [crashed[0], writing_id, other[0], offsets[0]]) == {
            crashed[0]: "Prepared", writing_id: "Ongoing", other[0]: "Prepared", offsets[0]: "Prepared"}

        df = spark.createDataFrame([(f"new-{i}",) for i in range(10)], "value string")
        write(df, bootstrap, sink, prefix)

        after = settled_states(bootstrap, [crashed[0], writing_id, other[0], offsets[0]])
        assert after[crashed[0]] == "CompleteAbort"
        assert after[writing_id] in DECIDED_ABORTED
        assert (after[other[0]], after[offsets[0]]) == ("Prepared", "Prepared")
        assert sorted(r.value.decode() for r in read_all(bootstrap, sink)) == sorted(f"new-{i}" for i in range(10))
        assert {r.value.decode() for r in read_all(bootstrap, sink, "read_uncommitted")} >= \
            {"crashed-0", "crashed-1", "writing-0"}
    finally:
        writing.close()  # fenced by the write: its abort fails quietly
    with Admin(bootstrap) as admin:
        admin.complete_transaction(other, False)
        admin.complete_transaction(offsets, False)
    assert_all_decided(bootstrap, f"{prefix}/")
    assert_all_decided(bootstrap, "other/")
    assert read_all(bootstrap, elsewhere) == []


def test_a_run_with_no_new_input_aborts_what_an_abandoned_attempt_prepared_after_the_last_commit(spark, bootstrap):
    """An attempt Spark gave up on (its transform failed upstream, so its writer saw its input end and
    went on) may prepare after its run's commit swept the run; it holds the output's last stable offset
    until a later run aborts it, and a run with nothing to read is such a run too."""
    name, source, sink = "idle", "idle-in", "idle-out"
    create(bootstrap, (source, 2), (sink, OUTPUT_PARTITIONS))
    expected = produce_keyed(bootstrap, source, 200, seed=3)
    assert {r.status for r in eos.run_once(spark, key_count_job(bootstrap, name, source, sink))} == {"committed"}
    assert_job_exactly_once(bootstrap, name, source, sink, expected)

    with Producer(bootstrap, transactional_id=f"{name}/r1-abcdef.p0.t99") as late:
        late.init_transactions()
        late.begin_transaction()
        late.send(sink, value="late", partition=0)
        abandoned = late.prepare_transaction()  # close() leaves it Prepared
    assert states(bootstrap, [abandoned[0]]) == {abandoned[0]: "Prepared"}

    assert eos.run_once(spark, key_count_job(bootstrap, name, source, sink)) == []  # nothing new to read
    assert settled_states(bootstrap, [abandoned[0]])[abandoned[0]] == "CompleteAbort"
    assert_job_exactly_once(bootstrap, name, source, sink, expected)
