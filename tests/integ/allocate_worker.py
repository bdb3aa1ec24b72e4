"""A separate allocator process for the tests: allocates COUNT blocks from the
producer_id_svc at ADDRESS, retrying retriable errors, and prints them as one
JSON list of [first_producer_id, count]."""

import argparse
import asyncio
import json
import sys

import grpc

from txlog.net.channels import open_channel
from txlog.protocol import errors
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc


async def allocate(address: str, requester_id: int, count: int, pause_s: float, give_up_s: float) -> list:
    loop = asyncio.get_running_loop()
    async with open_channel(address, timeout_s=5) as channel:
        stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
        blocks = []
        while len(blocks) < count:
            started = loop.time()
            while True:
                try:
                    reply = await stub.AllocateProducerIds(
                        producer_id_pb2.AllocateProducerIdsRequest(requester_id=requester_id)
                    )
                    break
                except grpc.RpcError as exc:
                    error = errors.from_rpc_error(exc)
                    if not error.retriable or loop.time() - started > give_up_s:
                        raise
                    await asyncio.sleep(0.05)
            blocks.append([reply.first_producer_id, reply.count])
            if pause_s:
                await asyncio.sleep(pause_s)
        return blocks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--requester-id", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--pause-s", type=float, default=0.0)
    parser.add_argument("--give-up-s", type=float, default=60.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(allocate(args.address, args.requester_id, args.count, args.pause_s, args.give_up_s))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
