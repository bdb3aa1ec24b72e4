"""docker-compose.yml run for real under podman (compose_smoke.py, which
`make deploy-smoke` runs too): the images built from the Dockerfile, every
service ready by its own health check, the shipped Spark job run once from the
Spark image against the stack, and the exactly-once chaos workload with no
anomaly while containers are killed, paused and restarted, and after every
partition_svc container was replaced (their volumes kept)."""

from __future__ import annotations

import compose_smoke
import pytest

from services.chaos.checker import ANOMALIES

SECONDS = 45.0


@pytest.mark.timeout(3600)  # the first build on a machine makes the base and installs every wheel into the images
def test_the_compose_stack_runs_the_job_and_loses_nothing_while_its_containers_are_killed_paused_and_replaced():
    summary = compose_smoke.smoke(seconds=SECONDS, seed=7)
    assert summary["services_ready"] == len(compose_smoke.SERVICES), summary
    job = summary["spark_job"]
    assert job["ranges"] == 4 and job["records_in"] == compose_smoke.EVENTS and job["records_out"] > 0, job
    assert {kind: summary[kind] for kind in ANOMALIES if summary[kind]} == {}, summary
    assert summary["anomalies"] == 0 and summary["stuck_workers"] == [], summary
    assert summary["committed"] > 0 and summary["aborted"] > 0 and summary["final_read_committed"] > 0, summary
    # each kind of fault at least once, and the replacement of every partition_svc at the end
    assert set(summary["faults"]) == {"kill_partition-svc", "kill_coordinator-svc", "kill_producer-id-svc", "kill_zookeeper",
                                      "pause", "restart", "replace"}, summary["faults"]
