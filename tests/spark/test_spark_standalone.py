"""The shipped job on a Spark standalone cluster (a master and two workers
started from the installed PySpark), not in local mode: its executors are JVMs
of their own with Python workers of their own, sharing nothing with the driver
but the machine. The txlog cluster runs mutual TLS, so the job's certificate
and key reach the executors the documented way (the same paths on every
worker: --tls-ca/--tls-cert/--tls-key become the source's and sink's
options). One executor's JVM is killed with SIGKILL while its task holds a
transaction open with half its output sent; Spark runs the task again
elsewhere, and the output counts every input record once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from outputs import (
    committed_offsets,
    counts,
    end_offsets,
    expected_views,
    expected_windows,
    open_transactions,
    views_of,
    windows_of,
)
from spark_env import job_report, worker_pythonpath
from standalone import StandaloneCluster
from support.waiting import wait_until

from spark_jobs import sample_events
from txlog import Admin

EVENTS = 4000
INPUT, OUTPUT, GROUP = "events", "event-counts", "windowed-counts"
JOB_TIMEOUT_S = 600


def run_job(bootstrap: str, master: str, env: dict[str, str], *extra: str) -> subprocess.Popen:
    """``python -m spark_jobs.windowed_counts --once`` as a user runs it, against ``master``."""
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.windowed_counts", "--once", "--bootstrap", bootstrap, "--input-topic", INPUT,
         "--output-topic", OUTPUT, "--group", GROUP, "--spark-master", master, *extra],
        env={**os.environ, "PYTHONPATH": worker_pythonpath(), **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)


@pytest.mark.timeout(1200)
def test_the_job_on_a_standalone_cluster_counts_every_event_once_with_an_executor_killed_mid_run(tls_txn_cluster, tmp_path):
    bootstrap, tls = tls_txn_cluster.state.bootstrap, tls_txn_cluster.client_tls()
    with Admin(bootstrap, **tls) as admin:
        admin.create_topics([(INPUT, 4), (OUTPUT, 2)])
    sample_events.load(bootstrap, INPUT, sample_events.events(EVENTS), **tls)
    tls_args = [arg for option, path in tls.items() for arg in (f"--{option.replace('_', '-')}", path)]
    release = tmp_path / "release"
    # each task sends half its output, then holds its transaction open until `release` exists
    held = {"SLOW_UNTIL_FILE": str(release), "SLOW_SECONDS": "900"}
    # the executors' Python workers take the transform's module and `held` from the workers' environment
    worker_env = {**held, "PYTHONPATH": worker_pythonpath()}
    with StandaloneCluster(tmp_path / "spark", workers=2, cores=1, env=worker_env) as spark_cluster:
        job = run_job(bootstrap, spark_cluster.master_url, held, "--transform", "spark_transforms:slow_counts", *tls_args)
        try:
            # two tasks at a time (two executors of one core each), both holding half their output
            wait_until(lambda: len(open_transactions(bootstrap, GROUP, **tls)) == 2 and len(spark_cluster.executor_pids()) == 2,
                       420, lambda: f"two executors, each with a task's transaction open: {open_transactions(bootstrap, GROUP, **tls)}")
            victim = spark_cluster.executor_pids()[0]
            os.kill(victim, signal.SIGKILL)
            release.touch()
            report = job_report(job, JOB_TIMEOUT_S)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.communicate()
        (app,) = spark_cluster.state()["completedapps"]  # one application, run by the cluster's executors
        assert app["name"] == f"windowed-counts:{GROUP}" and app["state"] == "FINISHED", app
    # the killed executor's task ran again; its range is "skipped" when the orphaned Python worker of the dead
    # JVM, released too, committed the whole range before the retry's init could fence it: once either way
    assert sorted(r["partition"] for r in report["ranges"]) == [0, 1, 2, 3]
    assert {r["status"] for r in report["ranges"]} <= {"committed", "skipped"}, report["ranges"]
    counted = counts(bootstrap, OUTPUT, **tls)
    assert views_of(counted) == expected_views(EVENTS)
    assert windows_of(counted) == expected_windows(EVENTS)
    assert committed_offsets(bootstrap, GROUP, INPUT, **tls) == end_offsets(bootstrap, INPUT, **tls)
    assert open_transactions(bootstrap, GROUP, **tls) == []
