"""docker-compose.yml for real: build the images, bring the stack up (every
service healthy), run one committed and one aborted transaction through it
with the client SDK, read them back with read_committed, take it down.

It needs a Docker engine with the compose plugin, and is skipped where none
is reachable. The client runs inside the compose network (in the
partition-svc-0 container), because the services advertise their compose
names, which resolve only there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chart_render import REPO

ONE_TRANSACTION = Path(__file__).with_name("one_transaction.py")
BOOTSTRAP = "partition-svc-0:7300,partition-svc-1:7300,partition-svc-2:7300"
PROJECT_SERVICES = {"zookeeper", "producer-id-svc", "partition-svc-0", "partition-svc-1", "partition-svc-2",
                    "coordinator-svc-0", "coordinator-svc-1"}


def docker_engine_reachable() -> bool:
    try:
        import docker

        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no socket, no permission, no daemon: all mean the same here
        return False


pytestmark = pytest.mark.skipif(not docker_engine_reachable(), reason="no Docker engine reachable here")


@pytest.mark.timeout(1800)  # the first build downloads the base images and ~1 GB of wheels
def test_compose_stack_runs_a_transaction_end_to_end():
    from testcontainers.compose import DockerCompose

    stack = DockerCompose(REPO, compose_file_name="docker-compose.yml", build=True, wait=True)
    with stack:
        running = {c.Service: c for c in stack.get_containers()}
        assert set(running) == PROJECT_SERVICES  # the Spark job's profile is not started
        for name, c in running.items():
            assert (c.State, c.Health) == ("running", "healthy"), name

        stdout, stderr, exit_code = stack.exec_in_container(
            ["python", "-c", ONE_TRANSACTION.read_text(), BOOTSTRAP, "compose-e2e"], service_name="partition-svc-0")
        assert exit_code == 0, stderr
        outcome = json.loads(stdout.strip().splitlines()[-1])
        assert outcome["values"] == ["committed-0", "committed-1"]
        assert outcome["position"] == outcome["last_stable_offset"] == outcome["high_watermark"] > 3
