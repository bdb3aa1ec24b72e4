"""The two sides of bench/peer_moves.py, each run in a container: ``serve`` a
gRPC health server as txlog's servers are set (printing when it serves);
``call`` it every half second (printing each answer) through txlog's channels
(``txlog``: txlog.net.channels.ChannelCache, as the SDK and the services call)
or through a channel with gRPC's defaults (``grpc``). One JSON object per line,
with the host's clock."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from txlog.net.channels import SERVER_KEEPALIVE_OPTIONS, ChannelCache

PORT = 7777
CALL_TIMEOUT_S = 2.0


def say(**fields) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


async def serve() -> None:
    server = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS)  # as every txlog server
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"0.0.0.0:{PORT}")
    await server.start()
    say(serving=True)
    await server.wait_for_termination()


async def call(how: str, address: str, seconds: float) -> None:
    channels = ChannelCache(timeout_s=CALL_TIMEOUT_S)
    plain = grpc.aio.insecure_channel(address)
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        channel = channels.get(address) if how == "txlog" else plain  # the cache's: one looked up for each call
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
            say(answer="OK")
        except grpc.RpcError as exc:
            say(answer=exc.code().name, details=(exc.details() or "")[:160])
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(serve() if sys.argv[1] == "serve" else call(sys.argv[2], sys.argv[3], float(sys.argv[4])))
