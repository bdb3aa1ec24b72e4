"""Benchmark: what mutual TLS costs (issue 15).

Produce and fetch throughput of one partition_svc with hand-built requests
(bench/produce_fetch.py's runs: one partition, 4 partitions, a fetch of
everything) on a plaintext cluster and on a cluster started with ``tls=True``
(mutual TLS on every port, ECDSA P-256 certificates from services.certs), in
the same run, alternating: plaintext, TLS, plaintext, TLS, each run on a fresh
cluster. Reported: each figure's median over the rounds (runs here vary by
+-25%) and the TLS / plaintext ratios (target
>= 0.85: TLS costs Kafka 10-30%). The authorizer of issue 15 is not built yet,
so its cost is not in these figures.

Prints one JSON object to stdout; progress goes to stderr.

    python bench/security.py [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import produce_fetch  # noqa: E402

from services.cluster import LocalCluster  # noqa: E402

FIGURES = ("produce_one_partition", "produce_four_partitions", "fetch_one_partition")
TARGET = 0.85


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="plaintext + TLS rounds, alternating (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be >= 1")
    return args


def one_run(workdir: Path, tls: bool, args: argparse.Namespace) -> dict:
    cluster = LocalCluster(workdir)
    cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0, tls=tls)
    try:
        service = cluster.state.services[produce_fetch.SERVICE]
        credentials = None
        if tls:
            files = cluster.state.tls
            read = lambda name: Path(files[name]).read_bytes()  # noqa: E731
            credentials = grpc.ssl_channel_credentials(read("ca"), read("key"), read("cert"))
        run_args = produce_fetch.parse_args(["--records", str(args.records), "--skip-memory"])
        pids = {"bench": os.getpid(), "partition_svc": service.pid}
        figures = asyncio.run(produce_fetch.measure_service(service.address, run_args, pids, credentials))
        return {name: figures[name]["mb_per_s"] for name in FIGURES}
    finally:
        cluster.down(grace_s=5)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs: dict[str, list[dict]] = {"plaintext": [], "mutual_tls": []}
    with tempfile.TemporaryDirectory(prefix="txlog-bench-security-") as workdir:
        for round_index in range(args.rounds):
            for mode in runs:
                print(f"round {round_index + 1}: {mode}", file=sys.stderr, flush=True)
                runs[mode].append(one_run(Path(workdir) / f"{mode}-{round_index}", mode == "mutual_tls", args))
    means = {mode: {name: round(statistics.median(r[name] for r in rs), 2) for name in FIGURES} for mode, rs in runs.items()}
    ratios = {name: round(means["mutual_tls"][name] / means["plaintext"][name], 3) for name in FIGURES}
    print(json.dumps({
        "benchmark": "security: produce and fetch MB/s with mutual TLS against plaintext, same machine, alternating runs",
        "parameters": {"records": args.records, "rounds": args.rounds, "record_bytes": produce_fetch.RECORD_BYTES,
                       "authorizer": "not built yet (issue 15): TLS only"},
        "machine": {"cpus": os.cpu_count()},
        "mb_per_s_median": means,
        "runs": runs,
        "mutual_tls_vs_plaintext": ratios,
        "target": TARGET,
        "meets_target": all(r >= TARGET for r in ratios.values()),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
