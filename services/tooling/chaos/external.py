"""The chaos workload against a cluster it did not start: the workers, final
read and checker of ``run.py``, with the faults left to whoever runs the
cluster (tests/deploy's container harness kills, pauses and replaces the
containers of a compose stack or a rendered chart meanwhile).

    python -m services.tooling.chaos.external start --bootstrap B --dir D [--seed N] [TLS]
        topics, then the workers, until the file D/stop appears; then the
        workers are stopped (D/stuck.json names any that had to be killed)
    python -m services.tooling.chaos.external check --bootstrap B --dir D [TLS]
        a wait past the transaction timeout, the final read, the checker:
        prints one JSON object (every anomaly count, "anomalies" their sum,
        the workload's figures) and writes it with examples to D/result.json

TLS: --tls-ca, --tls-cert, --tls-key (PEM files) for a cluster that requires
client certificates; every worker and the final read use them.
Both run where the cluster's advertised addresses resolve (inside a compose
network, beside the pods); D is shared with the harness, which creates D/stop.
No silent owners: their checker would need an address the coordinators can
call back, which a one-off container does not have.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from services.tooling.chaos import checker, security
from services.tooling.chaos.history import read_events
from services.tooling.chaos.run import TOPICS, TXN_TIMEOUT_MS, Workers, final_state, log, stop_workers
from txlog import Admin

POLL_S = 0.5


def start(bootstrap: str, directory: Path, seed: int, cut_probability: float, tls: dict[str, str]) -> list[str]:
    """Runs the workload until ``directory/stop`` exists; the workers that had to be killed."""
    directory.mkdir(parents=True, exist_ok=True)
    with Admin(bootstrap, default_api_timeout_ms=120_000, **tls) as admin:
        admin.create_topics(list(TOPICS.items()))
    workers = Workers(directory, bootstrap, seed, cut_probability, tls=tls)
    workers.start()
    log(f"{len(workers.processes)} workers on {bootstrap}, until {directory / 'stop'} exists")
    try:
        while not (directory / "stop").exists():
            time.sleep(POLL_S)
        stuck = stop_workers(directory, workers.processes)
    finally:
        for process in workers.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    (directory / "stuck.json").write_text(json.dumps(stuck))
    return stuck


def check(bootstrap: str, directory: Path, tls: dict[str, str]) -> dict:
    """The checker's verdict on the workers' histories and the cluster's final state."""
    time.sleep(TXN_TIMEOUT_MS / 1000 * 2 + 2)  # past the timeout: what is still open now is hanging
    final = final_state(bootstrap, tls)
    events = read_events(directory)
    result = checker.check(events, final)
    numbers = checker.figures(events, final)
    numbers.pop("replays")
    stuck_path = directory / "stuck.json"
    summary = {**result["counts"], "anomalies": sum(result["counts"].values()), **numbers,
               "stuck_workers": json.loads(stuck_path.read_text()) if stuck_path.exists() else []}
    (directory / "result.json").write_text(json.dumps({**summary, "examples": result["examples"]}, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.tooling.chaos.external", description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("start", "check"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--dir", required=True, type=Path, help="the run's folder, shared with the fault injector")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cut-probability", type=float, default=0.02)
    security.add_arguments(parser)
    args = parser.parse_args(argv)
    tls = security.options(args)
    if args.step == "start":
        stuck = start(args.bootstrap, args.dir.resolve(), args.seed, args.cut_probability, tls)
        return 1 if stuck else 0
    print(json.dumps(check(args.bootstrap, args.dir.resolve(), tls)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
