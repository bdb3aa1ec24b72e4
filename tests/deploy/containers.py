"""What the two container harnesses share (compose_smoke.py runs
docker-compose.yml, chart_smoke.py the chart's rendered workloads): podman
called with the repository's containers.conf, the images `make image` builds,
the chaos workload run in a container beside the services, and the loop that
injects one fault at a time while it runs."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICE_IMAGE, SPARK_IMAGE, ZOOKEEPER_IMAGE = "localhost/txlog:dev", "localhost/txlog-spark:dev", "localhost/txlog-zookeeper:dev"
WORKLOAD_MOUNT = "/chaos"


def log(harness: str, message: str) -> None:
    print(f"[{harness} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(REPO / "docker" / "podman-containers.conf"))}


def run(command: list[str], *, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=kwargs.pop("env", podman_env()),
                          **kwargs)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)[:300]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def build_images() -> None:
    """`make image`: layers are reused, so a second build takes seconds. One
    build at a time on a machine (the two harnesses may start together in a
    test run): the second waits, then finds every layer built."""
    with open(Path(tempfile.gettempdir()) / "txlog-image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["bash", str(REPO / "scripts" / "image.sh")], check=True, timeout=3600, env=podman_env(),
                       stdout=sys.stderr)


class Workload:
    """The chaos workload (services/tooling/chaos/external.py) in a container that
    ``one_off(*command, volumes=..., detach=...)`` starts where the cluster's
    advertised names resolve; its folder (mounted there) is shared with this
    process, which asks it to stop."""

    def __init__(self, directory: Path, bootstrap: str, seed: int, one_off: Callable[..., subprocess.CompletedProcess],
                 extra_args: tuple[str, ...] = ()):
        self.directory, self.bootstrap, self.seed, self.one_off = directory, bootstrap, seed, one_off
        self.args = ("--bootstrap", bootstrap, "--dir", WORKLOAD_MOUNT, *extra_args)
        self.container: str | None = None
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)

    @property
    def mount(self) -> str:
        return f"{self.directory}:{WORKLOAD_MOUNT}"

    def start(self) -> None:
        self.container = self.one_off("python", "-m", "services.tooling.chaos.external", "start", *self.args, "--seed",
                                      str(self.seed), volumes=(self.mount,), detach=True).stdout.strip()

    def stop(self) -> None:
        (self.directory / "stop").touch()
        if self.container is None:
            return
        run(["podman", "wait", self.container], timeout=300)
        output = run(["podman", "logs", self.container], check=False)
        (self.directory / "workload.log").write_text(output.stdout + output.stderr)
        run(["podman", "rm", self.container], check=False)

    def check(self) -> dict:
        """The checker's verdict (every anomaly count, ``anomalies`` their sum)."""
        done = self.one_off("python", "-m", "services.tooling.chaos.external", "check", *self.args, volumes=(self.mount,))
        return json.loads(done.stdout.strip().splitlines()[-1])


def inject_faults(faults: list[Callable[[], None]], settle: Callable[[], None], seconds: float, rng: random.Random) -> None:
    """Every fault once in a random order, then random ones until ``seconds``
    have passed; one at a time: ``settle`` (until everything is ready again)
    after each."""
    order = faults[:]
    rng.shuffle(order)
    deadline = time.monotonic() + seconds
    while True:
        fault = order.pop() if order else rng.choice(faults)
        fault()
        settle()  # one fault at a time: RF 3 with min.insync.replicas 2 takes one down, not two
        if time.monotonic() >= deadline and not order:
            break
        time.sleep(rng.uniform(2, 5))  # the workload's time between two faults: the gap is the point


def harness_main(argv: list[str] | None, description: str, smoke: Callable[..., dict], keeps: str,
                 passed: Callable[[dict], bool], switches: dict[str, str] | None = None) -> int:
    """A harness's command line: --seconds, --seed, --keep and its own
    ``switches`` (flag name -> help; each a keyword argument of ``smoke``);
    the summary as the last line, JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=60, help="how long faults go on (every kind at least once)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help=f"leave {keeps} up and the run's folder")
    for name, help_text in (switches or {}).items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, action="store_true", help=help_text)
    args = parser.parse_args(argv)
    summary = smoke(args.seconds, args.seed, args.keep, **{name: getattr(args, name) for name in switches or {}})
    print(json.dumps(summary), flush=True)
    return 0 if passed(summary) else 1
