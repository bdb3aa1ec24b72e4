"""Benchmark: how long a client cannot reach a peer that came back on another
IP, as a Kubernetes pod does after every restart.

Two clients call one gRPC server every half second (bench/peer_moved.py), each
in its own container on a podman network of the run's own: one through txlog's
channels (txlog.net.channels.ChannelCache, as the SDK and the services call),
one through a channel with gRPC's defaults, the baseline of the same run. The
server is killed (SIGKILL: no connection is closed) and replaced under the same
name on a new IP, ``--rounds`` times. For each round and client: the seconds
from the replacement serving to the client's first answer from it (None: not
within ``--wait-s``), and the calls that failed meanwhile; then the medians and
their ratio. Needs podman and the images `make image` builds.

    .venv/bin/python -m bench.peer_moves [--rounds 3] [--wait-s 90]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "deploy"))
from containers import SERVICE_IMAGE, build_images, run  # noqa: E402  (the container harnesses' podman helpers)

NAME = "peer.moves.bench"
CLIENTS = ("txlog", "grpc")


def lines(container: str) -> list[dict]:
    out = run(["podman", "logs", container], check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wait_for(found, deadline_s: float):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.5)
    return None


def ip_of(container: str) -> str:
    return run(["podman", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container]).stdout.strip()


def measure(rounds: int, wait_s: float) -> dict:
    tag = secrets.token_hex(4)
    network = f"txlog-peer-moves-{tag}"
    mount = f"{REPO / 'bench' / 'peer_moved.py'}:/peer_moved.py:ro"
    started: list[str] = []

    def start(name: str, *args: str, alias: bool = False) -> str:
        name = f"{network}-{name}"
        run(["podman", "run", "-d", "--name", name, "--network", network, *(["--network-alias", NAME] if alias else []),
             "-v", mount, SERVICE_IMAGE, "python", "/peer_moved.py", *args])
        started.append(name)
        return name

    run(["podman", "network", "create", network])
    results: dict[str, list[dict]] = {how: [] for how in CLIENTS}
    try:
        server = start("server-0", "serve", alias=True)
        if not wait_for(lambda: lines(server), 60):
            raise RuntimeError("the first server never served")
        clients = {how: start(f"client-{how}", "call", how, f"{NAME}:7777", str(rounds * (wait_s + 120))) for how in CLIENTS}
        for how, client in clients.items():
            if not wait_for(lambda c=client: any(e["answer"] == "OK" for e in lines(c)), 60):
                raise RuntimeError(f"the {how} client never reached the first server")
        for round_ in range(1, rounds + 1):
            before = ip_of(server)
            run(["podman", "kill", "--signal", "KILL", server])
            run(["podman", "rm", "-f", "-t", "0", server])
            server = start(f"server-{round_}", "serve", alias=True)
            serving = wait_for(lambda s=server: lines(s), 60)[0]["t"]
            moved = ip_of(server) != before
            for how, client in clients.items():
                first = wait_for(lambda c=client, s=serving: next((e["t"] for e in lines(c) if e["answer"] == "OK" and e["t"] > s), None),
                                 wait_s)
                failed = [e for e in lines(client) if e["answer"] != "OK" and serving - 5 < e["t"] <= (first or time.time())]
                results[how].append({"round": round_, "new_ip": moved,
                                     "unreachable_s": None if first is None else round(first - serving, 1),
                                     "failed_calls": len(failed), "last_error": failed[-1].get("details", "") if failed else ""})
    finally:
        run(["podman", "rm", "-f", "-t", "0", *started], check=False)
        run(["podman", "network", "rm", "-f", network], check=False)
    medians = {}
    for how, rows in results.items():
        values = [r["unreachable_s"] if r["unreachable_s"] is not None else wait_s for r in rows]
        medians[how] = statistics.median(values)
    return {"rounds": results, "median_unreachable_s": medians, "wait_s": wait_s,
            "txlog_vs_grpc_defaults": round(medians["txlog"] / medians["grpc"], 3) if medians["grpc"] else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="replacements of the server (default: %(default)s)")
    parser.add_argument("--wait-s", type=float, default=90.0, help="how long a client may take to reach the replacement; "
                        "longer counts as this (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.wait_s <= 0:
        parser.error("--rounds must be >= 1 and --wait-s > 0")
    build_images()
    print(json.dumps({"benchmark": "peer_moves", **measure(args.rounds, args.wait_s)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
