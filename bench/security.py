"""Benchmark: what mutual TLS and the authorizer cost (issue 15).

Produce and fetch throughput of one partition_svc with hand-built requests
(bench/produce_fetch.py's runs: one partition, 4 partitions, a fetch of
everything) on a plaintext cluster and on a cluster started with ``tls=True``
(mutual TLS on every port, ECDSA P-256 certificates from services.security.certs, and
the ACL authorizer), in the same run, alternating: plaintext, secured,
plaintext, secured, each run on a fresh cluster. On the secured cluster the
requests come from ``User:bench``, not a super user, so every call is
checked against ACLs (a prefixed All on ``bench-`` topics among a hundred
other principals' bindings). Reported: each figure's median over the rounds
(runs here vary by +-25%) and the secured / plaintext ratios (target >= 0.85:
TLS costs Kafka 10-30%).

Prints one JSON object to stdout; progress goes to stderr.

    python -m bench.security [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import grpc

from bench import produce_fetch
from bench.measure import alternating_runs, compared
from services.security import certs
from services.tooling.cluster import LocalCluster
from txlog import Admin, ClientError
from txlog.protocol.acls import ALLOW, CLUSTER, CLUSTER_NAME, LITERAL, PREFIXED, TOPIC, AclBinding
from txlog.two_phase import wait_until

PRINCIPAL = "bench"
OTHER_BINDINGS = 100  # other principals' ACLs the authorizer looks through on every call


def grant_bench(cluster: LocalCluster) -> None:
    """ACLs for User:bench (and for others, so the cache is not trivially
    small); returns once they work."""
    directory = Path(cluster.state.tls["dir"])
    certs.issue(directory, PRINCIPAL)
    bindings = [AclBinding(TOPIC, PREFIXED, "bench-", f"User:{PRINCIPAL}", "*", "All", ALLOW),
                AclBinding(CLUSTER, LITERAL, CLUSTER_NAME, f"User:{PRINCIPAL}", "*", "IdempotentWrite", ALLOW)]
    bindings += [AclBinding(TOPIC, LITERAL, f"other-{i}", f"User:other-{i}", "*", "Write", ALLOW) for i in range(OTHER_BINDINGS)]
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        admin.create_acls(bindings)
    mine = {"tls_ca": cluster.state.tls["ca"], "tls_cert": str(directory / f"{PRINCIPAL}.pem"),
            "tls_key": str(directory / f"{PRINCIPAL}-key.pem")}

    def allowed() -> bool:
        try:
            with Admin(cluster.state.bootstrap, default_api_timeout_ms=5000, **mine) as admin:
                admin.create_topics([("bench-probe", 1, 1)])
            return True
        except ClientError:
            return False

    wait_until(allowed, 60, "User:bench's ACLs in force")

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
            grant_bench(cluster)
            directory = Path(cluster.state.tls["dir"])
            credentials = grpc.ssl_channel_credentials(Path(cluster.state.tls["ca"]).read_bytes(),
                                                       (directory / f"{PRINCIPAL}-key.pem").read_bytes(),
                                                       (directory / f"{PRINCIPAL}.pem").read_bytes())
        run_args = produce_fetch.parse_args(["--records", str(args.records), "--skip-memory"])
        pids = {"bench": os.getpid(), "partition_svc": service.pid}
        figures = asyncio.run(produce_fetch.measure_service(service.address, run_args, pids, credentials))
        return {name: figures[name]["mb_per_s"] for name in FIGURES}
    finally:
        cluster.down(grace_s=5)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = alternating_runs(["plaintext", "mutual_tls_authorizer"], args.rounds, "txlog-bench-security-",
                            lambda workdir, mode: one_run(workdir, mode != "plaintext", args))
    print(json.dumps({
        "benchmark": "security: produce and fetch MB/s with mutual TLS and the ACL authorizer against plaintext, same machine, "
                     "alternating runs",
        "parameters": {"records": args.records, "rounds": args.rounds, "record_bytes": produce_fetch.RECORD_BYTES,
                       "authorizer": f"acl; requests as User:{PRINCIPAL} (not a super user), {OTHER_BINDINGS + 2} bindings"},
        **compared(runs, FIGURES, "plaintext", "mutual_tls_authorizer", TARGET, "secured_vs_plaintext"),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
