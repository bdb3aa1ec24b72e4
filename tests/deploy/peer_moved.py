"""The two sides of tests/deploy/test_peer_moves.py, each run in a container:
``serve`` a gRPC health server (printing when it serves), ``call`` a txlog
channel (txlog.net.channels.open_channel) asking it every half second
(printing each answer). One JSON object per line, with the host's clock."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from txlog.net.channels import SERVER_KEEPALIVE_OPTIONS, open_channel

PORT = 7777


def say(**fields) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


async def serve() -> None:
    server = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS)  # as every txlog server
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"0.0.0.0:{PORT}")
    await server.start()
    say(serving=True)
    await server.wait_for_termination()


async def call(address: str, seconds: float) -> None:
    stub = health_pb2_grpc.HealthStub(open_channel(address, timeout_s=2))
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            await stub.Check(health_pb2.HealthCheckRequest())
            say(answer="OK")
        except grpc.RpcError as exc:
            say(answer=exc.code().name)
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(serve() if sys.argv[1] == "serve" else call(sys.argv[2], float(sys.argv[3])))
