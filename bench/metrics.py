"""Benchmark: what metrics cost (issue 17).

Produce and fetch throughput of one partition_svc with hand-built requests
(bench/produce_fetch.py's runs: one partition, four partitions, a fetch of
everything), with metrics on (the /metrics endpoint, every call timed, records
and bytes counted per topic, scraped every ``--scrape-interval-s`` as
Prometheus would, so the gauges' callbacks run too) and off
(``--metrics-listen ''``: no reader, the instruments record into nothing), in
the same run, alternating on a fresh cluster each: off, on, off, on, ...
Reported: each figure's median over the rounds and the on / off ratios
(target >= 0.97), and partition_svc's CPU ms per MB in each mode (steadier
than MB/s on a noisy machine).

Prints one JSON object to stdout; progress goes to stderr.

    python -m bench.metrics [--records N] [--rounds R] [--scrape-interval-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import urllib.request
from pathlib import Path

from bench import produce_fetch
from bench.measure import alternating_runs, compared
from services.tooling.cluster import LocalCluster

FIGURES = ("produce_one_partition", "produce_four_partitions", "fetch_one_partition")
MODES = {"metrics_off": ["--metrics-listen", ""], "metrics_on": []}
TARGET = 0.97


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="off + on rounds, alternating (default: %(default)s)")
    parser.add_argument("--scrape-interval-s", type=float, default=1.0, help="how often /metrics is read (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.rounds < 1 or args.scrape_interval_s <= 0:
        parser.error("--records and --rounds must be >= 1, --scrape-interval-s > 0")
    return args


class Scraper(threading.Thread):
    """Reads /metrics every interval, as Prometheus would; counts the scrapes and their bytes."""

    def __init__(self, address: str, interval_s: float):
        super().__init__(daemon=True)
        self.address, self.interval_s = address, interval_s
        self.done = threading.Event()
        self.scrapes = self.bytes = 0

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=30) as response:
                self.bytes += len(response.read())
            self.scrapes += 1


def one_run(workdir: Path, mode: str, args: argparse.Namespace) -> dict:
    cluster = LocalCluster(workdir)
    cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0, service_args={"partition_svc": MODES[mode]})
    scraper = None
    try:
        service = cluster.state.services[produce_fetch.SERVICE]
        if mode == "metrics_on":
            scraper = Scraper(service.metrics_address, args.scrape_interval_s)
            scraper.start()
        run_args = produce_fetch.parse_args(["--records", str(args.records), "--skip-memory"])
        pids = {"bench": os.getpid(), "partition_svc": service.pid}
        figures = asyncio.run(produce_fetch.measure_service(service.address, run_args, pids, None))
        run = {name: figures[name]["mb_per_s"] for name in FIGURES}
        # partition_svc's CPU per MB: steadier than MB/s on a noisy machine, and where metrics cost would show
        run.update({f"{name}_service_cpu_ms_per_mb": figures[name]["cpu_ms_per_mb"]["partition_svc"] for name in FIGURES})
        if scraper is not None:
            scraper.done.set()
            scraper.join(30)
            run["scrapes"], run["scrape_bytes"] = scraper.scrapes, scraper.bytes
        return run
    finally:
        cluster.down(grace_s=5)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = alternating_runs(list(MODES), args.rounds, "txlog-bench-metrics-", lambda workdir, mode: one_run(workdir, mode, args))
    print(json.dumps({
        "benchmark": "metrics: produce and fetch MB/s with metrics on (scraped) against off, same machine, alternating runs",
        "parameters": {"records": args.records, "rounds": args.rounds, "record_bytes": produce_fetch.RECORD_BYTES,
                       "scrape_interval_s": args.scrape_interval_s},
        **compared(runs, FIGURES, "metrics_off", "metrics_on", TARGET, "on_vs_off"),
        "service_cpu_ms_per_mb_median": {mode: {name: statistics.median(r[f"{name}_service_cpu_ms_per_mb"] for r in rs)
                                                for name in FIGURES} for mode, rs in runs.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
