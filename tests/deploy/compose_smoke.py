"""docker-compose.yml for real, with podman (`make deploy-smoke`, and
test_compose_podman.py): the images built (`make image`), the stack started
with podman-compose, every service ready (its own health check, run as podman
would run it), the shipped Spark job run once in the Spark image against the
stack, then the chaos workload (services/chaos/external.py, in a container on
the stack's network, where the services' advertised names resolve) while
containers are killed, paused and restarted; then every partition_svc
container replaced at once (their data lives on only in their volumes) and
the checker's verdict on what the workload saw and what the stack holds.

    python tests/deploy/compose_smoke.py [--seconds N] [--seed N] [--keep]

The last line printed is one JSON object: services_ready, committed,
anomalies (the sum of every anomaly count), faults (by kind), and the rest of
the checker's figures.

podman 4.3 (Debian bookworm's) runs no health checks on its own (no systemd
timers here) and podman-compose ignores `condition: service_healthy` for it:
the services start together and wait for each other (they retry ZooKeeper and
their peers), and readiness is each container's health check, run here with
`podman healthcheck run`.

The TLS variant (docker-compose.tls.yml) does not start under podman 4.3:
its one-shot `certs` service, which every service depends on, has exited by
the time podman starts the coordinators, and podman then fails to build their
dependency graph ("depends on container ... not found in input list").
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/support, when run as a script (make deploy-smoke)
from containers import (  # noqa: E402
    SERVICE_IMAGE,
    SPARK_IMAGE,
    ZOOKEEPER_IMAGE,
    Workload,
    build_images,
    harness_main,
    inject_faults,
    podman_env,
    run,
)
from containers import log as harness_log  # noqa: E402
from support.waiting import wait_until  # noqa: E402

TXLOG_SERVICES = ("producer-id-svc", "partition-svc-0", "partition-svc-1", "partition-svc-2", "coordinator-svc-0", "coordinator-svc-1")
SERVICES = ("zookeeper", *TXLOG_SERVICES)
PARTITION_SERVICES = tuple(s for s in TXLOG_SERVICES if s.startswith("partition-svc"))
BOOTSTRAP = ",".join(f"{s}:7300" for s in PARTITION_SERVICES)
READY_TIMEOUT_S = 300.0
PAUSE_S = 8.0  # shorter than a partition_svc's ZooKeeper session (10 s by default): a stall, not a lost session
EVENTS = 5000


def log(message: str) -> None:
    harness_log("deploy-smoke", message)


@dataclass
class Stack:
    """One compose project of docker-compose.yml, run by podman-compose."""

    project: str
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        env = {**podman_env(), "TXLOG_ZOOKEEPER_IMAGE": os.environ.get("TXLOG_ZOOKEEPER_IMAGE", ZOOKEEPER_IMAGE)}
        return run([str(Path(sys.executable).with_name("podman-compose")), "-p", self.project, "-f", str(REPO / "docker-compose.yml"), *args],
                   timeout=timeout, env=env, check=check, cwd=REPO)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def up(self) -> None:
        self.compose("down", "--volumes", check=False)
        self.compose("up", "-d", "--no-build")

    def down(self) -> None:
        self.compose("down", "--volumes", "--timeout", "10", check=False)

    def healthy(self, service: str) -> bool:
        """The container's own health check (the compose file's), run as podman would run it."""
        return run(["podman", "healthcheck", "run", self.container(service)], check=False, timeout=60).returncode == 0

    def wait_ready(self, services: tuple[str, ...] = SERVICES, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """Until every one of ``services`` passes its health check; those that do, in order."""
        waiting = list(services)

        def all_ready() -> bool:
            waiting[:] = [s for s in waiting if not self.healthy(s)]
            return not waiting

        def logs() -> str:
            tails = {s: run(["podman", "logs", "--tail", "30", self.container(s)], check=False).stderr[-2000:] for s in waiting}
            return f"{waiting} ready; their logs end:\n{json.dumps(tails, indent=1)}"

        wait_until(all_ready, timeout_s, logs, interval_s=1.0)
        return list(services)

    def in_network(self, image: str, *command: str, volumes: tuple[str, ...] = (), detach: bool = False,
                   timeout: float = 900) -> subprocess.CompletedProcess:
        """``command`` in a one-off container of ``image`` on the stack's network."""
        mounts = [arg for v in volumes for arg in ("-v", v)]
        return run(["podman", "run", *(["-d"] if detach else ["--rm"]), "--network", self.network, "--user", "0",
                    *mounts, image, *command], timeout=timeout)

    def txlog(self, *args: str) -> subprocess.CompletedProcess:
        return self.in_network(SERVICE_IMAGE, "txlog", *args, "--bootstrap", BOOTSTRAP)

    # --- faults ---------------------------------------------------------------------------

    def count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def kill(self, service: str) -> None:
        """SIGKILL, then started again (as the restart policy would; not left to it, so the run is the same here and
        under an engine that restarts later)."""
        run(["podman", "kill", "--signal", "KILL", self.container(service)], check=False)
        run(["podman", "start", self.container(service)])
        self.count(f"kill_{service.rsplit('-', 1)[0] if service[-1].isdigit() else service}")

    def pause(self, service: str, seconds: float) -> None:
        run(["podman", "pause", self.container(service)])
        try:
            time.sleep(seconds)  # the fault itself: frozen this long, whatever happens meanwhile
        finally:
            run(["podman", "unpause", self.container(service)])
        self.count("pause")

    def restart(self, service: str) -> None:
        """SIGTERM (a graceful drain), then started again."""
        run(["podman", "restart", "--time", "30", self.container(service)])
        self.count("restart")

    def replace(self, services: tuple[str, ...]) -> None:
        """New containers for ``services`` (their volumes kept): what an image upgrade does."""
        self.compose("up", "-d", "--no-build", "--no-deps", "--force-recreate", *services)
        self.count("replace")


def spark_job(stack: Stack) -> dict:
    """The shipped job once, in the Spark image (the compose file's `windowed-counts`), over sample events."""
    stack.txlog("topics", "create", "events", "--partitions", "4")
    stack.txlog("topics", "create", "event-counts", "--partitions", "2")
    stack.in_network(SPARK_IMAGE, "python", "-m", "spark_jobs.sample_events", "--bootstrap", BOOTSTRAP, "--topic", "events",
                     "--count", str(EVENTS))
    done = stack.compose("--profile", "jobs", "run", "--rm", "windowed-counts",
                         "python", "-m", "spark_jobs.windowed_counts", "--once", "--show-totals", timeout=1200)
    (report,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"run"')]
    return report["run"]


def chaos(stack: Stack, directory: Path, seconds: float, seed: int) -> dict:
    """The chaos workload on the stack while containers are killed, paused and restarted; then every partition_svc
    replaced at once; then the checker."""
    rng = random.Random(seed)
    workload = Workload(directory, BOOTSTRAP, seed, lambda *command, **kw: stack.in_network(SERVICE_IMAGE, *command, **kw))
    workload.start()
    try:
        faults = [lambda: stack.kill(rng.choice(PARTITION_SERVICES)), lambda: stack.kill(rng.choice(("coordinator-svc-0", "coordinator-svc-1"))),
                  lambda: stack.pause(rng.choice(PARTITION_SERVICES), PAUSE_S), lambda: stack.restart(rng.choice(TXLOG_SERVICES)),
                  lambda: stack.kill("producer-id-svc"), lambda: stack.kill("zookeeper")]
        inject_faults(faults, stack.wait_ready, seconds, rng)
    finally:
        workload.stop()
    # every partition_svc replaced together: the records are then nowhere but in their volumes
    stack.replace(PARTITION_SERVICES)
    stack.wait_ready()
    return workload.check()


def smoke(seconds: float = 60, seed: int = 1, keep: bool = False) -> dict:
    build_images()
    stack = Stack("txlog-smoke")
    directory = Path(tempfile.mkdtemp(prefix="txlog-deploy-smoke-"))
    started = time.monotonic()
    try:
        stack.up()
        ready = stack.wait_ready()
        log(f"ready: {', '.join(ready)}")
        job = spark_job(stack)
        log(f"spark job: {job}")
        verdict = chaos(stack, directory / "chaos", seconds, seed)
    finally:
        if not keep:
            stack.down()
    summary = {"services_ready": len(ready), "spark_job": job, **verdict, "faults": stack.faults,
               "seconds": round(time.monotonic() - started), "dir": str(directory) if keep else None}
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    return harness_main(argv, __doc__.splitlines()[0], smoke, "the stack", lambda s: s["anomalies"] == 0)


if __name__ == "__main__":
    sys.exit(main())
