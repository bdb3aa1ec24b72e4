"""docker-compose.yml for real, with podman (`make deploy-smoke`, and
test_compose_podman.py): the images built (`make image`), the stack started
with podman-compose, every service ready (its own health check, run as podman
would run it), the shipped Spark job run once in the Spark image against the
stack, then the chaos workload (services/tooling/chaos/external.py, in a container on
the stack's network, where the services' advertised names resolve) while
containers are killed, paused and restarted; then every partition_svc
container replaced at once (their data lives on only in their volumes) and
the checker's verdict on what the workload saw and what the stack holds.

    python tests/deploy/compose_smoke.py [--seconds N] [--seed N] [--keep] [--tls] [--spark-cluster]

The last line printed is one JSON object: services_ready, committed,
anomalies (the sum of every anomaly count), faults (by kind), and the rest of
the checker's figures.

podman 4.3 (Debian bookworm's) runs no health checks on its own (no systemd
timers here) and podman-compose ignores `condition: service_healthy` for it:
the services start together and wait for each other (they retry ZooKeeper and
their peers), and readiness is each container's health check, run here with
`podman healthcheck run`.

--tls runs the TLS variant (docker-compose.tls.yml over docker-compose.yml):
mutual TLS, the ACL authorizer and ZooKeeper digest auth; the Spark job as
User:spark-job with the ACLs the one-shot `spark-job-acls` grants, the
operator's tools and the chaos workload as User:admin. podman 4.3 cannot
start a container that requires one that has exited, and every service there
requires the one-shot `certs`: it runs first, to its end, and the services
after it without their dependencies.

--spark-cluster runs the job a second time on a Spark standalone cluster
started from the Spark image on the stack's network (a master and two
workers, executors in their own JVMs), each task holding its transaction
open with half its output sent while one executor's JVM is killed (SIGKILL);
the views it counted must be those of the events, each once.
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


ADMIN_TLS = ("--tls-ca", "/etc/txlog/tls/ca.pem", "--tls-cert", "/etc/txlog/tls/admin.pem", "--tls-key",
             "/etc/txlog/tls/admin-key.pem")  # what docker-compose.tls.yml's `certs` issues User:admin, a super user


@dataclass
class Stack:
    """One compose project of docker-compose.yml (with ``tls``, and
    docker-compose.tls.yml over it), run by podman-compose."""

    project: str
    tls: bool = False
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        env = {**podman_env(), "TXLOG_ZOOKEEPER_IMAGE": os.environ.get("TXLOG_ZOOKEEPER_IMAGE", ZOOKEEPER_IMAGE)}
        files = ["docker-compose.yml", *(["docker-compose.tls.yml"] if self.tls else [])]
        return run([str(Path(sys.executable).with_name("podman-compose")), "-p", self.project,
                    *(arg for f in files for arg in ("-f", str(REPO / f))), *args], timeout=timeout, env=env, check=check, cwd=REPO)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def up(self) -> None:
        self.compose("down", "--volumes", check=False)
        if not self.tls:
            self.compose("up", "-d", "--no-build")
            return
        # podman (4.3) cannot start a container that --requires one that has exited, and every service of the TLS
        # variant depends on the one-shot `certs`: run it to its end first, then the rest without dependencies
        self.compose("up", "-d", "--no-build", "certs")
        status = run(["podman", "wait", self.container("certs")], timeout=300).stdout.strip()
        if status != "0":
            logs = run(["podman", "logs", self.container("certs")], check=False)
            raise RuntimeError(f"the certs service exited {status}:\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}")
        self.compose("up", "-d", "--no-build", "--no-deps", *SERVICES)

    def down(self) -> None:
        self.compose("down", "--volumes", "--timeout", "10", check=False)

    def healthy(self, service: str) -> bool:
        """The container's own health check (the compose file's), run as podman would run it. A check that
        does not end within a minute (podman itself stalls on a loaded machine) counts as not healthy yet:
        wait_ready asks again until its own deadline."""
        try:
            return run(["podman", "healthcheck", "run", self.container(service)], check=False, timeout=60).returncode == 0
        except subprocess.TimeoutExpired:
            return False

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

    @property
    def client_tls(self) -> tuple[str, ...]:
        """An operator's TLS arguments (the admin's certificate), none in plaintext."""
        return ADMIN_TLS if self.tls else ()

    def in_network(self, image: str, *command: str, volumes: tuple[str, ...] = (), detach: bool = False,
                   timeout: float = 900, podman_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """``command`` in a one-off container of ``image`` on the stack's network (with TLS, the CA and the
        certificates mounted)."""
        volumes = (*volumes, *([f"{self.project}_tls:/etc/txlog/tls:ro"] if self.tls else []))
        mounts = [arg for v in volumes for arg in ("-v", v)]
        return run(["podman", "run", *(["-d"] if detach else ["--rm"]), "--network", self.network, "--user", "0",
                    *mounts, *podman_args, image, *command], timeout=timeout)

    def txlog(self, *args: str) -> subprocess.CompletedProcess:
        return self.in_network(SERVICE_IMAGE, "txlog", *args, "--bootstrap", BOOTSTRAP, *self.client_tls)

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
    """The shipped job once, in the Spark image (the compose file's `windowed-counts`), over sample events; with TLS
    as User:spark-job, after the one-shot `spark-job-acls` granted it its ACLs."""
    stack.txlog("topics", "create", "events", "--partitions", "4")
    stack.txlog("topics", "create", "event-counts", "--partitions", "2")
    stack.in_network(SPARK_IMAGE, "python", "-m", "spark_jobs.sample_events", "--bootstrap", BOOTSTRAP, "--topic", "events",
                     "--count", str(EVENTS), *stack.client_tls)
    no_deps = ()
    if stack.tls:  # its dependencies, the one-shot `certs` among them, one by one (Stack.up says why)
        stack.compose("--profile", "jobs", "run", "--rm", "--no-deps", "spark-job-acls", timeout=600)
        no_deps = ("--no-deps",)
    done = stack.compose("--profile", "jobs", "run", "--rm", *no_deps, "windowed-counts",
                         "python", "-m", "spark_jobs.windowed_counts", "--once", timeout=1200)
    (report,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"run"')]
    return report["run"]


FIND_EXECUTORS = """
import os
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):  # not this finder
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"CoarseGrainedExecutorBackend" in cmdline.read():
                print(pid)
    except OSError:  # it ended meanwhile
        pass
"""
SPARK_TESTS = REPO / "tests" / "spark"  # spark_transforms (the held task) and outputs (the expected counts)
SPARK_WORKERS = 2


@dataclass
class SparkCluster:
    """A Spark standalone cluster from the Spark image on the stack's network: a
    master (`spark-master`) and workers of one core each, whose executors are
    JVMs of their own in the worker containers. Their Python workers see the
    tests' transforms and a shared folder (the held task's release file)."""

    stack: Stack
    shared: Path

    def name(self, role: str) -> str:
        return f"{self.stack.project}_{role}"

    @property
    def workers(self) -> list[str]:
        return [self.name(f"spark-worker-{i}") for i in range(SPARK_WORKERS)]

    def start(self) -> None:
        self.shared.mkdir(parents=True, exist_ok=True)
        self.shared.chmod(0o777)
        # every Spark process is known to the others by a name the network resolves (its alias), not the
        # container's hostname, which only it knows
        common = ["podman", "run", "-d", "--network", self.stack.network, "--label", f"{self.stack.project}-spark"]
        run([*common, "--name", self.name("spark-master"), *host_name("spark-master"), SPARK_IMAGE, "spark-class",
             "org.apache.spark.deploy.master.Master", "--host", "spark-master", "--port", "7077"])
        # with TLS the job's certificate and key at the same paths on every worker, as docs/guides/spark.md asks
        tls = ["-v", f"{self.stack.project}_tls:/etc/txlog/tls:ro"] if self.stack.tls else []
        for i, worker in enumerate(self.workers):
            run([*common, "--name", worker, *host_name(f"spark-worker-{i}"), *tls, "-v", f"{SPARK_TESTS}:/opt/txlog-tests:ro",
                 "-v", f"{self.shared}:/shared", "-e", "PYTHONPATH=/opt/txlog-tests", "-e", "SLOW_UNTIL_FILE=/shared/release",
                 "-e", "SLOW_SECONDS=900", SPARK_IMAGE, "spark-class", "org.apache.spark.deploy.worker.Worker", "--host",
                 f"spark-worker-{i}", "--cores", "1", "--memory", "1g", "--work-dir", "/tmp/spark-work", "spark://spark-master:7077"])
        master_log = lambda: run(["podman", "logs", self.name("spark-master")], check=False).stderr  # noqa: E731
        wait_until(lambda: master_log().count("Registering worker") >= SPARK_WORKERS, READY_TIMEOUT_S,
                   lambda: f"{SPARK_WORKERS} workers registered; the master's log ends:\n{master_log()[-3000:]}", interval_s=1.0)

    def executor_pids(self, worker: str) -> list[int]:
        """The executor JVMs in ``worker``'s container (their pids there)."""
        found = run(["podman", "exec", worker, "python", "-c", FIND_EXECUTORS], check=False)
        return [int(p) for p in found.stdout.split()]

    def kill_executor(self, worker: str, pid: int) -> None:
        run(["podman", "exec", worker, "python", "-c", f"import os, signal; os.kill({pid}, signal.SIGKILL)"])
        self.stack.count("kill_spark_executor")

    def stop(self) -> None:
        names = run(["podman", "ps", "-aq", "--filter", f"label={self.stack.project}-spark"], check=False).stdout.split()
        if names:
            run(["podman", "rm", "-f", "-t", "0", *names], check=False)


CLUSTER_GROUP, CLUSTER_OUTPUT = "windowed-counts-cluster", "event-counts-cluster"  # the events again, for this job alone
COUNTED = """
import json, os, outputs
bootstrap, tls = os.environ["BOOTSTRAP"], json.loads(os.environ["TLS"])
counted = outputs.counts(bootstrap, os.environ["OUTPUT"], **tls)
print(json.dumps({"views": outputs.views_of(counted), "expected": outputs.expected_views(int(os.environ["EVENTS"])),
                  "committed_offsets": outputs.committed_offsets(bootstrap, os.environ["GROUP"], "events", **tls),
                  "end_offsets": outputs.end_offsets(bootstrap, "events", **tls),
                  "open_transactions": [t.transactional_id for t in outputs.open_transactions(bootstrap, os.environ["GROUP"], **tls)]}))
"""


def host_name(name: str) -> tuple[str, ...]:
    """A Spark process's name on the network: its alias and hostname, and SPARK_LOCAL_HOSTNAME (what it advertises)."""
    return ("--network-alias", name, "--hostname", name, "-e", f"SPARK_LOCAL_HOSTNAME={name}")


def spark_cluster_job(stack: Stack, directory: Path) -> dict:
    """The shipped job from the Spark image on a Spark standalone cluster against the stack (the events again, under a
    group and into a topic of its own; with TLS as User:admin), each task holding its transaction open with half its
    output sent; one executor's JVM killed then. Its report, and the views it counted with those expected."""
    stack.txlog("topics", "create", CLUSTER_OUTPUT, "--partitions", "2")
    spark = SparkCluster(stack, directory / "spark-shared")
    mounts = (f"{SPARK_TESTS}:/opt/txlog-tests:ro", f"{spark.shared}:/shared")
    spark.stop()  # what an interrupted run may have left
    try:
        spark.start()
        driver = stack.in_network(SPARK_IMAGE, "env", "PYTHONPATH=/opt/txlog-tests", "SLOW_UNTIL_FILE=/shared/release",
                                  "SLOW_SECONDS=900", "python", "-m", "spark_jobs.windowed_counts", "--once", "--bootstrap",
                                  BOOTSTRAP, "--input-topic", "events", "--output-topic", CLUSTER_OUTPUT, "--group",
                                  CLUSTER_GROUP, "--spark-master", "spark://spark-master:7077", "--transform",
                                  "spark_transforms:slow_counts", *stack.client_tls, volumes=mounts, detach=True,
                                  podman_args=host_name("spark-driver")).stdout.strip()
        try:
            # both executors hold a task's transaction open, half its output sent
            wait_until(lambda: all(spark.executor_pids(w) for w in spark.workers) and len(open_transactions(stack)) == SPARK_WORKERS,
                       READY_TIMEOUT_S, lambda: f"each executor with a task's transaction open: {open_transactions(stack)}; "
                       f"the driver's log ends:\n{run(['podman', 'logs', driver], check=False).stderr[-3000:]}", interval_s=2.0)
            victim = spark.workers[0]
            spark.kill_executor(victim, spark.executor_pids(victim)[0])
            (spark.shared / "release").touch()
            status = run(["podman", "wait", driver], timeout=900).stdout.strip()
            output = run(["podman", "logs", driver], check=False)
        finally:
            run(["podman", "rm", "-f", "-t", "0", driver], check=False)
    finally:
        spark.stop()
    if status != "0":
        raise RuntimeError(f"the job on the Spark cluster exited {status}:\n{output.stderr[-4000:]}")
    (report,) = [json.loads(line) for line in output.stdout.splitlines() if line.startswith('{"run"')]
    tls = {flag[2:].replace("-", "_"): path for flag, path in zip(stack.client_tls[::2], stack.client_tls[1::2], strict=True)}
    counted = stack.in_network(SPARK_IMAGE, "env", "PYTHONPATH=/opt/txlog-tests", f"BOOTSTRAP={BOOTSTRAP}",
                               f"OUTPUT={CLUSTER_OUTPUT}", f"GROUP={CLUSTER_GROUP}", f"TLS={json.dumps(tls)}",
                               f"EVENTS={EVENTS}", "python", "-c", COUNTED, volumes=mounts[:1])
    return {**report, **json.loads(counted.stdout.strip().splitlines()[-1])}


def open_transactions(stack: Stack) -> list[str]:
    """The cluster job's transactions open now (Ongoing), by transactional id."""
    listed = stack.txlog("transactions", "list", "--state", "Ongoing", "--prefix", CLUSTER_GROUP)
    return [json.loads(line)["transactional_id"] for line in listed.stdout.splitlines() if line.startswith("{")]


def chaos(stack: Stack, directory: Path, seconds: float, seed: int) -> dict:
    """The chaos workload on the stack while containers are killed, paused and restarted; then every partition_svc
    replaced at once; then the checker."""
    rng = random.Random(seed)
    workload = Workload(directory, BOOTSTRAP, seed, lambda *command, **kw: stack.in_network(SERVICE_IMAGE, *command, **kw),
                        extra_args=stack.client_tls)
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


def smoke(seconds: float = 60, seed: int = 1, keep: bool = False, tls: bool = False, spark_cluster: bool = False,
          build: bool = True) -> dict:
    if build:
        build_images()
    stack = Stack("txlog-smoke-tls" if tls else "txlog-smoke", tls)
    directory = Path(tempfile.mkdtemp(prefix="txlog-deploy-smoke-"))
    started = time.monotonic()
    try:
        stack.up()
        ready = stack.wait_ready()
        log(f"ready: {', '.join(ready)}")
        job = spark_job(stack)
        log(f"spark job: {job}")
        cluster_job = spark_cluster_job(stack, directory) if spark_cluster else None
        log(f"spark job on a Spark cluster: {cluster_job}")
        verdict = chaos(stack, directory / "chaos", seconds, seed)
    finally:
        if not keep:
            stack.down()
    summary = {"services_ready": len(ready), "tls": tls, "spark_job": job, "spark_cluster_job": cluster_job, **verdict, "faults": stack.faults,
               "seconds": round(time.monotonic() - started), "dir": str(directory) if keep else None}
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return summary


def passed(summary: dict) -> bool:
    cluster_job = summary["spark_cluster_job"]
    return summary["anomalies"] == 0 and (cluster_job is None or cluster_job["views"] == cluster_job["expected"])


def main(argv: list[str] | None = None) -> int:
    return harness_main(argv, __doc__.splitlines()[0], smoke, "the stack", passed,
                        {"tls": "the TLS variant (docker-compose.tls.yml over docker-compose.yml)",
                         "spark_cluster": "the job again on a Spark standalone cluster from the Spark image, an executor killed"})


if __name__ == "__main__":
    sys.exit(main())
