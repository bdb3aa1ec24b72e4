"""A Spark standalone cluster from the installed PySpark, for the tests: a
master and workers, each a JVM of its own started with ``bin/spark-class``;
an application's executors are JVMs of their own again (launched by the
workers, in their work directories), with their own Python workers. Nothing
is shared with the driver but the machine.

    with StandaloneCluster(tmp_path, workers=2) as spark_cluster:
        ... --spark-master spark_cluster.master_url ...
        spark_cluster.executor_pids()   # the running executors' JVMs
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyspark
from support.waiting import wait_until

from services.tooling.cluster import free_port

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_TIMEOUT_S = 180.0
BOUND_PORT = re.compile(r"Successfully started service '(\w+)' on port (\d+)")


class StandaloneCluster:
    def __init__(self, directory: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                 env: dict[str, str] | None = None):
        self.directory, self.worker_count, self.cores, self.memory = Path(directory), workers, cores, memory
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
                    "SPARK_NO_DAEMONIZE": "1", **(env or {})}
        self.port, self.ui_port = free_port(), free_port()
        self.processes: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.log", "ab")
        self.processes.append(subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            return json.load(answer)

    def _bound_ports(self) -> bool:
        """Reads the ports the master bound from its log: Spark takes the next port when the one it is
        given was taken meanwhile (a suite run saw another JVM's page answer on the UI port chosen)."""
        bound = dict(BOUND_PORT.findall((self.directory / "master.log").read_text(errors="replace")))
        if "sparkMaster" not in bound or "MasterUI" not in bound:
            return False
        self.port, self.ui_port = int(bound["sparkMaster"]), int(bound["MasterUI"])
        return True

    def __enter__(self) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._start("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                        "--webui-port", str(self.ui_port))
            wait_until(self._bound_ports, START_TIMEOUT_S, lambda: f"the master's ports in {self.directory / 'master.log'}")
            for i in range(self.worker_count):
                work_dir = self.directory / f"worker-{i}"
                work_dir.mkdir(exist_ok=True)
                self._start(f"worker-{i}", WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(self.cores),
                            "--memory", self.memory, "--work-dir", str(work_dir), "--webui-port", str(free_port()),
                            self.master_url)
            wait_until(lambda: self.state().get("aliveworkers") == self.worker_count, START_TIMEOUT_S,
                       lambda: f"{self.worker_count} workers registered with {self.master_url} (logs in {self.directory})",
                       ignoring=lambda exc: isinstance(exc, OSError))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:  # a worker's group holds its executors too
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.executor_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the listing and the kill
                pass
        for process in self.processes:
            process.wait(timeout=30)

    def executor_pids(self) -> list[int]:
        """The executor JVMs running in this cluster's work directories (found by their working directory)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if EXECUTOR_CLASS.encode() in (proc / "cmdline").read_bytes() \
                        and self.directory in Path(os.readlink(proc / "cwd")).parents:
                    pids.append(int(proc.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
        return sorted(pids)
