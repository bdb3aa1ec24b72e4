"""Exits 0 when the txlog service in this container answers grpc.health.v1 SERVING.

The image's HEALTHCHECK and docker-compose.yml run it; Kubernetes does not
need it (its probes speak gRPC health themselves).

    python /opt/txlog/healthcheck.py [HOST:PORT]

Without an address it asks ``TXLOG_HEALTH_LISTEN`` (the plaintext
health-only port a TLS service opens), else ``TXLOG_LISTEN`` (wildcard hosts
read as 127.0.0.1), else every kind's default port: one container runs one service,
so only one of them answers. The overall service ("") is asked, which turns
NOT_SERVING while the ZooKeeper session is lost and from SIGTERM on, so a
draining or cut-off instance is reported unhealthy.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESSES = ("127.0.0.1:7100", "127.0.0.1:7200", "127.0.0.1:7300")  # producer_id, coordinator, partition
TIMEOUT_S = 3.0
WILDCARD_HOSTS = ("0.0.0.0", "[::]", "")


def addresses(argv: list[str], environ: dict[str, str]) -> list[str]:
    if argv:
        return argv
    listen = environ.get("TXLOG_HEALTH_LISTEN", "") or environ.get("TXLOG_LISTEN", "")
    if listen:
        host, port = listen.rsplit(":", 1)
        return [f"{'127.0.0.1' if host in WILDCARD_HOSTS else host}:{port}"]
    return list(DEFAULT_ADDRESSES)


def status(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str]) -> int:
    seen = []
    for address in addresses(argv, dict(os.environ)):
        answer = status(address)
        if answer == "SERVING":
            return 0
        seen.append(f"{address}: {answer}")
    print("not healthy: " + "; ".join(seen), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
