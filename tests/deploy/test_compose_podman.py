"""docker-compose.yml run for real under podman (compose_smoke.py, which
`make deploy-smoke` runs too): the images built from the Dockerfile, every
service ready by its own health check, the shipped Spark job run once from the
Spark image against the stack, and the exactly-once chaos workload with no
anomaly while containers are killed, paused and restarted, and after every
partition_svc container was replaced (their volumes kept)."""

from __future__ import annotations

import compose_smoke
import pytest

from services.tooling.chaos.checker import ANOMALIES

SECONDS = 45.0


@pytest.fixture(scope="module")
def images():
    """`make image`, once for the module: its two stacks publish the same host ports, so they run one after the
    other, on one worker (a module-scoped fixture makes tests/conftest.py keep them together)."""
    compose_smoke.build_images()


FAULTS = {"kill_partition-svc", "kill_coordinator-svc", "kill_producer-id-svc", "kill_zookeeper", "pause", "restart", "replace"}


def assert_exactly_once_under_faults(summary: dict, faults: set[str] = FAULTS) -> None:
    assert summary["services_ready"] == len(compose_smoke.SERVICES), summary
    job = summary["spark_job"]
    assert job["ranges"] == 4 and job["records_in"] == compose_smoke.EVENTS and job["records_out"] > 0, job
    assert {kind: summary[kind] for kind in ANOMALIES if summary[kind]} == {}, summary
    assert summary["anomalies"] == 0 and summary["stuck_workers"] == [], summary
    assert summary["committed"] > 0 and summary["aborted"] > 0 and summary["final_read_committed"] > 0, summary
    # each kind of fault at least once, and the replacement of every partition_svc at the end
    assert set(summary["faults"]) == faults, summary["faults"]


@pytest.mark.timeout(3600)  # the first build on a machine makes the base and installs every wheel into the images
def test_the_compose_stack_runs_the_job_and_loses_nothing_while_its_containers_are_killed_paused_and_replaced(images):
    summary = compose_smoke.smoke(seconds=SECONDS, seed=7, build=False)
    assert_exactly_once_under_faults(summary)


@pytest.mark.timeout(3600)
def test_the_tls_stack_runs_the_job_on_a_spark_cluster_with_an_executor_killed_and_loses_nothing_under_faults(images):
    """docker-compose.tls.yml over docker-compose.yml: mutual TLS, the ACL
    authorizer, the job as User:spark-job with the ACLs its one-shot grants;
    then the job from the Spark image on a Spark standalone cluster, one
    executor's JVM killed while each task holds a transaction open; then the
    chaos workload as User:admin under every kind of fault once."""
    summary = compose_smoke.smoke(seconds=0, seed=8, tls=True, spark_cluster=True, build=False)
    cluster_job = summary["spark_cluster_job"]
    assert cluster_job["run"]["records_in"] == compose_smoke.EVENTS, cluster_job
    assert sorted(r["partition"] for r in cluster_job["ranges"]) == [0, 1, 2, 3], cluster_job
    # a range is "skipped" when the killed JVM's orphaned Python worker committed it before the retry fenced it
    assert {r["status"] for r in cluster_job["ranges"]} <= {"committed", "skipped"}, cluster_job
    assert cluster_job["views"] == cluster_job["expected"], "every event counted once"
    assert cluster_job["committed_offsets"] == cluster_job["end_offsets"], "the group's offsets at the input's end"
    assert cluster_job["open_transactions"] == [], "no transaction of the job left open"
    assert summary["faults"]["kill_spark_executor"] == 1, summary["faults"]
    assert_exactly_once_under_faults(summary, FAULTS | {"kill_spark_executor"})
